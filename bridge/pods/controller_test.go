package pods

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/metrics"
	"github.com/mqlet/mqlet/sync/protocol"
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
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func start(t *testing.T, served []string, objs ...runtime.Object) *harness {
	t.Helper()
	h := &harness{t: t, kube: fake.NewClientset(objs...), broker: newMemBroker(), syncs: map[string]int{}}
	factory := informers.NewSharedInformerFactory(h.kube, 0)
	isServed := map[string]bool{}
	for _, n := range served {
		isServed[n] = true
	}
	c, err := New(Options{Kube: h.kube, Factory: factory, Broker: h.broker, Topics: topics,
		Served: func(n string) bool { return isServed[n] }, Metrics: metrics.NewRegistry(), Log: quietLog(),
		Debounce: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c.synced = func(queue, key string, err error) {
		h.mu.Lock()
		h.syncs[queue+"/"+key]++
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

	now := metav1.Now()
	for _, p := range []*v1.Pod{ran, never} {
		p := p.DeepCopy()
		p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &now, ptr(int64(30))
		if _, err := h.kube.CoreV1().Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var tomb1, tomb2 *protocol.DesiredObject
	waitFor(t, "tombstones", func() bool {
		tomb1 = desiredOf(t, h.broker.get(topics.Desired(nodeA, protocol.KindPod, "default", "web-1")), nodeA, protocol.KindPod, "default", "web-1")
		tomb2 = desiredOf(t, h.broker.get(topics.Desired(nodeA, protocol.KindPod, "default", "web-2")), nodeA, protocol.KindPod, "default", "web-2")
		return tomb1.Deleted && tomb2.Deleted
	})
	// The node has confirmed nothing yet (offline): both stay Terminating.
	h.after("node", nodeA, func() { h.c.NodeServed(nodeA) })
	if d := h.deletes(); len(d) != 0 {
		t.Fatalf("pods deleted before the node confirmed: %+v", d)
	}

	// The node takes the tombstones in: web-2 never ran there, so that is confirmation enough;
	// web-1 still runs (grace period), so it waits for the node to report it gone.
	h.after("node", nodeA, func() {
		h.c.Handle(protocol.Topic{Class: protocol.ClassAcks, Node: nodeA}, mustEncode(t, &protocol.Acks{Node: nodeA, Session: 1,
			IndexRevision: tomb1.Generation, Deleted: map[string]int64{"pods/default/web-1": tomb1.Generation, "pods/default/web-2": tomb2.Generation}}))
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

func TestRefusedPodBecomesFailed(t *testing.T) {
	pod := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	h := start(t, []string{nodeA}, pod)
	d := h.desired(nodeA, protocol.KindPod, "default", "web-1")
	reason := `policy: privileged containers are not allowed (container "httpd")`
	h.c.Handle(protocol.Topic{Class: protocol.ClassAcks, Node: nodeA}, mustEncode(t, &protocol.Acks{Node: nodeA, Session: 1,
		IndexRevision: d.Generation, Refused: map[string]protocol.Refusal{"pods/default/web-1": {Generation: d.Generation, Reason: reason}}}))
	waitFor(t, "Failed status", func() bool {
		p, err := h.kube.CoreV1().Pods("default").Get(context.Background(), "web-1", metav1.GetOptions{})
		return err == nil && p.Status.Phase == v1.PodFailed && p.Status.Reason == ReasonNodeRefused && p.Status.Message == reason
	})
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
// acks) must not take the node's acks of the tombstone for confirmation while the broker still
// holds a live status of that pod: the node takes the tombstone in before the pod has stopped.
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
	now := metav1.Now()
	p := pod.DeepCopy()
	p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &now, ptr(int64(30))
	if _, err := h.kube.CoreV1().Pods("default").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var tomb *protocol.DesiredObject
	waitFor(t, "tombstone", func() bool {
		tomb = desiredOf(t, h.broker.get(topics.Desired(nodeA, protocol.KindPod, "default", "web-3")), nodeA, protocol.KindPod, "default", "web-3")
		return tomb.Deleted
	})
	acks := mustEncode(t, &protocol.Acks{Node: nodeA, Session: 1, IndexRevision: tomb.Generation,
		Deleted: map[string]int64{"pods/default/web-3": tomb.Generation}})
	h.after("node", nodeA, func() { h.c.Handle(protocol.Topic{Class: protocol.ClassAcks, Node: nodeA}, acks) })
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
