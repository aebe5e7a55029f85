package mq

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/sync/protocol"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

const wait = 15 * time.Second

type recorder struct {
	mu   sync.Mutex
	msgs []Message
	ch   chan struct{}
}

func newRecorder() *recorder { return &recorder{ch: make(chan struct{}, 1)} }

func (r *recorder) handle(m Message) {
	r.mu.Lock()
	r.msgs = append(r.msgs, m)
	r.mu.Unlock()
	select {
	case r.ch <- struct{}{}:
	default:
	}
}

// waitFor waits until a recorded message satisfies ok, and returns it.
func (r *recorder) waitFor(t *testing.T, what string, ok func(Message) bool) Message {
	t.Helper()
	deadline := time.After(wait)
	for {
		r.mu.Lock()
		for _, m := range r.msgs {
			if ok(m) {
				r.mu.Unlock()
				return m
			}
		}
		r.mu.Unlock()
		select {
		case <-r.ch:
		case <-deadline:
			t.Fatalf("no message %s within %s", what, wait)
		}
	}
}

func (r *recorder) all() []Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Message(nil), r.msgs...)
}

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// start runs a Conn on broker until the test ends.
func start(t *testing.T, o Options) *Conn {
	t.Helper()
	o.ReconnectMin, o.ReconnectMax = 50*time.Millisecond, 300*time.Millisecond
	o.Timeout = 5 * time.Second
	if o.Log == nil {
		o.Log = testLog(t)
	}
	c, err := New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(wait):
			t.Errorf("Run did not return within %s", wait)
		}
	})
	waitConnected(t, c, 0)
	return c
}

// waitConnected waits for a connection whose session is above after.
func waitConnected(t *testing.T, c *Conn, after int64) int64 {
	t.Helper()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if s, ok := c.Connected(); ok && s > after {
			return s
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no connection with a session above %d within %s", after, wait)
	return 0
}

// publisher is a plain paho client standing in for nodes (and, with the plain listener, for a
// node writing outside its subtree).
func publisher(t *testing.T, url string) mqtt.Client {
	t.Helper()
	cl := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(url).SetClientID("test-pub").SetCleanSession(true))
	if tok := cl.Connect(); !tok.WaitTimeout(wait) || tok.Error() != nil {
		t.Fatalf("connect publisher: %v", tok.Error())
	}
	t.Cleanup(func() { cl.Disconnect(100) })
	return cl
}

func pub(t *testing.T, cl mqtt.Client, topic, payload string, retained bool) {
	t.Helper()
	if tok := cl.Publish(topic, 1, retained, payload); !tok.WaitTimeout(wait) || tok.Error() != nil {
		t.Fatalf("publish %s: %v", topic, tok.Error())
	}
}

func TestRoutesUplinkAndRefusesBadTopics(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	rec := newRecorder()
	c := start(t, Options{Broker: b.Plain, Handler: rec.handle})
	p := publisher(t, b.Plain)
	tp := c.Topics()

	pub(t, p, tp.Node("bad_node")+"/online", `{}`, false)        // invalid node name
	pub(t, p, tp.Node("n1")+"/nosuchclass", `{}`, false)         // unknown class: not subscribed at all
	pub(t, p, tp.Liveness("n1"), `{"online":true}`, true)        // retained
	pub(t, p, tp.NodeStatus("n2"), `status`, true)               // retained
	pub(t, p, tp.PodStatus("n2", "default", "web"), `pod`, true) // retained
	pub(t, p, tp.Events("n3"), `ev`, false)
	pub(t, p, tp.Acks("n3"), `acks`, true)
	pub(t, p, tp.Resync("n3"), `resync`, false)
	pub(t, p, tp.Index("n3"), `index`, true) // downlink: not routed

	want := map[protocol.Class]string{
		protocol.ClassLiveness: "n1", protocol.ClassNodeStatus: "n2", protocol.ClassPodStatus: "n2",
		protocol.ClassEvents: "n3", protocol.ClassAcks: "n3", protocol.ClassResync: "n3",
	}
	for class, node := range want {
		m := rec.waitFor(t, string(class)+" of "+node, func(m Message) bool { return m.Topic.Class == class })
		if m.Topic.Node != node || m.Session < 1 {
			t.Errorf("%s: routed as node %q session %d, want node %q and a session", class, m.Topic.Node, m.Session, node)
		}
		if class == protocol.ClassPodStatus && (m.Topic.Namespace != "default" || m.Topic.Name != "web" || string(m.Payload) != "pod") {
			t.Errorf("pod status routed as %+v payload %q", m.Topic, m.Payload)
		}
	}
	for _, m := range rec.all() {
		if _, ok := want[m.Topic.Class]; !ok || m.Topic.Node == "" || strings.Contains(m.Name, "bad_node") {
			t.Errorf("routed %s, which must be refused or not subscribed", m.Name)
		}
	}
	if got := c.refused.With("unparseable").Value(); got != 1 {
		t.Errorf("refused topics counted %v, want 1 (the invalid node name)", got)
	}
}

func TestPublishWaitsForPubackAndFailsWithoutBroker(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	c := start(t, Options{Broker: b.Plain, Handler: func(Message) {}})
	ctx := context.Background()
	topic := c.Topics().Index("n1")
	if err := c.Publish(ctx, topic, []byte("rev-1"), true); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	// Acknowledged means the broker holds it: a reader that subscribes now gets it retained.
	got, err := c.Snapshot(ctx, topic)
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if string(got[topic]) != "rev-1" {
		t.Fatalf("snapshot after an acknowledged publish: %q, want rev-1", got)
	}

	b.Stop(t)
	deadline := time.Now().Add(wait)
	for {
		if _, ok := c.Connected(); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still connected %s after the broker stopped", wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := c.Publish(pctx, topic, []byte("rev-2"), true); err == nil {
		t.Fatal("Publish without a broker returned nil: it must only succeed on a PUBACK")
	}
}

