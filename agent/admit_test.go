package agent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/pod"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// memPod is testPod requesting mem of memory ("" for a BestEffort pod).
func memPod(name, mem string) *v1.Pod {
	p := testPod(name)
	if mem != "" {
		p.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceMemory: resource.MustParse(mem)}
	}
	return p
}

func allocatable(pairs ...string) func() v1.ResourceList {
	l := v1.ResourceList{}
	for _, kv := range pairs {
		k, v, _ := strings.Cut(kv, "=")
		l[v1.ResourceName(k)] = resource.MustParse(v)
	}
	return func() v1.ResourceList { return l.DeepCopy() }
}

func podNamed(a *testAgent, name string) *v1.Pod {
	for _, p := range a.Pods() {
		if p.Name == name {
			return &p
		}
	}
	return nil
}

// waitPhase waits until the pod has phase (and, when reason is set, that reason).
func waitPhase(t *testing.T, a *testAgent, name string, phase v1.PodPhase, reason string) *v1.Pod {
	t.Helper()
	var p *v1.Pod
	eventually(t, name+" "+string(phase)+" "+reason, func() bool {
		p = podNamed(a, name)
		return p != nil && p.Status.Phase == phase && (reason == "" || p.Status.Reason == reason)
	})
	return p
}

func eventsWithReason(rep *fakeReporter, reason string) []event.Event {
	_, _, es := rep.snapshot()
	var out []event.Event
	for _, e := range es {
		if e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// A pod that does not fit is refused with kubelet's reason and message, stays listed Failed, starts
// nothing and does not count against the node; the pods admitted before it do.
func TestAdmissionRefusesWhatDoesNotFit(t *testing.T) {
	rt, st, src, rep := newFakeRuntime(), store.NewMemory(), newFakeSource(source.MQTT), &fakeReporter{}
	a := startAgentWith(t, Options{Report: rep, Allocatable: allocatable("memory=1Gi", "pods=3")}, rt, st, src)
	src.send(source.Change{Op: source.Resync, Items: []source.Item{mqttItem(memPod("a", "600Mi"), 1), mqttItem(memPod("b", "600Mi"), 1)}})
	waitPhase(t, a, "a", v1.PodRunning, "")
	b := waitPhase(t, a, "b", v1.PodFailed, "OutOfmemory")
	want := "Node didn't have enough resource: memory, requested: 629145600, used: 629145600, capacity: 1073741824"
	if b.Status.Message != want {
		t.Errorf("message %q, want %q", b.Status.Message, want)
	}
	if n := rt.podContainers(b.UID); n != 0 || len(b.Status.ContainerStatuses) != 0 {
		t.Errorf("refused pod has %d containers, statuses %+v", n, b.Status.ContainerStatuses)
	}
	es := eventsWithReason(rep, "OutOfmemory")
	if len(es) != 1 || es[0].Type != event.Warning || es[0].Message != want || es[0].Object.Name != "b" || es[0].Object.UID != b.UID {
		t.Errorf("events %+v, want one Warning about b", es)
	}
	if storedNames(t, st) != "default/a default/b" {
		t.Errorf("store holds %q: a refused pod stays desired", storedNames(t, st))
	}

	// b does not count: c and d fit beside a; then the pod count is full.
	src.send(source.Change{Op: source.Upsert, Items: []source.Item{mqttItem(memPod("c", "300Mi"), 1), mqttItem(memPod("d", ""), 1)}})
	waitPhase(t, a, "c", v1.PodRunning, "")
	waitPhase(t, a, "d", v1.PodRunning, "")
	src.send(source.Change{Op: source.Upsert, Items: []source.Item{mqttItem(memPod("e", ""), 1)}})
	e := waitPhase(t, a, "e", v1.PodFailed, "OutOfpods")
	if e.Status.Message != "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3" {
		t.Errorf("OutOfpods message %q", e.Status.Message)
	}

	// A resync that repeats b unchanged neither admits it again nor reports it again.
	src.send(source.Change{Op: source.Resync, Items: []source.Item{mqttItem(memPod("a", "600Mi"), 1), mqttItem(memPod("b", "600Mi"), 1),
		mqttItem(memPod("c", "300Mi"), 1), mqttItem(memPod("d", ""), 1), mqttItem(memPod("e", ""), 1)}})
	waitApplied(t, src)
	if n := len(eventsWithReason(rep, "OutOfmemory")); n != 1 {
		t.Errorf("a resync repeated the refusal: %d events", n)
	}

	// A new spec of a refused pod is admitted afresh: still too big beside a and c, so refused
	// again with the new numbers; once c is gone it runs.
	src.send(source.Change{Op: source.Delete, Keys: []string{"default/d", "default/e"}})
	eventually(t, "d gone", func() bool { return podNamed(a, "d") == nil })
	src.send(source.Change{Op: source.Upsert, Items: []source.Item{mqttItem(memPod("b", "500Mi"), 2)}})
	eventually(t, "b refused with its new request", func() bool {
		p := podNamed(a, "b")
		return p.Status.Reason == "OutOfmemory" && strings.Contains(p.Status.Message, "requested: 524288000, used: 943718400,")
	})
	src.send(source.Change{Op: source.Delete, Keys: []string{"default/c"}})
	eventually(t, "c gone", func() bool { return podNamed(a, "c") == nil })
	// Once it would fit, it still stays Failed: a pod that failed never runs again under the same
	// UID, as kubelet and the bridge have it (Kubernetes shows it Failed and its controller may
	// have replaced it). Before, it was moved back to Running.
	src.send(source.Change{Op: source.Upsert, Items: []source.Item{mqttItem(memPod("b", "400Mi"), 3)}})
	waitApplied(t, src)
	eventually(t, "b on its new spec", func() bool {
		p := podNamed(a, "b")
		return p != nil && p.Spec.Containers[0].Resources.Requests.Memory().String() == "400Mi"
	})
	if p := podNamed(a, "b"); p.Status.Phase != v1.PodFailed || p.DeletionTimestamp != nil || rt.podContainers(b.UID) != 0 {
		t.Errorf("b after a spec that fits: phase %s, deleting %v, %d containers; want Failed, not deleting, none",
			p.Status.Phase, p.DeletionTimestamp != nil, rt.podContainers(b.UID))
	}
}

// A refused file pod whose manifest is edited to fit is replaced, as removing the file and adding
// it again would replace it: the Failed pod is torn down, and the new spec runs in a new worker.
// The worker that held it Failed never runs anything.
func TestRefusedFilePodReplacedWhenItFits(t *testing.T) {
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.File)
	a := startAgentWith(t, Options{Allocatable: allocatable("memory=1Gi")}, rt, st, src)
	src.send(resync(fileItem(memPod("big", "2Gi"), "big.yaml")))
	refused := waitPhase(t, a, "big", v1.PodFailed, "OutOfmemory")
	a.mu.Lock()
	old := a.workers[refused.UID]
	a.mu.Unlock()

	src.send(resync(fileItem(memPod("big", "100Mi"), "big.yaml")))
	waitPhase(t, a, "big", v1.PodRunning, "")
	a.mu.Lock()
	now := a.workers[refused.UID]
	a.mu.Unlock()
	if now == old {
		t.Errorf("the worker that held the pod Failed runs it again")
	}
	if p := old.Pod(); p.Status.Phase != v1.PodFailed {
		t.Errorf("the old worker's pod left Failed for %s", p.Status.Phase)
	}
}

// New pods are admitted in creation order, each against those admitted before it, whatever order
// the source lists them in; a pod deleted by the same change makes room.
func TestAdmissionOrder(t *testing.T) {
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.MQTT)
	a := startAgentWith(t, Options{Allocatable: allocatable("memory=1Gi")}, rt, st, src)
	old := memPod("old", "700Mi")
	src.send(source.Change{Op: source.Resync, Items: []source.Item{mqttItem(old, 1)}})
	waitPhase(t, a, "old", v1.PodRunning, "")

	early, late := memPod("early", "600Mi"), memPod("late", "600Mi")
	early.CreationTimestamp = metav1.NewTime(time.Now().Add(-time.Hour))
	late.CreationTimestamp = metav1.NewTime(time.Now())
	// old goes in the same change: its 700Mi is free for the newcomers.
	src.send(source.Change{Op: source.Resync, Items: []source.Item{mqttItem(late, 1), mqttItem(early, 1)}})
	waitPhase(t, a, "early", v1.PodRunning, "")
	waitPhase(t, a, "late", v1.PodFailed, "OutOfmemory")
}

