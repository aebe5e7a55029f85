package link

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/mqlet/mqlet/internal/mqtttest"
)

// The receipt is the broker's PUBACK, nothing earlier: with the broker frozen (SIGSTOP) the
// PUBLISH sits in the socket and the receipt stays open; once it runs again the PUBACK settles it.
// A connection that dies with the PUBLISH unacknowledged fails the receipt, never nil.
func TestReceiptOnlyAfterPuback(t *testing.T) {
	checkGoroutines(t)
	b := mqtttest.Start(t, mqtttest.Options{})
	l := startLink(t, testOptions(t, b.Plain, "node-a"))
	waitConnected(t, l.Link)

	if err := waitReceipt(t, l.Publish("t/warm-up", []byte("0"), false)); err != nil {
		t.Fatalf("publish to a running broker: %v", err)
	}

	signal(t, b, syscall.SIGSTOP)
	frozen := true
	t.Cleanup(func() {
		if frozen && b.Pid() != 0 {
			_ = syscall.Kill(b.Pid(), syscall.SIGCONT)
		}
	})
	r := l.Publish("t/a", []byte("1"), false)
	select {
	case <-r.Done():
		t.Fatalf("receipt settled (err %v) while the broker was stopped: it cannot be a PUBACK", r.Err())
	case <-time.After(500 * time.Millisecond):
	}
	if err := r.Err(); !errors.Is(err, ErrPending) {
		t.Errorf("Err before the PUBACK = %v, want ErrPending", err)
	}
	signal(t, b, syscall.SIGCONT)
	frozen = false
	if err := waitReceipt(t, r); err != nil {
		t.Fatalf("receipt after the broker resumed: %v, want nil", err)
	}

	// Frozen again, then killed: the PUBLISH is never acknowledged.
	signal(t, b, syscall.SIGSTOP)
	frozen = true
	r = l.Publish("t/b", []byte("2"), false)
	select {
	case <-r.Done():
		t.Fatalf("receipt settled (err %v) while the broker was stopped", r.Err())
	case <-time.After(300 * time.Millisecond):
	}
	b.Kill(t)
	frozen = false
	err := waitReceipt(t, r)
	if !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("receipt after the broker was killed: %v, want ErrConnectionLost", err)
	}
	if !strings.Contains(err.Error(), "t/b") {
		t.Errorf("error %q does not name the topic t/b", err)
	}
	t.Logf("receipt error: %v", err)
}

// Publishing with no connection fails at once: nothing is queued anywhere.
func TestPublishNotConnected(t *testing.T) {
	checkGoroutines(t)
	l, err := New(testOptions(t, "tcp://127.0.0.1:1", "node-a"))
	if err != nil {
		t.Fatal(err)
	}
	r := l.Publish("t/a", []byte("x"), false)
	select {
	case <-r.Done():
	default:
		t.Fatal("receipt of a publish without a connection is not settled at once")
	}
	if !errors.Is(r.Err(), ErrNotConnected) {
		t.Errorf("Err = %v, want ErrNotConnected", r.Err())
	}
	if err := l.Resubscribe("t/#"); err == nil || !strings.Contains(err.Error(), "not one of") {
		t.Errorf("Resubscribe of a filter that is not subscribed: %v", err)
	}
	if _, _, ok := l.Connected(); ok {
		t.Error("Connected says ok before Run")
	}
	if r := l.Publish("t/+", nil, false); r.Err() == nil || !strings.Contains(r.Err().Error(), "wildcards") {
		t.Errorf("publish to a wildcard topic: %v", r.Err())
	}
}

