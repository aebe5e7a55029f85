package podevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// clock is a settable time for the correlator's windows and the throttle.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// countingStore is a store.Memory that counts writes and can be made to fail them.
type countingStore struct {
	*store.Memory
	mu      sync.Mutex
	updates int
	fail    error
}

func (s *countingStore) UpdateEvents(put []store.PodEvents, del []types.UID) error {
	s.mu.Lock()
	s.updates++
	fail := s.fail
	s.mu.Unlock()
	if fail != nil {
		return fail
	}
	return s.Memory.UpdateEvents(put, del)
}

func (s *countingStore) writes() int { s.mu.Lock(); defer s.mu.Unlock(); return s.updates }

func newTest(t *testing.T) (*Recorder, *countingStore, *clock) {
	t.Helper()
	c := &clock{t: time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)}
	st := &countingStore{Memory: store.NewMemory()}
	r := New(Options{Store: st, Node: "edge-1", Log: slog.New(slog.DiscardHandler), Now: c.now, FlushDelay: 20 * time.Millisecond})
	if err := r.Load(); err != nil {
		t.Fatal(err)
	}
	return r, st, c
}

func podEvent(uid, reason, msg string, at time.Time) event.Event {
	return event.Event{Time: at, Type: event.Warning, Reason: reason, Message: msg,
		Object: event.Object{Kind: event.KindPod, Namespace: "default", Name: "pod-" + uid, UID: types.UID(uid), FieldPath: "spec.containers{main}"}}
}

func stored(t *testing.T, s store.State, uid string) []store.EventRecord {
	t.Helper()
	p, ok, err := s.GetEvents(types.UID(uid))
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return nil
	}
	return p.Events
}

// The same event again is one entry with a count and first/last times; another message, reason
// or container is another entry.
func TestDeduplicates(t *testing.T) {
	r, _, c := newTest(t)
	t0 := c.now()
	for i := range 3 {
		r.Record(podEvent("a", "BackOff", "Back-off restarting failed container main", t0.Add(time.Duration(i)*time.Second)))
	}
	r.Record(podEvent("a", "Pulled", "Container image \"x\" already present on machine", t0.Add(4*time.Second)))
	other := podEvent("a", "BackOff", "Back-off restarting failed container main", t0.Add(5*time.Second))
	other.Object.FieldPath = "spec.containers{side}"
	r.Record(other)
	evs := r.Events("a")
	if len(evs) != 3 {
		t.Fatalf("%d events, want 3: %+v", len(evs), evs)
	}
	b := evs[0]
	if b.Reason != "BackOff" || b.Count != 3 || !b.FirstTimestamp.Time.Equal(t0) || !b.LastTimestamp.Time.Equal(t0.Add(2*time.Second)) ||
		b.InvolvedObject.FieldPath != "spec.containers{main}" {
		t.Errorf("deduplicated event = %+v", b)
	}
	if evs[1].Reason != "Pulled" || evs[1].Count != 1 || evs[2].InvolvedObject.FieldPath != "spec.containers{side}" || evs[2].Count != 1 {
		t.Errorf("other events = %+v", evs[1:])
	}
	// Seen again, an event moves to the end (least recently seen first).
	r.Record(podEvent("a", "BackOff", "Back-off restarting failed container main", t0.Add(6*time.Second)))
	if evs := r.Events("a"); evs[2].Reason != "BackOff" || evs[2].Count != 4 || evs[2].InvolvedObject.FieldPath != "spec.containers{main}" {
		t.Errorf("after a repeat: %+v", evs)
	}
}

