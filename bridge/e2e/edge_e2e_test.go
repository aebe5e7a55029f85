package e2e

// The end-to-end tests of mqlet-bridge with a real agent: one edge node in a real cluster, driven
// the way a user drives it (client-go calls equal to kubectl's), checked on three sides: the API,
// the broker's retained state and containerd itself.

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/internal/testenv"
	"github.com/mqlet/mqlet/sync/protocol"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Bounds of the waits. kubetest's node lifecycle controller marks a node Unknown 20s after its
// Lease's last renewal (bridge: every 10s) and looks every 2s.
const (
	readyBound   = 90 * time.Second
	runBound     = 90 * time.Second
	unknownBound = 60 * time.Second
)

const testNS = metav1.NamespaceDefault

// edgeSuite carries what one step leaves for the next.
type edgeSuite struct {
	w *edgeWorld

	configMap string // mounted by the Deployment's pod
	deploy    string
	depPod    *v1.Pod // the Deployment's running pod

	tolerant *v1.Pod // survives the node's absence; checked again after the bridge takeover
}

// TestEdgeNode runs the end-to-end scenarios in order on one cluster, one broker, two
// bridge replicas and one agent.
func TestEdgeNode(t *testing.T) {
	w := newEdgeWorld(t)
	w.startCloudNode("cloud-e2e")
	w.startBridge(t, "bridge-a")
	w.startBridge(t, "bridge-b")
	w.startAgent(t)
	s := &edgeSuite{w: w}

	steps := []struct {
		name string
		run  func(*testing.T)
	}{
		{"NodeRegistersAndTurnsReady", s.nodeRegistersAndTurnsReady},
		{"DeploymentPodRunsOnContainerd", s.deploymentPodRunsOnContainerd},
		{"ConfigMapChangeReachesMountedFile", s.configMapChangeReachesMountedFile},
		{"DeletePodRemovesContainerThenObject", s.deletePodRemovesContainerThenObject},
		{"NodeOfflineAndBack", s.nodeOfflineAndBack},
		{"TwoBridgesDoNotFight", s.twoBridgesDoNotFight},
	}
	for _, st := range steps {
		ok := t.Run(st.name, func(t *testing.T) {
			st.run(t)
			w.checkProcs(t)
		})
		if !ok {
			// Each step builds on the world the previous one left; later ones would only fail
			// for the same reason.
			t.Fatalf("step %s failed: the later steps depend on it", st.name)
		}
	}
}