// Pods restored from the store were admitted before: a node that shrank does not refuse them.
func TestRestoredPodsNotJudgedAgain(t *testing.T) {
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.MQTT)
	a := startAgentWith(t, Options{Allocatable: allocatable("memory=1Gi")}, rt, st, src)
	src.send(source.Change{Op: source.Resync, Items: []source.Item{mqttItem(memPod("a", "800Mi"), 1)}})
	waitPhase(t, a, "a", v1.PodRunning, "")
	a.stopAgent()

	src = newFakeSource(source.MQTT)
	a = startAgentWith(t, Options{Allocatable: allocatable("memory=100Mi")}, rt, st, src)
	src.send(source.Change{Op: source.Resync, Items: []source.Item{mqttItem(memPod("a", "800Mi"), 1)}})
	waitApplied(t, src)
	if p := waitPhase(t, a, "a", v1.PodRunning, ""); p.Status.Reason != "" {
		t.Errorf("restored pod refused: %s", p.Status.Reason)
	}
}

// Under memory pressure BestEffort pods are refused with kubelet's eviction reason and message,
// except critical (manifest-dir) pods; other pods are admitted.
func TestAdmissionUnderMemoryPressure(t *testing.T) {
	rt, st := newFakeRuntime(), store.NewMemory()
	files, mqtt := newFakeSource(source.File), newFakeSource(source.MQTT)
	pressure := func() []v1.NodeConditionType { return []v1.NodeConditionType{v1.NodeMemoryPressure} }
	a := startAgentWith(t, Options{Pressure: pressure}, rt, st, files, mqtt)
	files.send(resync(fileItem(memPod("static", ""), "static.yaml")))
	mqtt.send(source.Change{Op: source.Resync, Items: []source.Item{mqttItem(memPod("be", ""), 1), mqttItem(memPod("bu", "10Mi"), 1)}})
	waitPhase(t, a, "static", v1.PodRunning, "")
	waitPhase(t, a, "bu", v1.PodRunning, "")
	be := waitPhase(t, a, "be", v1.PodFailed, "Evicted")
	if be.Status.Message != "The node had condition: [MemoryPressure]. " {
		t.Errorf("message %q", be.Status.Message)
	}
}

