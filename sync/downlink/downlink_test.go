package downlink

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
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

// These tests drive the downlink's logic with the in-memory store twin; the real broker and the
// real agent are exercised by sync/nodesync's and cmd/mqlet/e2e's tests.

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
	fetches [][]string
	reject  map[string]string // pod key -> reason the fake agent refuses it with
	cancel  context.CancelFunc
	done    chan struct{}
}

func newRig(t *testing.T, st *store.Memory) *rig { return newRigWith(t, st, nil) }

func newRigWith(t *testing.T, st *store.Memory, trusted []ed25519.PublicKey) *rig {
	return newRigHolding(t, st, trusted, -1)
}

func newRigHolding(t *testing.T, st *store.Memory, trusted []ed25519.PublicKey, hold time.Duration) *rig {
	r := &rig{t: t, st: st, done: make(chan struct{})}
	r.d = New(Options{
		Node: node, Topics: tp, Store: st, Settle: 50 * time.Millisecond, Trusted: trusted, AckHold: hold,
		Events: event.SinkFunc(func(e event.Event) { r.mu.Lock(); r.events = append(r.events, e); r.mu.Unlock() }),
		Acks:   func(a protocol.Acks) { r.mu.Lock(); r.acks = append(r.acks, a); r.mu.Unlock() },
		Resync: func(_ string, missing []string) { r.mu.Lock(); r.resends = append(r.resends, missing); r.mu.Unlock() },
		Fetch:  func(keys []string) { r.mu.Lock(); r.fetches = append(r.fetches, keys); r.mu.Unlock() },
	})
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		r.d.Run(ctx, func(c source.Change) source.Result {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.changes = append(r.changes, c)
			var res source.Result
			for _, it := range c.Items {
				if why, ok := r.reject[source.Key(it.Pod)]; ok && c.Op == source.Upsert {
					if res.Rejected == nil {
						res.Rejected = map[string]string{}
					}
					res.Rejected[source.Key(it.Pod)] = why
				}
			}
			return res
		})
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
	r.sendMsg(Message{Topic: topic, Payload: payload, Retained: retained})
}