// A connect failure names the broker it could not reach.
func TestConnectErrorNamesBroker(t *testing.T) {
	checkGoroutines(t)
	b := mqtttest.Start(t, mqtttest.Options{})
	b.Stop(t) // a port nobody listens on any more
	l, err := New(testOptions(t, b.Plain, "node-a"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.connection(context.Background())
	want := "mqtt connect " + b.Plain + ": "
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("connection error %v, want it to start with %q", err, want)
	}
	t.Logf("connect error: %v", err)
}

// Subscriptions are made by each connection's OnConnect handler, so a message published after a
// broker restart (which forgets every subscription: no persistence) still arrives.
func TestSubscriptionsSurviveRestart(t *testing.T) {
	checkGoroutines(t)
	b := mqtttest.Start(t, mqtttest.Options{})
	o := testOptions(t, b.Plain, "node-a")
	o.Subscriptions = []string{"t/#"}
	l := startLink(t, o)
	s1, lost := waitConnected(t, l.Link)

	b.Stop(t)
	select {
	case <-lost:
	case <-time.After(ackWait):
		t.Fatalf("lost channel not closed within %s of the broker stopping", ackWait)
	}
	if _, _, ok := l.Connected(); ok {
		t.Error("Connected says ok while the broker is down")
	}
	if r := l.Publish("t/x", nil, false); !errors.Is(r.Err(), ErrNotConnected) {
		t.Errorf("publish while down: %v, want ErrNotConnected", r.Err())
	}
	b.Start(t)
	s2, _ := waitConnected(t, l.Link)
	if s2 <= s1 {
		t.Errorf("session after the restart %d, want more than %d", s2, s1)
	}

	pub := startLink(t, testOptions(t, b.Plain, "control"))
	waitConnected(t, pub.Link)
	if err := waitReceipt(t, pub.Publish("t/after", []byte("hello"), false)); err != nil {
		t.Fatal(err)
	}
	m := receive(t, l.Link, "t/after")["t/after"]
	if string(m.Payload) != "hello" || m.Session != s2 {
		t.Errorf("got %q in session %d, want %q in session %d", m.Payload, m.Session, "hello", s2)
	}
}

// A consumer that does not read the inbox never stalls paho: 5000 messages overflow a small
// inbox, the extra ones are dropped and counted, OnOverflow hears of it, and the connection stays
// the same one and still gets PUBACKs.
func TestSlowConsumerNeverStallsLink(t *testing.T) {
	checkGoroutines(t)
	const n, inbox = 5000, 100
	b := mqtttest.Start(t, mqtttest.Options{})
	overflowed := make(chan struct{}, 1)
	o := testOptions(t, b.Plain, "node-a")
	o.Subscriptions = []string{"flood/#"}
	o.InboxSize = inbox
	o.OnOverflow = func() {
		select {
		case overflowed <- struct{}{}:
		default:
		}
	}
	l := startLink(t, o)
	session, lost := waitConnected(t, l.Link)

	pub := startLink(t, testOptions(t, b.Plain, "control"))
	waitConnected(t, pub.Link)
	receipts := make([]*Receipt, n)
	for i := range receipts {
		receipts[i] = pub.Publish(fmt.Sprintf("flood/%d", i), []byte("x"), false)
	}
	for i, r := range receipts {
		if err := waitReceipt(t, r); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}

	select {
	case <-overflowed:
	case <-time.After(ackWait):
		t.Fatalf("OnOverflow not called within %s (dropped %d)", ackWait, l.Dropped())
	}
	// Every message is either in the inbox or counted as dropped, once paho delivered them all.
	deadline := time.Now().Add(ackWait)
	for l.Dropped()+uint64(len(l.Inbox())) < n && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := l.Dropped() + uint64(len(l.Inbox())); got != n {
		t.Errorf("dropped %d + in inbox %d = %d, want %d", l.Dropped(), len(l.Inbox()), got, n)
	}
	if l.Dropped() == 0 {
		t.Fatal("nothing dropped although nothing read the inbox")
	}
	select {
	case <-lost:
		t.Fatal("the connection was lost while the inbox was full")
	default:
	}
	if s, _, ok := l.Connected(); !ok || s != session {
		t.Fatalf("Connected = %d, %v; want the same session %d", s, ok, session)
	}
	if err := waitReceipt(t, l.Publish("other/after-flood", []byte("ok"), false)); err != nil {
		t.Fatalf("publish after the flood: %v", err)
	}
	t.Logf("dropped %d of %d with an inbox of %d", l.Dropped(), n, inbox)
}

// Resubscribe makes the broker resend every retained message under the filter: the full resend
// of desired state a node asks for after an overflow.
func TestResubscribeResendsRetained(t *testing.T) {
	checkGoroutines(t)
	b := mqtttest.Start(t, mqtttest.Options{})
	pub := startLink(t, testOptions(t, b.Plain, "control"))
	waitConnected(t, pub.Link)
	for _, k := range []string{"a", "b"} {
		if err := waitReceipt(t, pub.Publish("desired/"+k, []byte(k), true)); err != nil {
			t.Fatal(err)
		}
	}
	o := testOptions(t, b.Plain, "node-a")
	o.Subscriptions = []string{"desired/#", "other/#"}
	l := startLink(t, o)
	waitConnected(t, l.Link)
	for tp, m := range receive(t, l.Link, "desired/a", "desired/b") {
		if !m.Retained {
			t.Errorf("first delivery of %s is not flagged retained", tp)
		}
	}
	if err := l.Resubscribe("desired/#"); err != nil {
		t.Fatal(err)
	}
	for tp, m := range receive(t, l.Link, "desired/a", "desired/b") {
		if !m.Retained || "desired/"+string(m.Payload) != tp {
			t.Errorf("resent %s: %q retained=%v", tp, m.Payload, m.Retained)
		}
	}
}

// Liveness: Online(N) is retained once connected; a stale Will (Offline of an older session,
// published retained by someone else while this session is up) is answered with Online(N)
// again; a clean stop leaves Offline(N) retained.
func TestLiveness(t *testing.T) {
	checkGoroutines(t)
	const topic = "mqlet/v2/nodes/node-a/status"
	b := mqtttest.Start(t, mqtttest.Options{})
	var sessions atomic.Int64
	sessions.Store(41)
	l := startLink(t, liveness(testOptions(t, b.Plain, "node-a"), topic, &sessions))
	s, _ := waitConnected(t, l.Link)
	if s != 42 {
		t.Fatalf("session %d, want 42 (the first NextSession)", s)
	}
	if got := retained(t, b.Plain, topic); got != "online 42" {
		t.Fatalf("retained after connect %q, want %q", got, "online 42")
	}

	// A late Will of session 41.
	bystander := pahoClient(t, b.Plain)
	if tok := bystander.Publish(topic, 1, true, "offline 41"); !tok.WaitTimeout(ackWait) || tok.Error() != nil {
		t.Fatalf("publish the stale will: %v", tok.Error())
	}
	eventuallyRetained(t, b.Plain, topic, "online 42")

	l.stop(t)
	if got := retained(t, b.Plain, topic); got != "offline 42" {
		t.Fatalf("retained after a clean stop %q, want %q", got, "offline 42")
	}
}

// A stale offline the broker retained before the link connected (the last session's Will) comes
// with the subscription, before the echo of the new session's Online, which already replaced it:
// it is not answered with a second Online. The stop's Offline closes what the watcher saw.
func TestRetainedStaleOfflineIsNotAnsweredTwice(t *testing.T) {
	checkGoroutines(t)
	const topic = "mqlet/v2/nodes/node-a/online"
	b := mqtttest.Start(t, mqtttest.Options{})
	bystander := pahoClient(t, b.Plain)
	if tok := bystander.Publish(topic, 1, true, "offline 41"); !tok.WaitTimeout(ackWait) || tok.Error() != nil {
		t.Fatalf("publish the stale will: %v", tok.Error())
	}
	var mu sync.Mutex
	var seen []string
	done := make(chan struct{})
	watcher := pahoClient(t, b.Plain)
	if tok := watcher.Subscribe(topic, 1, func(_ mqtt.Client, m mqtt.Message) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, string(m.Payload()))
		if string(m.Payload()) == "offline 42" {
			close(done)
		}
	}); !tok.WaitTimeout(ackWait) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	var sessions atomic.Int64
	sessions.Store(41)
	l := startLink(t, liveness(testOptions(t, b.Plain, "node-a"), topic, &sessions))
	waitConnected(t, l.Link)
	// Its own online, and only that, reaches the inbox: the end of the retained messages of the
	// connection's subscriptions (the link subscribes to its liveness topic after publishing it).
	if m := receive(t, l.Link, topic)[topic]; string(m.Payload) != "online 42" || m.Session != 42 {
		t.Fatalf("liveness message in the inbox %+v, want the echo of online 42", m)
	}
	// A message the link publishes after connecting: the broker forwards the link's publishes in
	// order, so a second Online, if any, comes before it.
	if err := waitReceipt(t, l.Publish("mqlet/v2/nodes/node-a/events", []byte("x"), false)); err != nil {
		t.Fatal(err)
	}
	l.stop(t)
	select {
	case <-done:
	case <-time.After(ackWait):
		t.Fatal("the stop's offline 42 never reached the watcher")
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"offline 41", "online 42", "offline 42"}; !slices.Equal(seen, want) {
		t.Fatalf("liveness messages %q, want %q", seen, want)
	}
}

