package e2e

// Pod cgroups, QoS tiers and OOM kills with the real agent, the test containerd and this machine's
// real cgroups (v1 hybrid). Pods live below /mqlet/<test namespace>, which testenv's namespace
// clean-up removes with every tier.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/mqlet/mqlet/agent/cgroup"
	"github.com/mqlet/mqlet/hw"
	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/sync/protocol"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

const qosPods = `apiVersion: v1
kind: Pod
metadata: {name: gold}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: a, image: mqlet.test/busybox:1, command: ["sleep", "3600"], resources: {limits: {cpu: 250m, memory: 24Mi}}}
  - {name: b, image: mqlet.test/busybox:1, command: ["sleep", "3600"], resources: {limits: {cpu: 150m, memory: 8Mi}}}
---
apiVersion: v1
kind: Pod
metadata: {name: silver}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: a, image: mqlet.test/busybox:1, command: ["sleep", "3600"], resources: {requests: {cpu: 300m, memory: 8Mi}, limits: {cpu: "1", memory: 64Mi}}}
---
apiVersion: v1
kind: Pod
metadata: {name: bronze}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: a, image: mqlet.test/busybox:1, command: ["sleep", "3600"]}
`

// requireV1Cgroups skips on a cgroup v2 host: the paths read below are v1's (docs/configuration.md: v2 is tested
// on fixtures).
func requireV1Cgroups(t *testing.T) cgroup.Layout {
	t.Helper()
	l, err := cgroup.Detect("/proc/self/mountinfo", "/")
	if err != nil {
		t.Fatal(err)
	}
	if l.Mode != cgroup.Legacy && l.Mode != cgroup.Hybrid {
		t.Skipf("cgroup %s: these checks read v1 hierarchies", l.Mode)
	}
	return l
}

func readCgroup(t *testing.T, l cgroup.Layout, controller, rel, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(l.V1[controller], rel, file))
	if err != nil {
		t.Fatalf("%s cgroup: %v", controller, err)
	}
	return strings.TrimSpace(string(b))
}

// podCgroupDirs lists every directory named pod<uid> below base in any mounted hierarchy.
func podCgroupDirs(l cgroup.Layout, base, uid string) []string {
	var out []string
	for _, mnt := range l.Mounts {
		filepath.WalkDir(filepath.Join(mnt, base), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() && d.Name() == "pod"+uid {
				out = append(out, p)
			}
			return nil
		})
	}
	return out
}

