package e2e

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/internal/testenv"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/protocol"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// Admission and graceful node shutdown on the real agent and containerd.

func requesting(name, mem string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sleep", "3600"]
    resources:
      requests: {memory: ` + mem + `}
`
}

// runningTaskCount counts the running tasks of the pod's containers, from containerd itself.
func (h *harness) runningTaskCount(p *v1.Pod) int {
	n := 0
	tasks := h.tasks()
	for id := range tasks {
		if strings.HasPrefix(id, ctrd.ContainerIDPrefix(string(p.UID))) {
			n++
		}
	}
	return n
}

func refusedWith(reason string) func(*v1.Pod) bool {
	return func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed && p.Status.Reason == reason }
}

// A pod that does not fit node allocatable is refused with kubelet's reason and message, stays
// listed as Failed (`mqlet pods` shows the reason as STATUS, `describe` the message) and never
// starts; it does not count, so a pod that fits runs; with maxPods 1 the next one is OutOfpods.
func TestAdmissionRefusesPodsThatDoNotFit(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("big.yaml", requesting("big", "1Ti"))
	h.startAgent("--max-pods", "1")
	big := h.waitPod("big", "refused", refusedWith("OutOfmemory"))
	if !strings.HasPrefix(big.Status.Message, "Node didn't have enough resource: memory, requested: 1099511627776, used: 0, capacity: ") {
		t.Errorf("message %q", big.Status.Message)
	}
	h.writeManifest("small.yaml", requesting("small", "16Mi"))
	h.waitPod("small", "running beside the refused pod", allRunning)
	if n := h.runningTaskCount(big); n != 0 {
		t.Errorf("the refused pod has %d running tasks", n)
	}
	for _, id := range h.containerIDs() {
		if strings.HasPrefix(id, ctrd.ContainerIDPrefix(string(big.UID))) {
			t.Errorf("the refused pod has container %s", id)
		}
	}

	h.writeManifest("third.yaml", requesting("third", "16Mi"))
	third := h.waitPod("third", "refused", refusedWith("OutOfpods"))
	if third.Status.Message != "Node didn't have enough resource: pods, requested: 1, used: 1, capacity: 1" {
		t.Errorf("message %q", third.Status.Message)
	}
	out := h.mqlet("pods")
	for _, want := range []string{"big", "OutOfmemory", "third", "OutOfpods", "small"} {
		if !strings.Contains(out, want) {
			t.Errorf("mqlet pods lacks %q:\n%s", want, out)
		}
	}
	if row := lineWith(out, "big"); !strings.Contains(row, "0/1") || !strings.Contains(row, "OutOfmemory") {
		t.Errorf("big's row: %q", row)
	}
	desc := h.mqlet("describe", "pod", "third")
	for _, want := range []string{"Failed", "OutOfpods", "Node didn't have enough resource: pods, requested: 1, used: 1, capacity: 1"} {
		if !strings.Contains(desc, want) {
			t.Errorf("describe lacks %q:\n%s", want, desc)
		}
	}
	if !strings.Contains(h.agentLog.String(), "pod refused at admission") {
		t.Errorf("no log of the refusal")
	}

	// A refused pod made to fit is admitted afresh once there is room.
	os.Remove(filepath.Join(h.manifests, "small.yaml"))
	waitFor(t, "small gone", func() bool { _, err := h.getPod("small"); return err != nil })
	h.writeManifest("big.yaml", requesting("big", "8Mi"))
	h.waitPod("big", "running once it fits", allRunning)
}

// Critical pod admission on the real agent: with maxPods 3 taken by two control-plane pods and a
// manifest pod, a second manifest pod (critical, like kubelet's static pods) does not wait for room:
// the smaller control-plane pod is stopped, Failed with Preempting and a message naming the
// manifest pod, and the manifest pod runs; the other pods keep their containers.
func TestCriticalPodPreemptsForReal(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	cp := newControlPlane(t, b.Plain)
	h.writeManifest("first.yaml", requesting("first", "16Mi"))
	h.startMQTTAgent(b.Plain, "--max-pods", "3")
	cp.applyYAML(requesting("big", "64Mi"), requesting("small", "32Mi"))
	keep := map[string]map[string]uint32{}
	for _, name := range []string{"first", "big", "small"} {
		p := h.waitPod(name, "running", allRunning)
		keep[name] = h.podTasks(p)
	}
	h.writeManifest("static.yaml", requesting("static", "16Mi"))
	static := h.waitPod("static", "running after making room", allRunning)
	small := h.waitPod("small", "preempted", refusedWith("Preempting"))
	if want := "Preempted in order to admit critical pod default/" + static.Name; small.Status.Message != want {
		t.Errorf("small's message %q, want %q", small.Status.Message, want)
	}
	waitFor(t, "small's container stopped", func() bool { return len(h.podTasks(small)) == 0 })
	for _, name := range []string{"first", "big"} {
		p, err := h.getPod(name)
		if err != nil || !allRunning(p) || !equalPids(h.podTasks(p), keep[name]) {
			t.Errorf("%s disturbed: %v %v", name, p, err)
		}
	}
	if !strings.Contains(h.agentLog.String(), "pod preempted to admit a critical pod") {
		t.Errorf("no log of the preemption")
	}
}

func lineWith(out, word string) string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == word {
			return l
		}
	}
	return ""
}

// A hostPort that a process on the node listens on (the test's own listener on 127.0.0.1) refuses
// the pod with kubelet's NodePorts reason; once free, a new version of the pod runs.
func TestAdmissionRefusesTakenHostPort(t *testing.T) {
	h := newHarness(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	pod := func(arg string) string {
		return `apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sleep", "` + arg + `"]
    ports: [{containerPort: 80, hostPort: ` + port + `}]
`
	}
	h.writeManifest("web.yaml", pod("3600"))
	h.startAgent()
	web := h.waitPod("web", "refused", refusedWith("NodePorts"))
	if !strings.HasPrefix(web.Status.Message, "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports") ||
		!strings.Contains(web.Status.Message, ":"+port+"/TCP is in use on the host") {
		t.Errorf("message %q", web.Status.Message)
	}
	if out := h.mqlet("pods"); !strings.Contains(lineWith(out, "web"), "NodePorts") {
		t.Errorf("mqlet pods:\n%s", out)
	}
	if n := h.runningTaskCount(web); n != 0 {
		t.Errorf("refused pod runs %d tasks", n)
	}
	l.Close()
	h.writeManifest("web.yaml", pod("3601"))
	h.waitPod("web", "running once the port is free", allRunning)
}

// unmountStateMounts unmounts what an agent mounted under its state dir (as the harness does):
// pod namespaces are bind mounts there and each pod's /dev/shm a tmpfs in its pod dir.
func unmountStateMounts(state string) {
	var all []string
	for _, pattern := range []string{"netns/*", "ipcns/*", "pidns/*", "pods/*/shm"} {
		m, _ := filepath.Glob(filepath.Join(state, pattern))
		all = append(all, m...)
	}
	for _, m := range all {
		unix.Unmount(m, unix.MNT_DETACH)
	}
}

// mqttLikeSource delivers pods as a non-file source would (the MQTT downlink), so they are not
// critical; it sends its set once.
type mqttLikeSource struct{ pods []*v1.Pod }

func (s mqttLikeSource) Kind() source.Kind { return source.MQTT }

func (s mqttLikeSource) Run(ctx context.Context, deliver func(source.Change) source.Result) error {
	c := source.Change{Op: source.Resync}
	for _, p := range s.pods {
		c.Items = append(c.Items, source.Item{Pod: p, Ref: source.Ref{Kind: source.MQTT, Origin: "test/" + p.Name}, Generation: 1})
	}
	deliver(c)
	<-ctx.Done()
	return nil
}

// Under memory pressure (the pressure reading injected into an in-process agent) a BestEffort pod
// from the control plane is refused with kubelet's eviction reason; a Burstable one and a
// manifest-dir (critical) BestEffort one run on the real containerd.
func TestAdmissionBestEffortRefusedUnderMemoryPressure(t *testing.T) {
	env := testenv.Require(t)
	dir, err := os.MkdirTemp("", "mq")
	if err != nil {
		t.Fatal(err)
	}
	// Pod namespaces are bind mounts under the state dir: unmounted before the dir goes, after
	// the namespace's containers are removed (cleanups run last registered first).
	t.Cleanup(func() { unmountStateMounts(filepath.Join(dir, "state")); os.RemoveAll(dir) })
	ns := testenv.Namespace(t, env.ContainerdAddress)
	log := slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rt, err := ctrd.New(ctx, ctrd.Options{Address: env.ContainerdAddress, Namespace: ns, StateDir: filepath.Join(dir, "state"), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	rc, err := ctrd.OpenArchive(env.Image(testenv.Busybox))
	if err != nil {
		t.Fatal(err)
	}
	_, err = rt.ImportArchive(ctx, rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	manifests := filepath.Join(dir, "pods")
	os.MkdirAll(manifests, 0o755)
	os.WriteFile(filepath.Join(manifests, "static.yaml"), []byte(sleeper("static", "3600")), 0o644)

	a := agent.New(agent.Options{NodeName: "e2e-node", Log: log, RelistPeriod: time.Second,
		Pressure: func() []v1.NodeConditionType { return []v1.NodeConditionType{v1.NodeMemoryPressure} }},
		rt, db, manifest.NewDir(manifests),
		mqttLikeSource{pods: []*v1.Pod{mustPod(t, sleeper("besteffort", "3600")), mustPod(t, requesting("burstable", "16Mi"))}})
	runErr := make(chan error, 1)
	go func() { runErr <- a.Run(ctx) }()
	// The pods outlive the agent, as with kubelet: the namespace's cleanup removes them.
	defer func() { cancel(); <-runErr }()

	get := func(name string) *v1.Pod {
		for _, p := range a.Pods() {
			if p.Name == name {
				return &p
			}
		}
		return nil
	}
	waitFor(t, "static and burstable running, besteffort refused", func() bool {
		s, b, be := get("static"), get("burstable"), get("besteffort")
		return s != nil && allRunning(s) && b != nil && allRunning(b) && be != nil && be.Status.Phase == v1.PodFailed
	})
	be := get("besteffort")
	if be.Status.Reason != "Evicted" || be.Status.Message != "The node had condition: [MemoryPressure]. " {
		t.Errorf("besteffort: %s %q", be.Status.Reason, be.Status.Message)
	}
	cs, err := rt.ListContainers(ctx, string(be.UID))
	if err != nil || len(cs) != 0 {
		t.Errorf("refused pod's containers: %v %v", cs, err)
	}
}

// Graceful node shutdown by the shutdown signal (SIGPWR) on the real agent: the pod from the
// control plane (MQTT, not critical) is stopped first and finishes its SIGTERM handler before the
// manifest-dir (critical) pod is even signalled; both end Failed/Terminated with kubelet's message;
// after the agent restarts (the next boot) both run again.
func TestGracefulShutdownOnSignal(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	cp := newControlPlane(t, b.Plain)
	out := filepath.Join(h.dir, "out")
	os.MkdirAll(out, 0o777)
	order := filepath.Join(out, "order")
	h.writeManifest("static.yaml", `apiVersion: v1
kind: Pod
metadata: {name: static}
spec:
  terminationGracePeriodSeconds: 10
  volumes:
  - {name: out, hostPath: {path: "`+out+`"}}
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "trap 'echo static-term >> /out/order; exit 0' TERM; echo static-start >> /out/order; while true; do sleep 0.1; done"]
    volumeMounts: [{name: out, mountPath: /out}]