func (r *rig) sendMsg(m Message) {
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
	if !r.d.Offer(m) || !r.d.Offer(Message{Topic: "sentinel"}) {
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

// podMsg is a pod's desired message.
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

// indexOf is an index at rev listing each payload (by its topic's key) with its generation and digest.
func indexOf(t *testing.T, rev int64, msgs map[string][]byte) (string, []byte) {
	t.Helper()
	objs := map[string]protocol.IndexEntry{}
	for topic, payload := range msgs {
		pt, err := tp.Parse(topic)
		if err != nil {
			t.Fatal(err)
		}
		var d protocol.Desired
		if err := json.Unmarshal(payload, &d); err != nil {
			t.Fatal(err)
		}
		objs[protocol.ObjectKey(pt.Kind, pt.Namespace, pt.Name)] = protocol.IndexEntry{Generation: d.Generation, Digest: protocol.Digest(payload)}
	}
	b, _ := protocol.Encode(&protocol.Index{Node: node, Revision: rev, Objects: objs})
	return tp.Index(node), b
}

// applied is what acks say the node applied: complete acks list it; compact ones against the
// index in force, which the node stored (the broker's copy, for a real reader).
func (r *rig) applied(a protocol.Acks) map[string]protocol.IndexEntry {
	r.t.Helper()
	var x *protocol.Index
	if marks, _, err := r.st.ListMarks(); err == nil && len(marks[indexMark].Data) > 0 {
		var derr error
		if x, derr = protocol.DecodeIndex(protocol.Topic{Class: protocol.ClassIndex, Node: node}, marks[indexMark].Data, 0); derr != nil {
			r.t.Fatalf("stored index: %v", derr)
		}
	}
	m, ok := a.AppliedIn(x)
	if !ok {
		r.t.Fatalf("compact acks %+v name an index the node does not hold", a)
	}
	return m
}

func (r *rig) lastAcks() protocol.Acks {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.acks) == 0 {
		r.t.Fatal("no acks")
	}
	return r.acks[len(r.acks)-1]
}

func upserts(changes []source.Change) []string {
	var out []string
	for _, c := range changes {
		if c.Op == source.Upsert {
			for _, it := range c.Items {
				out = append(out, fmt.Sprintf("%s@%d", it.Pod.Name, it.Generation))
			}
		}
	}
	return out
}

func deletes(changes []source.Change) []string {
	var out []string
	for _, c := range changes {
		if c.Op == source.Delete {
			out = append(out, c.Keys...)
		}
	}
	return out
}

// An object is applied only once an index lists its exact payload; one that arrives first waits
// for it, and one whose digest differs from the listed one is never applied.
func TestOnlyWhatTheIndexListsIsApplied(t *testing.T) {
	r := newRig(t, store.NewMemory())
	ta, a := podMsg(t, "a", 2, "img:2")
	r.send(ta, a, true)
	if got := upserts(must(r.snapshot())); len(got) != 0 {
		t.Fatalf("applied before any index listed it: %v", got)
	}
	ti, idx := indexOf(t, 2, map[string][]byte{ta: a})
	r.send(ti, idx, true)
	if got := upserts(must(r.snapshot())); !slices.Equal(got, []string{"a@2"}) {
		t.Fatalf("upserts %v, want a@2 once the index lists it", got)
	}
	r.send(ta, a, true) // a replay: silent
	// Same generation, other content (a second writer, or a forged message): never applied.
	_, forged := podMsg(t, "a", 2, "evil:latest")
	r.send(ta, forged, false)
	changes, events := r.snapshot()
	if got := upserts(changes); len(got) != 1 {
		t.Fatalf("a payload the index does not list was applied: %v", got)
	}
	if len(events) != 1 || events[0].Reason != "DigestMismatch" {
		t.Fatalf("events %+v, want one DigestMismatch", events)
	}
	if a := r.lastAcks(); r.applied(a)["pods/default/a"].Generation != 2 || a.IndexRevision != 2 || a.IndexDigest != protocol.Digest(idx) {
		t.Fatalf("acks %+v", a)
	}
}

// The reproduction: the node stored the index listing a and b, took a in, and was killed;
// b arrives after the restart at a generation at or below the stored revision. It is applied, not
// treated as deleted.
func TestRestartBetweenIndexAndObjectLosesNothing(t *testing.T) {
	st := store.NewMemory()
	r := newRig(t, st)
	ta, a := podMsg(t, "a", 3, "img")
	tb, b := podMsg(t, "b", 3, "img")
	ti, idx := indexOf(t, 3, map[string][]byte{ta: a, tb: b})
	r.send(ti, idx, true)
	r.send(ta, a, true)
	r.stop()

	r2 := newRig(t, st)
	if m := r2.lastAcks().Missing; len(m) != 1 || m["pods/default/b"].Generation != 3 {
		t.Fatalf("after the restart the acks list missing %v, want b from the stored index", m)
	}
	r2.send(tb, b, true) // subscriptions are made in any order: the object before the index replay
	r2.send(ti, idx, true)
	changes, _ := r2.snapshot()
	if got := upserts(changes); !slices.Equal(got, []string{"b@3"}) || len(deletes(changes)) != 0 {
		t.Fatalf("upserts %v deletes %v, want b applied and nothing deleted", got, deletes(changes))
	}
	if a := r2.lastAcks(); len(r2.applied(a)) != 2 || len(a.Missing) != 0 {
		t.Fatalf("acks %+v", a)
	}
}

// Deletion needs a newer index that leaves the object out; a stale or conflicting index is refused
// (durably, in the acks) and changes nothing.
func TestOnlyANewerIndexDeletes(t *testing.T) {
	r := newRig(t, store.NewMemory())
	ta, a := podMsg(t, "a", 1, "img")
	tb, b := podMsg(t, "b", 2, "img")
	ti, idx2 := indexOf(t, 2, map[string][]byte{ta: a, tb: b})
	r.send(ta, a, true)
	r.send(tb, b, true)
	r.send(ti, idx2, true)
	_, idx3 := indexOf(t, 3, map[string][]byte{tb: b})
	r.send(ti, idx3, false)
	if got := deletes(must(r.snapshot())); !slices.Equal(got, []string{"default/a"}) {
		t.Fatalf("deletes %v, want a", got)
	}
	if marks, _, _ := r.st.ListMarks(); len(marks) != 2 { // the index and b: a's mark is gone
		t.Fatalf("marks %v, want the index's and b's only", marks)
	}
	_, stale := indexOf(t, 2, map[string][]byte{})
	r.send(ti, stale, false)
	_, conflicting := indexOf(t, 3, map[string][]byte{})
	r.send(ti, conflicting, false)
	changes, events := r.snapshot()
	if got := deletes(changes); len(got) != 1 {
		t.Fatalf("a stale or conflicting index deleted %v", got)
	}
	if len(events) != 2 || !strings.Contains(events[0].Message, "stale index revision 2") || !strings.Contains(events[1].Message, "conflicting index") {
		t.Fatalf("events %+v", events)
	}
	if a := r.lastAcks(); a.IndexRefused == nil || a.IndexRefused.Generation != 3 || a.IndexRevision != 3 || a.IndexDigest != protocol.Digest(idx3) {
		t.Fatalf("acks %+v, want the conflicting revision 3 refused and revision 3 (the first) in force", a)
	}
}

// An entry that does not arrive is fetched again and asked for (backing off); nothing is deleted
// because a message is missing, and a cleared topic changes nothing.
func TestMissingIsAskedForNeverDeleted(t *testing.T) {
	r := newRig(t, store.NewMemory())
	ta, a := podMsg(t, "a", 1, "img")
	tb, b := podMsg(t, "b", 3, "img")
	r.send(ta, a, true)
	ti, idx := indexOf(t, 3, map[string][]byte{ta: a, tb: b})
	r.send(ti, idx, true)
	r.send(ta, nil, true) // cleared: never a deletion
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		n := len(r.resends)
		var got []string
		if n > 0 {
			got = r.resends[0]
		}
		fetches := slices.Clone(r.fetches)
		r.mu.Unlock()
		if n > 0 {
			if !slices.Equal(got, []string{"pods/default/b"}) {
				t.Fatalf("resync asked for %v", got)
			}
			if len(fetches) < 2 || !slices.Equal(fetches[0], []string{"pods/default/b"}) || !slices.Equal(fetches[len(fetches)-1], []string{"pods/default/b"}) {
				t.Fatalf("fetches %v, want b fetched at the index and again before the resync", fetches)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no resync asked within 5s for an object the index lists")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := deletes(must(r.snapshot())); len(got) != 0 {
		t.Fatalf("deleted %v", got)
	}
	if a := r.lastAcks(); a.Missing["pods/default/b"].Generation != 3 || r.applied(a)["pods/default/a"].Generation != 1 {
		t.Fatalf("acks %+v", a)
	}
}

// Every entry ends in one durable outcome: a pod the agent refuses and an object the node cannot
// decode are refused at their generation, in the acks, across a restart, and are not asked for
// again (no resubscribe loop replaying the desired set).
func TestRefusalsAreDurableOutcomes(t *testing.T) {
	st := store.NewMemory()
	r := newRig(t, st)
	r.mu.Lock()
	r.reject = map[string]string{"default/priv": "policy: privileged containers are not allowed"}
	r.mu.Unlock()
	tp1, priv := podMsg(t, "priv", 4, "img")
	tn := tp.Desired(node, protocol.KindPod, "default", "newer")
	newer := []byte(`{"apiVersion":"mqlet.io/v2","kind":"Pod","node":"edge-1","namespace":"default","name":"newer","generation":4,` +
		`"object":{"metadata":{"name":"newer"},"spec":{"containers":[{"name":"c","image":"i"}],"fieldFromANewerAPI":true}}}`)
	ti, idx := indexOf(t, 4, map[string][]byte{tp1: priv, tn: newer})
	r.send(ti, idx, true)
	r.send(tp1, priv, true)
	r.send(tn, newer, true)
	check := func(a protocol.Acks) {
		t.Helper()
		if len(r.applied(a)) != 0 || len(a.Missing) != 0 || len(a.Refused) != 2 ||
			a.Refused["pods/default/priv"].Generation != 4 || !strings.Contains(a.Refused["pods/default/priv"].Reason, "privileged") ||
			a.Refused["pods/default/newer"].Generation != 4 || !strings.Contains(a.Refused["pods/default/newer"].Reason, "fieldFromANewerAPI") {
			t.Fatalf("acks %+v, want both refused at generation 4 with their reasons", a)
		}
	}
	check(r.lastAcks())
	time.Sleep(200 * time.Millisecond) // four settle delays: a missing entry would have been asked for
	r.mu.Lock()
	resends := len(r.resends)
	r.mu.Unlock()
	if resends != 0 {
		t.Fatalf("%d resyncs asked although every entry has an outcome", resends)
	}
	r.stop()
	r2 := newRig(t, st)
	check(r2.lastAcks())
	r2.send(tn, newer, true) // replayed: silent, judged already
	if _, events := r2.snapshot(); len(events) != 0 {
		t.Fatalf("a replayed refused generation was reported again: %+v", events)
	}
}

func TestConfigMapsAndSecretsFollowTheIndex(t *testing.T) {
	st := store.NewMemory()
	r := newRig(t, st)
	s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "creds"}, Data: map[string][]byte{"k": []byte("v")}}
	d, _ := protocol.NewDesired(node, 2, s)
	b, _ := protocol.Encode(d)
	topic := tp.Desired(node, protocol.KindSecret, "default", "creds")
	ti, idx := indexOf(t, 2, map[string][]byte{topic: b})
	r.send(ti, idx, true)
	r.send(topic, b, true)
	rec, ok, err := st.GetObject(store.KindSecret, "default", "creds")
	if err != nil || !ok || string(rec.Secret.Data["k"]) != "v" || rec.Generation != 2 {
		t.Fatalf("secret not stored: %+v %v %v", rec, ok, err)
	}
	_, idx3 := indexOf(t, 3, nil)
	r.send(ti, idx3, false)
	if _, ok, _ := st.GetObject(store.KindSecret, "default", "creds"); ok {
		t.Fatal("secret still stored after an index left it out")
	}
	if a := r.lastAcks(); len(r.applied(a)) != 0 || a.IndexRevision != 3 {
		t.Fatalf("acks %+v", a)
	}
}