// Pod and QoS cgroups with kubelet's sizes for a Guaranteed, a Burstable and a BestEffort pod,
// node allocatable as kubelet enforces it (capacity minus the reservations, not the hard eviction
// threshold) on the top, the containers below their pod's cgroup; all removed with the pods.
func TestPodAndQoSCgroups(t *testing.T) {
	h := newHarness(t)
	l := requireV1Cgroups(t)
	h.writeManifest("qos.yaml", qosPods)
	h.startAgent("--system-reserved", "memory=1Gi,pid=1000", "--agent-reserved", "cpu=500m,memory=200Mi")
	pods := map[string]*v1.Pod{}
	for _, name := range []string{"gold", "silver", "bronze"} {
		pods[name] = h.waitPod(name, "running", allRunning)
	}
	base := "/mqlet/" + h.ns

	memCap, err := hw.MemTotal("/")
	if err != nil {
		t.Fatal(err)
	}
	pidCap, err := hw.PIDMax("/")
	if err != nil {
		t.Fatal(err)
	}
	allocMem := memCap - 1<<30 - 200<<20           // systemReserved, agentReserved
	allocMem -= allocMem % int64(os.Getpagesize()) // the kernel keeps whole pages
	want := []struct{ controller, rel, file, value string }{
		{"memory", base, "memory.limit_in_bytes", strconv.FormatInt(allocMem, 10)},
		{"cpu", base, "cpu.shares", strconv.FormatUint(cgroup.MilliCPUToShares(int64(runtime.NumCPU())*1000-500), 10)},
		{"pids", base, "pids.max", strconv.FormatInt(pidCap-1000, 10)},
		// Guaranteed: directly below the top, limits the sum of its containers'.
		{"memory", base + "/pod" + string(pods["gold"].UID), "memory.limit_in_bytes", strconv.Itoa(32 << 20)},
		{"cpu", base + "/pod" + string(pods["gold"].UID), "cpu.cfs_quota_us", "40000"},
		{"cpu", base + "/pod" + string(pods["gold"].UID), "cpu.shares", "409"},
		// Burstable: in its tier, which weighs its pods' requests.
		{"memory", base + "/burstable/pod" + string(pods["silver"].UID), "memory.limit_in_bytes", strconv.Itoa(64 << 20)},
		{"cpu", base + "/burstable/pod" + string(pods["silver"].UID), "cpu.cfs_quota_us", "100000"},
		{"cpu", base + "/burstable/pod" + string(pods["silver"].UID), "cpu.shares", "307"},
		{"cpu", base + "/burstable", "cpu.shares", "307"},
		// BestEffort: the minimum weight, for the pod and its tier.
		{"cpu", base + "/besteffort/pod" + string(pods["bronze"].UID), "cpu.shares", "2"},
		{"cpu", base + "/besteffort/pod" + string(pods["bronze"].UID), "cpu.cfs_quota_us", "-1"},
		{"cpu", base + "/besteffort", "cpu.shares", "2"},
	}
	for _, w := range want {
		if got := readCgroup(t, l, w.controller, w.rel, w.file); got != w.value {
			t.Errorf("%s %s/%s = %s, want %s", w.controller, w.rel, w.file, got, w.value)
		}
	}
	// The containers run below their pod's cgroup, in the right tier.
	tasks := h.tasks()
	for name, tier := range map[string]string{"gold": "", "silver": "burstable/", "bronze": "besteffort/"} {
		pid := tasks[strings.TrimPrefix(containerStatus(pods[name], "a").ContainerID, "containerd://")]
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			t.Fatal(err)
		}
		prefix := base + "/" + tier + "pod" + string(pods[name].UID) + "/"
		if !strings.Contains(string(b), ":memory:"+prefix) || !strings.Contains(string(b), ":pids:"+prefix) {
			t.Errorf("%s's container (pid %d) is not below %s:\n%s", name, pid, prefix, b)
		}
		// No swap: a BestEffort container (no memory limit, so no memory+swap limit on v1) gets
		// swappiness 0.
		if name == "bronze" {
			for _, line := range strings.Split(string(b), "\n") {
				if rel, ok := strings.CutPrefix(line[strings.Index(line, ":")+1:], "memory:"); ok {
					if got := readCgroup(t, l, "memory", rel, "memory.swappiness"); got != "0" {
						t.Errorf("BestEffort container %s: memory.swappiness = %s, want 0 (no swap)", rel, got)
					}
				}
			}
		}
	}

	os.Remove(filepath.Join(h.manifests, "qos.yaml"))
	for name, p := range pods {
		waitFor(t, name+"'s cgroups removed with it", func() bool {
			_, err := h.getPod(name)
			return err != nil && len(podCgroupDirs(l, base, string(p.UID))) == 0
		})
	}
}

// events collects the events the agent publishes over MQTT.
type events struct {
	mu  sync.Mutex
	all []protocol.Event
}

func subscribeEvents(t *testing.T, broker string) *events {
	t.Helper()
	ev := &events{}
	c := connectMQTT(t, broker)
	tok := c.Subscribe(topics.Events(e2eNode), 1, func(_ mqtt.Client, m mqtt.Message) {
		if e, err := protocol.DecodeEvent(m.Payload(), 0); err == nil {
			ev.mu.Lock()
			ev.all = append(ev.all, *e)
			ev.mu.Unlock()
		}
	})
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe to events: %v", tok.Error())
	}
	return ev
}