// A host port a process on the node listens on refuses the pod; one free is fine.
func TestAdmissionHostPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := int32(l.Addr().(*net.TCPAddr).Port)
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.MQTT)
	a := startAgentWith(t, Options{}, rt, st, src)
	p := testPod("web")
	p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 80, HostPort: port}}
	src.send(source.Change{Op: source.Resync, Items: []source.Item{mqttItem(p, 1)}})
	got := waitPhase(t, a, "web", v1.PodFailed, "NodePorts")
	if !strings.Contains(got.Status.Message, ":"+strconv.Itoa(int(port))+"/TCP is in use on the host") {
		t.Errorf("message %q", got.Status.Message)
	}
}

// Admission reads the node (allocatable, pressure) without holding the lock that event routing and
// the API need: those reads may be I/O.
func TestAdmissionReadsTheNodeOutsideTheLock(t *testing.T) {
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.MQTT)
	var a *Agent
	held := make(chan bool, 10)
	probe := func() bool {
		if a.mu.TryLock() {
			a.mu.Unlock()
			return false
		}
		return true
	}
	opts := Options{NodeName: "n", Log: slog.New(slog.DiscardHandler),
		Allocatable: func() v1.ResourceList { held <- probe(); return v1.ResourceList{} },
		Pressure:    func() []v1.NodeConditionType { held <- probe(); return nil }}
	a = New(opts, rt, st, src)
	a.runCtx, a.stop = context.WithCancel(context.Background())
	defer a.shutdown()
	a.Apply(source.MQTT, source.Change{Op: source.Resync, Items: []source.Item{mqttItem(testPod("x"), 1)}})
	if len(held) != 2 {
		t.Fatalf("node read %d times, want 2", len(held))
	}
	for range 2 {
		if <-held {
			t.Errorf("the node was read with a.mu held")
		}
	}
}

