package pods

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/prom"
	"github.com/mqlet/mqlet/internal/testpki"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

type harness struct {
	t      *testing.T
	kube   *fake.Clientset
	broker *memBroker
	c      *Controller

	mu    sync.Mutex
	syncs map[string]int // queue+"/"+key -> syncs done
	errs  map[string]int // queue+"/"+key -> syncs that failed
	logs  logBuffer
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// logBuffer keeps what the controller logs, for tests that check a warning.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func start(t *testing.T, served []string, objs ...runtime.Object) *harness {
	t.Helper()
	return startSigning(t, nil, served, objs...)
}

// startSigning is start with the bridge signing its indexes with key.
func startSigning(t *testing.T, key ed25519.PrivateKey, served []string, objs ...runtime.Object) *harness {
	t.Helper()
	return startWith(t, func(o *Options) { o.SigningKey = key }, served, objs...)
}

// startWith is start with the options changed by opt.
func startWith(t *testing.T, opt func(*Options), served []string, objs ...runtime.Object) *harness {
	t.Helper()
	h := &harness{t: t, kube: fake.NewClientset(objs...), broker: newMemBroker(), syncs: map[string]int{}, errs: map[string]int{}}
	factory := informers.NewSharedInformerFactory(h.kube, 0)
	isServed := map[string]bool{}
	for _, n := range served {
		isServed[n] = true
	}
	o := Options{Kube: h.kube, Factory: factory, Broker: h.broker, Topics: topics,
		Served: func(n string) bool { return isServed[n] }, Metrics: prom.NewRegistry(),
		Log:      slog.New(slog.NewTextHandler(&h.logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Debounce: 5 * time.Millisecond}
	opt(&o)
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	c.synced = func(queue, key string, err error) {
		h.mu.Lock()
		h.syncs[queue+"/"+key]++
		if err != nil {
			h.errs[queue+"/"+key]++
		}
		h.mu.Unlock()
	}
	h.c = c
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		factory.Shutdown()
	})
	return h
}

func (h *harness) count(queue, key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.syncs[queue+"/"+key]
}

// after runs action and waits until the queue has synced key at least once more: the positive
// signal that the action was looked at.
func (h *harness) after(queue, key string, action func()) {
	h.t.Helper()
	n := h.count(queue, key)
	action()
	waitFor(h.t, queue+" sync of "+key, func() bool { return h.count(queue, key) > n })
}

func (h *harness) desired(node string, kind protocol.ObjectKind, ns, name string) *protocol.DesiredObject {
	h.t.Helper()
	var b []byte
	waitFor(h.t, "retained "+name, func() bool { b = h.broker.get(topics.Desired(node, kind, ns, name)); return b != nil })
	return desiredOf(h.t, b, node, kind, ns, name)
}

func (h *harness) deletes() []k8stesting.DeleteActionImpl {
	var out []k8stesting.DeleteActionImpl
	for _, a := range h.kube.Actions() {
		if d, ok := a.(k8stesting.DeleteActionImpl); ok && d.GetResource().Resource == "pods" {
			out = append(out, d)
		}
	}
	return out
}

func (h *harness) statusUpdates() int {
	n := 0
	for _, a := range h.kube.Actions() {
		if a.GetVerb() == "update" && a.GetSubresource() == "status" {
			n++
		}
	}
	return n
}

func statusPayload(t *testing.T, node string, p *v1.Pod, st v1.PodStatus, deleted bool) []byte {
	t.Helper()
	ps := &protocol.PodStatus{Node: node, Namespace: p.Namespace, Name: p.Name, UID: p.UID, Source: "mqtt", Generation: 1, Deleted: deleted}
	if !deleted {
		run := SanitizePod(p)
		run.Status = st
		ps.Object = run
	}
	return mustEncode(t, ps)
}

func statusTopic(node string, p *v1.Pod) protocol.Topic {
	return protocol.Topic{Class: protocol.ClassPodStatus, Node: node, Kind: protocol.KindPod, Namespace: p.Namespace, Name: p.Name}
}

// index is the node's retained index, decoded.
func (h *harness) index(node string) *protocol.Index {
	h.t.Helper()
	b := h.broker.get(topics.Index(node))
	if b == nil {
		return nil
	}
	idx, err := protocol.DecodeIndex(protocol.Topic{Class: protocol.ClassIndex, Node: node}, b, 0)
	if err != nil {
		h.t.Fatalf("retained index of %s: %v", node, err)
	}
	return idx
}

// dropped waits for an index that leaves every key out and for their retained topics to be
// cleared, and returns that index.
func (h *harness) dropped(node string, keys ...string) *protocol.Index {
	h.t.Helper()
	var idx *protocol.Index
	waitFor(h.t, fmt.Sprintf("an index without %v and their topics cleared", keys), func() bool {
		if idx = h.index(node); idx == nil {
			return false
		}
		for _, k := range keys {
			kind, ns, name, err := protocol.ParseObjectKey(k)
			if err != nil {
				h.t.Fatal(err)
			}
			if _, listed := idx.Objects[k]; listed || h.broker.get(topics.Desired(node, kind, ns, name)) != nil {
				return false
			}
		}
		return true
	})
	return idx
}

func acksTopic(node string) protocol.Topic {
	return protocol.Topic{Class: protocol.ClassAcks, Node: node}
}

