package uplink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Pure-logic tests with a fake link whose receipts the test completes; sync/nodesync runs the
// uplink against a real mosquitto and bbolt file.

type receipt struct {
	done chan struct{}
	err  error
}

func (r *receipt) Done() <-chan struct{} { return r.done }
func (r *receipt) Err() error            { return r.err }

type sent struct {
	topic   string
	payload []byte
	r       *receipt
}

type fakeLink struct {
	mu   sync.Mutex
	up   chan struct{} // closed when "connected"
	lost chan struct{}
	sent []sent
}

func (l *fakeLink) WaitConnected(ctx context.Context) (int64, <-chan struct{}, error) {
	select {
	case <-l.up:
		l.mu.Lock()
		defer l.mu.Unlock()
		return 1, l.lost, nil
	case <-ctx.Done():
		return 0, nil, ctx.Err()
	}
}

// Send records a publish; the test completes its receipt, except for markers and summaries,
// acknowledged at once.
func (l *fakeLink) Send(topic string, payload []byte, retained bool) Receipt {
	r := &receipt{done: make(chan struct{})}
	if topic == tp.NodeMarker("n1") || topic == tp.Summary("n1") {
		close(r.done)
	}
	l.mu.Lock()
	l.sent = append(l.sent, sent{topic, payload, r})
	l.mu.Unlock()
	return r
}

// all is what was sent, markers (each connection sends one, and more while none comes back) and
// summaries (one after each change) left out.
func (l *fakeLink) all() []sent {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []sent
	for _, s := range l.sent {
		if s.topic != tp.NodeMarker("n1") && s.topic != tp.Summary("n1") {
			out = append(out, s)
		}
	}
	return out
}

func (l *fakeLink) markers() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.sent {
		if s.topic == tp.NodeMarker("n1") {
			out = append(out, string(s.payload))
		}
	}
	return out
}

var tp = protocol.MustTopics(protocol.DefaultPrefix)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func pod(name string) store.DesiredPod {
	return store.DesiredPod{Pod: &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}},
		Source: source.Ref{Kind: source.MQTT}, Generation: 1}
}