func (s *edgeSuite) nodeRegistersAndTurnsReady(t *testing.T) {
	w := s.w
	ctx := context.Background()
	var n *v1.Node
	within(t, readyBound, "Node "+edgeNode+" registered, Ready, not-ready taint gone", func() (bool, string) {
		var err error
		n, err = w.kube.CoreV1().Nodes().Get(ctx, edgeNode, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		notReadyTaint := slices.ContainsFunc(n.Spec.Taints, func(x v1.Taint) bool { return x.Key == v1.TaintNodeNotReady })
		return nodeReady(n) == v1.ConditionTrue && !notReadyTaint, fmt.Sprintf("Ready=%s taints=%v", nodeReady(n), n.Spec.Taints)
	})
	want := map[string]string{
		"kubernetes.io/hostname": edgeNode, "kubernetes.io/os": "linux", "kubernetes.io/arch": runtime.GOARCH,
		edgeRoleLabel: "", "site": "e2e-lab",
	}
	for k, v := range want {
		if got, ok := n.Labels[k]; !ok || got != v {
			t.Errorf("label %s = %q (present %v), want %q; labels %v", k, got, ok, v, n.Labels)
		}
	}
	if !slices.ContainsFunc(n.Spec.Taints, func(x v1.Taint) bool {
		return x.Key == "mqlet.io/edge" && x.Value == "true" && x.Effect == v1.TaintEffectPreferNoSchedule
	}) {
		t.Errorf("taints %v lack the agent's mqlet.io/edge=true:PreferNoSchedule", n.Spec.Taints)
	}
	if !strings.HasPrefix(n.Status.NodeInfo.ContainerRuntimeVersion, "containerd://") || len(n.Status.Addresses) == 0 ||
		n.Status.Allocatable.Pods().Value() == 0 {
		t.Errorf("node status lacks the agent's facts: runtime %q, addresses %v, allocatable %v",
			n.Status.NodeInfo.ContainerRuntimeVersion, n.Status.Addresses, n.Status.Allocatable)
	}

	// The node Lease is the heartbeat Kubernetes watches: held in the node's name and renewed.
	// The Lease and the Ready status are two writes of the bridge: the Lease may follow a moment
	// after the status (seen under load in CI).
	leases := w.kube.CoordinationV1().Leases("kube-node-lease")
	var l *coordinationv1.Lease
	within(t, readyBound, "the node Lease in kube-node-lease", func() (bool, string) {
		var err error
		l, err = leases.Get(ctx, edgeNode, metav1.GetOptions{})
		return err == nil, errString(err)
	})
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != edgeNode || l.Spec.RenewTime == nil {
		t.Fatalf("node Lease %+v: want holder %s and a renew time", l.Spec, edgeNode)
	}
	first := l.Spec.RenewTime.Time
	within(t, 30*time.Second, "node Lease renewed", func() (bool, string) {
		l, err := leases.Get(ctx, edgeNode, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return l.Spec.RenewTime.After(first), fmt.Sprintf("renewTime %v (first %v)", l.Spec.RenewTime, first)
	})
}

// shLoop is a container command that stops at once on SIGTERM (busybox's sh as pid 1 would
// otherwise ignore it for the whole grace period).
func shLoop(body string) []string {
	return []string{"sh", "-c", `trap "exit 0" TERM; while true; do ` + body + `; sleep 1; done`}
}

func (s *edgeSuite) deploymentPodRunsOnContainerd(t *testing.T) {
	w := s.w
	ctx := context.Background()
	s.configMap, s.deploy = uniqueName("cfg"), uniqueName("web")
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: s.configMap}, Data: map[string]string{"greeting": "hello-1"}}
	if _, err := w.kube.CoreV1().ConfigMaps(testNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": s.deploy}
	grace := int64(5)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: s.deploy},
		Spec: appsv1.DeploymentSpec{
			Replicas: new(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: v1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: v1.PodSpec{
					NodeSelector:                  map[string]string{edgeRoleLabel: "", "kubernetes.io/hostname": edgeNode},
					TerminationGracePeriodSeconds: &grace,
					Containers: []v1.Container{{
						Name: "main", Image: testenv.BusyboxRef,
						Command:      shLoop(`echo "greeting=$(cat /etc/cfg/greeting)"`),
						VolumeMounts: []v1.VolumeMount{{Name: "cfg", MountPath: "/etc/cfg"}},
					}},
					Volumes: []v1.Volume{{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
						LocalObjectReference: v1.LocalObjectReference{Name: s.configMap}}}}},
				},
			},
		},
	}
	if _, err := w.kube.AppsV1().Deployments(testNS).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.depPod = s.waitDeploymentPod(t, "")
	p := s.depPod
	if !slices.ContainsFunc(p.Status.Conditions, func(c v1.PodCondition) bool {
		return c.Type == v1.PodScheduled && c.Status == v1.ConditionTrue
	}) {
		t.Errorf("pod %s: no PodScheduled=True condition (the scheduler's): %v", p.Name, p.Status.Conditions)
	}
	cs := p.Status.ContainerStatuses[0]
	if cs.RestartCount != 0 || !cs.Ready || !strings.HasPrefix(cs.ContainerID, "containerd://") || cs.ImageID == "" {
		t.Errorf("container status %+v: want ready, restartCount 0, a containerd:// id and an image id", cs)
	}
	if _, ok := w.tasks(t)[containerdID(cs.ContainerID)]; !ok {
		t.Errorf("container %s of pod %s has no running task in containerd namespace %s", cs.ContainerID, p.Name, w.ns)
	}
	if p.Status.ObservedGeneration != p.Generation {
		t.Errorf("status.observedGeneration %d, want the pod's generation %d", p.Status.ObservedGeneration, p.Generation)
	}

	// The agent's events about the pod, as events.k8s.io/v1 Events from the bridge.
	within(t, 30*time.Second, "a Started Event for pod "+p.Name, func() (bool, string) {
		evs, err := w.kube.EventsV1().Events(testNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range evs.Items {
			if e.Regarding.Kind != "Pod" || e.Regarding.Name != p.Name {
				continue
			}
			seen = append(seen, e.ReportingController+"/"+e.Reason)
			if e.Reason == "Started" && e.ReportingController == "mqlet.io/mqlet" && e.Regarding.UID == p.UID &&
				e.ReportingInstance != "" && strings.Contains(e.Note, "main") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("events for the pod: %v", seen)
	})
}

// waitDeploymentPod waits for the Deployment's pod (other than the one with uid not) to run on
// the edge node, and returns it.
func (s *edgeSuite) waitDeploymentPod(t *testing.T, not types.UID) *v1.Pod {
	t.Helper()
	var found *v1.Pod
	within(t, runBound, "the Deployment's pod Running on "+edgeNode, func() (bool, string) {
		pods, err := s.w.kube.CoreV1().Pods(testNS).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + s.deploy})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for i := range pods.Items {
			p := &pods.Items[i]
			seen = append(seen, podSummary(p))
			if p.UID != not && p.DeletionTimestamp == nil && p.Spec.NodeName == edgeNode && podRunning(p) {
				found = p
				return true, ""
			}
		}
		return false, strings.Join(seen, "; ")
	})
	return found
}

