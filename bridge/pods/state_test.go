package pods

import (
	"crypto/ed25519"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
)

const nodeA = "edge-a"

func wantOf(t *testing.T, objs ...any) map[string]*object {
	t.Helper()
	out := map[string]*object{}
	for _, x := range objs {
		var o *object
		var err error
		switch v := x.(type) {
		case *v1.Pod:
			o, err = encodeObject(protocol.KindPod, v.Namespace, v.Name, SanitizePod(v))
		case *v1.ConfigMap:
			o, err = encodeObject(protocol.KindConfigMap, v.Namespace, v.Name, SanitizeConfigMap(v))
		case *v1.Secret:
			o, err = encodeObject(protocol.KindSecret, v.Namespace, v.Name, SanitizeSecret(v))
		}
		if err != nil {
			t.Fatal(err)
		}
		out[o.key()] = o
	}
	return out
}

// retain plays a plan into a retained-message map, as the broker would keep it: the exact
// payloads the plan publishes, then the index, then the cleared topics.
func retain(t *testing.T, retained map[string][]byte, p plan) {
	t.Helper()
	for _, w := range p.Writes {
		retained[topics.Desired(w.Msg.Node, w.Msg.Kind, w.Msg.Namespace, w.Msg.Name)] = w.Payload
	}
	if p.Index != nil {
		retained[topics.Index(p.Index.Node)] = p.IndexPayload
	}
	for _, k := range p.Clears {
		kind, ns, name, err := protocol.ParseObjectKey(k)
		if err != nil {
			t.Fatal(err)
		}
		delete(retained, topics.Desired(nodeA, kind, ns, name))
	}
}

func keysOf(p plan) map[string]int64 {
	out := map[string]int64{}
	for _, w := range p.Writes {
		out[w.Key] = w.Msg.Generation
	}
	return out
}

func mustPlan(t *testing.T, s *nodeState, want map[string]*object, terminating, resend map[string]bool, force bool) plan {
	t.Helper()
	iw := indexIfChanged
	if force {
		iw = indexRepublish
	}
	p, err := s.plan(nodeA, want, terminating, resend, iw, nil)
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	checkPlanDigests(t, p)
	return p
}

// checkPlanDigests checks that every entry of a plan's index that a write of the plan covers
// lists the digest of that write's exact payload, and that IndexDigest is the index payload's.
func checkPlanDigests(t *testing.T, p plan) {
	t.Helper()
	if p.Index == nil {
		return
	}
	for _, w := range p.Writes {
		e, ok := p.Index.Objects[w.Key]
		if !ok {
			t.Errorf("plan writes %s, which its index does not list", w.Key)
			continue
		}
		if e.Generation != w.Msg.Generation || e.Digest != protocol.Digest(w.Payload) {
			t.Errorf("index entry %s = %+v, the payload written has generation %d and digest %s", w.Key, e, w.Msg.Generation, protocol.Digest(w.Payload))
		}
	}
	if p.IndexDigest != protocol.Digest(p.IndexPayload) {
		t.Errorf("IndexDigest %s is not the digest of the index payload", p.IndexDigest)
	}
}