// A node shutdown stops the pods that are not critical first, then the manifest-dir ones; each ends
// Failed/Terminated with kubelet's message; new pods are refused meanwhile. The next start runs
// them all again, the refused one included.
func TestShutdownPodsCriticalLast(t *testing.T) {
	rt, st := newFakeRuntime(), store.NewMemory()
	files, mqtt := newFakeSource(source.File), newFakeSource(source.MQTT)
	a := startAgentWith(t, Options{}, rt, st, files, mqtt)
	files.send(resync(fileItem(testPod("static"), "static.yaml")))
	prio := testPod("prio")
	prio.Spec.PriorityClassName = "system-node-critical"
	mqtt.send(source.Change{Op: source.Resync, Items: []source.Item{mqttItem(testPod("app"), 1), mqttItem(prio, 1)}})
	for _, n := range []string{"static", "app", "prio"} {
		waitPhase(t, a, n, v1.PodRunning, "")
	}

	a.ShutdownPods(context.Background(), 5*time.Second, 5*time.Second)
	if !a.ShuttingDown() {
		t.Errorf("ShuttingDown is false during a shutdown")
	}
	exited := map[string]time.Time{}
	for _, n := range []string{"static", "app", "prio"} {
		p := waitPhase(t, a, n, v1.PodFailed, pod.ReasonNodeShutdown)
		if p.Status.Message != "Pod was terminated in response to imminent node shutdown." {
			t.Errorf("%s: message %q", n, p.Status.Message)
		}
		cs, _ := rt.ListContainers(context.Background(), string(p.UID))
		if len(cs) != 1 || cs[0].State != ctrd.StateExited {
			t.Fatalf("%s: containers %+v, want one stopped", n, cs)
		}
		exited[n] = cs[0].ExitedAt
	}
	if !exited["app"].Before(exited["static"]) || !exited["app"].Before(exited["prio"]) {
		t.Errorf("stop order: app %v, static %v, prio %v; want app first", exited["app"], exited["static"], exited["prio"])
	}
	mqtt.send(source.Change{Op: source.Upsert, Items: []source.Item{mqttItem(testPod("late"), 1)}})
	late := waitPhase(t, a, "late", v1.PodFailed, "NodeShutdown")
	if late.Status.Message != "Pod was rejected as the node is shutting down." {
		t.Errorf("late: %q", late.Status.Message)
	}
	if rt.podContainers(late.UID) != 0 {
		t.Errorf("a pod refused during the shutdown started")
	}
	a.stopAgent()

	// The next boot: everything desired runs again.
	a = startAgentWith(t, Options{}, rt, st, newFakeSource(source.File), newFakeSource(source.MQTT))
	for _, n := range []string{"static", "app", "prio", "late"} {
		p := waitPhase(t, a, n, v1.PodRunning, "")
		if p.Status.Reason != "" {
			t.Errorf("%s still carries %s", n, p.Status.Reason)
		}
	}
	if a.ShuttingDown() {
		t.Errorf("a fresh agent says it is shutting down")
	}
}

// A pod whose grace period is shorter than its group's keeps its own; the wait for a group ends
// when its pods have stopped, not at the end of the group's grace.
func TestShutdownPodsWaitsOnlyUntilStopped(t *testing.T) {
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.MQTT)
	a := startAgentWith(t, Options{}, rt, st, src)
	src.send(source.Change{Op: source.Resync, Items: []source.Item{mqttItem(testPod("app"), 1)}})
	waitPhase(t, a, "app", v1.PodRunning, "")
	done := make(chan struct{})
	go func() { a.ShutdownPods(context.Background(), time.Hour, time.Hour); close(done) }()
	eventually(t, "ShutdownPods returns once the pods stopped (their grace is an hour)", func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
	if p := podNamed(a, "app"); p.Status.Phase != v1.PodFailed {
		t.Errorf("returned before app stopped: %s", p.Status.Phase)
	}
	a.CancelShutdown()
	if a.ShuttingDown() {
		t.Errorf("still shutting down after CancelShutdown")
	}
	src.send(source.Change{Op: source.Upsert, Items: []source.Item{mqttItem(testPod("next"), 1)}})
	waitPhase(t, a, "next", v1.PodRunning, "")
}