func markDeleted(t *testing.T, h *harness, pods ...*v1.Pod) {
	t.Helper()
	now := metav1.Now()
	for _, p := range pods {
		p := p.DeepCopy()
		p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &now, ptr(int64(30))
		if _, err := h.kube.CoreV1().Pods(p.Namespace).Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDeletionWaitsForTheNodesConfirmation(t *testing.T) {
	ran := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	never := apiPod("default", "web-2", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000002")
	h := start(t, []string{nodeA}, ran, never,
		configMap("default", "web-config", map[string]string{"a": "1"}),
		secret("default", "web-secret", map[string][]byte{"token": []byte("x")}))
	h.desired(nodeA, protocol.KindPod, "default", "web-1")
	h.desired(nodeA, protocol.KindPod, "default", "web-2")
	// The node runs web-1.
	h.after("status", topics.PodStatus(nodeA, "default", "web-1"), func() {
		h.c.Handle(statusTopic(nodeA, ran), statusPayload(t, nodeA, ran, v1.PodStatus{Phase: v1.PodRunning}, false))
	})

	markDeleted(t, h, ran, never)
	idx := h.dropped(nodeA, "pods/default/web-1", "pods/default/web-2")
	// The node has confirmed nothing yet (offline): both stay Terminating.
	h.after("node", nodeA, func() { h.c.NodeServed(nodeA) })
	if d := h.deletes(); len(d) != 0 {
		t.Fatalf("pods deleted before the node confirmed: %+v", d)
	}

	// The node takes the index in: web-2 never ran there, so that is confirmation enough;
	// web-1 still runs (grace period), so it waits for the node to report it gone.
	h.after("node", nodeA, func() {
		h.c.Handle(acksTopic(nodeA), mustEncode(t, &protocol.Acks{Node: nodeA, Session: 1,
			IndexRevision: idx.Revision, IndexDigest: protocol.Digest(h.broker.get(topics.Index(nodeA))), Applied: idx.Objects}))
	})
	d := h.deletes()
	if len(d) != 1 || d[0].GetName() != "web-2" {
		t.Fatalf("deletes after the acks: %+v, want web-2 only", d)
	}
	if g := d[0].DeleteOptions.GracePeriodSeconds; g == nil || *g != 0 {
		t.Errorf("grace period %v, want 0", g)
	}
	if pc := d[0].DeleteOptions.Preconditions; pc == nil || pc.UID == nil || *pc.UID != never.UID {
		t.Errorf("preconditions %+v, want uid %s", pc, never.UID)
	}

	// A "gone" status of another uid confirms nothing.
	other := ran.DeepCopy()
	other.UID = "6f1c2d3e-aaaa-4bbb-8ccc-0000000000ff"
	h.after("status", topics.PodStatus(nodeA, "default", "web-1"), func() {
		h.c.Handle(statusTopic(nodeA, ran), statusPayload(t, nodeA, other, v1.PodStatus{}, true))
	})
	if d := h.deletes(); len(d) != 1 {
		t.Fatalf("a gone status of another uid deleted the pod: %+v", d)
	}
	h.c.Handle(statusTopic(nodeA, ran), statusPayload(t, nodeA, ran, v1.PodStatus{}, true))
	waitFor(t, "web-1 deleted", func() bool { return len(h.deletes()) == 2 })
	if d := h.deletes()[1]; d.GetName() != "web-1" || *d.DeleteOptions.Preconditions.UID != ran.UID || *d.DeleteOptions.GracePeriodSeconds != 0 {
		t.Errorf("second delete %+v", d)
	}
}

// A deletion is confirmed by the node's acks only under the v2 rule: acks at or above the revision
// of the index that left the pod out, naming the pod in none of applied, refused and missing.
// Acks still listing it, or older than that index, confirm nothing; and the retained object is
// cleared only once that index is out.
func TestDeletionConfirmedOnlyByTheV2AcksRule(t *testing.T) {
	keep := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	keep.Spec.Containers[0].Env = nil
	keep.Spec.Volumes = keep.Spec.Volumes[1:]
	keep.Spec.Containers[0].VolumeMounts = keep.Spec.Containers[0].VolumeMounts[1:]
	gone := keep.DeepCopy()
	gone.Name, gone.UID = "web-2", "6f1c2d3e-aaaa-4bbb-8ccc-000000000002"
	h := start(t, []string{nodeA}, keep, gone)
	sent := h.desired(nodeA, protocol.KindPod, "default", "web-2")
	var before *protocol.Index
	waitFor(t, "an index of both pods", func() bool { before = h.index(nodeA); return before != nil && len(before.Objects) == 2 })
	podTopic := topics.Desired(nodeA, protocol.KindPod, "default", "web-2")

	markDeleted(t, h, gone)
	idx := h.dropped(nodeA, "pods/default/web-2")
	if idx.Revision <= before.Revision {
		t.Fatalf("the index leaving web-2 out has revision %d, not above %d", idx.Revision, before.Revision)
	}
	// The retained object went only after the index that leaves it out.
	h.broker.mu.Lock()
	log := append([]string(nil), h.broker.log...)
	h.broker.mu.Unlock()
	iIndex, iClear := -1, -1
	for i, topic := range log {
		if topic == topics.Index(nodeA) {
			iIndex = i
		}
		if topic == podTopic {
			iClear = i
		}
	}
	if iClear < iIndex {
		t.Errorf("publishes %v: web-2's topic was cleared before the index that leaves it out", log)
	}
	if v := h.c.m.cleared.Value(); v != 1 {
		t.Errorf("cleared metric %v, want 1", v)
	}

	keepEntry := idx.Objects["pods/default/web-1"]
	sentEntry := before.Objects["pods/default/web-2"]
	if sentEntry.Generation != sent.Generation {
		t.Fatalf("index entry %+v, retained generation %d", sentEntry, sent.Generation)
	}
	for _, tc := range []struct {
		name string
		acks protocol.Acks
	}{
		{"acks of the index before", protocol.Acks{IndexRevision: before.Revision, Applied: before.Objects}},
		{"acks below the dropping index, key left out", protocol.Acks{IndexRevision: idx.Revision - 1,
			Applied: map[string]protocol.IndexEntry{"pods/default/web-1": keepEntry}}},
		{"applied still", protocol.Acks{IndexRevision: idx.Revision,
			Applied: map[string]protocol.IndexEntry{"pods/default/web-1": keepEntry, "pods/default/web-2": sentEntry}}},
		{"refused still", protocol.Acks{IndexRevision: idx.Revision, Applied: map[string]protocol.IndexEntry{"pods/default/web-1": keepEntry},
			Refused: map[string]protocol.Refusal{"pods/default/web-2": {Generation: sentEntry.Generation, Digest: sentEntry.Digest, Reason: "policy"}}}},
		{"missing still", protocol.Acks{IndexRevision: idx.Revision, Applied: map[string]protocol.IndexEntry{"pods/default/web-1": keepEntry},
			Missing: map[string]protocol.IndexEntry{"pods/default/web-2": sentEntry}}},
	} {
		a := tc.acks
		a.Node, a.Session = nodeA, 1
		h.after("node", nodeA, func() { h.c.Handle(acksTopic(nodeA), mustEncode(t, &a)) })
		if d := h.deletes(); len(d) != 0 {
			t.Fatalf("%s: web-2 deleted: %+v", tc.name, d)
		}
	}
	h.after("node", nodeA, func() {
		h.c.Handle(acksTopic(nodeA), mustEncode(t, &protocol.Acks{Node: nodeA, Session: 1, IndexRevision: idx.Revision,
			Applied: map[string]protocol.IndexEntry{"pods/default/web-1": keepEntry}}))
	})
	if d := h.deletes(); len(d) != 1 || d[0].GetName() != "web-2" {
		t.Fatalf("deletes after acks of the dropping index: %+v, want web-2", d)
	}
}

// Every index entry the bridge publishes lists the generation and protocol.Digest of the exact
// retained payload of its object: after the first sync, after a change, after a resync request,
// and after a restart that read the retained state back.
func TestIndexDigestsArePublishedPayloads(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	node, _ := sealedNode(t, nodeA)
	h := start(t, []string{nodeA}, pod, node,
		configMap("default", "web-config", map[string]string{"a": "1"}),
		secret("default", "web-secret", map[string][]byte{"token": []byte("x")}))
	check := func(when string, n int) *protocol.Index {
		t.Helper()
		var idx *protocol.Index
		waitFor(t, fmt.Sprintf("%s: an index of %d objects", when, n), func() bool {
			idx = h.index(nodeA)
			return idx != nil && len(idx.Objects) == n
		})
		for k, e := range idx.Objects {
			kind, ns, name, err := protocol.ParseObjectKey(k)
			if err != nil {
				t.Fatal(err)
			}
			payload := h.broker.get(topics.Desired(nodeA, kind, ns, name))
			d := desiredOf(t, payload, nodeA, kind, ns, name)
			if e.Digest != protocol.Digest(payload) || e.Generation != d.Generation {
				t.Errorf("%s: index entry %s = %+v; the retained payload has generation %d and digest %s",
					when, k, e, d.Generation, protocol.Digest(payload))
			}
		}
		return idx
	}
	first := check("first sync", 3)

	cm, err := h.kube.CoreV1().ConfigMaps("default").Get(context.Background(), "web-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["a"], cm.ResourceVersion = "2", "2"
	if _, err := h.kube.CoreV1().ConfigMaps("default").Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a new index", func() bool { idx := h.index(nodeA); return idx != nil && idx.Revision > first.Revision })
	second := check("configMap change", 3)
	if second.Objects["configmaps/default/web-config"].Digest == first.Objects["configmaps/default/web-config"].Digest {
		t.Errorf("the changed configMap kept its digest")
	}

	h.after("node", nodeA, func() {
		h.c.Handle(protocol.Topic{Class: protocol.ClassResync, Node: nodeA}, mustEncode(t, &protocol.ResyncRequest{Node: nodeA, Session: 1,
			Reason: "missing", Missing: []string{"pods/default/web-1"}}))
	})
	check("resync", 3)

	// A new leader reads the retained state back: it writes nothing, and what it would list is
	// what the broker holds.
	retained, err := h.broker.Snapshot(context.Background(), topics.Index(nodeA), topics.DesiredFilter(nodeA))
	if err != nil {
		t.Fatal(err)
	}
	s, problems := newNodeState(nodeA, topics, retained, 0, nil)
	if len(problems) != 0 {
		t.Fatal(problems)
	}
	for k, e := range s.entries {
		if e.Digest != s.index[k].Digest {
			t.Errorf("restart: %s read with digest %s, the index lists %s", k, e.Digest, s.index[k].Digest)
		}
	}
}

func TestStatusIsolationAndMerge(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	pod.Status.Conditions = append(pod.Status.Conditions, v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: "EvictionByEvictionAPI"})
	h := start(t, []string{nodeA, "edge-b"}, pod)
	h.desired(nodeA, protocol.KindPod, "default", "web-1")
	ts := metav1.NewTime(time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC))
	running := v1.PodStatus{Phase: v1.PodRunning, PodIP: "10.88.0.7", PodIPs: []v1.PodIP{{IP: "10.88.0.7"}}, HostIP: "192.168.1.2",
		StartTime: &ts, QOSClass: v1.PodQOSBurstable,
		Conditions: []v1.PodCondition{
			{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: ts},
			{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: ts},
		},
		ContainerStatuses: []v1.ContainerStatus{{Name: "httpd", Ready: true, Image: "127.0.0.1:5000/busybox:1.36",
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: ts}}, ContainerID: "containerd://abc"}},
	}
	refused := func(reason string) float64 {
		return h.c.m.refused.With(string(protocol.ClassPodStatus), reason).Value()
	}

	// edge-b speaks for a pod bound to edge-a.
	h.after("status", topics.PodStatus("edge-b", "default", "web-1"), func() {
		h.c.Handle(statusTopic("edge-b", pod), statusPayload(t, "edge-b", pod, running, false))
	})
	// edge-b writes a payload naming edge-a on its own topic: the envelope must match the topic.
	h.after("status", topics.PodStatus("edge-b", "default", "web-1"), func() {
		h.c.Handle(statusTopic("edge-b", pod), statusPayload(t, nodeA, pod, running, false))
	})
	// edge-a reports another pod of that name.
	other := pod.DeepCopy()
	other.UID = "6f1c2d3e-aaaa-4bbb-8ccc-0000000000ff"
	h.after("status", topics.PodStatus(nodeA, "default", "web-1"), func() {
		h.c.Handle(statusTopic(nodeA, pod), statusPayload(t, nodeA, other, running, false))
	})
	if refused("not-bound") != 1 || refused("invalid") != 1 || refused("uid") != 1 {
		t.Errorf("refused not-bound %v invalid %v uid %v, want 1 each", refused("not-bound"), refused("invalid"), refused("uid"))
	}
	if n := h.statusUpdates(); n != 0 {
		t.Fatalf("%d status writes from refused messages", n)
	}

	h.after("status", topics.PodStatus(nodeA, "default", "web-1"), func() {
		h.c.Handle(statusTopic(nodeA, pod), statusPayload(t, nodeA, pod, running, false))
	})
	got, err := h.kube.CoreV1().Pods("default").Get(context.Background(), "web-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := got.Status
	if st.Phase != v1.PodRunning || st.PodIP != "10.88.0.7" || len(st.ContainerStatuses) != 1 || !st.ContainerStatuses[0].Ready || st.ObservedGeneration != 1 {
		t.Errorf("status written: %+v", st)
	}
	conds := map[v1.PodConditionType]v1.PodCondition{}
	for _, c := range st.Conditions {
		conds[c.Type] = c
	}
	if conds[v1.PodReady].Status != v1.ConditionTrue || conds[v1.DisruptionTarget].Reason != "EvictionByEvictionAPI" ||
		!conds[v1.PodScheduled].LastTransitionTime.Time.Equal(pod.Status.Conditions[0].LastTransitionTime.Time) || len(conds) != 3 {
		t.Errorf("conditions %+v: want the node's Ready, the API's PodScheduled and DisruptionTarget", st.Conditions)
	}
	// The same report again writes nothing.
	n := h.statusUpdates()
	h.after("status", topics.PodStatus(nodeA, "default", "web-1"), func() {
		h.c.Handle(statusTopic(nodeA, pod), statusPayload(t, nodeA, pod, running, false))
	})
	if h.statusUpdates() != n {
		t.Errorf("an unchanged status was written again")
	}
}

// A pod its node refused (admission or policy, or a payload it could not decode) becomes Failed, as
// kubelet fails a pod its admission rejects; a refusal of another payload than the one the bridge
// holds for that generation (another digest) is not about the pod.
func TestRefusedPodBecomesFailed(t *testing.T) {
	web1 := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	web2 := apiPod("default", "web-2", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000002")
	h := start(t, []string{nodeA}, web1, web2)
	h.desired(nodeA, protocol.KindPod, "default", "web-1")
	h.desired(nodeA, protocol.KindPod, "default", "web-2")
	var idx *protocol.Index
	waitFor(t, "an index of both pods", func() bool { idx = h.index(nodeA); return idx != nil && len(idx.Objects) >= 2 })
	e1, e2 := idx.Objects["pods/default/web-1"], idx.Objects["pods/default/web-2"]
	policy := `policy: privileged containers are not allowed (container "httpd")`
	undecodable := `undecodable: desired pod object: invalid JSON: unexpected end of JSON input`
	failed := func(name, reason string) bool {
		p, err := h.kube.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == v1.PodFailed && p.Status.Reason == ReasonNodeRefused && p.Status.Message == reason
	}
	refused := func(m map[string]protocol.Refusal) []byte {
		return mustEncode(t, &protocol.Acks{Node: nodeA, Session: 1, IndexRevision: idx.Revision, Refused: m})
	}

	other := protocol.Digest([]byte("another payload"))
	h.after("node", nodeA, func() {
		h.c.Handle(acksTopic(nodeA), refused(map[string]protocol.Refusal{
			"pods/default/web-2": {Generation: e2.Generation, Digest: other, Reason: undecodable}}))
	})
	h.c.mu.Lock()
	n := len(h.c.refusals)
	h.c.mu.Unlock()
	if n != 0 || h.statusUpdates() != 0 {
		t.Fatalf("a refusal of another payload was taken for the pod's: %d refusals noted, %d status writes", n, h.statusUpdates())
	}

	h.c.Handle(acksTopic(nodeA), refused(map[string]protocol.Refusal{
		"pods/default/web-1": {Generation: e1.Generation, Digest: e1.Digest, Reason: policy},
		"pods/default/web-2": {Generation: e2.Generation, Digest: e2.Digest, Reason: undecodable}}))
	waitFor(t, "both pods Failed with the node's reasons", func() bool { return failed("web-1", policy) && failed("web-2", undecodable) })
}

func TestEventsBecomeAPIEvents(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	h := start(t, []string{nodeA, "edge-b"}, pod)
	ev := func(node string) []byte {
		return mustEncode(t, &protocol.Event{Node: node, Time: time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC), Type: "Warning",
			Reason: "BackOff", Message: "Back-off restarting failed container httpd",
			Object: protocol.ObjectRef{Kind: "Pod", Namespace: "default", Name: "web-1", UID: pod.UID}, Source: "agent"})
	}
	h.c.Handle(protocol.Topic{Class: protocol.ClassEvents, Node: "edge-b"}, ev("edge-b"))
	h.c.Handle(protocol.Topic{Class: protocol.ClassEvents, Node: nodeA}, ev(nodeA))
	waitFor(t, "an event", func() bool { return h.c.m.eventsWritten.Value() == 1 })
	if v := h.c.m.refused.With(string(protocol.ClassEvents), "not-bound").Value(); v != 1 {
		t.Errorf("edge-b's event about edge-a's pod: refused %v, want 1", v)
	}
	list, err := h.kube.EventsV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("events %+v, %v", list, err)
	}
	e := list.Items[0]
	if e.Regarding.UID != pod.UID || e.Regarding.Kind != "Pod" || e.ReportingController != ReportingController ||
		e.ReportingInstance != nodeA || e.Reason != "BackOff" || e.Action != "BackOff" || !strings.Contains(e.Note, "Back-off") || e.Type != "Warning" {
		t.Errorf("event %+v", e)
	}
}