// Ten distinct messages of one reason within ten minutes: from the tenth on they are one combined
// event counting them, carrying the latest message, as kubelet's aggregator does. After a quiet
// window, messages are kept apart again.
func TestAggregatesSimilar(t *testing.T) {
	r, _, c := newTest(t)
	t0 := c.now()
	for i := range 13 {
		r.Record(podEvent("a", "Unhealthy", fmt.Sprintf("Readiness probe failed: attempt %d", i), t0.Add(time.Duration(i)*time.Second)))
	}
	evs := r.Events("a")
	if len(evs) != 10 {
		t.Fatalf("%d events, want 9 single and 1 combined: %+v", len(evs), evs)
	}
	comb := evs[9]
	if comb.Count != 4 || comb.Message != "(combined from similar events): Readiness probe failed: attempt 12" ||
		!comb.FirstTimestamp.Time.Equal(t0.Add(9*time.Second)) || !comb.LastTimestamp.Time.Equal(t0.Add(12*time.Second)) {
		t.Errorf("combined event = %+v", comb)
	}
	for i, e := range evs[:9] {
		if e.Count != 1 || e.Message != fmt.Sprintf("Readiness probe failed: attempt %d", i) {
			t.Errorf("event %d = %+v", i, e)
		}
	}
	later := t0.Add(12*time.Second + aggregateWindow + time.Second)
	r.Record(podEvent("a", "Unhealthy", "Readiness probe failed: later", later))
	if evs := r.Events("a"); evs[len(evs)-1].Message != "Readiness probe failed: later" {
		t.Errorf("after a quiet window: %+v", evs[len(evs)-1])
	}
}

