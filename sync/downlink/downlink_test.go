package downlink

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/event"
	"github.com/mqlet/mqlet/agent/source"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// These tests drive the downlink's logic with the in-memory store twin; the real broker and the
// real agent are exercised by sync/nodesync's and cmd/mqlet's tests.

var tp = protocol.MustTopics(protocol.DefaultPrefix)

const node = "edge-1"

type rig struct {
	t       *testing.T
	d       *Downlink
	st      *store.Memory
	mu      sync.Mutex
	changes []source.Change
	events  []event.Event
	acks    []protocol.Acks
	resends [][]string
	cancel  context.CancelFunc
	done    chan struct{}
}

func newRig(t *testing.T, st *store.Memory) *rig {
	r := &rig{t: t, st: st, done: make(chan struct{})}
	r.d = New(Options{
		Node: node, Topics: tp, Store: st, Settle: 50 * time.Millisecond,
		Events: event.SinkFunc(func(e event.Event) { r.mu.Lock(); r.events = append(r.events, e); r.mu.Unlock() }),
		Acks:   func(a protocol.Acks) { r.mu.Lock(); r.acks = append(r.acks, a); r.mu.Unlock() },
		Resend: func(_ string, missing []string) { r.mu.Lock(); r.resends = append(r.resends, missing); r.mu.Unlock() },
	})
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		r.d.Run(ctx, func(c source.Change) { r.mu.Lock(); r.changes = append(r.changes, c); r.mu.Unlock() })
	}()
	t.Cleanup(r.stop)
	r.waitChanges(1) // the initial resync
	return r
}

func (r *rig) stop() {
	r.cancel()
	<-r.done
}

// send offers a message and waits until the downlink's goroutine has handled it: a sentinel with
// an unparsable topic, offered after it, is refused (with an event) only once it is done.
func (r *rig) send(topic string, payload []byte, retained bool) {
	r.t.Helper()
	count := func() int {
		r.mu.Lock()
		defer r.mu.Unlock()
		n := 0
		for _, e := range r.events {
			if e.Source == "mqtt sentinel" {
				n++
			}
		}
		return n
	}
	before := count()
	if !r.d.Offer(Message{Topic: topic, Payload: payload, Retained: retained}) || !r.d.Offer(Message{Topic: "sentinel"}) {
		r.t.Fatal("offer refused")
	}
	deadline := time.Now().Add(5 * time.Second)
	for count() == before {
		if time.Now().After(deadline) {
			r.t.Fatal("the downlink did not handle the message within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

func (r *rig) waitChanges(n int) {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		got := len(r.changes)
		r.mu.Unlock()
		if got >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	r.t.Fatalf("want %d changes within 5s", n)
}

func (r *rig) snapshot() ([]source.Change, []event.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var events []event.Event
	for _, e := range r.events {
		if e.Source != "mqtt sentinel" {
			events = append(events, e)
		}
	}
	return append([]source.Change(nil), r.changes...), events
}

func podMsg(t *testing.T, name string, gen int64, image string) (string, []byte) {
	t.Helper()
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: image}}}}
	d, err := protocol.NewDesired(node, gen, p)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := protocol.Encode(d)
	return tp.Desired(node, protocol.KindPod, "default", name), b
}

func tombMsg(name string, gen int64) (string, []byte) {
	b, _ := protocol.Encode(protocol.NewTombstone(node, protocol.KindPod, "default", name, gen))
	return tp.Desired(node, protocol.KindPod, "default", name), b
}

func indexMsg(rev int64, objs map[string]int64) (string, []byte) {
	b, _ := protocol.Encode(&protocol.Index{Node: node, Revision: rev, Objects: objs})
	return tp.Index(node), b
}

func TestGenerationsOnlyGrow(t *testing.T) {
	r := newRig(t, store.NewMemory())
	topic, v2 := podMsg(t, "web", 2, "img:2")
	_, v1msg := podMsg(t, "web", 1, "img:1")
	r.send(topic, v2, false)
	r.send(topic, v2, true)    // retained replay: silent
	r.send(topic, v2, false)   // a live duplicate: refused with an event
	r.send(topic, v1msg, true) // reordered, older: refused
	changes, events := r.snapshot()
	if len(changes) != 2 || changes[1].Op != source.Upsert || changes[1].Items[0].Generation != 2 {
		t.Fatalf("want the resync and one upsert at generation 2, got %+v", changes)
	}
	if it := changes[1].Items[0]; it.Ref.Kind != source.MQTT || it.Ref.Origin != topic || it.Pod.Spec.Containers[0].Image != "img:2" {
		t.Fatalf("upsert item %+v", it)
	}
	if len(events) != 2 || !strings.Contains(events[0].Message, "duplicate generation 2") || !strings.Contains(events[1].Message, "stale generation 1") {
		t.Fatalf("events %+v", events)
	}
	marks, _, _ := r.st.ListMarks()
	if marks["pods/default/web"].Generation != 2 {
		t.Fatalf("mark %+v", marks["pods/default/web"])
	}
}