func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	st := store.NewMemory()
	r := newRig(t, st)
	topic, good := podMsg(t, "web", 1, "img")
	ti, idx := indexOf(t, 1, map[string][]byte{topic: good})
	r.send(ti, idx, true)
	r.send(topic, good, true)
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
		{ti, big, "payload too large"},
		{ti, []byte("{garbled"), "invalid JSON"},
		{strings.Replace(topic, node, "edge-2", 1), other, `for node "edge-2"`},
		{tp.Node(node) + "/desired/deployments/default/x", []byte("{}"), "unknown kind"},
		{"elsewhere/topic", []byte("{}"), "outside"},
		{tp.Events(node), []byte("{}"), "carries no desired state"},
	}
	for _, c := range cases {
		r.send(c.topic, c.payload, false)
	}
	changes, events := r.snapshot()
	if got := upserts(changes); len(got) != 1 || len(deletes(changes)) != 0 {
		t.Fatalf("bad input changed the desired set: %v / %v", got, deletes(changes))
	}
	if len(events) != len(cases) {
		t.Fatalf("want %d refusal events, got %+v", len(cases), events)
	}
	for i, c := range cases {
		if events[i].Type != event.Warning || !strings.Contains(events[i].Message, c.want) || !strings.Contains(events[i].Message, c.topic) {
			t.Errorf("case %d: event %+v, want one naming the topic and %q", i, events[i], c.want)
		}
	}
	if a := r.lastAcks(); r.applied(a)["pods/default/web"].Generation != 1 || a.IndexRevision != 1 {
		t.Fatalf("acks changed: %+v", a)
	}
}