// The Will of a connection that ended without DISCONNECT: a client taking over the node's client
// ID makes the broker drop the link's connection and publish its Will, Offline(N). The link
// reconnects as N+1 (taking the ID back) and whatever order the Will and Online(N+1) reach the
// broker in, the node ends up online.
func TestLivenessAfterTakeover(t *testing.T) {
	checkGoroutines(t)
	const topic = "mqlet/v2/nodes/node-a/status"
	b := mqtttest.Start(t, mqtttest.Options{})
	var sessions atomic.Int64
	l := startLink(t, liveness(testOptions(t, b.Plain, "node-a"), topic, &sessions))
	s1, lost := waitConnected(t, l.Link)

	thief := pahoClientID(t, b.Plain, "node-a")
	select {
	case <-lost:
	case <-time.After(ackWait):
		t.Fatalf("the link's connection survived a takeover of its client ID")
	}
	_ = thief
	s2, _ := waitConnected(t, l.Link)
	if s2 <= s1 {
		t.Fatalf("session after the takeover %d, want more than %d", s2, s1)
	}
	eventuallyRetained(t, b.Plain, topic, fmt.Sprintf("online %d", s2))
}

// TLS with a client certificate whose CN is the username, and the node ACL
// (pattern readwrite mqlet/v2/nodes/%u/#): the node subscribes to and publishes in its own
// subtree, gets the desired state the admin identity publishes there, and a client without a
// certificate cannot connect. (mosquitto 2.0.11 grants a v3.1.1 SUBSCRIBE outside the subtree and
// filters at delivery, so a refused SUBACK, which the link treats as a failed connection, cannot
// be provoked here; internal/mqtttest's TestTLSACL shows the filtering.)
func TestTLSClientCertificate(t *testing.T) {
	checkGoroutines(t)
	b := mqtttest.Start(t, mqtttest.Options{Identities: []string{"node-a"}})
	certFile, keyFile := b.ClientCert("node-a")
	const prefix = "mqlet/v2/nodes/node-a/"
	var sessions atomic.Int64
	o := liveness(testOptions(t, b.TLS, "node-a"), prefix+"status", &sessions)
	o.CAFile, o.CertFile, o.KeyFile = b.CAFile, certFile, keyFile
	o.Subscriptions = []string{prefix + "desired/#"}
	l := startLink(t, o)
	waitConnected(t, l.Link)

	adminCert, adminKey := b.ClientCert(mqtttest.Admin)
	ao := testOptions(t, b.TLS, mqtttest.Admin)
	ao.CAFile, ao.CertFile, ao.KeyFile = b.CAFile, adminCert, adminKey
	admin := startLink(t, ao)
	waitConnected(t, admin.Link)
	if err := waitReceipt(t, admin.Publish(prefix+"desired/pod", []byte("spec"), true)); err != nil {
		t.Fatal(err)
	}
	if m := receive(t, l.Link, prefix+"desired/pod")[prefix+"desired/pod"]; string(m.Payload) != "spec" {
		t.Errorf("desired/pod = %q", m.Payload)
	}
	if err := waitReceipt(t, l.Publish(prefix+"status/pods", []byte("ok"), true)); err != nil {
		t.Errorf("publish in the node's own subtree: %v", err)
	}

	// No client certificate: the TLS handshake fails.
	nocert := testOptions(t, b.TLS, "node-a-nocert")
	nocert.CAFile = b.CAFile
	nl, err := New(nocert)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nl.connection(context.Background()); err == nil || !strings.HasPrefix(err.Error(), "mqtt connect "+b.TLS) {
		t.Errorf("connect without a client certificate: %v", err)
	}
}