func run(t *testing.T, u *Uplink) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { u.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// An entry leaves the outbox only when its publish is acknowledged; a failed publish keeps it,
// and a status changed while offline is sent once, in its final version.
func TestOutboxEntryLeavesOnlyOnAcknowledgement(t *testing.T) {
	st := store.NewMemory()
	l := &fakeLink{up: make(chan struct{}), lost: make(chan struct{})}
	u := New(Options{Node: "n1", Topics: tp, Store: st, Link: l})
	run(t, u)

	for i := range 5 {
		u.PodStatus(pod("web"), v1.PodStatus{Message: string(rune('a' + i))})
	}
	// The final status, and the summary after it.
	waitFor(t, "outbox written", func() bool {
		s, _ := st.OutboxStats()
		entries, _ := st.OutboxList(0)
		return s.Entries == 2 && len(entries) == 2 && bytesContain(entries[0].Payload, `"message":"e"`) &&
			entries[1].Topic == tp.Summary("n1")
	})

	close(l.up) // connected
	waitFor(t, "published", func() bool { return len(l.all()) == 1 })
	first := l.all()[0]
	if !bytesContain(first.payload, `"message":"e"`) {
		t.Fatalf("sent %s, want the final status only", first.payload)
	}
	// The library gives up on it (connection going): it stays.
	first.r.err = errors.New("connection lost before PUBACK")
	close(first.r.done)
	// Sent again (after the drainer's pause): the failure was handled, and the entry is still
	// there; acknowledged this time, it goes.
	waitFor(t, "published again", func() bool { return len(l.all()) == 2 })
	if entries, _ := st.OutboxList(0); len(entries) != 2 || entries[0].Topic != first.topic {
		t.Fatalf("an unacknowledged entry left the outbox (or the summary after it): %+v", entries)
	}
	close(l.all()[1].r.done)
	waitFor(t, "outbox empty", func() bool { s, _ := st.OutboxStats(); return s.Entries == 0 })
}

func TestUnchangedStatusIsNotSentAgain(t *testing.T) {
	st := store.NewMemory()
	l := &fakeLink{up: make(chan struct{}), lost: make(chan struct{})}
	u := New(Options{Node: "n1", Topics: tp, Store: st, Link: l})
	run(t, u)
	close(l.up)
	u.PodStatus(pod("web"), v1.PodStatus{Phase: v1.PodRunning})
	waitFor(t, "published", func() bool { return len(l.all()) == 1 })
	close(l.all()[0].r.done)
	u.PodStatus(pod("web"), v1.PodStatus{Phase: v1.PodRunning})
	u.Emit(event.Event{Reason: "Marker"})
	waitFor(t, "marker event published", func() bool { return len(l.all()) == 2 })
	if got := l.all()[1].topic; got != tp.Events("n1") {
		t.Fatalf("an unchanged status was sent again (second publish on %s)", got)
	}
}

// The payload that suppresses unchanged reports goes with the pod: a node running pods with ever
// new names does not keep one per name forever.
func TestGonePodForgetsItsDigest(t *testing.T) {
	st := store.NewMemory()
	l := &fakeLink{up: make(chan struct{}), lost: make(chan struct{})}
	u := New(Options{Node: "n1", Topics: tp, Store: st, Link: l})
	for i := range 100 {
		p := pod(fmt.Sprintf("job-%d", i))
		u.PodStatus(p, v1.PodStatus{Phase: v1.PodSucceeded})
		u.PodGone(p)
	}
	u.PodStatus(pod("web"), v1.PodStatus{Phase: v1.PodRunning})
	u.mu.Lock()
	n := len(u.kept)
	u.mu.Unlock()
	if n != 1 {
		t.Errorf("%d topics kept, want 1 (the live pod's)", n)
	}
	// The recent deleted statuses are still queued: forgetting the digest does not drop the
	// report. The oldest, past maxGoneStatuses, are queued as clears of their topic.
	u.mu.Lock()
	e, ok := u.latest[tp.PodStatus("n1", "default", "job-90")]
	old, oldOK := u.latest[tp.PodStatus("n1", "default", "job-7")]
	u.mu.Unlock()
	if !ok || !bytesContain(e.Payload, `"deleted":true`) {
		t.Errorf("job-90's deleted status is not queued: %s", e.Payload)
	}
	if !oldOK || len(old.Payload) != 0 || !old.Retained {
		t.Errorf("job-7's topic is not queued for clearing: %+v", old)
	}
}

func TestDroppedEventsAreReported(t *testing.T) {
	st := store.NewMemory()
	l := &fakeLink{up: make(chan struct{}), lost: make(chan struct{})}
	u := New(Options{Node: "n1", Topics: tp, Store: st, Link: l, Limits: store.OutboxLimits{MaxEvents: 5}})
	run(t, u)
	for range 20 {
		u.Emit(event.Event{Reason: "Spam", Message: "x"})
		time.Sleep(time.Millisecond) // separate writes, so the outbox itself drops
	}
	waitFor(t, "a drop report queued", func() bool {
		entries, _ := st.OutboxList(0)
		for _, e := range entries {
			if bytesContain(e.Payload, `"reason":"EventsDropped"`) {
				return true
			}
		}
		return false
	})
}

func bytesContain(b []byte, s string) bool {
	return strings.Contains(string(b), s)
}

// ackCounting counts the outbox removals.
type ackCounting struct {
	*store.Memory
	mu    sync.Mutex
	calls [][]store.OutboxRef
}

func (s *ackCounting) OutboxAckMany(acks []store.OutboxRef) error {
	s.mu.Lock()
	s.calls = append(s.calls, acks)
	s.mu.Unlock()
	return s.Memory.OutboxAckMany(acks)
}

func (s *ackCounting) removals() [][]store.OutboxRef {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]store.OutboxRef(nil), s.calls...)
}

// A send window that ends early (a publish not acknowledged) still removes what was
// acknowledged before it, with one call, and nothing after it.
func TestWindowRemovesAcknowledgedEntriesWithOneCall(t *testing.T) {
	st := &ackCounting{Memory: store.NewMemory()}
	l := &fakeLink{up: make(chan struct{}), lost: make(chan struct{})}
	u := New(Options{Node: "n1", Topics: tp, Store: st, Link: l})
	run(t, u)
	for i := range 10 {
		u.PodStatus(pod(fmt.Sprintf("p%d", i)), v1.PodStatus{Phase: v1.PodRunning})
	}
	waitFor(t, "outbox written", func() bool { s, _ := st.OutboxStats(); return s.Entries == 11 }) // and the summary
	queued, _ := st.OutboxList(0)

	close(l.up)
	waitFor(t, "window sent", func() bool { return len(l.all()) == 10 })
	sent := l.all()
	for _, s := range sent[:5] {
		close(s.r.done)
	}
	sent[5].r.err = errors.New("connection lost before PUBACK")
	close(sent[5].r.done)
	for _, s := range sent[6:] { // acknowledged, but after the failed one: they stay, to keep the order
		close(s.r.done)
	}
	waitFor(t, "acknowledged entries removed", func() bool { return len(st.removals()) > 0 })
	calls := st.removals()
	if len(calls) != 1 || len(calls[0]) != 5 {
		t.Fatalf("removals %v, want one call with the first 5 entries", calls)
	}
	for i, r := range calls[0] {
		if r.Seq != queued[i].Seq || r.Topic != queued[i].Topic {
			t.Errorf("removed %+v, want entry %d (%s)", r, queued[i].Seq, queued[i].Topic)
		}
	}
	left, _ := st.OutboxList(0)
	if len(left) != 6 || left[0].Seq != queued[5].Seq || left[5].Topic != tp.Summary("n1") {
		t.Errorf("outbox after the window: %d entries from seq %d, want the 6 from the failed one (%d) to the summary", len(left), left[0].Seq, queued[5].Seq)
	}
}