// A pod stored without a digest (a crash before its mark, or a node upgraded from protocol v1) runs
// from the start; it is fetched once an index lists it, and applied again at the same generation.
func TestStoredPodWithoutDigestIsRestatedThenFetched(t *testing.T) {
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
	if a := r.lastAcks(); r.applied(a)["pods/default/web"].Generation != 4 {
		t.Fatalf("before any index the acks must say what the node runs: %+v", a)
	}
	topic, msg := podMsg(t, "web", 4, "img")
	ti, idx := indexOf(t, 4, map[string][]byte{topic: msg})
	r.send(ti, idx, true)
	r.mu.Lock()
	fetches := slices.Clone(r.fetches)
	r.mu.Unlock()
	if len(fetches) != 1 || !slices.Equal(fetches[0], []string{"pods/default/web"}) {
		t.Fatalf("fetches %v", fetches)
	}
	r.send(topic, msg, true)
	if got := upserts(must(r.snapshot())); !slices.Equal(got, []string{"web@4"}) {
		t.Fatalf("upserts %v", got)
	}
}

// A stored index is a decision taken: a pod it leaves out that is still stored (the agent stopped
// between storing the index and deleting the pod) is deleted at the next start.
func TestStoredIndexIsFinishedAtStart(t *testing.T) {
	st := store.NewMemory()
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "gone", UID: "u1"}}
	st.PutDesired(store.DesiredPod{Pod: p, Source: source.Ref{Kind: source.MQTT, Origin: "t"}, Generation: 2})
	_, idx := indexOf(t, 5, nil)
	st.UpdateMarks([]store.SyncMark{{Key: "pods/default/gone", Generation: 2, Digest: protocol.Digest([]byte("x"))},
		{Key: "index", Generation: 5, Digest: protocol.Digest(idx), Data: idx}}, nil)
	r := newRig(t, st)
	r.waitChanges(2)
	if got := deletes(must(r.snapshot())); !slices.Equal(got, []string{"default/gone"}) {
		t.Fatalf("deletes %v", got)
	}
}