// of returns the events with reason about pod name.
func (ev *events) of(reason, pod string) []protocol.Event {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var out []protocol.Event
	for _, e := range ev.all {
		if e.Reason == reason && e.Object.Kind == "Pod" && e.Object.Name == pod {
			out = append(out, e)
		}
	}
	return out
}

const oomPods = `apiVersion: v1
kind: Pod
metadata: {name: hog-always}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: hog
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "head -c 64m /dev/zero | tail"]
    resources: {limits: {memory: 20Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: hog-never}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: hog
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "head -c 64m /dev/zero | tail"]
    resources: {limits: {memory: 20Mi}}
`

// A container over its memory limit is OOM-killed by the kernel and reported OOMKilled (exit 137),
// restarted per its pod's policy (Always: again; Never: not), with a Warning event per kill.
func TestOOMKilledRestartedPerPolicyWithEvent(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{})
	ev := subscribeEvents(t, b.Plain)
	h.writeManifest("hogs.yaml", oomPods)
	h.startMQTTAgent(b.Plain)

	p := h.waitPod("hog-always", "restarted after an OOM kill", func(p *v1.Pod) bool {
		cs := containerStatus(p, "hog")
		last := cs.LastTerminationState.Terminated
		return cs.RestartCount >= 1 && last != nil && last.Reason == "OOMKilled"
	})
	if last := containerStatus(p, "hog").LastTerminationState.Terminated; last.ExitCode != 137 || last.Signal != 9 {
		t.Errorf("hog-always last state: exit %d signal %d, want 137 and 9", last.ExitCode, last.Signal)
	}
	p = h.waitPod("hog-never", "terminated OOMKilled", func(p *v1.Pod) bool {
		term := containerStatus(p, "hog").State.Terminated
		return term != nil && term.Reason == "OOMKilled"
	})
	if cs := containerStatus(p, "hog"); cs.RestartCount != 0 || cs.State.Terminated.ExitCode != 137 || p.Status.Phase != v1.PodFailed {
		t.Errorf("hog-never: restarts %d exit %d phase %s, want 0, 137, Failed", cs.RestartCount, cs.State.Terminated.ExitCode, p.Status.Phase)
	}
	// One Warning event per kill: hog-always has been killed at least twice by now.
	waitFor(t, "OOMKilled events for both pods", func() bool {
		return len(ev.of("OOMKilled", "hog-never")) == 1 && len(ev.of("OOMKilled", "hog-always")) >= 2
	})
	for _, e := range append(ev.of("OOMKilled", "hog-never"), ev.of("OOMKilled", "hog-always")...) {
		if e.Type != "Warning" || !strings.Contains(e.Message, "hog") || !strings.Contains(e.Message, "20Mi") {
			t.Errorf("OOMKilled event: %+v", e)
		}
	}
	// The OOM kill counter names the namespace, pod and container of each kill.
	fams := scrape(t, unixHTTP(h.sock), "http://mqlet/metrics")
	if v, ok := sampleOf(fams, "mqlet_container_oom_kills_total", map[string]string{"namespace": "default", "pod": "hog-never", "container": "hog"}); v != 1 {
		t.Errorf("mqlet_container_oom_kills_total of default/hog-never/hog = %v (found %v), want 1", v, ok)
	}
	if v, _ := sampleOf(fams, "mqlet_container_oom_kills_total", map[string]string{"namespace": "default", "pod": "hog-always", "container": "hog"}); v < 2 {
		t.Errorf("mqlet_container_oom_kills_total of default/hog-always/hog = %v, want at least 2", v)
	}
}