// MQTT over websockets, when this mosquitto has them.
func TestWebsockets(t *testing.T) {
	checkGoroutines(t)
	b := mqtttest.Start(t, mqtttest.Options{})
	if b.WS == "" {
		t.Skip("this mosquitto has no websockets listener")
	}
	o := testOptions(t, b.WS, "node-a")
	o.Subscriptions = []string{"ws/#"}
	l := startLink(t, o)
	waitConnected(t, l.Link)
	if err := waitReceipt(t, l.Publish("ws/echo", []byte("hi"), false)); err != nil {
		t.Fatal(err)
	}
	receive(t, l.Link, "ws/echo")
}

// Run returns only after every goroutine it started, paho's included, has ended: after a
// connection, traffic both ways, a reconnect, and the stop.
func TestRunEndsEveryGoroutine(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	var sessions atomic.Int64
	o := liveness(testOptions(t, b.Plain, "node-a"), "mqlet/v2/nodes/node-a/status", &sessions)
	o.Subscriptions = []string{"t/#"}
	o.OnOverflow = func() {}
	l, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	_, lost := waitConnected(t, l)
	for i := range 50 {
		if err := waitReceipt(t, l.Publish(fmt.Sprintf("t/%d", i), []byte("x"), false)); err != nil {
			t.Fatal(err)
		}
	}
	receive(t, l, "t/49")
	b.Kill(t)
	select {
	case <-lost:
	case <-time.After(ackWait):
		t.Fatal("connection not lost after the broker was killed")
	}
	b.Start(t)
	waitConnected(t, l)
	if err := waitReceipt(t, l.Publish("t/again", []byte("x"), false)); err != nil {
		t.Fatal(err)
	}
	receive(t, l, "t/again")
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(stopWait):
		t.Fatalf("Run did not return within %s", stopWait)
	}
	// Checked at once, with only a short grace for goroutines that are past their last action.
	noGoroutinesLeft(t, time.Second)
}