// The acks and the marks stay O(desired set): a node that ran 5,000 short-lived pods one after the
// other (each index adds one and drops the previous) keeps one entry.
func TestStateStaysBoundedAfterManyShortLivedPods(t *testing.T) {
	st := store.NewMemory()
	r := newRig(t, st)
	for i := int64(1); i <= 5000; i++ {
		topic, msg := podMsg(t, fmt.Sprintf("job-%d", i), i, "img")
		ti, idx := indexOf(t, i, map[string][]byte{topic: msg})
		r.d.Offer(Message{Topic: topic, Payload: msg, Retained: true})
		r.send(ti, idx, true)
	}
	a := r.lastAcks()
	b, _ := protocol.Encode(&a)
	if len(r.applied(a)) != 1 || len(b) > 1024 {
		t.Fatalf("acks after 5,000 jobs: %d applied, %d bytes", len(r.applied(a)), len(b))
	}
	if marks, _, _ := st.ListMarks(); len(marks) != 2 {
		t.Fatalf("%d marks after 5,000 jobs, want 2 (the index and the last job)", len(marks))
	}
	t.Logf("acks after 5,000 jobs: %d bytes", len(b))
}

func must[T any](v T, _ ...any) T { return v }

// signedIndexOf is indexOf signed with key.
func signedIndexOf(t *testing.T, key ed25519.PrivateKey, rev int64, msgs map[string][]byte) (string, []byte) {
	t.Helper()
	topic, b := indexOf(t, rev, msgs)
	x, err := protocol.DecodeIndex(protocol.Topic{Class: protocol.ClassIndex, Node: node}, b, 0)
	if err != nil {
		t.Fatal(err)
	}
	protocol.SignIndex(x, key)
	b, _ = protocol.Encode(x)
	return topic, b
}