`)
	// A node status period longer than the test: a node status that says "shutting down" can only
	// come from the push at shutdown start.
	h.startMQTTAgent(b.Plain, "--mqtt-allowed-host-path", out, "--node-status-update-frequency", "1h",
		"--shutdown-grace-period", "12s", "--shutdown-grace-period-critical-pods", "6s")
	cp.applyYAML(`apiVersion: v1
kind: Pod
metadata: {name: app}
spec:
  terminationGracePeriodSeconds: 10
  volumes:
  - {name: out, hostPath: {path: "` + out + `"}}
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "trap 'echo app-term >> /out/order; sleep 1; echo app-done >> /out/order; exit 0' TERM; echo app-start >> /out/order; while true; do sleep 0.1; done"]
    volumeMounts: [{name: out, mountPath: /out}]
`)
	h.waitPod("static", "running", allRunning)
	h.waitPod("app", "running", allRunning)
	waitFor(t, "both containers started", func() bool {
		b, _ := os.ReadFile(order)
		return strings.Contains(string(b), "static-start") && strings.Contains(string(b), "app-start")
	})
	waitFor(t, "the shutdown signal watched", func() bool { return strings.Contains(h.agentLog.String(), "graceful node shutdown on") })
	os.WriteFile(order, nil, 0o666)

	readyIs := func(status v1.ConditionStatus, msg string) func([]byte) bool {
		return func(p []byte) bool {
			s, err := protocol.DecodeNodeStatus(p, 0)
			if err != nil || s.Object == nil {
				return false
			}
			c := nodeCondition(s.Object, v1.NodeReady)
			return c != nil && c.Status == status && strings.Contains(c.Message, msg)
		}
	}
	waitRetained(t, b.Plain, topics.NodeStatus(e2eNode), "a Ready node status", readyIs(v1.ConditionTrue, ""))

	if err := h.agent.Process.Signal(syscall.SIGPWR); err != nil {
		t.Fatal(err)
	}
	// The node status says so at once, not at its next period (an hour away).
	waitRetained(t, b.Plain, topics.NodeStatus(e2eNode), "the node status of the shutdown",
		readyIs(v1.ConditionFalse, "node is shutting down"))
	for _, name := range []string{"app", "static"} {
		p := h.waitPod(name, "stopped for the shutdown", refusedWith("Terminated"))
		if p.Status.Message != "Pod was terminated in response to imminent node shutdown." {
			t.Errorf("%s: message %q", name, p.Status.Message)
		}
	}
	waitFor(t, "no task left", func() bool { return len(h.tasks()) == 0 })
	b2, _ := os.ReadFile(order)
	if got := strings.Fields(string(b2)); strings.Join(got, " ") != "app-term app-done static-term" {
		t.Errorf("order of SIGTERMs: %q, want app-term app-done static-term (the critical pod last)", got)
	}

	// The node refuses new pods while it shuts down.
	cp.applyYAML(sleeper("late", "3600"))
	late := h.waitPod("late", "refused during the shutdown", refusedWith("NodeShutdown"))
	if late.Status.Message != "Pod was rejected as the node is shutting down." {
		t.Errorf("late: %q", late.Status.Message)
	}

	// The next boot: everything desired runs again.
	h.stopAgent()
	h.startMQTTAgent(b.Plain, "--mqtt-allowed-host-path", out)
	for _, name := range []string{"app", "static", "late"} {
		h.waitPod(name, "running again after the restart", allRunning)
	}
	if n := len(h.tasks()); n != 3 {
		t.Errorf("%d tasks after the restart, want 3", n)
	}
}