func TestReconnectResubscribes(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	rec := newRecorder()
	c := start(t, Options{Broker: b.Plain, Handler: rec.handle})
	s1, _ := c.Connected()
	b.Stop(t)
	b.Start(t)
	s2 := waitConnected(t, c, s1)

	p := publisher(t, b.Plain)
	pub(t, p, c.Topics().Liveness("n9"), `{"after":"restart"}`, true)
	m := rec.waitFor(t, "after the restart", func(m Message) bool { return m.Topic.Node == "n9" })
	if m.Session != s2 {
		t.Errorf("message carries session %d, want the new connection's %d", m.Session, s2)
	}
}

func TestSnapshotReadsRetainedState(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	c := start(t, Options{Broker: b.Plain, Handler: func(Message) {}})
	p := publisher(t, b.Plain)
	tp := c.Topics()
	for _, n := range []string{"a", "b", "c"} {
		pub(t, p, tp.Index(n), "idx-"+n, true)
	}
	pub(t, p, tp.Desired("a", protocol.KindPod, "default", "web"), "pod", true)
	got, err := c.Snapshot(context.Background(), tp.AllNodes(protocol.ClassIndex))
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if len(got) != 3 || string(got[tp.Index("b")]) != "idx-b" {
		t.Fatalf("snapshot: %q, want the three indexes", got)
	}
	// A second snapshot reads afresh (the first unsubscribed).
	got, err = c.Snapshot(context.Background(), tp.DesiredFilter("a"))
	if err != nil || len(got) != 1 {
		t.Fatalf("second snapshot: %q, %v", got, err)
	}
}

func TestOverflowAsksForResend(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	block := make(chan struct{})
	var mu sync.Mutex
	seen := map[string]int{}
	handler := func(m Message) {
		<-block
		mu.Lock()
		seen[m.Name]++
		mu.Unlock()
	}
	c := start(t, Options{Broker: b.Plain, Handler: handler, QueueSize: 32, Shards: 1})
	p := publisher(t, b.Plain)
	const n = 200
	topics := make([]string, n)
	for i := range n {
		topics[i] = c.Topics().NodeStatus("node-" + string(rune('a'+i%26)) + strings.Repeat("x", i/26))
		pub(t, p, topics[i], "s", true)
	}
	close(block)
	// Every retained status must arrive eventually, through the resend the overflow asked for.
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		missing := 0
		for _, tp := range topics {
			if seen[tp] == 0 {
				missing++
			}
		}
		mu.Unlock()
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d retained statuses never handled after an overflow", missing, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if c.overflows.Value() == 0 || c.resyncs.Value() == 0 {
		t.Errorf("overflows %v, resyncs %v: the test did not overflow the queues", c.overflows.Value(), c.resyncs.Value())
	}
}

func TestPasswordFile(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "pw")
	if err := os.WriteFile(f, []byte("s3cret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := New(Options{Broker: "tcp://127.0.0.1:1", Username: "u", PasswordFile: f, Handler: func(Message) {}})
	if err == nil || !strings.Contains(err.Error(), "chmod 600") || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("world-readable password file: err %v, want a chmod 600 error without the password", err)
	}
	os.Chmod(f, 0o600)
	pw, err := ReadPasswordFile(f)
	if err != nil || pw != "s3cret" {
		t.Fatalf("ReadPasswordFile: %q, %v", pw, err)
	}
	if _, err := New(Options{Broker: "tcp://127.0.0.1:1", PasswordFile: f, Handler: func(Message) {}}); err == nil {
		t.Fatal("a password file without a username was accepted")
	}
	if _, err := New(Options{Broker: "http://x", Handler: func(Message) {}}); err == nil || !strings.Contains(err.Error(), "scheme") {
		t.Fatalf("bad scheme: %v", err)
	}
	if _, err := New(Options{Broker: "tcp://x:1883", CAFile: f, Handler: func(Message) {}}); err == nil {
		t.Fatal("TLS files with a tcp:// broker were accepted")
	}
}

// A snapshot whose filter overlaps an uplink subscription (a node's acks) must not take live
// uplink messages away from the handler.
func TestSnapshotOverlappingUplinkKeepsRouting(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	var mu sync.Mutex
	seen := map[string]bool{}
	c := start(t, Options{Broker: b.Plain, Handler: func(m Message) {
		mu.Lock()
		seen[string(m.Payload)] = true
		mu.Unlock()
	}})
	p := publisher(t, b.Plain)
	topic := c.Topics().Acks("n1")
	stop := make(chan struct{})
	snaps := make(chan int, 1)
	go func() {
		n := 0
		defer func() { snaps <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := c.Snapshot(context.Background(), topic); err != nil {
				t.Errorf("Snapshot: %v", err)
				return
			}
			n++
		}
	}()
	const n = 200
	for i := range n {
		pub(t, p, topic, strings.Repeat("a", i+1), true)
	}
	close(stop)
	if got := <-snaps; got < 10 {
		t.Fatalf("only %d snapshots ran while publishing: the test did not overlap them", got)
	}
	deadline := time.Now().Add(wait)
	for {
		mu.Lock()
		missing := 0
		for i := range n {
			if !seen[strings.Repeat("a", i+1)] {
				missing++
			}
		}
		mu.Unlock()
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d live acks never reached the handler while snapshots of the same topic ran", missing, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
