package pods

import (
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

// retain plays a plan into a retained-message map, as the broker would keep it.
func retain(t *testing.T, retained map[string][]byte, p plan) {
	t.Helper()
	for _, w := range p.Writes {
		retained[topics.Desired(w.Msg.Node, w.Msg.Kind, w.Msg.Namespace, w.Msg.Name)] = mustEncode(t, w.Msg)
	}
	if p.Index != nil {
		retained[topics.Index(p.Index.Node)] = mustEncode(t, p.Index)
	}
}

func keysOf(p plan) map[string]int64 {
	out := map[string]int64{}
	for _, w := range p.Writes {
		g := w.Msg.Generation
		if w.Msg.Deleted {
			g = -g
		}
		out[w.Key] = g
	}
	return out
}

func TestPlanWritesChangesOnceAtTheNextGeneration(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-0123456789ab")
	cm := configMap("default", "web-config", map[string]string{"a": "1"})
	sec := secret("default", "web-secret", map[string][]byte{"token": []byte("s3cr3t")})
	s := &nodeState{entries: map[string]entry{}, index: map[string]int64{}}

	p := s.plan(nodeA, wantOf(t, pod, cm, sec), nil, nil, false)
	if got := keysOf(p); len(got) != 3 || got["pods/default/web-1"] != 1 || got["configmaps/default/web-config"] != 1 || got["secrets/default/web-secret"] != 1 {
		t.Fatalf("first plan writes %v, want the three objects at generation 1", got)
	}
	if p.Index == nil || p.Index.Revision != 1 || len(p.Index.Objects) != 3 {
		t.Fatalf("first index %+v, want revision 1 with 3 objects", p.Index)
	}
	s.commit(p)

	if p := s.plan(nodeA, wantOf(t, pod, cm, sec), nil, nil, false); !p.empty() {
		t.Fatalf("nothing changed, yet the plan writes %v (index %+v)", keysOf(p), p.Index)
	}

	// A status write changes resourceVersion and status only: nothing to send.
	pod2 := pod.DeepCopy()
	pod2.ResourceVersion = "9999"
	pod2.Status.Phase = v1.PodRunning
	if p := s.plan(nodeA, wantOf(t, pod2, cm, sec), nil, nil, false); !p.empty() {
		t.Fatalf("a status change republishes %v", keysOf(p))
	}

	cm2 := cm.DeepCopy()
	cm2.Data["a"] = "2"
	p = s.plan(nodeA, wantOf(t, pod, cm2, sec), nil, nil, false)
	if got := keysOf(p); len(got) != 1 || got["configmaps/default/web-config"] != 2 {
		t.Fatalf("a configMap change writes %v, want only the configMap at generation 2", got)
	}
	if p.Index == nil || p.Index.Revision != 2 || p.Index.Objects["pods/default/web-1"] != 1 || p.Index.Objects["configmaps/default/web-config"] != 2 {
		t.Fatalf("index after the configMap change: %+v", p.Index)
	}
	s.commit(p)

	// The pod goes (deleted outright): a tombstone, and the index omits it; its secret goes too.
	p = s.plan(nodeA, wantOf(t, cm2), nil, nil, false)
	if got := keysOf(p); len(got) != 2 || got["pods/default/web-1"] != -3 || got["secrets/default/web-secret"] != -3 {
		t.Fatalf("removal writes %v, want tombstones at generation 3", got)
	}
	if _, listed := p.Index.Objects["pods/default/web-1"]; listed || p.Index.Revision != 3 {
		t.Fatalf("index after removal: %+v", p.Index)
	}
	s.commit(p)
	if p := s.plan(nodeA, wantOf(t, cm2), nil, nil, false); !p.empty() {
		t.Fatalf("tombstones are written again: %v", keysOf(p))
	}
}

func TestPlanTombstonesATerminatingPodNeverSent(t *testing.T) {
	s := &nodeState{counter: 7, entries: map[string]entry{}, index: map[string]int64{}}
	p := s.plan(nodeA, nil, map[string]bool{"pods/default/gone": true}, nil, false)
	if got := keysOf(p); len(got) != 1 || got["pods/default/gone"] != -8 {
		t.Fatalf("writes %v, want a tombstone at 8", got)
	}
	s.commit(p)
	if p := s.plan(nodeA, nil, map[string]bool{"pods/default/gone": true}, nil, false); !p.empty() {
		t.Fatalf("second plan writes %v", keysOf(p))
	}
}

func TestRestartFromSnapshotWritesNothingAndCountsAbove(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-0123456789ab")
	cm := configMap("default", "web-config", map[string]string{"a": "1"})
	retained := map[string][]byte{}
	first := &nodeState{entries: map[string]entry{}, index: map[string]int64{}}
	p := first.plan(nodeA, wantOf(t, pod, cm), map[string]bool{"pods/default/old": true}, nil, false)
	retain(t, retained, p)
	first.commit(p)
	// The node's acks show a generation above the index (another writer, or a lost index).
	retained[topics.Acks(nodeA)] = mustEncode(t, &protocol.Acks{Node: nodeA, Session: 1, IndexRevision: 1,
		Applied: map[string]int64{"pods/default/web-1": 1}, Refused: map[string]protocol.Refusal{"pods/default/x": {Generation: 40, Reason: "r"}}})
	// And someone else's payload the bridge cannot read.
	retained[topics.Desired(nodeA, protocol.KindPod, "default", "junk")] = []byte("{not json")
	retained[topics.Node("edge-b")+"/index"] = mustEncode(t, &protocol.Index{Node: "edge-b", Revision: 99})

	s, problems := newNodeState(nodeA, topics, retained, 0)
	if len(problems) != 1 {
		t.Errorf("problems %v, want the one unreadable payload", problems)
	}
	if s.counter != 40 {
		t.Errorf("counter %d after restart, want 40 (the highest generation in the acks)", s.counter)
	}
	p = s.plan(nodeA, wantOf(t, pod, cm), map[string]bool{"pods/default/old": true}, nil, false)
	if got := keysOf(p); len(got) != 1 || got["pods/default/junk"] != -41 {
		t.Fatalf("after restart the plan writes %v, want only a tombstone for the unreadable object at 41", got)
	}
	if p.Index.Objects["pods/default/web-1"] != 1 || p.Index.Objects["configmaps/default/web-config"] != 1 || p.Index.Revision != 41 {
		t.Fatalf("index %+v: the unchanged objects must keep generation 1", p.Index)
	}
	delete(retained, topics.Desired(nodeA, protocol.KindPod, "default", "junk"))
	s, _ = newNodeState(nodeA, topics, retained, 0)
	if p := s.plan(nodeA, wantOf(t, pod, cm), map[string]bool{"pods/default/old": true}, nil, false); !p.empty() {
		t.Fatalf("a restart over the same retained state writes %v (index %+v)", keysOf(p), p.Index)
	}
}

func TestPlanRepairsALostIndexAndAnswersResync(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-0123456789ab")
	retained := map[string][]byte{}
	first := &nodeState{entries: map[string]entry{}, index: map[string]int64{}}
	p := first.plan(nodeA, wantOf(t, pod), nil, nil, false)
	retain(t, retained, p)
	delete(retained, topics.Index(nodeA)) // a crash between the object and the index
	s, _ := newNodeState(nodeA, topics, retained, 0)
	p = s.plan(nodeA, wantOf(t, pod), nil, nil, false)
	if len(p.Writes) != 0 || p.Index == nil || p.Index.Objects["pods/default/web-1"] != 1 || p.Index.Revision != 2 {
		t.Fatalf("plan %v index %+v: want only an index listing the object at 1", keysOf(p), p.Index)
	}
	s.commit(p)
	p = s.plan(nodeA, wantOf(t, pod), nil, map[string]bool{"pods/default/web-1": true}, true)
	if got := keysOf(p); len(got) != 1 || got["pods/default/web-1"] != 1 || p.Index == nil || p.Index.Revision != 2 {
		t.Fatalf("resync plan %v index %+v: want the object again at 1 and the index at 2", got, p.Index)
	}
}