// A pod keeps MaxPerPod events, dropping the least recently seen.
func TestBoundPerPod(t *testing.T) {
	r, _, c := newTest(t)
	t0 := c.now()
	for i := range MaxPerPod + 10 {
		// Distinct reasons: no aggregation.
		r.Record(podEvent("a", fmt.Sprintf("Reason%02d", i), "m", t0.Add(time.Duration(i)*time.Second)))
	}
	evs := r.Events("a")
	if len(evs) != MaxPerPod || evs[0].Reason != "Reason10" || evs[MaxPerPod-1].Reason != fmt.Sprintf("Reason%02d", MaxPerPod+9) {
		t.Fatalf("%d events from %s to %s, want %d from Reason10", len(evs), evs[0].Reason, evs[len(evs)-1].Reason, MaxPerPod)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
}

// All pods together keep MaxTotal events, dropping the least recently seen of any pod, and the
// store holds the same.
func TestBoundTotal(t *testing.T) {
	r, st, c := newTest(t)
	t0 := c.now()
	pods := MaxTotal/MaxPerPod + 5
	n := 0
	for p := range pods {
		for i := range MaxPerPod {
			r.Record(podEvent(fmt.Sprintf("uid-%03d", p), fmt.Sprintf("R%02d", i), "m", t0.Add(time.Duration(n)*time.Millisecond)))
			n++
		}
	}
	r.mu.Lock()
	total := r.total
	r.mu.Unlock()
	if total != MaxTotal {
		t.Errorf("total = %d, want %d", total, MaxTotal)
	}
	for p := range 5 {
		if evs := r.Events(types.UID(fmt.Sprintf("uid-%03d", p))); len(evs) != 0 {
			t.Errorf("oldest pod uid-%03d kept %d events, want 0", p, len(evs))
		}
	}
	if evs := r.Events(types.UID(fmt.Sprintf("uid-%03d", pods-1))); len(evs) != MaxPerPod {
		t.Errorf("newest pod kept %d events, want %d", len(evs), MaxPerPod)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	lists, _, err := st.ListEvents()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0
	for _, l := range lists {
		sum += len(l.Events)
	}
	if sum != MaxTotal || len(lists) != MaxTotal/MaxPerPod {
		t.Errorf("store holds %d events of %d pods, want %d of %d", sum, len(lists), MaxTotal, MaxTotal/MaxPerPod)
	}
}

// A burst of events for many pods is written with one store transaction.
func TestFlushBatches(t *testing.T) {
	r, st, c := newTest(t)
	for i := range 200 {
		r.Record(podEvent(fmt.Sprintf("uid-%d", i%10), "BackOff", "m", c.now()))
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	if w := st.writes(); w != 1 {
		t.Errorf("%d store writes for a burst of 200 events, want 1", w)
	}
	if evs := stored(t, st, "uid-3"); len(evs) != 1 || evs[0].Count != 20 {
		t.Errorf("stored uid-3 = %+v, want one event seen 20 times", evs)
	}
	if err := r.Flush(); err != nil || st.writes() != 1 {
		t.Errorf("a flush with nothing new wrote (%d writes, %v)", st.writes(), err)
	}
}

// Run writes a burst a moment after it arrives (far fewer writes than events), and what is
// pending when it stops; a new recorder loads the lists back.
func TestRunFlushesAndReloads(t *testing.T) {
	r, st, c := newTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx, nil) }()
	for i := range 100 {
		r.Record(podEvent("a", "BackOff", "m", c.now().Add(time.Duration(i)*time.Millisecond)))
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(stored(t, st, "a")) == 0 || stored(t, st, "a")[0].Count != 100 {
		if time.Now().After(deadline) {
			t.Fatalf("burst not stored within 10s: %+v", stored(t, st, "a"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if w := st.writes(); w >= 10 {
		t.Errorf("%d store writes for 100 events, want a few", w)
	}
	r.Record(podEvent("b", "Started", "Started container main", c.now()))
	cancel()
	<-done
	if evs := stored(t, st, "b"); len(evs) != 1 {
		t.Errorf("event recorded just before stop: stored %+v, want it flushed on the way out", evs)
	}

	again := New(Options{Store: st, Node: "edge-1", Log: slog.New(slog.DiscardHandler), Now: c.now})
	if err := again.Load(); err != nil {
		t.Fatal(err)
	}
	if evs := again.Events("a"); len(evs) != 1 || evs[0].Count != 100 {
		t.Errorf("reloaded a = %+v", evs)
	}
	// The counts go on from what was loaded.
	again.Record(podEvent("a", "BackOff", "m", c.now().Add(time.Second)))
	if evs := again.Events("a"); evs[0].Count != 101 {
		t.Errorf("after reload and one more: count %d, want 101", evs[0].Count)
	}
}

// A failed write keeps the lists pending; the next flush writes them.
func TestFlushRetries(t *testing.T) {
	r, st, c := newTest(t)
	st.fail = errors.New("disk full")
	r.Record(podEvent("a", "Started", "Started container main", c.now()))
	if err := r.Flush(); err == nil {
		t.Fatal("flush with a failing store: no error")
	}
	st.fail = nil
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	if evs := stored(t, st, "a"); len(evs) != 1 {
		t.Errorf("after the retry: %+v", evs)
	}
}

// A pod's events go with it: Forget (the pod is gone), and Prune (pods the agent no longer has,
// unless they had events since the agent was asked).
func TestForgetAndPrune(t *testing.T) {
	r, st, c := newTest(t)
	for _, uid := range []string{"a", "b", "c", "d"} {
		r.Record(podEvent(uid, "Started", "Started container main", c.now()))
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	r.Forget("a")
	c.add(time.Minute)
	seen := c.now()
	r.Record(podEvent("d", "Killing", "Stopping container main", seen.Add(time.Second))) // after keep was read
	r.Prune(map[types.UID]bool{"c": true}, seen)
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	for uid, want := range map[string]int{"a": 0, "b": 0, "c": 1, "d": 2} {
		if n := len(r.Events(types.UID(uid))); n != want {
			t.Errorf("pod %s keeps %d events, want %d", uid, n, want)
		}
		if n := len(stored(t, st, uid)); n != want {
			t.Errorf("store holds %d events of pod %s, want %d", n, uid, want)
		}
	}
}

// The control plane gets a burst of 25 events per pod, then one per 5 minutes; the local list
// counts every one, and events about the node are not held back.
func TestThrottle(t *testing.T) {
	r, _, c := newTest(t)
	forwarded := 0
	for i := range 40 {
		if r.Record(podEvent("a", "Unhealthy", "Liveness probe failed", c.now().Add(time.Duration(i)*time.Millisecond))) {
			forwarded++
		}
	}
	if forwarded != spamBurst {
		t.Errorf("%d of 40 events forwarded, want %d", forwarded, spamBurst)
	}
	if evs := r.Events("a"); len(evs) != 1 || evs[0].Count != 40 {
		t.Errorf("local list = %+v, want one event seen 40 times", evs)
	}
	c.add(spamRefill)
	if !r.Record(podEvent("a", "Unhealthy", "Liveness probe failed", c.now())) {
		t.Errorf("no event forwarded after a refill period")
	}
	if r.Record(podEvent("a", "Unhealthy", "Liveness probe failed", c.now())) {
		t.Errorf("a second event forwarded within the refill period")
	}
	node := event.Event{Type: event.Warning, Reason: "Rejected", Object: event.NodeObject("edge-1")}
	for range 40 {
		if !r.Record(node) {
			t.Fatalf("a node event was held back")
		}
	}
	if evs := r.Events(""); len(evs) != 0 {
		t.Errorf("node events were kept as pod events: %+v", evs)
	}
}

// Events come out as Kubernetes Events kubectl would show; the cause's source is an annotation;
// long messages are bounded.
func TestEventsAsV1(t *testing.T) {
	r, _, c := newTest(t)
	e := podEvent("a", "Rejected", strings.Repeat("é", maxMessage), c.now())
	e.Source = "file /etc/mqlet/pods/a.yaml#0"
	r.Record(e)
	got := r.Events("a")[0]
	if got.InvolvedObject.Kind != "Pod" || got.InvolvedObject.UID != "a" || got.InvolvedObject.Name != "pod-a" ||
		got.Namespace != "default" || got.Source.Component != Component || got.Source.Host != "edge-1" ||
		got.Type != string(event.Warning) || got.Count != 1 || got.Annotations[AnnotationSource] != e.Source {
		t.Errorf("v1 event = %+v", got)
	}
	if len(got.Message) > maxMessage || !strings.HasSuffix(got.Message, "...") || !strings.HasPrefix(got.Message, "éé") {
		t.Errorf("message of %d bytes not bounded to %d: %.20q...", len(got.Message), maxMessage, got.Message)
	}
}

// Wrap records, forwards what the throttle lets through, and forgets a pod that is gone.
func TestWrap(t *testing.T) {
	r, _, c := newTest(t)
	next := &sinkReporter{}
	rep := r.Wrap(next)
	rep.Emit(podEvent("a", "Started", "Started container main", c.now()))
	pod := &v1.Pod{}
	pod.UID = "a"
	rep.PodGone(store.DesiredPod{Pod: pod})
	if len(next.events) != 1 || next.gone != 1 {
		t.Errorf("next got %d events and %d gone, want 1 and 1", len(next.events), next.gone)
	}
	if evs := r.Events("a"); len(evs) != 0 {
		t.Errorf("events of a gone pod: %+v", evs)
	}
	r.Wrap(nil).Emit(podEvent("b", "Started", "Started container main", c.now())) // no next: no panic
	if evs := r.Events("b"); len(evs) != 1 {
		t.Errorf("standalone: %+v", evs)
	}
}

type sinkReporter struct {
	events []event.Event
	gone   int
}

func (s *sinkReporter) PodStatus(store.DesiredPod, v1.PodStatus) {}
func (s *sinkReporter) PodGone(store.DesiredPod)                 { s.gone++ }
func (s *sinkReporter) Emit(e event.Event)                       { s.events = append(s.events, e) }

// Stored lists longer than the bound (an older, roomier release) are cut on load.
func TestLoadTrims(t *testing.T) {
	st := store.NewMemory()
	long := store.PodEvents{UID: "a", Namespace: "default", Name: "pod-a"}
	t0 := time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)
	for i := range MaxPerPod + 5 {
		at := t0.Add(time.Duration(i) * time.Second)
		long.Events = append(long.Events, store.EventRecord{Type: "Normal", Reason: fmt.Sprintf("R%02d", i), Message: "m", Count: 1, FirstTime: at, LastTime: at})
	}
	if err := st.UpdateEvents([]store.PodEvents{long}, nil); err != nil {
		t.Fatal(err)
	}
	r := New(Options{Store: st, Log: slog.New(slog.DiscardHandler)})
	if err := r.Load(); err != nil {
		t.Fatal(err)
	}
	if evs := r.Events("a"); len(evs) != MaxPerPod || evs[0].Reason != "R05" {
		t.Errorf("loaded %d events from %s", len(evs), evs[0].Reason)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	if p, _, _ := st.GetEvents("a"); len(p.Events) != MaxPerPod {
		t.Errorf("store keeps %d after the trim was flushed", len(p.Events))
	}
}