// A marker that does not come back is sent again on a back-off; only the latest value settles the
// connection's check, and once it is settled no more markers go.
func TestMarkerRetriedAndOnlyTheLatestCounts(t *testing.T) {
	st := store.NewMemory()
	l := &fakeLink{up: make(chan struct{}), lost: make(chan struct{})}
	u := New(Options{Node: "n1", Topics: tp, Store: st, Link: l, MarkerRetry: 5 * time.Millisecond})
	run(t, u)
	close(l.up)
	waitFor(t, "a second marker", func() bool { return len(l.markers()) >= 2 })
	settled := func() bool {
		u.mu.Lock()
		defer u.mu.Unlock()
		return u.check != nil && u.check.settled
	}
	first := l.markers()[0]
	u.Receive(protocol.ClassNodeMarker, []byte(first), false, 1)
	if settled() {
		t.Fatal("an older marker settled the check")
	}
	u.mu.Lock()
	latest := u.check.marker
	u.mu.Unlock()
	u.Receive(protocol.ClassNodeMarker, []byte(latest), false, 2)
	if settled() {
		t.Fatal("a marker arriving on another connection settled the check")
	}
	waitFor(t, "the latest marker settles the check", func() bool {
		u.mu.Lock()
		latest := u.check.marker
		u.mu.Unlock()
		u.Receive(protocol.ClassNodeMarker, []byte(latest), false, 1)
		return settled()
	})
	n := len(l.markers())
	time.Sleep(100 * time.Millisecond) // the back-off would have sent several by now
	if got := len(l.markers()); got != n {
		t.Errorf("%d markers sent after the check settled", got-n)
	}
}

// The echo of the connection's own online message settles the check without any marker, whether
// it arrives before the uplink made the check (the link offers the connection after the online's
// PUBACK) or after; a marker goes only when no echo came within the retry period. Fake time.
func TestOnlineEchoSettlesTheCheckWithoutAMarker(t *testing.T) {
	for _, early := range []bool{true, false} {
		t.Run(fmt.Sprintf("echo before the check %v", early), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := &fakeLink{up: make(chan struct{}), lost: make(chan struct{})}
				u := New(Options{Node: "n1", Topics: tp, Store: store.NewMemory(), Link: l, MarkerRetry: time.Second})
				run(t, u)
				settled := func() bool {
					synctest.Wait()
					u.mu.Lock()
					defer u.mu.Unlock()
					return u.check != nil && u.check.settled
				}
				if early {
					u.Receive(protocol.ClassLiveness, []byte("online"), false, 1)
				}
				close(l.up)
				if !early {
					time.Sleep(500 * time.Millisecond)
					u.Receive(protocol.ClassLiveness, []byte("online"), false, 1)
				}
				if !settled() {
					t.Fatal("the echo did not settle the check")
				}
				time.Sleep(5 * time.Second)
				synctest.Wait()
				if m := l.markers(); len(m) != 0 {
					t.Fatalf("markers sent though the echo settled the check: %q", m)
				}
			})
		})
	}
	t.Run("no echo", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l := &fakeLink{up: make(chan struct{}), lost: make(chan struct{})}
			u := New(Options{Node: "n1", Topics: tp, Store: store.NewMemory(), Link: l, MarkerRetry: time.Second})
			run(t, u)
			close(l.up)
			u.Receive(protocol.ClassLiveness, []byte("online"), false, 7) // another connection's
			time.Sleep(1100 * time.Millisecond)
			synctest.Wait()
			if m := l.markers(); len(m) != 1 {
				t.Fatalf("markers after the retry period without an echo: %q, want one", m)
			}
		})
	})
}