// Apply tells the source what it refused (so the MQTT source can acknowledge a refusal durably
// instead of listing the pod as applied), and that a change it could not store was not acted on.
func TestApplyResultNamesRefusalsAndStoreFailures(t *testing.T) {
	rt, src := newFakeRuntime(), newFakeSource(source.MQTT)
	st := &failingDesired{State: store.NewMemory()}
	a := New(Options{NodeName: "n", Log: slog.New(slog.DiscardHandler)}, rt, st, src)
	a.runCtx, a.stop = context.WithCancel(context.Background())
	defer a.shutdown()

	bad := testPod("bad")
	bad.Spec.HostNetwork = true // the default policy refuses host namespaces for MQTT pods
	res := a.Apply(source.MQTT, source.Change{Op: source.Upsert, Items: []source.Item{mqttItem(testPod("good"), 1), mqttItem(bad, 1)}})
	if res.Err != nil || len(res.Rejected) != 1 || !strings.Contains(res.Rejected["default/bad"], "host") {
		t.Fatalf("Apply = %+v, want default/bad refused for its host namespace and nothing else", res)
	}
	st.fail = true
	res = a.Apply(source.MQTT, source.Change{Op: source.Upsert, Items: []source.Item{mqttItem(testPod("later"), 2)}})
	if res.Err == nil || !strings.Contains(res.Err.Error(), "disk full") {
		t.Fatalf("Apply with a failing store = %+v, want the store's error", res)
	}
}

// failingDesired is a store whose desired-pod writes fail when fail is set.
type failingDesired struct {
	store.State
	fail bool
}

func (f *failingDesired) UpdateDesired(put []store.DesiredPod, del []types.UID) error {
	if f.fail {
		return errors.New("disk full")
	}
	return f.State.UpdateDesired(put, del)
}

// Critical pod admission (kubelet's): a manifest-dir pod that does not fit evicts the fewest,
// lowest-QoS control-plane pods that make room, each Failed with Preempting and a Warning naming
// the critical pod, and then runs; the critical pods already running and the pods not needed stay.
// A critical pod that no preemption can fit is refused as before, and nothing is stopped for it.
func TestCriticalPodPreemptsToFit(t *testing.T) {
	rt, st, rep := newFakeRuntime(), store.NewMemory(), &fakeReporter{}
	files, mqtt := newFakeSource(source.File), newFakeSource(source.MQTT)
	a := startAgentWith(t, Options{Report: rep, Allocatable: allocatable("memory=1Gi")}, rt, st, files, mqtt)
	files.send(resync(fileItem(memPod("first", "200Mi"), "first.yaml")))
	guaranteed := memPod("guaranteed", "300Mi")
	guaranteed.Spec.Containers[0].Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse("300Mi")}
	mqtt.send(source.Change{Op: source.Resync, Items: []source.Item{mqttItem(guaranteed, 1),
		mqttItem(memPod("big", "300Mi"), 1), mqttItem(memPod("small", "200Mi"), 1)}})
	for _, n := range []string{"first", "guaranteed", "big", "small"} {
		waitPhase(t, a, n, v1.PodRunning, "")
	}
	// 1000Mi of 1024Mi are taken; a manifest pod of 150Mi needs 126Mi more: small (Burstable, the
	// closest fit) goes, not the Guaranteed pod, not big, never the critical first.
	files.send(resync(fileItem(memPod("first", "200Mi"), "first.yaml"), fileItem(memPod("static", "150Mi"), "static.yaml")))
	small := waitPhase(t, a, "small", v1.PodFailed, "Preempting")
	if want := "Preempted in order to admit critical pod default/static"; small.Status.Message != want {
		t.Errorf("small's message %q, want %q", small.Status.Message, want)
	}
	waitPhase(t, a, "static", v1.PodRunning, "")
	for _, n := range []string{"first", "guaranteed", "big"} {
		if p := podNamed(a, n); p.Status.Phase != v1.PodRunning {
			t.Errorf("%s: %s %s, want Running", n, p.Status.Phase, p.Status.Reason)
		}
	}
	es := eventsWithReason(rep, "Preempting")
	if len(es) != 1 || es[0].Type != event.Warning || es[0].Object.Name != "small" || es[0].Message != small.Status.Message {
		t.Errorf("Preempting events %+v, want one Warning on small naming static", es)
	}
	// Too big even with every control-plane pod gone: refused, and no pod is stopped for it.
	files.send(resync(fileItem(memPod("first", "200Mi"), "first.yaml"), fileItem(memPod("static", "150Mi"), "static.yaml"),
		fileItem(memPod("huge", "900Mi"), "huge.yaml")))
	waitPhase(t, a, "huge", v1.PodFailed, "OutOfmemory")
	for _, n := range []string{"guaranteed", "big"} {
		if p := podNamed(a, n); p.Status.Phase != v1.PodRunning {
			t.Errorf("%s stopped for a critical pod that could not fit anyway: %s %s", n, p.Status.Phase, p.Status.Reason)
		}
	}
}