func TestPlanWritesChangesOnceAtTheNextGeneration(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-0123456789ab")
	cm := configMap("default", "web-config", map[string]string{"a": "1"})
	sec := secret("default", "web-secret", map[string][]byte{"token": []byte("s3cr3t")})
	s := newEmptyState()

	p := mustPlan(t, s, wantOf(t, pod, cm, sec), nil, nil, false)
	if got := keysOf(p); len(got) != 3 || got["pods/default/web-1"] != 1 || got["configmaps/default/web-config"] != 1 || got["secrets/default/web-secret"] != 1 {
		t.Fatalf("first plan writes %v, want the three objects at generation 1", got)
	}
	if p.Index == nil || p.Index.Revision != 1 || len(p.Index.Objects) != 3 {
		t.Fatalf("first index %+v, want revision 1 with 3 objects", p.Index)
	}
	s.commit(p)

	if p := mustPlan(t, s, wantOf(t, pod, cm, sec), nil, nil, false); !p.empty() {
		t.Fatalf("nothing changed, yet the plan writes %v (index %+v)", keysOf(p), p.Index)
	}

	// A status write changes resourceVersion and status only: nothing to send.
	pod2 := pod.DeepCopy()
	pod2.ResourceVersion = "9999"
	pod2.Status.Phase = v1.PodRunning
	if p := mustPlan(t, s, wantOf(t, pod2, cm, sec), nil, nil, false); !p.empty() {
		t.Fatalf("a status change republishes %v", keysOf(p))
	}

	cm2 := cm.DeepCopy()
	cm2.Data["a"] = "2"
	before := s.index
	p = mustPlan(t, s, wantOf(t, pod, cm2, sec), nil, nil, false)
	if got := keysOf(p); len(got) != 1 || got["configmaps/default/web-config"] != 2 {
		t.Fatalf("a configMap change writes %v, want only the configMap at generation 2", got)
	}
	if p.Index == nil || p.Index.Revision != 2 || p.Index.Objects["pods/default/web-1"] != before["pods/default/web-1"] ||
		p.Index.Objects["configmaps/default/web-config"].Generation != 2 {
		t.Fatalf("index after the configMap change: %+v", p.Index)
	}
	s.commit(p)

	// The pod goes (deleted outright): the index leaves it out, and its secret too; their
	// retained topics are cleared; nothing is written for them.
	p = mustPlan(t, s, wantOf(t, cm2), nil, nil, false)
	if len(p.Writes) != 0 {
		t.Fatalf("removal writes %v, want nothing", keysOf(p))
	}
	if _, listed := p.Index.Objects["pods/default/web-1"]; listed || p.Index.Revision != 3 || len(p.Index.Objects) != 1 {
		t.Fatalf("index after removal: %+v, want revision 3 with the configMap only", p.Index)
	}
	if len(p.Clears) != 2 || p.Clears[0] != "pods/default/web-1" || p.Clears[1] != "secrets/default/web-secret" {
		t.Fatalf("removal clears %v, want the pod and the secret", p.Clears)
	}
	s.commit(p)
	if r := s.dropRevision("pods/default/web-1"); r != 3 {
		t.Errorf("drop revision of the removed pod %d, want 3", r)
	}
	if p := mustPlan(t, s, wantOf(t, cm2), nil, nil, false); !p.empty() {
		t.Fatalf("the removal is planned again: writes %v, clears %v, index %+v", keysOf(p), p.Clears, p.Index)
	}
}

func TestPlanGivesATerminatingPodNeverSentARevision(t *testing.T) {
	s := newEmptyState()
	s.counter = 7
	p := mustPlan(t, s, nil, map[string]bool{"pods/default/gone": true}, nil, false)
	if len(p.Writes) != 0 || p.Index == nil || p.Index.Revision != 8 || len(p.Index.Objects) != 0 {
		t.Fatalf("plan writes %v, index %+v: want only an empty index at 8", keysOf(p), p.Index)
	}
	s.commit(p)
	if r := s.dropRevision("pods/default/gone"); r != 8 {
		t.Errorf("drop revision %d, want 8 (the index that leaves the pod out)", r)
	}
	if p := mustPlan(t, s, nil, map[string]bool{"pods/default/gone": true}, nil, false); !p.empty() {
		t.Fatalf("second plan writes %v, index %+v", keysOf(p), p.Index)
	}
}

func TestRestartFromSnapshotWritesNothingAndCountsAbove(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-0123456789ab")
	cm := configMap("default", "web-config", map[string]string{"a": "1"})
	retained := map[string][]byte{}
	first := newEmptyState()
	p := mustPlan(t, first, wantOf(t, pod, cm), map[string]bool{"pods/default/old": true}, nil, false)
	retain(t, retained, p)
	first.commit(p)
	// The node's acks show a generation above the index (another writer, or a lost index).
	retained[topics.Acks(nodeA)] = mustEncode(t, &protocol.Acks{Node: nodeA, Session: 1, IndexRevision: 1,
		Applied: map[string]protocol.IndexEntry{"pods/default/web-1": p.Index.Objects["pods/default/web-1"]},
		Refused: map[string]protocol.Refusal{"pods/default/x": {Generation: 40, Reason: "r"}}})
	// And someone else's payload the bridge cannot read.
	retained[topics.Desired(nodeA, protocol.KindPod, "default", "junk")] = []byte("{not json")
	retained[topics.Node("edge-b")+"/index"] = mustEncode(t, &protocol.Index{Node: "edge-b", Revision: 99})

	s, problems := newNodeState(nodeA, topics, retained, 0, nil)
	if len(problems) != 1 {
		t.Errorf("problems %v, want the one unreadable payload", problems)
	}
	if s.counter != 40 {
		t.Errorf("counter %d after restart, want 40 (the highest generation in the acks)", s.counter)
	}
	for k, e := range s.index {
		if got := s.entries[k].Digest; got != e.Digest {
			t.Errorf("%s: retained payload digest %s, the retained index lists %s", k, got, e.Digest)
		}
	}
	p = mustPlan(t, s, wantOf(t, pod, cm), map[string]bool{"pods/default/old": true}, nil, false)
	if len(p.Writes) != 0 || p.Index != nil || len(p.Clears) != 1 || p.Clears[0] != "pods/default/junk" {
		t.Fatalf("after restart the plan writes %v, index %+v, clears %v: want only the unreadable object cleared (no index lists it)",
			keysOf(p), p.Index, p.Clears)
	}
	retain(t, retained, p)
	s, _ = newNodeState(nodeA, topics, retained, 0, nil)
	if p := mustPlan(t, s, wantOf(t, pod, cm), map[string]bool{"pods/default/old": true}, nil, false); !p.empty() {
		t.Fatalf("a restart over the same retained state writes %v (index %+v, clears %v)", keysOf(p), p.Index, p.Clears)
	}
}