// With trust anchors, only an index signed by one of them is taken: an unsigned one, a forged one
// (altered after signing), one signed by another key, or an older signed one (a replay) changes
// nothing and is refused in the acks. A signed one applies, and a rotation (two anchors) takes both.
func TestTrustAnchorsOnlySignedIndexesApply(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	_, rogue, _ := ed25519.GenerateKey(rand.Reader)
	st := store.NewMemory()
	r := newRigWith(t, st, []ed25519.PublicKey{pub})
	ta, a := podMsg(t, "a", 1, "img")
	tb, b := podMsg(t, "b", 2, "evil")
	ti, signed := signedIndexOf(t, priv, 1, map[string][]byte{ta: a})
	r.send(ta, a, true)
	r.send(ti, signed, true)
	if got := upserts(must(r.snapshot())); !slices.Equal(got, []string{"a@1"}) {
		t.Fatalf("upserts %v, want a from the signed index", got)
	}
	_, unsigned := indexOf(t, 2, map[string][]byte{tb: b})
	_, otherKey := signedIndexOf(t, rogue, 2, map[string][]byte{tb: b})
	var x protocol.Index
	_, good2 := signedIndexOf(t, priv, 2, map[string][]byte{ta: a})
	json.Unmarshal(good2, &x)
	x.Objects["pods/default/b"] = protocol.IndexEntry{Generation: 2, Digest: protocol.Digest(b)} // added after signing
	forged, _ := protocol.Encode(&x)
	r.send(tb, b, true) // the attacker's object, retained
	for name, idx := range map[string][]byte{"unsigned": unsigned, "another key": otherKey, "forged": forged} {
		r.send(ti, idx, false)
		changes, _ := r.snapshot()
		if got := upserts(changes); len(got) != 1 || len(deletes(changes)) != 0 {
			t.Fatalf("%s index changed the node: upserts %v deletes %v", name, got, deletes(changes))
		}
		if a := r.lastAcks(); a.IndexRefused == nil || a.IndexRevision != 1 || len(r.applied(a)) != 1 {
			t.Fatalf("%s index: acks %+v, want it refused and revision 1 in force", name, a)
		}
	}
	// A later signed index applies; replaying the older signed one changes nothing.
	_, third := signedIndexOf(t, priv, 3, map[string][]byte{ta: a})
	r.send(ti, third, false)
	r.send(ti, signed, false)
	if a := r.lastAcks(); a.IndexRevision != 3 || a.IndexRefused == nil || !strings.Contains(a.IndexRefused.Reason, "stale") {
		t.Fatalf("acks %+v, want revision 3 in force and the replay refused as stale", a)
	}
	// The acks carry the signed index, for a writer that must rebuild without trusting the broker.
	if a := r.lastAcks(); string(a.Index) != string(third) {
		t.Fatalf("acks carry index %q", a.Index)
	}
	r.stop()
	// Restarted with the key no longer trusted: the stored index is not in force any more.
	r2 := newRigWith(t, st, []ed25519.PublicKey{rogue.Public().(ed25519.PublicKey)})
	if a := r2.lastAcks(); a.IndexRevision != 0 {
		t.Fatalf("a stored index signed by a key no longer trusted stayed in force: %+v", a)
	}
}

// Review regressions. A secret stored just before its mark (a kill between the two writes) is
// held at the next start, so an index that leaves it out deletes it.
func TestSecretStoredBeforeItsMarkIsDeletedByALaterIndex(t *testing.T) {
	st := store.NewMemory()
	s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "creds"}, Data: map[string][]byte{"k": []byte("v")}}
	d, _ := protocol.NewDesired(node, 1, s)
	b, _ := protocol.Encode(d)
	topic := tp.Desired(node, protocol.KindSecret, "default", "creds")
	_, idx := indexOf(t, 1, map[string][]byte{topic: b})
	st.UpdateMarks([]store.SyncMark{{Key: "index", Generation: 1, Digest: protocol.Digest(idx), Data: idx}}, nil)
	if err := st.PutObject(store.ObjectRecord{Kind: store.KindSecret, Namespace: "default", Name: "creds", Generation: 1, Secret: s, Source: source.Ref{Kind: source.MQTT, Origin: topic}}); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, st)
	_, idx2 := indexOf(t, 2, nil)
	r.send(tp.Index(node), idx2, true)
	if _, ok, _ := st.GetObject(store.KindSecret, "default", "creds"); ok {
		t.Errorf("secret creds still stored after index 2 left it out (acks %+v)", r.lastAcks())
	}
}

