package link

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/mqlet/mqlet/internal/mqtttest"
)

// Bounds for the waits in these tests. They are generous: a loaded CI machine must not turn them
// into failures, and a passing run does not wait for them.
const (
	connectWait = 15 * time.Second // a Link (re)connects: back-off in tests is at most 500ms
	ackWait     = 10 * time.Second // a PUBACK, a message, a retained value
	stopWait    = 15 * time.Second // Run returns after ctx ended
)

// testLog sends the link's log to t.Log, so a failing test shows what the link did.
func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// testOptions fills what every test link wants: a short back-off, so reconnects after a broker
// restart take well under a second, and the test's log.
func testOptions(t *testing.T, broker, clientID string) Options {
	return Options{
		Broker:         broker,
		ClientID:       clientID,
		ConnectTimeout: 5 * time.Second,
		ReconnectMin:   50 * time.Millisecond,
		ReconnectMax:   500 * time.Millisecond,
		Log:            testLog(t),
	}
}

// running is a Link whose Run goroutine the test controls.
type running struct {
	*Link
	cancel context.CancelFunc
	done   chan error
}

// stop cancels Run and waits (bounded) for it to return nil.
func (r *running) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok && err != nil {
			t.Errorf("Run returned %v, want nil after its context ended", err)
		}
	case <-time.After(stopWait):
		t.Fatalf("Run did not return within %s of its context ending", stopWait)
	}
}

// startLink creates a Link from o and runs it until the test ends (or stop is called).
func startLink(t *testing.T, o Options) *running {
	t.Helper()
	l, err := New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Link: l, cancel: cancel, done: make(chan error, 1)}
	go func() {
		r.done <- l.Run(ctx)
		close(r.done)
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func waitConnected(t *testing.T, l *Link) (int64, <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), connectWait)
	defer cancel()
	s, lost, err := l.WaitConnected(ctx)
	if err != nil {
		t.Fatalf("WaitConnected: %v", err)
	}
	return s, lost
}

// waitReceipt waits (bounded) for a receipt and returns its error.
func waitReceipt(t *testing.T, r *Receipt) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ackWait)
	defer cancel()
	return r.Wait(ctx)
}

// receive waits (bounded) until a message arrived on each of topics in l's inbox, in any order
// (paho hands messages over on a goroutine each), skipping other topics; it returns the last one
// per topic.
func receive(t *testing.T, l *Link, topics ...string) map[string]Message {
	t.Helper()
	want := map[string]bool{}
	for _, tp := range topics {
		want[tp] = true
	}
	got := map[string]Message{}
	timeout := time.After(ackWait)
	for len(got) < len(want) {
		select {
		case m := <-l.Inbox():
			if want[m.Topic] {
				got[m.Topic] = m
			}
		case <-timeout:
			t.Fatalf("within %s got messages on %d of %q", ackWait, len(got), topics)
		}
	}
	return got
}

// signal sends sig to the broker's pid.
func signal(t *testing.T, b *mqtttest.Broker, sig syscall.Signal) {
	t.Helper()
	pid := b.Pid()
	if pid == 0 {
		t.Fatalf("broker is not running")
	}
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatalf("kill -%d %d: %v", sig, pid, err)
	}
}

func randomID(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// pahoClient connects a plain paho client (a bystander: another node, the control plane) and
// disconnects it when the test ends.
func pahoClient(t *testing.T, broker string) mqtt.Client {
	t.Helper()
	return pahoClientID(t, broker, randomID("bystander-"))
}

// pahoClientID is pahoClient with a given client ID.
func pahoClientID(t *testing.T, broker, clientID string) mqtt.Client {
	t.Helper()
	o := mqtt.NewClientOptions().AddBroker(broker).SetClientID(clientID).
		SetAutoReconnect(false).SetConnectTimeout(5 * time.Second)
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(ackWait) || tok.Error() != nil {
		t.Fatalf("bystander connect %s: %v", broker, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}

// retained returns the retained message on topic ("" when there is none), as a fresh subscriber
// sees it.
func retained(t *testing.T, broker, topic string) string {
	t.Helper()
	o := mqtt.NewClientOptions().AddBroker(broker).SetClientID(randomID("reader-")).
		SetAutoReconnect(false).SetConnectTimeout(5 * time.Second)
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(ackWait) || tok.Error() != nil {
		t.Fatalf("reader connect %s: %v", broker, tok.Error())
	}
	defer c.Disconnect(100)
	got := make(chan string, 1)
	tok := c.Subscribe(topic, 1, func(_ mqtt.Client, m mqtt.Message) {
		if m.Retained() {
			select {
			case got <- string(m.Payload()):
			default:
			}
		}
	})
	if !tok.WaitTimeout(ackWait) || tok.Error() != nil {
		t.Fatalf("reader subscribe %s: %v", topic, tok.Error())
	}
	// The broker sends retained messages right after the SUBACK; a short wait covers "none".
	select {
	case s := <-got:
		return s
	case <-time.After(time.Second):
		return ""
	}
}

// eventuallyRetained polls the retained value of topic until it is want (bounded).
func eventuallyRetained(t *testing.T, broker, topic, want string) {
	t.Helper()
	deadline := time.Now().Add(ackWait)
	for {
		got := retained(t, broker, topic)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("retained on %s is %q, want %q (waited %s)", topic, got, want, ackWait)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// liveness returns Options fields for the liveness topic with payloads "online N" / "offline N",
// sessions counted from first by a counter the test can read.
func liveness(o Options, topic string, sessions *atomic.Int64) Options {
	o.LivenessTopic = topic
	o.Online = func(s int64) []byte { return fmt.Appendf(nil, "online %d", s) }
	o.Offline = func(s int64) []byte { return fmt.Appendf(nil, "offline %d", s) }
	o.IsStaleOffline = func(p []byte, current int64) bool {
		var s int64
		n, _ := fmt.Sscanf(string(p), "offline %d", &s)
		return n == 1 && s < current
	}
	o.NextSession = func() (int64, error) { return sessions.Add(1), nil }
	return o
}

// leakedGoroutines lists the stacks of goroutines, other than the caller's, that run code of
// paho or of this package's types.
func leakedGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	stacks := strings.Split(string(buf), "\n\n")
	var leaked []string
	for _, s := range stacks[1:] { // the first is the caller's
		if strings.Contains(s, "github.com/eclipse/paho.mqtt.golang") ||
			strings.Contains(s, "github.com/mqlet/mqlet/sync/link.(*") {
			leaked = append(leaked, s)
		}
	}
	return leaked
}

// checkGoroutines registers, first, a cleanup that runs last: once every Link of the test has
// stopped and every bystander disconnected, no goroutine of paho or of this package may remain
// (after a bounded wait, since paho's Disconnect lets a few finish just after it returns).
func checkGoroutines(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { noGoroutinesLeft(t, 5*time.Second) })
}

func noGoroutinesLeft(t *testing.T, wait time.Duration) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		leaked := leakedGoroutines()
		if len(leaked) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d goroutines of paho or sync/link still run %s after the links stopped:\n%s",
				len(leaked), wait, strings.Join(leaked, "\n\n"))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