func (s *edgeSuite) configMapChangeReachesMountedFile(t *testing.T) {
	w := s.w
	ctx := context.Background()
	logHas := func(want string) func() (bool, string) {
		return func() (bool, string) {
			out, err := w.containerLog(testNS, s.depPod.Name, "main")
			if err != nil {
				return false, err.Error()
			}
			return strings.Contains(out, want), lastLine(out)
		}
	}
	within(t, 30*time.Second, "the container prints the configMap's first value", logHas("greeting=hello-1"))
	cm, err := w.kube.CoreV1().ConfigMaps(testNS).Get(ctx, s.configMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["greeting"] = "hello-2"
	if _, err := w.kube.CoreV1().ConfigMaps(testNS).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	within(t, 90*time.Second, "the changed configMap value in the container's mounted file", logHas("greeting=hello-2"))
	// kubectl logs does not reach edge pods; `mqlet ctl logs` over the same broker does (README).
	within(t, 30*time.Second, "`mqlet ctl logs` over MQTT shows the new value", func() (bool, string) {
		out, err := w.mqletCLI("ctl", "--broker", w.broker.Plain, "logs", s.depPod.Name, "--node", edgeNode, "--tail", "3")
		return err == nil && strings.Contains(out, "greeting=hello-2"), fmt.Sprint(out, err)
	})
	// The file changed under the running container: no restart.
	p, err := w.kube.CoreV1().Pods(testNS).Get(ctx, s.depPod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.Status.ContainerStatuses[0].ContainerID, s.depPod.Status.ContainerStatuses[0].ContainerID; got != want {
		t.Errorf("container id changed from %s to %s: the configMap change restarted the container", want, got)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

func (s *edgeSuite) deletePodRemovesContainerThenObject(t *testing.T) {
	w := s.w
	ctx := context.Background()
	p := s.depPod
	id := containerdID(p.Status.ContainerStatuses[0].ContainerID)
	if err := w.kube.CoreV1().Pods(testNS).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The object stays (Terminating) until the node confirmed; once it is gone, the container
	// must already be stopped.
	w.waitPodGone(t, p)
	if pid, ok := w.tasks(t)[id]; ok {
		t.Errorf("the API object of pod %s is gone but its container %s still runs (pid %d): the bridge did not wait for the node", p.Name, id, pid)
	}
	within(t, 30*time.Second, "container "+id+" removed from containerd", func() (bool, string) {
		ids := w.containers(t)
		return !slices.Contains(ids, id), fmt.Sprintf("containers %v", ids)
	})
	// The ReplicaSet replaces the pod, on the edge node again.
	s.depPod = s.waitDeploymentPod(t, p.UID)
}

// edgePod is a pod bound to the edge node directly (spec.nodeName, as after scheduling).
func edgePod(name string, tolerations ...v1.Toleration) *v1.Pod {
	grace := int64(5)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"e2e": "edge"}},
		Spec: v1.PodSpec{
			NodeName:                      edgeNode,
			TerminationGracePeriodSeconds: &grace,
			Tolerations:                   tolerations,
			Containers:                    []v1.Container{{Name: "main", Image: testenv.BusyboxRef, Command: shLoop("true")}},
		},
	}
}

// edgeTolerations are the ones README documents for edge workloads: stay bound however long the
// node is away.
func edgeTolerations() []v1.Toleration {
	return []v1.Toleration{
		{Key: v1.TaintNodeUnreachable, Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoExecute},
		{Key: v1.TaintNodeNotReady, Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoExecute},
	}
}

func (s *edgeSuite) createPod(t *testing.T, p *v1.Pod) *v1.Pod {
	t.Helper()
	got, err := s.w.kube.CoreV1().Pods(testNS).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", p.Name, err)
	}
	return got
}