// A restarted node whose stored index lists an object it lacks asks for it even when the broker
// sends nothing at all (it lost its state).
func TestMissingAtStartIsAskedForWithoutAnyMessage(t *testing.T) {
	st := store.NewMemory()
	topic, msg := podMsg(t, "web", 1, "img")
	_, idx := indexOf(t, 1, map[string][]byte{topic: msg})
	st.UpdateMarks([]store.SyncMark{{Key: "index", Generation: 1, Digest: protocol.Digest(idx), Data: idx}}, nil)
	r := newRig(t, st)
	waitFor := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		n := len(r.resends)
		r.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(waitFor) {
			t.Fatal("the missing entry was never asked for")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Acks are compact while the broker holds the index in force and complete (every applied entry,
// for a writer to rebuild from) when it holds another (older, or cleared) or, after a reconnect,
// none: the node's marker, which comes back after the connection's retained messages, tells.
func TestAcksCompleteWhileTheBrokerLacksTheIndexInForce(t *testing.T) {
	r := newRig(t, store.NewMemory())
	ta, a := podMsg(t, "a", 2, "img")
	ti, idx := indexOf(t, 2, map[string][]byte{ta: a})
	_, old := indexOf(t, 1, nil)
	marker := tp.NodeMarker(node)
	r.sendMsg(Message{Topic: ta, Payload: a, Retained: true, Session: 1})
	r.sendMsg(Message{Topic: ti, Payload: idx, Retained: true, Session: 1})
	want := map[string]protocol.IndexEntry{"pods/default/a": {Generation: 2, Digest: protocol.Digest(a)}}
	step := func(what string, m Message, complete bool) {
		t.Helper()
		r.sendMsg(m)
		got := r.lastAcks()
		switch {
		case got.IndexRevision != 2 || got.IndexDigest != protocol.Digest(idx):
			t.Fatalf("%s: acks %+v, want revision 2 in force", what, got)
		case complete && (got.Compact || !maps.Equal(got.Applied, want)):
			t.Fatalf("%s: acks %+v, want complete ones listing a", what, got)
		case !complete && (!got.Compact || len(got.Applied) != 0):
			t.Fatalf("%s: acks %+v, want compact ones", what, got)
		}
	}
	step("the index in force on the broker", Message{Topic: marker, Payload: []byte("m1"), Session: 1}, false)
	step("the broker holds an older index", Message{Topic: ti, Payload: old, Retained: true, Session: 1}, true)
	step("the index in force again", Message{Topic: ti, Payload: idx, Retained: true, Session: 1}, false)
	step("a reconnect: the marker came back without the index", Message{Topic: marker, Payload: []byte("m2"), Session: 2}, true)
	step("a reconnect with the index", Message{Topic: ti, Payload: idx, Retained: true, Session: 3}, false)
	step("its marker", Message{Topic: marker, Payload: []byte("m3"), Session: 3}, false)
	step("an older connection's marker", Message{Topic: marker, Payload: []byte("m2"), Session: 2}, false)
	step("the index topic cleared", Message{Topic: ti, Payload: nil, Retained: true, Session: 3}, true)
}

// An object is asked for again only after it has been missing a whole settle period: one that a
// newer index listed just before the timer fired (its payload is on its way) waits for its own
// period instead of triggering a resync request at once. Fake time (synctest), so the periods are
// exact.
func TestSettleAsksOnlyForWhatWaitedAWholePeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, store.NewMemory()) // Settle: 50 ms
		ta, a := podMsg(t, "a", 1, "img")
		tb, b := podMsg(t, "b", 2, "img")
		ti, idx1 := indexOf(t, 1, map[string][]byte{ta: a})
		_, idx2 := indexOf(t, 2, map[string][]byte{ta: a, tb: b})
		resends := func() [][]string {
			synctest.Wait()
			r.mu.Lock()
			defer r.mu.Unlock()
			return slices.Clone(r.resends)
		}
		r.send(ti, idx1, true) // a missing: the timer is armed
		time.Sleep(40 * time.Millisecond)
		r.send(ti, idx2, true) // b missing too, 10 ms before the timer fires
		time.Sleep(20 * time.Millisecond)
		if got := resends(); len(got) != 1 || !slices.Equal(got[0], []string{"pods/default/a"}) {
			t.Fatalf("resync requests after the first period: %v, want one naming a alone", got)
		}
		time.Sleep(200 * time.Millisecond)
		if got := resends(); len(got) < 2 || !slices.Equal(got[1], []string{"pods/default/a", "pods/default/b"}) {
			t.Fatalf("resync requests after b's own period: %v, want the second naming a and b", got)
		}
	})
}