// A node that comes back (its Node turns Ready again) has its retained pod statuses written
// again: while it was away the node lifecycle controller marked its pods not Ready, and the node,
// whose pods ran on unchanged, has nothing new to report.
func TestNodeBackRewritesRetainedStatuses(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeA},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}}}
	h := start(t, []string{nodeA}, pod, node)
	h.desired(nodeA, protocol.KindPod, "default", "web-1")
	ts := metav1.NewTime(time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC))
	running := v1.PodStatus{Phase: v1.PodRunning, PodIP: "10.88.0.7",
		Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: ts}},
		ContainerStatuses: []v1.ContainerStatus{{Name: "httpd", Ready: true,
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: ts}}, ContainerID: "containerd://abc"}}}
	payload := statusPayload(t, nodeA, pod, running, false)
	h.broker.Publish(context.Background(), topics.PodStatus(nodeA, "default", "web-1"), payload, true)
	h.after("status", topics.PodStatus(nodeA, "default", "web-1"), func() { h.c.Handle(statusTopic(nodeA, pod), payload) })

	ctx := context.Background()
	podReady := func() v1.ConditionStatus {
		p, err := h.kube.CoreV1().Pods("default").Get(ctx, "web-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodReady {
				return c.Status
			}
		}
		return ""
	}
	setNodeReady := func(s v1.ConditionStatus) {
		n, err := h.kube.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Conditions[0].Status = s
		if _, err := h.kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The node goes away: Unknown, and its pod marked not Ready as the node lifecycle controller does.
	setNodeReady(v1.ConditionUnknown)
	p, _ := h.kube.CoreV1().Pods("default").Get(ctx, "web-1", metav1.GetOptions{})
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == v1.PodReady {
			p.Status.Conditions[i].Status = v1.ConditionFalse
		}
	}
	if _, err := h.kube.CoreV1().Pods("default").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the informer sees the pod not Ready", func() bool {
		q, err := h.c.podLister.Pods("default").Get("web-1")
		return err == nil && !podConditionIs(q, v1.PodReady, v1.ConditionTrue)
	})
	if podReady() != v1.ConditionFalse {
		t.Fatal("pod Ready should be False while the node is away")
	}
	// Back: Ready True. No new message from the node; the retained status is written again.
	setNodeReady(v1.ConditionTrue)
	waitFor(t, "pod Ready again from the node's retained status", func() bool { return podReady() == v1.ConditionTrue })
}