// waitRunning waits until the API shows the pod running with a container whose task runs in
// containerd, and returns the pod.
func (s *edgeSuite) waitRunning(t *testing.T, name string) *v1.Pod {
	t.Helper()
	var p *v1.Pod
	within(t, runBound, "pod "+name+" Running with a running task", func() (bool, string) {
		var err error
		p, err = s.w.kube.CoreV1().Pods(testNS).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if !podRunning(p) || !podConditionTrue(p, v1.PodReady) {
			return false, podSummary(p)
		}
		_, ok := s.w.tasks(t)[containerdID(p.Status.ContainerStatuses[0].ContainerID)]
		return ok, podSummary(p) + " (no running task yet)"
	})
	return p
}

func podConditionTrue(p *v1.Pod, c v1.PodConditionType) bool {
	return slices.ContainsFunc(p.Status.Conditions, func(x v1.PodCondition) bool { return x.Type == c && x.Status == v1.ConditionTrue })
}

func (s *edgeSuite) nodeOfflineAndBack(t *testing.T) {
	w := s.w
	ctx := context.Background()
	pods := w.kube.CoreV1().Pods(testNS)

	tolerant := s.createPod(t, edgePod(uniqueName("tolerant"), edgeTolerations()...))
	evictable := s.createPod(t, edgePod(uniqueName("evictable"), v1.Toleration{
		Key: v1.TaintNodeUnreachable, Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoExecute, TolerationSeconds: new(int64(5))}))
	tolerant = s.waitRunning(t, tolerant.Name)
	evictable = s.waitRunning(t, evictable.Name)
	tolID := containerdID(tolerant.Status.ContainerStatuses[0].ContainerID)
	evID := containerdID(evictable.Status.ContainerStatuses[0].ContainerID)
	tolPid := w.tasks(t)[tolID]

	// The agent stops (SIGTERM: it publishes offline); its containers keep running.
	w.stopAgent(t)
	stoppedAt := time.Now()
	var n *v1.Node
	within(t, unknownBound, "node Ready Unknown and tainted unreachable after the agent stopped", func() (bool, string) {
		var err error
		n, err = w.kube.CoreV1().Nodes().Get(ctx, edgeNode, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		tainted := slices.ContainsFunc(n.Spec.Taints, func(x v1.Taint) bool {
			return x.Key == v1.TaintNodeUnreachable && x.Effect == v1.TaintEffectNoExecute
		})
		return nodeReady(n) == v1.ConditionUnknown && tainted, fmt.Sprintf("Ready=%s taints=%v", nodeReady(n), n.Spec.Taints)
	})
	t.Logf("node Unknown and tainted unreachable %s after the agent stopped", time.Since(stoppedAt).Round(time.Second))
	if l, err := w.kube.CoordinationV1().Leases("kube-node-lease").Get(ctx, edgeNode, metav1.GetOptions{}); err != nil {
		t.Error(err)
	} else if l.Spec.RenewTime.After(stoppedAt.Add(2 * time.Second)) {
		// A renewal already on its way when the agent stopped may land just after.
		t.Errorf("node Lease renewed at %v, after the agent stopped at %v", l.Spec.RenewTime.Time, stoppedAt)
	}

	// Without the tolerations, the taint eviction controller deletes the pod after its 5s; the
	// node is away, so the pod stays Terminating and its container keeps running.
	within(t, 30*time.Second, "pod "+evictable.Name+" deleted (Terminating) by the taint eviction controller", func() (bool, string) {
		p, err := pods.Get(ctx, evictable.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.DeletionTimestamp != nil, podSummary(p)
	})
	// A pod bound to the node while it is away.
	born := s.createPod(t, edgePod(uniqueName("offline-born"), edgeTolerations()...))

	// Still away: the tolerant pod is left alone, the evicted one waits for its node.
	if p, err := pods.Get(ctx, tolerant.Name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("tolerant pod %s while the node is away: %v %s", tolerant.Name, err, podSummary(p))
	}
	if p, err := pods.Get(ctx, evictable.Name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp == nil {
		t.Errorf("evicted pod %s, while its node is away, should stay Terminating: %v %s", evictable.Name, err, podSummary(p))
	}
	tasks := w.tasks(t)
	if tasks[tolID] != tolPid || tasks[evID] == 0 {
		t.Errorf("containers while the agent is stopped: tolerant %s pid %d (was %d), evicted %s pid %d; want both running",
			tolID, tasks[tolID], tolPid, evID, tasks[evID])
	}

	w.startAgent(t)
	within(t, readyBound, "node Ready again after the agent returned", func() (bool, string) {
		n, err := w.kube.CoreV1().Nodes().Get(ctx, edgeNode, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return nodeReady(n) == v1.ConditionTrue, fmt.Sprintf("Ready=%s", nodeReady(n))
	})

	t.Run("TolerantPodNotRestarted", func(t *testing.T) {
		p := s.waitRunning(t, tolerant.Name)
		cs := p.Status.ContainerStatuses[0]
		if got := containerdID(cs.ContainerID); got != tolID || cs.RestartCount != 0 {
			t.Errorf("tolerant pod after the node returned: container %s restarts %d, want %s restarts 0", got, cs.RestartCount, tolID)
		}
		if pid := w.tasks(t)[tolID]; pid != tolPid {
			t.Errorf("tolerant pod's task pid %d, want the same process %d as before the node went away", pid, tolPid)
		}
		s.tolerant = p
	})
	t.Run("EvictedPodStoppedThenDeleted", func(t *testing.T) {
		within(t, runBound, "evicted pod "+evictable.Name+" gone from the API", func() (bool, string) {
			p, err := pods.Get(ctx, evictable.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, ""
			}
			return false, fmt.Sprint(err, podSummary(p))
		})
		if pid, ok := w.tasks(t)[evID]; ok {
			t.Errorf("evicted pod's object is gone but its container %s still runs (pid %d)", evID, pid)
		}
	})
	t.Run("PodCreatedWhileOfflineRuns", func(t *testing.T) {
		s.waitRunning(t, born.Name)
	})
}

func (s *edgeSuite) twoBridgesDoNotFight(t *testing.T) {
	w := s.w
	ctx := context.Background()
	// Both replicas have run through every step so far.
	s.checkRetained(t)
	lead := w.leader(t)
	var standby *bridgeProc
	w.mu.Lock()
	for id, b := range w.bridges {
		if id != lead.identity && b.running() {
			standby = b
		}
	}
	w.mu.Unlock()
	if standby == nil {
		t.Fatal("no standby bridge running")
	}
	// Only the leader is connected to the broker and acts.
	for _, c := range []struct {
		b             *bridgeProc
		leader, ready string
	}{{lead, "1", "ready: leader"}, {standby, "0", "ready: standby"}} {
		m, err := httpGet("http://" + c.b.metrics + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		if got := metricValue(m, "bridge_leader"); got != c.leader {
			t.Errorf("bridge %s: bridge_leader %s, want %s", c.b.identity, got, c.leader)
		}
		if got := metricValue(m, "bridge_mqtt_connected"); got != c.leader {
			t.Errorf("bridge %s: bridge_mqtt_connected %s, want %s", c.b.identity, got, c.leader)
		}
		if r, err := httpGet("http://" + c.b.metrics + "/readyz"); err != nil || !strings.HasPrefix(r, c.ready) {
			t.Errorf("bridge %s /readyz: %q %v, want %q", c.b.identity, r, err, c.ready)
		}
	}

	// One change, one index revision: a pod bound to the node, then a label change on it. The
	// status writes in between (the bridge's own) must not republish it.
	key := func(name string) string { return protocol.ObjectKey(protocol.KindPod, testNS, name) }
	p := s.createPod(t, edgePod(uniqueName("once"), edgeTolerations()...))
	s.waitRunning(t, p.Name)
	// A merge patch, not a read-modify-write: the bridge may write the pod's status in between.
	if _, err := w.kube.CoreV1().Pods(testNS).Patch(ctx, p.Name, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"changed":"yes"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// The relabelled pod's generation, then what the node was sent up to it: two desired messages
	// and two index revisions that list the pod, one per change.
	var relabelled int64
	within(t, 30*time.Second, "the relabelled pod in the node's desired state", func() (bool, string) {
		msgs := w.watch.podMessages(key(p.Name))
		for _, m := range msgs {
			if m.labels["changed"] == "yes" {
				relabelled = m.generation
				return true, ""
			}
		}
		return false, fmt.Sprintf("desired messages %+v", msgs)
	})
	var gens []int64 // the pod's generation in each index message that lists it, up to relabelled
	within(t, 30*time.Second, "an index listing the relabelled pod", func() (bool, string) {
		gens = gens[:0]
		for _, x := range w.watch.indexes() {
			e, ok := x.Objects[key(p.Name)]
			g := e.Generation
			if ok && (len(gens) == 0 || gens[len(gens)-1] != g) {
				gens = append(gens, g)
			}
			if g == relabelled {
				return true, ""
			}
		}
		return false, fmt.Sprintf("generations %v", gens)
	})
	var sent []int64
	for _, m := range w.watch.podMessages(key(p.Name)) {
		if !m.cleared && m.generation <= relabelled && !slices.Contains(sent, m.generation) {
			sent = append(sent, m.generation)
		}
	}
	if len(gens) != 2 || len(sent) != 2 {
		t.Errorf("pod %s was sent at generations %v and listed at %v by the index up to its relabelling: want one of each for the create and one for the label change",
			p.Name, sent, gens)
	}
	s.checkRetained(t)

	kubeletPort := func() int32 {
		n, err := w.kube.CoreV1().Nodes().Get(ctx, edgeNode, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n.Status.DaemonEndpoints.KubeletEndpoint.Port
	}
	portBefore := kubeletPort()

	// The leader dies without a word; the standby takes the Lease and carries on.
	if err := lead.stop(syscall.SIGKILL, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	delete(w.bridges, lead.identity) // its exit is wanted: checkProcs must not count it
	w.mu.Unlock()
	killedAt := time.Now()
	next := w.leader(t)
	if next.identity != standby.identity {
		t.Fatalf("leader after killing %s: %s, want %s", lead.identity, next.identity, standby.identity)
	}
	t.Logf("%s took over %s after %s was killed", next.identity, time.Since(killedAt).Round(time.Millisecond), lead.identity)
	after := s.waitRunning(t, s.createPod(t, edgePod(uniqueName("after-takeover"), edgeTolerations()...)).Name)
	if after.Spec.NodeName != edgeNode {
		t.Errorf("pod after takeover on node %q", after.Spec.NodeName)
	}
	// The new leader serves the node's kubelet API on the port the Node records (the old
	// leader's): the API server reaches it there for the pod's log.
	if _, err := w.kube.CoreV1().Pods(testNS).GetLogs(after.Name, &v1.PodLogOptions{}).DoRaw(ctx); err != nil {
		t.Errorf("log of pod %s through the API after the takeover: %v", after.Name, err)
	}
	if got := kubeletPort(); got != portBefore || got == 0 {
		t.Errorf("the node's kubelet port went from %d to %d with the takeover", portBefore, got)
	}
	// Nothing that ran was restarted by the new leader's first sync.
	tasks := w.tasks(t)
	for _, old := range []*v1.Pod{s.tolerant, s.depPod} {
		id := containerdID(old.Status.ContainerStatuses[0].ContainerID)
		if _, ok := tasks[id]; !ok {
			t.Errorf("pod %s's container %s no longer runs after the takeover", old.Name, id)
		}
	}
	s.checkRetained(t)

	// configs/bridge's RBAC was enough for everything the bridges did.
	w.mu.Lock()
	procs := slices.Clone(w.procs)
	w.mu.Unlock()
	for _, p := range procs {
		if strings.HasPrefix(p.name, "bridge-") {
			if lines := grepLines(p.log(), "forbidden"); lines != "" {
				t.Errorf("%s was refused by the API (RBAC):\n%s", p.name, lines)
			}
		}
	}
}

// checkRetained checks what the watcher saw of the node's retained state over the whole run: the
// index revision never went back or repeated with other content (two writers would make it), the
// node never refused a generation, and the broker never had two bridges connected at once.
func (s *edgeSuite) checkRetained(t *testing.T) {
	t.Helper()
	w := s.w
	idx := w.watch.indexes()
	if len(idx) == 0 {
		t.Fatal("the watcher saw no index message")
	}
	for i := 1; i < len(idx); i++ {
		a, b := idx[i-1], idx[i]
		if b.Revision < a.Revision || (b.Revision == a.Revision && !maps.Equal(a.Objects, b.Objects)) {
			t.Errorf("index went from revision %d %v to %d %v", a.Revision, a.Objects, b.Revision, b.Objects)
		}
	}
	// An index lists the digest of the payload sent at the generation it lists, and a pod's
	// retained topic is cleared only after an index that leaves the pod out.
	w.watch.mu.Lock()
	pods := maps.Clone(w.watch.pods)
	w.watch.mu.Unlock()
	for key, msgs := range pods {
		for _, m := range msgs {
			if m.cleared {
				var dropped bool
				for _, x := range idx {
					if _, listed := x.Objects[key]; x.seq < m.seq {
						dropped = !listed
					}
				}
				if !dropped {
					t.Errorf("%s was cleared (message %d) before an index left it out", key, m.seq)
				}
				continue
			}
			for _, x := range idx {
				if e, ok := x.Objects[key]; ok && e.Generation == m.generation && e.Digest != m.digest {
					t.Errorf("index revision %d lists %s at generation %d with digest %s; the payload sent has %s",
						x.Revision, key, e.Generation, e.Digest, m.digest)
				}
			}
		}
	}
	// The node's acks catch up with the last index: it took in everything written.
	last := idx[len(idx)-1].Revision
	within(t, 30*time.Second, fmt.Sprintf("the node's acks at index revision %d", last), func() (bool, string) {
		a := w.watch.latestAcks()
		return a != nil && a.IndexRevision >= last, fmt.Sprintf("acks %+v", a)
	})
	w.watch.mu.Lock()
	refused, bad := maps.Clone(w.watch.refused), slices.Clone(w.watch.bad)
	w.watch.mu.Unlock()
	if len(refused) > 0 {
		t.Errorf("the node refused generations: %v", refused)
	}
	if len(bad) > 0 {
		t.Errorf("undecodable retained messages: %v", bad)
	}
	// Both replicas have the admin identity, which the broker makes their client id.
	const fight = "Client " + mqtttest.Admin + " already connected, closing old connection"
	if log := tailFile(w.broker.LogFile, 100000); strings.Contains(log, fight) {
		t.Errorf("two bridges were connected to the broker at once (they fought over it):\n%s", grepLines(log, fight))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