// A change costs one acks: acks naming objects just fetched are held back (AckHold) until those
// arrive, and sent when the hold ends if they have not. Fake time (synctest).
func TestAcksHeldBackWhileFetchedObjectsArrive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRigHolding(t, store.NewMemory(), nil, 500*time.Millisecond)
		acks := func() []protocol.Acks {
			synctest.Wait()
			r.mu.Lock()
			defer r.mu.Unlock()
			return slices.Clone(r.acks)
		}
		start := len(acks()) // the acks of the initial resync
		ta, a := podMsg(t, "a", 1, "img")
		ti, idx1 := indexOf(t, 1, map[string][]byte{ta: a})
		r.send(ti, idx1, true)
		time.Sleep(100 * time.Millisecond) // the fetch's round trip
		r.send(ta, a, true)
		if got := acks()[start:]; len(got) != 1 || got[0].IndexRevision != 1 || len(got[0].Missing) != 0 {
			t.Fatalf("acks after an index and its object: %+v, want one, naming nothing missing", got)
		}
		tb, b := podMsg(t, "b", 2, "img")
		_, idx2 := indexOf(t, 2, map[string][]byte{ta: a, tb: b})
		r.send(ti, idx2, true) // b never arrives
		time.Sleep(490 * time.Millisecond)
		if got := acks()[start:]; len(got) != 1 {
			t.Fatalf("acks sent %d ms into the hold: %+v", 490, got[1:])
		}
		time.Sleep(20 * time.Millisecond)
		if got := acks()[start:]; len(got) != 2 || got[1].IndexRevision != 2 || got[1].Missing["pods/default/b"].Generation != 2 {
			t.Fatalf("acks after the hold: %+v, want revision 2 naming b missing", got)
		}
	})
}

// The node learned the broker lacks its index (complete acks went out); the agent
// restarts. Until a connection shows the broker holds the index, its acks stay complete: compact
// ones, drained as soon as a connection is up, would overwrite the complete ones on a broker that
// still lacks the index, and a writer would then have nothing to rebuild from. (Found in review.)
func TestAcksAreCompleteAfterARestartUntilTheBrokerShowsTheIndex(t *testing.T) {
	st := store.NewMemory()
	r := newRig(t, st)
	ta, a := podMsg(t, "a", 2, "img")
	ti, idx := indexOf(t, 2, map[string][]byte{ta: a})
	r.sendMsg(Message{Topic: ta, Payload: a, Retained: true, Session: 1})
	r.sendMsg(Message{Topic: ti, Payload: idx, Retained: true, Session: 1})
	r.sendMsg(Message{Topic: tp.NodeMarker(node), Payload: []byte("m"), Session: 2}) // broker lost it
	if got := r.lastAcks(); got.Compact {
		t.Fatalf("before the restart: acks %+v, want complete", got)
	}
	r.stop()

	r2 := newRig(t, st)
	if got := r2.lastAcks(); got.Compact {
		t.Fatalf("after the restart, before any connection: acks %+v are compact, though the last thing the node knew is that the broker lacks revision %d", got, got.IndexRevision)
	}
}