func podConditionIs(p *v1.Pod, typ v1.PodConditionType, s v1.ConditionStatus) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return c.Status == s
		}
	}
	return false
}

// A bridge that has not handled a pod's status yet (just started; statuses are read apart from the
// acks) must not take the node's acks of the index that leaves the pod out for confirmation while
// the broker still holds a live status of that pod: the node takes the index in before the pod has
// stopped.
func TestDeletionWithoutStatusInMemoryReadsTheRetainedStatus(t *testing.T) {
	pod := apiPod("default", "web-3", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000003")
	h := start(t, []string{nodeA}, pod)
	h.desired(nodeA, protocol.KindPod, "default", "web-3")
	// The node's live status sits in the broker only: the controller never handled it.
	statusTopicName := topics.PodStatus(nodeA, "default", "web-3")
	if err := h.broker.Publish(context.Background(), statusTopicName,
		statusPayload(t, nodeA, pod, v1.PodStatus{Phase: v1.PodRunning}, false), true); err != nil {
		t.Fatal(err)
	}
	markDeleted(t, h, pod)
	idx := h.dropped(nodeA, "pods/default/web-3")
	acks := mustEncode(t, &protocol.Acks{Node: nodeA, Session: 1, IndexRevision: idx.Revision})
	h.after("node", nodeA, func() { h.c.Handle(acksTopic(nodeA), acks) })
	if d := h.deletes(); len(d) != 0 {
		t.Fatalf("deleted on the acks while the retained status says the pod still runs: %+v", d)
	}
	// Once the retained status says gone, the same acks confirm it.
	if err := h.broker.Publish(context.Background(), statusTopicName,
		statusPayload(t, nodeA, pod, v1.PodStatus{}, true), true); err != nil {
		t.Fatal(err)
	}
	h.after("node", nodeA, func() { h.c.NodeServed(nodeA) })
	waitFor(t, "web-3 deleted", func() bool { return len(h.deletes()) == 1 })
}

// A pod the API's Node satisfies goes to its node without its node selection (the node cannot
// judge the Node's labels), one it does not satisfy keeps it, and the form sent first stays when
// the Node's labels change later.
func TestNodeSelectionJudgedAgainstTheAPINode(t *testing.T) {
	sel := apiPod("default", "sel", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000011")
	sel.Spec.NodeSelector = map[string]string{"node-role.kubernetes.io/edge": ""}
	miss := apiPod("default", "miss", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000012")
	miss.Spec.NodeSelector = map[string]string{"site": "elsewhere"}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeA, Labels: map[string]string{"node-role.kubernetes.io/edge": ""}}}
	h := start(t, []string{nodeA}, sel, miss, node)

	d := h.desired(nodeA, protocol.KindPod, "default", "sel")
	if d.Pod.Spec.NodeSelector != nil {
		t.Errorf("pod the Node satisfies: sent with nodeSelector %v", d.Pod.Spec.NodeSelector)
	}
	if m := h.desired(nodeA, protocol.KindPod, "default", "miss"); m.Pod.Spec.NodeSelector["site"] != "elsewhere" {
		t.Errorf("pod the Node does not satisfy: sent with nodeSelector %v, want it kept", m.Pod.Spec.NodeSelector)
	}

	// The Node loses the label; the next sync of the node must not change what it has.
	ctx := context.Background()
	n, err := h.kube.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels = nil
	if _, err := h.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the informer sees the Node relabelled", func() bool {
		x, err := h.c.nodeLister.Get(nodeA)
		return err == nil && len(x.Labels) == 0
	})
	h.after("node", nodeA, func() { h.c.NodeServed(nodeA) })
	if again := h.desired(nodeA, protocol.KindPod, "default", "sel"); again.Generation != d.Generation || again.Pod.Spec.NodeSelector != nil {
		t.Errorf("after the Node's labels changed: generation %d -> %d, nodeSelector %v; want the pod unchanged",
			d.Generation, again.Generation, again.Pod.Spec.NodeSelector)
	}
}