func TestAcksTopCountsEveryV2Field(t *testing.T) {
	for _, tc := range []struct {
		name string
		a    protocol.Acks
	}{
		{"indexRevision", protocol.Acks{IndexRevision: 50}},
		{"applied", protocol.Acks{IndexRevision: 1, Applied: map[string]protocol.IndexEntry{"pods/default/a": {Generation: 50}}}},
		{"refused", protocol.Acks{IndexRevision: 1, Refused: map[string]protocol.Refusal{"pods/default/a": {Generation: 50}}}},
		{"missing", protocol.Acks{IndexRevision: 1, Missing: map[string]protocol.IndexEntry{"pods/default/a": {Generation: 50}}}},
		{"indexRefused", protocol.Acks{IndexRevision: 1, IndexRefused: &protocol.Refusal{Generation: 50}}},
	} {
		if got := tc.a.Top(); got != 50 {
			t.Errorf("%s: acksTop %d, want 50", tc.name, got)
		}
	}
}

func TestPlanRepairsALostIndexAndAnswersResync(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-0123456789ab")
	retained := map[string][]byte{}
	first := newEmptyState()
	p := mustPlan(t, first, wantOf(t, pod), nil, nil, false)
	retain(t, retained, p)
	sent := p.Writes[0]
	delete(retained, topics.Index(nodeA)) // a crash between the object and the index
	s, _ := newNodeState(nodeA, topics, retained, 0, nil)
	p = mustPlan(t, s, wantOf(t, pod), nil, nil, false)
	if want := (protocol.IndexEntry{Generation: 1, Digest: sent.Digest}); len(p.Writes) != 0 || p.Index == nil ||
		p.Index.Objects["pods/default/web-1"] != want || p.Index.Revision != 2 {
		t.Fatalf("plan %v index %+v: want only an index listing the object at 1 with the retained payload's digest", keysOf(p), p.Index)
	}
	s.commit(p)
	p = mustPlan(t, s, wantOf(t, pod), nil, map[string]bool{"pods/default/web-1": true}, true)
	if got := keysOf(p); len(got) != 1 || got["pods/default/web-1"] != 1 || p.Index == nil || p.Index.Revision != 2 {
		t.Fatalf("resync plan %v index %+v: want the object again at 1 and the index at 2", got, p.Index)
	}
	if string(p.Writes[0].Payload) != string(sent.Payload) {
		t.Errorf("the resent object is not the same bytes as the retained one")
	}
}

// A retained object whose bytes this bridge would encode differently (another writer's encoding)
// is listed with its own digest; asked for again, it goes out as a new generation, so the index
// never lists a digest the broker does not hold.
func TestResendOfAnotherEncodingIsANewGeneration(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-0123456789ab")
	o := wantOf(t, pod)["pods/default/web-1"]
	w, err := newWrite(nodeA, o.key(), o, 5)
	if err != nil {
		t.Fatal(err)
	}
	other := append([]byte(" "), w.Payload...) // the same JSON, other bytes
	retained := map[string][]byte{topics.Desired(nodeA, protocol.KindPod, "default", "web-1"): other}
	s, problems := newNodeState(nodeA, topics, retained, 0, nil)
	if len(problems) != 0 {
		t.Fatal(problems)
	}
	p := mustPlan(t, s, wantOf(t, pod), nil, nil, false)
	if len(p.Writes) != 0 || p.Index.Objects["pods/default/web-1"] != (protocol.IndexEntry{Generation: 5, Digest: protocol.Digest(other)}) {
		t.Fatalf("plan writes %v, index %+v: want the retained payload listed as it is", keysOf(p), p.Index)
	}
	s.commit(p)
	p = mustPlan(t, s, wantOf(t, pod), nil, map[string]bool{"pods/default/web-1": true}, true)
	if got := keysOf(p); len(got) != 1 || got["pods/default/web-1"] != 7 || p.Index.Revision != 7 {
		t.Fatalf("resend writes %v, index %+v: want the object at a new generation 7", got, p.Index)
	}
}