func TestTombstoneIsRememberedAcrossRestart(t *testing.T) {
	st := store.NewMemory()
	r := newRig(t, st)
	topic, up := podMsg(t, "web", 3, "img")
	_, tomb := tombMsg("web", 4)
	r.send(topic, up, false)
	r.send(topic, tomb, false)
	changes, _ := r.snapshot()
	if last := changes[len(changes)-1]; last.Op != source.Delete || last.Keys[0] != "default/web" {
		t.Fatalf("last change %+v", last)
	}
	r.stop()

	// A restarted node gets the old create replayed: it must not come back.
	r2 := newRig(t, st)
	r2.send(topic, up, true)
	changes, events := r2.snapshot()
	if len(changes) != 1 {
		t.Fatalf("a stale create after a tombstone was applied: %+v", changes)
	}
	if len(events) != 1 || !strings.Contains(events[0].Message, "stale generation 3") {
		t.Fatalf("events %+v", events)
	}
}

func TestIndexDeletesWhatItNoLongerLists(t *testing.T) {
	r := newRig(t, store.NewMemory())
	ta, a := podMsg(t, "a", 1, "img")
	tb, b := podMsg(t, "b", 2, "img")
	r.send(ta, a, true)
	r.send(tb, b, true)
	// Deleted while the node was away, tombstone lost: the index at revision 5 lists only b.
	it, idx := indexMsg(5, map[string]int64{"pods/default/b": 2})
	r.send(it, idx, true)
	changes, _ := r.snapshot()
	last := changes[len(changes)-1]
	if last.Op != source.Delete || len(last.Keys) != 1 || last.Keys[0] != "default/a" {
		t.Fatalf("want a deleted by the index, got %+v", last)
	}
	// An object newer than the index is kept: c at generation 7 with the index still at 5.
	tc, c := podMsg(t, "c", 7, "img")
	r.send(tc, c, false)
	r.send(it, idx, true)
	changes2, _ := r.snapshot()
	for _, ch := range changes2[len(changes):] {
		if ch.Op == source.Delete {
			t.Fatalf("an object newer than the index was deleted: %+v", ch)
		}
	}
	// A stale index (revision 4) changes nothing.
	it4, idx4 := indexMsg(4, map[string]int64{})
	r.send(it4, idx4, false)
	changes3, events := r.snapshot()
	if len(changes3) != len(changes2) || !strings.Contains(events[len(events)-1].Message, "stale index revision 4") {
		t.Fatalf("a stale index acted: %+v / %+v", changes3[len(changes2):], events)
	}
}

func TestMissingObjectsAskForResendAndNothingIsDeletedWithoutAnIndex(t *testing.T) {
	r := newRig(t, store.NewMemory())
	ta, a := podMsg(t, "a", 1, "img")
	r.send(ta, a, true)
	// An empty retained payload is a cleared topic, never a deletion.
	r.send(ta, nil, true)
	it, idx := indexMsg(3, map[string]int64{"pods/default/a": 1, "pods/default/b": 3})
	r.send(it, idx, true)
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		n := len(r.resends)
		var got []string
		if n > 0 {
			got = r.resends[0]
		}
		r.mu.Unlock()
		if n > 0 {
			if len(got) != 1 || got[0] != "pods/default/b" {
				t.Fatalf("resend asked for %v", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no resend asked within 5s for an object the index lists")
		}
		time.Sleep(5 * time.Millisecond)
	}
	changes, _ := r.snapshot()
	for _, c := range changes {
		if c.Op == source.Delete {
			t.Fatalf("something was deleted: %+v", c)
		}
	}
}

func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	st := store.NewMemory()
	r := newRig(t, st)
	topic, good := podMsg(t, "web", 1, "img")
	r.send(topic, good, false)
	big := make([]byte, protocol.DefaultMaxPayload+1)
	for i := range big {
		big[i] = ' '
	}
	_, other := podMsg(t, "web", 5, "img")
	cases := []struct {
		topic   string
		payload []byte
		want    string
	}{
		{topic, big, "payload too large"},
		{topic, []byte("{garbled"), "invalid JSON"},
		{strings.Replace(topic, node, "edge-2", 1), other, `for node "edge-2"`},
		{tp.Node(node) + "/desired/deployments/default/x", []byte("{}"), "unknown kind"},
		{"elsewhere/topic", []byte("{}"), "outside"},
		{tp.Events(node), []byte("{}"), "carries no desired state"},
	}
	for _, c := range cases {
		r.send(c.topic, c.payload, false)
	}
	changes, events := r.snapshot()
	if len(changes) != 2 {
		t.Fatalf("bad input changed the desired set: %+v", changes[2:])
	}
	if len(events) != len(cases) {
		t.Fatalf("want %d refusal events, got %+v", len(cases), events)
	}
	for i, c := range cases {
		if events[i].Type != event.Warning || !strings.Contains(events[i].Message, c.want) || !strings.Contains(events[i].Message, c.topic) {
			t.Errorf("case %d: event %+v, want one naming the topic and %q", i, events[i], c.want)
		}
	}
	marks, _, _ := st.ListMarks()
	if marks["pods/default/web"].Generation != 1 {
		t.Fatalf("mark changed: %+v", marks)
	}
}