// shortReads makes the broker's reads of node's statuses lose the status topics in drop while
// lossy() holds, and counts those reads.
type shortReads struct {
	mu    sync.Mutex
	lossy bool
	reads int
}

func (s *shortReads) install(b *memBroker, node string, drop ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.onSnapshot = func(filters []string, out map[string][]byte) {
		if !slices.Contains(filters, topics.PodStatusFilter(node)) {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.reads++
		if s.lossy {
			for _, t := range drop {
				delete(out, t)
			}
		}
	}
}

func (s *shortReads) set(lossy bool) {
	s.mu.Lock()
	s.lossy = lossy
	s.mu.Unlock()
}

func (s *shortReads) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads
}

func summaryPayload(t *testing.T, node string, pods int) []byte {
	return mustEncode(t, &protocol.StatusSummary{Node: node, Pods: pods, Digest: protocol.Digest([]byte(node))})
}

// A read of a node's retained statuses with fewer live statuses than its status summary counts is
// read again at once; still short, it is handled for what it holds, a warning names the node and
// the counts, and it is read again later, never taking the missing status for gone. A node without
// a summary is not checked.
func TestShortStatusReadIsReadAgain(t *testing.T) {
	web1 := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	web2 := apiPod("default", "web-2", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000002")
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeA},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}}}
	h := start(t, []string{nodeA}, web1, web2, node)
	h.desired(nodeA, protocol.KindPod, "default", "web-2")
	ctx := context.Background()
	ts := metav1.NewTime(time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC))
	running := v1.PodStatus{Phase: v1.PodRunning,
		Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: ts}}}
	for _, p := range []*v1.Pod{web1, web2} {
		payload := statusPayload(t, nodeA, p, running, false)
		h.broker.Publish(ctx, topics.PodStatus(nodeA, p.Namespace, p.Name), payload, true)
		h.after("status", topics.PodStatus(nodeA, p.Namespace, p.Name), func() { h.c.Handle(statusTopic(nodeA, p), payload) })
	}
	// A pod the node reported gone keeps a retained status that the summary does not count.
	old := apiPod("default", "web-9", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000009")
	h.broker.Publish(ctx, topics.PodStatus(nodeA, "default", "web-9"), statusPayload(t, nodeA, old, v1.PodStatus{}, true), true)
	h.broker.Publish(ctx, topics.Summary(nodeA), summaryPayload(t, nodeA, 2), true)
	var reads shortReads
	reads.install(h.broker, nodeA, topics.PodStatus(nodeA, "default", "web-2"))

	ready := func(name string) v1.ConditionStatus {
		p, err := h.kube.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodReady {
				return c.Status
			}
		}
		return ""
	}
	// awayAndBack marks the node's pods not Ready (the node lifecycle controller, while the node
	// was away) and brings the node back, which makes the controller read its statuses again.
	awayAndBack := func() {
		t.Helper()
		setNode := func(s v1.ConditionStatus) {
			n, err := h.kube.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			n.Status.Conditions[0].Status = s
			if _, err := h.kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		setNode(v1.ConditionUnknown)
		for _, name := range []string{"web-1", "web-2"} {
			p, err := h.kube.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for i := range p.Status.Conditions {
				if p.Status.Conditions[i].Type == v1.PodReady {
					p.Status.Conditions[i].Status = v1.ConditionFalse
				}
			}
			if _, err := h.kube.CoreV1().Pods("default").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "the informers see the node away and its pods not Ready", func() bool {
			n, err := h.c.nodeLister.Get(nodeA)
			if err != nil || nodeReady(n) {
				return false
			}
			for _, name := range []string{"web-1", "web-2"} {
				if q, err := h.c.podLister.Pods("default").Get(name); err != nil || podConditionIs(q, v1.PodReady, v1.ConditionTrue) {
					return false
				}
			}
			return true
		})
		setNode(v1.ConditionTrue)
	}

	// One lossy read, then a whole one: repaired at once.
	reads.set(true)
	h.broker.mu.Lock()
	once := h.broker.onSnapshot
	h.broker.onSnapshot = func(filters []string, out map[string][]byte) {
		once(filters, out)
		if slices.Contains(filters, topics.PodStatusFilter(nodeA)) {
			reads.set(false)
		}
	}
	h.broker.mu.Unlock()
	awayAndBack()
	waitFor(t, "both pods Ready again", func() bool { return ready("web-1") == v1.ConditionTrue && ready("web-2") == v1.ConditionTrue })
	if n := reads.count(); n != 2 {
		t.Errorf("%d reads of the statuses, want 2 (the short one and the one again)", n)
	}
	if v := h.c.m.shortReads.With("repaired").Value(); v != 1 {
		t.Errorf("repaired short reads %v, want 1", v)
	}

	// Lossy for good: web-1 comes back from what arrived; web-2 waits, with a warning, and is read
	// again later.
	reads.install(h.broker, nodeA, topics.PodStatus(nodeA, "default", "web-2"))
	reads.set(true)
	before := reads.count()
	awayAndBack()
	waitFor(t, "web-1 Ready again and a read again later", func() bool {
		return ready("web-1") == v1.ConditionTrue && reads.count() >= before+4
	})
	if ready("web-2") != v1.ConditionFalse {
		t.Errorf("web-2 Ready %s, want False: its status never arrived", ready("web-2"))
	}
	if logs := h.logs.String(); !strings.Contains(logs, "stays short of its status summary") ||
		!strings.Contains(logs, "node="+nodeA) || !strings.Contains(logs, "expected=2") || !strings.Contains(logs, "got=1") {
		t.Errorf("no warning naming the node and the counts; logs:\n%s", logs)
	}
	if v := h.c.m.shortReads.With("short").Value(); v < 1 {
		t.Errorf("short reads %v, want at least 1", v)
	}
	reads.set(false)
	waitFor(t, "web-2 Ready again once a read is whole", func() bool { return ready("web-2") == v1.ConditionTrue })

	// Without a summary (an older node) nothing is checked: one read.
	h.broker.Publish(ctx, topics.Summary(nodeA), nil, true)
	reads.set(true)
	before = reads.count()
	awayAndBack()
	waitFor(t, "web-1 Ready again", func() bool { return ready("web-1") == v1.ConditionTrue })
	h.after("node", nodeA, func() { h.c.NodeServed(nodeA) })
	if n := reads.count() - before; n != 1 {
		t.Errorf("%d reads of a node without a summary, want 1", n)
	}
}