const oomLater = `apiVersion: v1
kind: Pod
metadata: {name: hog-later}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  volumes:
  - {name: trigger, hostPath: {path: "%s"}}
  containers:
  - name: hog
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "while [ ! -e /trigger/go ]; do sleep 0.1; done; head -c 64m /dev/zero | tail"]
    resources: {limits: {memory: 20Mi}}
    volumeMounts: [{name: trigger, mountPath: /trigger}]
`

// An OOM kill while the agent is stopped (no event can be seen) is reported OOMKilled with exit
// 137, and an event, by the next agent, from the counters of the container's cgroup.
func TestOOMKillWhileAgentStoppedReported(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{})
	ev := subscribeEvents(t, b.Plain)
	trigger := filepath.Join(h.dir, "trigger")
	os.MkdirAll(trigger, 0o755)
	h.writeManifest("later.yaml", fmt.Sprintf(oomLater, trigger))
	h.startMQTTAgent(b.Plain)
	p := h.waitPod("hog-later", "running", allRunning)
	id := strings.TrimPrefix(containerStatus(p, "hog").ContainerID, "containerd://")

	h.stopAgent()
	if err := os.WriteFile(filepath.Join(trigger, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	exit := h.waitTaskExit(id)
	if exit != 137 {
		t.Fatalf("the container's task exited %d, want 137 (OOM-killed)", exit)
	}

	h.startMQTTAgent(b.Plain)
	p = h.waitPod("hog-later", "terminated OOMKilled", func(p *v1.Pod) bool {
		term := containerStatus(p, "hog").State.Terminated
		return term != nil && term.Reason != ""
	})
	if term := containerStatus(p, "hog").State.Terminated; term.Reason != "OOMKilled" || term.ExitCode != 137 || term.ContainerID != "containerd://"+id {
		t.Errorf("after the restart: terminated %+v, want OOMKilled, exit 137, container %s", term, id)
	}
	waitFor(t, "an OOMKilled event after the restart", func() bool { return len(ev.of("OOMKilled", "hog-later")) == 1 })
}

// waitTaskExit polls containerd until the container's task has stopped and returns its exit status.
func (h *harness) waitTaskExit(id string) uint32 {
	h.t.Helper()
	c, err := containerd.New(h.env.ContainerdAddress)
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	ctx := namespaces.WithNamespace(context.Background(), h.ns)
	var code uint32
	waitFor(h.t, "task "+id+" exited", func() bool {
		ctr, err := c.LoadContainer(ctx, id)
		if err != nil {
			h.t.Fatalf("load %s: %v", id, err)
		}
		task, err := ctr.Task(ctx, nil)
		if err != nil {
			h.t.Fatalf("task of %s: %v", id, err)
		}
		st, err := task.Status(ctx)
		if err != nil || st.Status != containerd.Stopped {
			return false
		}
		code = st.ExitStatus
		return true
	})
	return code
}

const sharedPIDBurstable = `apiVersion: v1
kind: Pod
metadata: {name: shared-burst}
spec:
  shareProcessNamespace: true
  terminationGracePeriodSeconds: 1
  containers:
  - {name: a, image: mqlet.test/busybox:1, command: ["sleep", "3600"], resources: {requests: {cpu: 100m}}}
`

// The PID namespace holder of a shareProcessNamespace pod joins its pod's cgroup in the Burstable
// tier, a level that did not exist before the tiers: in the v1 cpuset hierarchy each new level must
// get its parent's CPUs and memory nodes, or nothing can join it.
func TestSharedPIDHolderInTierCgroup(t *testing.T) {
	h := newHarness(t)
	l := requireV1Cgroups(t)
	h.writeManifest("shared.yaml", sharedPIDBurstable)
	h.startAgent()
	p := h.waitPod("shared-burst", "running", allRunning)
	recs, _ := filepath.Glob(filepath.Join(h.state, "pods", string(p.UID), "pidns-holder"))
	if len(recs) != 1 {
		t.Fatalf("no holder record for %s", p.UID)
	}
	b, _ := os.ReadFile(recs[0])
	pid := strings.Fields(string(b))[0]
	t.Cleanup(func() { // by its recorded pid, should the pod's removal fail
		if n, err := strconv.Atoi(pid); err == nil {
			if cmd, _ := os.ReadFile("/proc/" + pid + "/cmdline"); strings.Contains(string(cmd), "sandbox-pause") {
				unix.Kill(n, unix.SIGKILL)
			}
		}
	})
	cg, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	leaf := "/mqlet/" + h.ns + "/burstable/pod" + string(p.UID) + "/sandbox-pause"
	for _, c := range []string{"cpuset", "memory", "cpu"} {
		if _, ok := l.V1[c]; !ok {
			continue
		}
		if !strings.Contains(string(cg), ":"+c+":"+leaf+"\n") && !strings.Contains(string(cg), ","+c+":"+leaf+"\n") {
			t.Errorf("holder (pid %s) not in %s %s:\n%s", pid, c, leaf, cg)
		}
	}
	if _, ok := l.V1["cpuset"]; ok {
		if cpus := readCgroup(t, l, "cpuset", leaf, "cpuset.cpus"); cpus == "" {
			t.Error("the holder's cpuset has no CPUs")
		}
	}
	os.Remove(filepath.Join(h.manifests, "shared.yaml"))
	waitFor(t, "the pod's cgroups removed with it", func() bool {
		_, err := h.getPod("shared-burst")
		return err != nil && len(podCgroupDirs(l, "/mqlet/"+h.ns, string(p.UID))) == 0
	})
}

const movingPod = `apiVersion: v1
kind: Pod
metadata: {name: mover}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: a, image: mqlet.test/busybox:1, command: ["sleep", "3600"], resources: %s}
`

// A spec update that changes the pod's QoS class moves it to the new tier: the recreated container
// runs below the new pod cgroup, and the old one goes once its container has.
func TestQoSClassChangeMovesPodCgroup(t *testing.T) {
	h := newHarness(t)
	l := requireV1Cgroups(t)
	h.writeManifest("mover.yaml", fmt.Sprintf(movingPod, "{requests: {cpu: 100m}, limits: {memory: 32Mi}}"))
	h.startAgent()
	before := h.waitPod("mover", "running", allRunning)
	base := "/mqlet/" + h.ns
	oldDir := base + "/burstable/pod" + string(before.UID)
	if got := readCgroup(t, l, "memory", oldDir, "memory.limit_in_bytes"); got != strconv.Itoa(32<<20) {
		t.Fatalf("burstable pod cgroup memory limit = %s", got)
	}

	h.writeManifest("mover.yaml", fmt.Sprintf(movingPod, "{limits: {cpu: 200m, memory: 32Mi}}"))
	oldID := containerStatus(before, "a").ContainerID
	after := h.waitPod("mover", "running its recreated container", func(p *v1.Pod) bool {
		return allRunning(p) && containerStatus(p, "a").ContainerID != oldID
	})
	if after.Status.QOSClass != v1.PodQOSGuaranteed {
		t.Fatalf("QoS class after the edit = %s", after.Status.QOSClass)
	}
	newDir := base + "/pod" + string(after.UID)
	pid := h.tasks()[strings.TrimPrefix(containerStatus(after, "a").ContainerID, "containerd://")]
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), ":memory:"+newDir+"/") {
		t.Errorf("recreated container not below %s:\n%s", newDir, b)
	}
	if got := readCgroup(t, l, "cpu", newDir, "cpu.cfs_quota_us"); got != "20000" {
		t.Errorf("guaranteed pod cgroup quota = %s, want 20000", got)
	}
	waitFor(t, "the old tier's pod cgroup removed", func() bool {
		for _, mnt := range l.Mounts {
			if _, err := os.Stat(filepath.Join(mnt, oldDir)); err == nil {
				return false
			}
		}
		return true
	})
}