func TestGoneFromNode(t *testing.T) {
	const key = "pods/default/web-1"
	e := protocol.IndexEntry{Generation: 4, Digest: protocol.Digest([]byte("x"))}
	other := map[string]protocol.IndexEntry{"pods/default/other": e}
	// The bridge's own index of revision 5 (it left the key out), as compact acks name it.
	mine := &protocol.Index{Revision: 5, Objects: other, PayloadDigest: protocol.Digest([]byte("index 5"))}
	for _, tc := range []struct {
		name string
		acks *protocol.Acks
		rev  int64
		gone bool
	}{
		{"no acks", nil, 5, false},
		{"no drop revision", &protocol.Acks{IndexRevision: 9}, 0, false},
		{"acks below the dropping revision", &protocol.Acks{IndexRevision: 4}, 5, false},
		{"still applied", &protocol.Acks{IndexRevision: 5, Applied: map[string]protocol.IndexEntry{key: e}}, 5, false},
		{"still refused", &protocol.Acks{IndexRevision: 5, Refused: map[string]protocol.Refusal{key: {Generation: 4, Reason: "r"}}}, 5, false},
		{"still missing", &protocol.Acks{IndexRevision: 6, Missing: map[string]protocol.IndexEntry{key: e}}, 5, false},
		{"at the dropping revision, not named", &protocol.Acks{IndexRevision: 5, Applied: other}, 5, true},
		{"above it, not named", &protocol.Acks{IndexRevision: 8}, 5, true},
		// Compact acks list only exceptions: they confirm against the index they name.
		{"compact, the bridge's index", &protocol.Acks{Compact: true, IndexRevision: 5, IndexDigest: mine.PayloadDigest}, 5, true},
		{"compact, another index of that revision", &protocol.Acks{Compact: true, IndexRevision: 5, IndexDigest: protocol.Digest([]byte("theirs"))}, 5, false},
		{"compact, a newer index", &protocol.Acks{Compact: true, IndexRevision: 8, IndexDigest: protocol.Digest([]byte("index 8"))}, 5, false},
	} {
		if got := goneFromNode(tc.acks, key, tc.rev, mine); got != tc.gone {
			t.Errorf("%s: goneFromNode %v, want %v", tc.name, got, tc.gone)
		}
	}
}