// The retained status that tells "still stopping" from "never ran" must come from a whole read: a
// read that lost it (fewer live statuses than the node's summary counts) does not confirm a
// deletion the acks alone would.
func TestShortStatusReadDoesNotConfirmADeletion(t *testing.T) {
	pod := apiPod("default", "web-3", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000003")
	h := start(t, []string{nodeA}, pod)
	h.desired(nodeA, protocol.KindPod, "default", "web-3")
	ctx := context.Background()
	statusTopicName := topics.PodStatus(nodeA, "default", "web-3")
	h.broker.Publish(ctx, statusTopicName, statusPayload(t, nodeA, pod, v1.PodStatus{Phase: v1.PodRunning}, false), true)
	h.broker.Publish(ctx, topics.Summary(nodeA), summaryPayload(t, nodeA, 1), true)
	var reads shortReads
	reads.install(h.broker, nodeA, statusTopicName)
	reads.set(true)

	markDeleted(t, h, pod)
	idx := h.dropped(nodeA, "pods/default/web-3")
	acks := mustEncode(t, &protocol.Acks{Node: nodeA, Session: 1, IndexRevision: idx.Revision})
	h.after("node", nodeA, func() { h.c.Handle(acksTopic(nodeA), acks) })
	if d := h.deletes(); len(d) != 0 {
		t.Fatalf("deleted on a short read of the statuses: %+v", d)
	}
	waitFor(t, "a retry after the short read", func() bool { return reads.count() >= 4 })
	if d := h.deletes(); len(d) != 0 {
		t.Fatalf("deleted on a short read of the statuses: %+v", d)
	}
	if !strings.Contains(h.logs.String(), "expected=1 got=0") {
		t.Errorf("no warning with the counts; logs:\n%s", h.logs.String())
	}
	// The read is whole again: the pod still runs, so nothing is deleted yet; gone, it is.
	reads.set(false)
	n := reads.count()
	waitFor(t, "a whole read", func() bool { return reads.count() > n })
	h.after("node", nodeA, func() { h.c.NodeServed(nodeA) })
	if d := h.deletes(); len(d) != 0 {
		t.Fatalf("deleted while the retained status says the pod runs: %+v", d)
	}
	h.broker.Publish(ctx, statusTopicName, statusPayload(t, nodeA, pod, v1.PodStatus{}, true), true)
	h.broker.Publish(ctx, topics.Summary(nodeA), summaryPayload(t, nodeA, 0), true)
	h.after("node", nodeA, func() { h.c.NodeServed(nodeA) })
	waitFor(t, "web-3 deleted", func() bool { return len(h.deletes()) == 1 })
}

// A node whose acks show it running another index than the retained one (a newer revision the
// broker lost, or the same revision with other bytes) gets the API's desired set as an index at a
// new revision above it, with the unchanged objects as they are; a node that refused the bridge's
// index is not written to again and again.
func TestNodeRunningAnotherIndexGetsANewRevision(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	h := start(t, []string{nodeA}, pod)
	h.desired(nodeA, protocol.KindPod, "default", "web-1")
	var idx *protocol.Index
	waitFor(t, "an index", func() bool { idx = h.index(nodeA); return idx != nil })
	digest := protocol.Digest(h.broker.get(topics.Index(nodeA)))
	objects := len(h.broker.log) - 1
	other := protocol.Digest([]byte("another writer's index"))
	stale := map[string]protocol.IndexEntry{"pods/default/gone": {Generation: idx.Revision + 4, Digest: other}}

	// The node acks the bridge's own index: nothing to write.
	writes := h.c.m.indexWrites.Value()
	h.after("node", nodeA, func() {
		h.c.Handle(acksTopic(nodeA), mustEncode(t, &protocol.Acks{Node: nodeA, Session: 1, IndexRevision: idx.Revision, IndexDigest: digest, Applied: idx.Objects}))
	})
	if v := h.c.m.indexWrites.Value(); v != writes {
		t.Fatalf("%v index writes on acks of the retained index", v-writes)
	}

	for i, tc := range []struct {
		name string
		acks protocol.Acks
	}{
		{"newer revision", protocol.Acks{IndexRevision: idx.Revision + 5, IndexDigest: other, Applied: stale}},
		{"same revision, other bytes", protocol.Acks{Applied: stale}}, // revision and digest set below
	} {
		cur := h.index(nodeA)
		a := tc.acks
		a.Node, a.Session = nodeA, int64(i+2)
		if a.IndexRevision == 0 {
			a.IndexRevision, a.IndexDigest = cur.Revision, other
		}
		h.after("node", nodeA, func() { h.c.Handle(acksTopic(nodeA), mustEncode(t, &a)) })
		got := h.index(nodeA)
		if got.Revision <= a.IndexRevision || got.Objects["pods/default/web-1"] != idx.Objects["pods/default/web-1"] || len(got.Objects) != 1 {
			t.Fatalf("%s: index after acks at revision %d: %+v; want a higher revision listing web-1 as it was", tc.name, a.IndexRevision, got)
		}
	}
	if n := len(h.broker.log) - 1 - objects - 2; n != 0 {
		t.Errorf("%d messages besides the two indexes: unchanged objects must not be written again (%v)", n, h.broker.log)
	}

	// The node runs another index of the bridge's revision and refuses the bridge's as a conflict:
	// writing again would only be refused again.
	cur := h.index(nodeA)
	writes = h.c.m.indexWrites.Value()
	for i := range 3 {
		h.after("node", nodeA, func() {
			h.c.Handle(acksTopic(nodeA), mustEncode(t, &protocol.Acks{Node: nodeA, Session: int64(10 + i), IndexRevision: cur.Revision,
				IndexDigest: other, Applied: stale, IndexRefused: &protocol.Refusal{Generation: cur.Revision,
					Digest: protocol.Digest(h.broker.get(topics.Index(nodeA))), Reason: "conflict"}}))
		})
	}
	if v := h.c.m.indexWrites.Value(); v != writes {
		t.Errorf("%v index writes answering a refusal of the current index", v-writes)
	}
	if !strings.Contains(h.logs.String(), "the node refused the current index") {
		t.Errorf("no warning about the refused index; logs:\n%s", h.logs.String())
	}
}

// A Secret goes to a node only sealed to the key its API Node carries: while the node has not
// published one, the pod and its ConfigMap go out and the Secret does not; once the key is there,
// the Secret follows, sealed, and opens with the node's key.
func TestSecretWaitsForTheNodesSealingKey(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	h := start(t, []string{nodeA}, pod,
		configMap("default", "web-config", map[string]string{"a": "1"}),
		secret("default", "web-secret", map[string][]byte{"token": []byte("x")}))
	secKey := protocol.ObjectKey(protocol.KindSecret, "default", "web-secret")
	var idx *protocol.Index
	waitFor(t, "an index with the pod and its configMap", func() bool { idx = h.index(nodeA); return idx != nil && len(idx.Objects) >= 2 })
	if _, listed := idx.Objects[secKey]; listed || len(idx.Objects) != 2 {
		t.Fatalf("index without the node's sealing key: %v, want the pod and the configMap only", slices.Sorted(maps.Keys(idx.Objects)))
	}
	node, key := sealedNode(t, nodeA)
	if _, err := h.kube.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := h.desired(nodeA, protocol.KindSecret, "default", "web-secret")
	if len(d.Secret.Data) != 0 || d.Sealed == nil {
		t.Fatalf("secret sent as %+v, want it sealed", d.Secret)
	}
	if err := key.Open(nodeA, d.Secret, d.Sealed); err != nil || string(d.Secret.Data["token"]) != "x" {
		t.Fatalf("sealed secret opened: %q, %v", d.Secret.Data, err)
	}
}

// With the fleet's CA (--node-ca), a Secret is sealed only to a key the node's certificate vouches
// for: a key someone put on the API Node (or in the node's retained status, which the Node is
// copied from) without the node's attestation gets nothing; the node's own attested key gets the
// Secret, sealed to it.
func TestSecretSealedOnlyToAnAttestedKey(t *testing.T) {
	ca := testpki.NewCA(t)
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	forged, _ := sealedNode(t, nodeA)
	nodes, err := sealing.NewNodeTrust(ca.Pool, "")
	if err != nil {
		t.Fatal(err)
	}
	h := startWith(t, func(o *Options) { o.NodeTrust = nodes }, []string{nodeA}, pod, forged,
		configMap("default", "web-config", map[string]string{"a": "1"}),
		secret("default", "web-secret", map[string][]byte{"token": []byte("x")}))
	secKey := protocol.ObjectKey(protocol.KindSecret, "default", "web-secret")
	var idx *protocol.Index
	waitFor(t, "an index with the pod and its configMap", func() bool { idx = h.index(nodeA); return idx != nil && len(idx.Objects) >= 2 })
	if _, listed := idx.Objects[secKey]; listed {
		t.Fatalf("the secret was sent to a key the node did not vouch for: %v", slices.Sorted(maps.Keys(idx.Objects)))
	}
	// Synced again and again, the node logs why the Secret waits once, not per sync.
	for range 3 {
		h.after("node", nodeA, func() { h.c.queueNode(nodeA) })
	}
	if n := strings.Count(h.logs.String(), "not vouched for by its certificate"); n != 1 {
		t.Errorf("the reason the secret waits was logged %d times over 4 syncs, want once:\n%s", n, h.logs.String())
	}
	key, err := sealing.Generate()
	if err != nil {
		t.Fatal(err)
	}
	att, err := sealing.Attest(ca.Issue(t, testpki.Cert{CN: nodeA}), nodeA, key)
	if err != nil {
		t.Fatal(err)
	}
	own := forged.DeepCopy()
	own.Annotations = map[string]string{sealing.AnnotationKey: key.Public(), sealing.AttestationKey: att}
	if _, err := h.kube.CoreV1().Nodes().Update(context.Background(), own, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := h.desired(nodeA, protocol.KindSecret, "default", "web-secret")
	if d.Sealed == nil || d.Sealed.KeyID != key.ID() {
		t.Fatalf("secret sent as %+v, want it sealed to the node's attested key %s", d.Sealed, key.ID())
	}
	if err := key.Open(nodeA, d.Secret, d.Sealed); err != nil || string(d.Secret.Data["token"]) != "x" {
		t.Fatalf("sealed secret opened: %q, %v", d.Secret.Data, err)
	}
}

// With a signing key, every index the bridge writes verifies with it, so nodes with trust anchors
// take it; a change of the desired set is signed again, and an unsigned bridge's index does not
// verify.
func TestIndexesSignedWithTheBridgesKey(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	pod.Spec.Containers[0].Env = nil
	pod.Spec.Volumes = nil
	h := startSigning(t, key, []string{nodeA}, pod)
	var idx *protocol.Index
	waitFor(t, "a signed index", func() bool { idx = h.index(nodeA); return idx != nil && len(idx.Objects) > 0 })
	if err := protocol.VerifyIndex(idx, []ed25519.PublicKey{pub}); err != nil {
		t.Fatalf("the bridge's index does not verify with its key: %v", err)
	}
	first := idx.Revision
	p2 := apiPod("default", "web-2", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000002")
	p2.Spec.Containers[0].Env = nil
	p2.Spec.Volumes = nil
	if _, err := h.kube.CoreV1().Pods("default").Create(context.Background(), p2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the next index", func() bool { idx = h.index(nodeA); return idx != nil && idx.Revision > first })
	if err := protocol.VerifyIndex(idx, []ed25519.PublicKey{pub}); err != nil {
		t.Fatalf("the next index does not verify: %v", err)
	}

	unsigned := start(t, []string{nodeA}, apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001"))
	waitFor(t, "an unsigned index", func() bool { idx = unsigned.index(nodeA); return idx != nil })
	if err := protocol.VerifyIndex(idx, []ed25519.PublicKey{pub}); err == nil {
		t.Fatal("an unsigned bridge's index verified")
	}
}

// A node that says it takes the API's deletions (protocol.AnnotationPodDeletion) keeps getting a pod
// being deleted, at a new generation carrying the API's deletionTimestamp and
// deletionGracePeriodSeconds (and a shortened grace again), so it stops the pod with that grace;
// the pod is deleted from the API once the node reports it gone. A node that does not say so (an
// older agent) gets the deletion as before: an index that leaves the pod out.
func TestDeletionGraceReachesANodeThatTakesIt(t *testing.T) {
	const nodeOld = "edge-old"
	p := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000021")
	old := apiPod("default", "web-2", nodeOld, "6f1c2d3e-aaaa-4bbb-8ccc-000000000022")
	graceful := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeA,
		Annotations: map[string]string{protocol.AnnotationPodDeletion: protocol.PodDeletionGraceful}}}
	older := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeOld}}
	h := start(t, []string{nodeA, nodeOld}, p, old, graceful, older)
	before := h.desired(nodeA, protocol.KindPod, "default", "web-1")
	if before.Pod.DeletionTimestamp != nil || before.Pod.DeletionGracePeriodSeconds != nil {
		t.Fatalf("a pod not being deleted sent with deletion metadata: %v %v", before.Pod.DeletionTimestamp, before.Pod.DeletionGracePeriodSeconds)
	}
	h.desired(nodeOld, protocol.KindPod, "default", "web-2")

	ctx := context.Background()
	deleteWith := func(grace int64) {
		t.Helper()
		cur, err := h.kube.CoreV1().Pods("default").Get(ctx, "web-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		now := metav1.Now()
		cur.DeletionTimestamp, cur.DeletionGracePeriodSeconds = &now, ptr(grace)
		if _, err := h.kube.CoreV1().Pods("default").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sentGrace := func(above int64) *protocol.DesiredObject {
		t.Helper()
		var d *protocol.DesiredObject
		waitFor(t, "a new generation of web-1", func() bool {
			d = h.desired(nodeA, protocol.KindPod, "default", "web-1")
			return d.Generation > above
		})
		if e, listed := h.index(nodeA).Objects["pods/default/web-1"]; !listed || e.Generation != d.Generation {
			t.Fatalf("the index lists web-1 as %+v (listed %v), want generation %d", e, listed, d.Generation)
		}
		return d
	}
	deleteWith(30)
	d := sentGrace(before.Generation)
	if d.Pod.DeletionTimestamp == nil || d.Pod.DeletionGracePeriodSeconds == nil || *d.Pod.DeletionGracePeriodSeconds != 30 {
		t.Fatalf("web-1 sent with deletionTimestamp %v, deletionGracePeriodSeconds %v; want the API's 30", d.Pod.DeletionTimestamp, d.Pod.DeletionGracePeriodSeconds)
	}
	// A second delete shortens the grace: the node gets that too.
	deleteWith(3)
	d = sentGrace(d.Generation)
	if g := d.Pod.DeletionGracePeriodSeconds; g == nil || *g != 3 {
		t.Fatalf("after a shorter delete web-1 sent with deletionGracePeriodSeconds %v, want 3", g)
	}
	if n := len(h.deletes()); n != 0 {
		t.Fatalf("%d deletes before the node reported the pod gone", n)
	}
	h.c.Handle(statusTopic(nodeA, p), statusPayload(t, nodeA, p, v1.PodStatus{}, true))
	waitFor(t, "web-1 deleted from the API", func() bool { return len(h.deletes()) == 1 })
	if del := h.deletes()[0]; del.GetName() != "web-1" || *del.DeleteOptions.GracePeriodSeconds != 0 || *del.DeleteOptions.Preconditions.UID != p.UID {
		t.Errorf("delete %+v, want web-1 with grace 0 and its uid", del)
	}

	// The older node: the index leaves its pod out.
	markDeleted(t, h, old)
	h.dropped(nodeOld, "pods/default/web-2")
}