func TestConfigMapsAndSecretsAreStored(t *testing.T) {
	st := store.NewMemory()
	r := newRig(t, st)
	s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "creds"}, Data: map[string][]byte{"k": []byte("v")}}
	d, _ := protocol.NewDesired(node, 2, s)
	b, _ := protocol.Encode(d)
	topic := tp.Desired(node, protocol.KindSecret, "default", "creds")
	r.send(topic, b, true)
	rec, ok, err := st.GetObject(store.KindSecret, "default", "creds")
	if err != nil || !ok || string(rec.Secret.Data["k"]) != "v" || rec.Generation != 2 {
		t.Fatalf("secret not stored: %+v %v %v", rec, ok, err)
	}
	tb, _ := protocol.Encode(protocol.NewTombstone(node, protocol.KindSecret, "default", "creds", 3))
	r.send(topic, tb, false)
	if _, ok, _ := st.GetObject(store.KindSecret, "default", "creds"); ok {
		t.Fatal("secret still stored after its tombstone")
	}
	r.mu.Lock()
	last := r.acks[len(r.acks)-1]
	r.mu.Unlock()
	if last.Deleted["secrets/default/creds"] != 3 {
		t.Fatalf("acks %+v", last)
	}
}

func TestRestartRestatesStoredPods(t *testing.T) {
	st := store.NewMemory()
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "u1"}}
	if err := st.PutDesired(store.DesiredPod{Pod: p, Source: source.Ref{Kind: source.MQTT, Origin: "t"}, Generation: 4}); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, st)
	changes, _ := r.snapshot()
	if changes[0].Op != source.Resync || len(changes[0].Items) != 1 || changes[0].Items[0].Generation != 4 {
		t.Fatalf("initial change %+v", changes[0])
	}
	// The stored pod counts as taken in even without a mark: its generation replayed is silent.
	topic, msg := podMsg(t, "web", 4, "img")
	r.send(topic, msg, true)
	if changes, _ := r.snapshot(); len(changes) != 1 {
		t.Fatalf("a replay of the stored generation was applied: %+v", changes)
	}
}

// An object at or below the index's revision that the index does not list was deleted since:
// a reordered replay of it is never started.
func TestObjectOlderThanIndexAndUnlistedIsNotStarted(t *testing.T) {
	r := newRig(t, store.NewMemory())
	it, idx := indexMsg(6, map[string]int64{})
	r.send(it, idx, true)
	ta, a := podMsg(t, "a", 4, "img")
	r.send(ta, a, true)
	changes, _ := r.snapshot()
	for _, c := range changes {
		if c.Op == source.Upsert {
			t.Fatalf("a pod the index says is deleted was started: %+v", c)
		}
	}
	marks, _, _ := r.st.ListMarks()
	if m := marks["pods/default/a"]; !m.Deleted || m.Generation != 6 {
		t.Fatalf("mark %+v, want a tombstone at the index revision", m)
	}
	// Newer than the index: applied.
	_, a7 := podMsg(t, "a", 7, "img")
	r.send(ta, a7, false)
	changes, _ = r.snapshot()
	if last := changes[len(changes)-1]; last.Op != source.Upsert || last.Items[0].Generation != 7 {
		t.Fatalf("last change %+v", last)
	}
}