func TestNodeRunsAnotherIndex(t *testing.T) {
	d1, d2 := protocol.Digest([]byte("1")), protocol.Digest([]byte("2"))
	applied := map[string]protocol.IndexEntry{"pods/default/a": {Generation: 3}}
	held := &nodeState{indexRev: 10, indexDigest: d1}
	none := newEmptyState()
	for _, tc := range []struct {
		name string
		acks *protocol.Acks
		s    *nodeState
		want bool
	}{
		{"no acks", nil, held, false},
		{"the retained index", &protocol.Acks{IndexRevision: 10, IndexDigest: d1}, held, false},
		{"behind", &protocol.Acks{IndexRevision: 9, IndexDigest: d2}, held, false},
		{"newer", &protocol.Acks{IndexRevision: 11, IndexDigest: d2}, held, true},
		{"same revision, other bytes", &protocol.Acks{IndexRevision: 10, IndexDigest: d2}, held, true},
		{"same revision, no digest (older node)", &protocol.Acks{IndexRevision: 10}, held, false},
		{"refused the retained one", &protocol.Acks{IndexRevision: 10, IndexDigest: d2,
			IndexRefused: &protocol.Refusal{Generation: 10, Digest: d1, Reason: "conflict"}}, held, false},
		{"refused an older one", &protocol.Acks{IndexRevision: 11, IndexDigest: d2,
			IndexRefused: &protocol.Refusal{Generation: 8, Reason: "stale"}}, held, true},
		{"no index anywhere, objects applied", &protocol.Acks{Applied: applied}, none, true},
		{"no index anywhere, nothing applied", &protocol.Acks{}, none, false},
		{"no index on the node yet", &protocol.Acks{Applied: applied}, held, false},
	} {
		if got := nodeRunsAnotherIndex(tc.acks, tc.s); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// An object that cannot be sent (too large) stays listed as the retained state has it: with its
// retained generation and digest, or, when the broker no longer holds its payload, with the entry
// the index has; it is never left out (which would delete it from the node) nor cleared.
func TestStuckObjectKeepsItsEntry(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-0123456789ab")
	cm := configMap("default", "web-config", map[string]string{"a": "1"})
	retained := map[string][]byte{}
	first := newEmptyState()
	p := mustPlan(t, first, wantOf(t, pod, cm), nil, nil, false)
	retain(t, retained, p)
	listed := p.Index.Objects

	cm2 := cm.DeepCopy()
	cm2.Data["a"] = "a change too large to send"
	stuck := func() map[string]*object {
		w := wantOf(t, pod, cm2)
		w["configmaps/default/web-config"].Stuck = true
		return w
	}
	s, _ := newNodeState(nodeA, topics, retained, 0, nil)
	if p := mustPlan(t, s, stuck(), nil, nil, false); !p.empty() {
		t.Fatalf("a stuck change writes %v, index %+v, clears %v; want nothing", keysOf(p), p.Index, p.Clears)
	}
	// The broker lost the configMap's payload but kept the index.
	delete(retained, topics.Desired(nodeA, protocol.KindConfigMap, "default", "web-config"))
	s, _ = newNodeState(nodeA, topics, retained, 0, nil)
	if p := mustPlan(t, s, stuck(), nil, nil, false); !p.empty() {
		t.Fatalf("a stuck object without its payload: writes %v, index %+v, clears %v; want nothing", keysOf(p), p.Index, p.Clears)
	}
	// Another change (the pod) rewrites the index: the stuck object keeps its entry.
	pod2 := pod.DeepCopy()
	pod2.Labels["v"] = "2"
	w := stuck()
	for k, o := range wantOf(t, pod2) {
		w[k] = o
	}
	p = mustPlan(t, s, w, nil, nil, false)
	if p.Index == nil || p.Index.Objects["configmaps/default/web-config"] != listed["configmaps/default/web-config"] || len(p.Clears) != 0 {
		t.Fatalf("index %+v, clears %v: want the stuck configMap listed as %+v", p.Index, p.Clears, listed["configmaps/default/web-config"])
	}
}

// A signing bridge goes past the newest revision it knows to be genuine (its own signed index)
// by at most maxCounterStep on figures it cannot verify: forged acks claiming a generation near
// the ceiling do not make it sign an index there (where the node would be frozen). An unsigned
// bridge has nothing to anchor to, but never writes past the ceiling.
func TestForgedCounterIsBoundedForASigningBridge(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-0123456789ab")
	retained := map[string][]byte{}
	first := newEmptyState()
	p, err := first.plan(nodeA, wantOf(t, pod), nil, nil, indexIfChanged, key)
	if err != nil {
		t.Fatal(err)
	}
	retain(t, retained, p)
	retained[topics.Acks(nodeA)] = mustEncode(t, &protocol.Acks{Node: nodeA, Session: 1, IndexRevision: 1,
		IndexRefused: &protocol.Refusal{Generation: maxCounter - 2, Reason: "forged"}})

	s, _ := newNodeState(nodeA, topics, retained, 0, []ed25519.PublicKey{pub})
	if s.counter != 1+maxCounterStep {
		t.Errorf("signing bridge: counter %d over forged acks, want the signed revision 1 + maxCounterStep", s.counter)
	}
	// A figure within the step is followed (a node that went on under another writer's signed
	// revisions the bridge cannot check).
	retained[topics.Acks(nodeA)] = mustEncode(t, &protocol.Acks{Node: nodeA, Session: 1, IndexRevision: 40})
	if s, _ := newNodeState(nodeA, topics, retained, 0, []ed25519.PublicKey{pub}); s.counter != 40 {
		t.Errorf("signing bridge: counter %d, want the acks' 40", s.counter)
	}

	// Unsigned: the forged figure is taken, and the next write is refused at the ceiling.
	retained[topics.Acks(nodeA)] = mustEncode(t, &protocol.Acks{Node: nodeA, Session: 1, IndexRevision: 1,
		IndexRefused: &protocol.Refusal{Generation: maxCounter, Reason: "forged"}})
	s, _ = newNodeState(nodeA, topics, retained, 0, nil)
	pod2 := apiPod("default", "web-2", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-0123456789ac")
	if _, err := s.plan(nodeA, wantOf(t, pod, pod2), nil, nil, indexIfChanged, nil); err == nil || !strings.Contains(err.Error(), "past what a writer goes on from") {
		t.Errorf("a write at the ceiling = %v, want a refusal", err)
	}
}
