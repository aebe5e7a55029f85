package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/mqlet/mqlet/hw"
	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/sync/protocol"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// The eviction tests run the real agent on the test containerd with real cgroups: a pod really
// allocates memory (or fills a disk), the agent's own signals see it, and the pod is evicted. The
// pods that must survive are a manifest-dir pod that kubelet's ranking would pick first (over its
// request, lowest priority), and a control-plane pod that stays within its request.

// evictedEvents collects the Evicted events the node publishes, by pod name.
func evictedEvents(t *testing.T, broker string) func() map[string]string {
	var mu sync.Mutex
	got := map[string]string{}
	c := connectMQTT(t, broker)
	c.Subscribe(topics.Events(e2eNode), 1, func(_ mqtt.Client, m mqtt.Message) {
		if e, err := protocol.DecodeEvent(m.Payload(), 0); err == nil && e.Reason == "Evicted" {
			mu.Lock()
			got[e.Object.Name] = e.Message
			mu.Unlock()
		}
	}).WaitTimeout(5 * time.Second)
	return func() map[string]string {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]string{}
		for k, v := range got {
			out[k] = v
		}
		return out
	}
}

// podTasks returns the running task of every container of the pod, from containerd.
func (h *harness) podTasks(p *v1.Pod) map[string]uint32 {
	h.t.Helper()
	all := h.tasks()
	out := map[string]uint32{}
	for _, cs := range p.Status.ContainerStatuses {
		id := strings.TrimPrefix(cs.ContainerID, "containerd://")
		if pid, ok := all[id]; ok {
			out[id] = pid
		}
	}
	return out
}

func evicted(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed && p.Status.Reason == "Evicted" }

// waitLog waits for a line of the agent's log that holds every part.
func (h *harness) waitLog(what string, parts ...string) {
	h.t.Helper()
	waitFor(h.t, what, func() bool {
		for _, line := range strings.Split(h.agentLog.String(), "\n") {
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(line, p)
			}
			if ok {
				return true
			}
		}
		return false
	})
}

func (h *harness) logCount(part string) int { return strings.Count(h.agentLog.String(), part) }

// logEviction puts the agent's eviction lines in the test log.
func (h *harness) logEviction() {
	for _, line := range strings.Split(h.agentLog.String(), "\n") {
		if strings.Contains(line, "eviction") {
			h.t.Log(line)
		}
	}
}

// The memory.available threshold is set 1 GiB under what the node has free when the test starts,
// read with the same signal the agent computes; the allocating pod then takes 3 GiB (two busybox
// dd processes holding 1.5 GiB buffers each: anonymous memory charged to the pod's cgroup). Other
// tests on the machine move the signal by a few hundred MiB; the margins are several times that.
func TestMemoryEvictionForReal(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	cp := newControlPlane(t, b.Plain)
	events := evictedEvents(t, b.Plain)

	mem, err := hw.NodeMemory("/")
	if err != nil {
		t.Fatal(err)
	}
	const margin, alloc = 1024, 3072 // MiB
	if mem.Available>>20 < alloc+margin+1024 {
		t.Skipf("only %d MiB available; the test needs %d MiB", mem.Available>>20, alloc+margin+1024)
	}
	threshold := mem.Available>>20 - margin
	t.Logf("memory.available %d MiB (%s); hard threshold %d MiB", mem.Available>>20, mem.Source, threshold)

	// Over its request (0) by 32 MiB in /dev/shm, lowest priority: kubelet's ranking would take it
	// first; it is a manifest-dir pod, so it must stay.
	h.writeManifest("static.yaml", `apiVersion: v1
kind: Pod
metadata: {name: static}
spec:
  priority: -100
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "dd if=/dev/zero of=/dev/shm/fill bs=1M count=32 2>/dev/null; exec sleep 3600"]
`)
	h.startMQTTAgent(b.Plain, "--eviction-hard", fmt.Sprintf("memory.available<%dMi", threshold),
		"--eviction-monitoring-period", "1s", "--eviction-pressure-transition-period", "2s")
	cp.applyYAML(`apiVersion: v1
kind: Pod
metadata: {name: bystander}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sleep", "3600"]
    resources: {requests: {memory: 64Mi}}
`, `apiVersion: v1
kind: Pod
metadata: {name: hog}
spec:
  terminationGracePeriodSeconds: 30
  volumes:
  - {name: ctl, emptyDir: {}}
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "while [ ! -e /ctl/go ]; do sleep 0.1; done; dd if=/dev/zero bs=1536M count=1 2>/dev/null | sleep 3600 & dd if=/dev/zero bs=1536M count=1 2>/dev/null | sleep 3600 & wait"]
    resources: {requests: {memory: 16Mi}}
    volumeMounts: [{name: ctl, mountPath: /ctl}]
`)
	static := h.waitPod("static", "running", allRunning)
	bystander := h.waitPod("bystander", "running", allRunning)
	hog := h.waitPod("hog", "running", allRunning)
	staticTasks, bystanderTasks := h.podTasks(static), h.podTasks(bystander)
	if len(staticTasks) != 1 || len(bystanderTasks) != 1 {
		t.Fatalf("tasks: static %v, bystander %v", staticTasks, bystanderTasks)
	}
	if n := h.logCount("eviction: evicting pod"); n != 0 {
		t.Fatalf("%d evictions before the hog allocated (the machine's memory moved by %d MiB?)\n%s", n, margin, h.agentLog)
	}

	if err := os.WriteFile(filepath.Join(h.state, "pods", string(hog.UID), "volumes", "ctl", "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	hog = h.waitPod("hog", "evicted", evicted)
	if !strings.HasPrefix(hog.Status.Message, "The node was low on resource: memory. Threshold quantity: ") ||
		!strings.Contains(hog.Status.Message, "Pod hog was using ") {
		t.Errorf("hog's status message = %q", hog.Status.Message)
	}
	waitFor(t, "Evicted event for hog over MQTT", func() bool { return events()["hog"] != "" })
	if msg := events()["hog"]; msg != hog.Status.Message {
		t.Errorf("event message %q, status message %q", msg, hog.Status.Message)
	}

	// The pressure ends (the hog's memory went with its processes): the manager says so once the
	// transition period has passed. Nothing else was evicted meanwhile.
	h.waitLog("MemoryPressure cleared", "node condition changed", "MemoryPressure", "status=false")
	h.logEviction()
	if n := h.logCount("eviction: evicting pod"); n != 1 {
		t.Errorf("%d evictions, want 1 (the hog)\n%s", n, h.agentLog)
	}
	if got := events(); len(got) != 1 {
		t.Errorf("Evicted events for %v, want the hog's only", got)
	}
	for name, want := range map[string]map[string]uint32{"static": staticTasks, "bystander": bystanderTasks} {
		p, err := h.getPod(name)
		if err != nil {
			t.Fatal(err)
		}
		if !allRunning(p) || !equalPids(h.podTasks(p), want) {
			t.Errorf("%s disturbed: %s, tasks %v -> %v", name, podSummaryForTest(p), want, h.podTasks(p))
		}
	}
	// /metrics counts the one eviction, by its signal.
	fams := scrape(t, unixHTTP(h.sock), "http://mqlet/metrics")
	if n, ok := sampleOf(fams, "mqlet_pod_evictions_total", map[string]string{"eviction_signal": "memory.available"}); !ok || n != 1 {
		t.Errorf("mqlet_pod_evictions_total{eviction_signal=\"memory.available\"} = %v (found %v), want 1", n, ok)
	}
	if f := fams["mqlet_pod_evictions_total"]; f != nil {
		sum := 0.0
		for _, m := range f.Metric {
			sum += m.GetCounter().GetValue()
		}
		if sum != 1 {
			t.Errorf("mqlet_pod_evictions_total sums to %v over its signals, want 1: %v", sum, f)
		}
	}

	// Not restarted, also not by a new agent: restart it and wait until every pod's worker has
	// synced at least once (the sync histogram counts 3), then the hog still runs nothing, is still
	// Evicted and has no restart.
	h.stopAgent()
	h.startMQTTAgent(b.Plain, "--eviction-hard", fmt.Sprintf("memory.available<%dMi", threshold),
		"--eviction-monitoring-period", "1s", "--eviction-pressure-transition-period", "2s")
	hc := unixHTTP(h.sock)
	waitFor(t, "every pod synced by the restarted agent", func() bool {
		n, _ := sampleOf(scrape(t, hc, "http://mqlet/metrics"), "mqlet_pod_sync_duration_seconds", map[string]string{})
		return n >= 3
	})
	hog, _ = h.getPod("hog")
	if n := len(h.podTasks(hog)); n != 0 || !evicted(hog) || containerStatus(hog, "c").RestartCount != 0 {
		t.Errorf("evicted hog came back: %d tasks, %s", n, podSummaryForTest(hog))
	}
}

// nodefs.available on a 64 MiB tmpfs mounted as the agent's state dir: a pod fills its emptyDir,
// the agent sees the state dir's file system run low, evicts that pod, and frees its emptyDir.
func TestDiskEvictionOnSmallStateDir(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	if err := os.MkdirAll(h.state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", h.state, "tmpfs", 0, "size=64m,mode=0755"); err != nil {
		t.Fatalf("mount a tmpfs state dir: %v", err)
	}
	t.Cleanup(func() {
		// Before the harness's own clean-up: the agent stops first, then the whole state tree
		// (pod namespaces and shm mounts below it included) is detached.
		h.stopAgent()
		if err := unix.Unmount(h.state, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount the tmpfs state dir: %v", err)
		}
	})
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	cp := newControlPlane(t, b.Plain)

	// Over its ephemeral-storage request (0), lowest priority: ranked first, but a manifest-dir pod.
	h.writeManifest("static.yaml", `apiVersion: v1
kind: Pod
metadata: {name: static}
spec:
  priority: -100
  terminationGracePeriodSeconds: 2
  volumes: [{name: data, emptyDir: {}}]
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "dd if=/dev/zero of=/data/f bs=1M count=4 2>/dev/null; exec sleep 3600"]
    volumeMounts: [{name: data, mountPath: /data}]
`)
	h.startMQTTAgent(b.Plain, "--eviction-hard", "nodefs.available<20Mi",
		"--eviction-monitoring-period", "1s", "--eviction-pressure-transition-period", "2s")
	cp.applyYAML(`apiVersion: v1
kind: Pod
metadata: {name: bystander}
spec:
  terminationGracePeriodSeconds: 2
  volumes: [{name: data, emptyDir: {}}]
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "dd if=/dev/zero of=/data/f bs=1M count=1 2>/dev/null; exec sleep 3600"]
    resources: {requests: {ephemeral-storage: 16Mi}}
    volumeMounts: [{name: data, mountPath: /data}]
`, `apiVersion: v1
kind: Pod
metadata: {name: writer}
spec:
  terminationGracePeriodSeconds: 2
  volumes: [{name: data, emptyDir: {}}]
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "while [ ! -e /data/go ]; do sleep 0.1; done; dd if=/dev/zero of=/data/fill bs=1M count=44; exec sleep 3600"]
    volumeMounts: [{name: data, mountPath: /data}]
`)
	static := h.waitPod("static", "running", allRunning)
	bystander := h.waitPod("bystander", "running", allRunning)
	writer := h.waitPod("writer", "running", allRunning)
	staticTasks, bystanderTasks := h.podTasks(static), h.podTasks(bystander)
	before, err := hw.Filesystem(h.state)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("state dir tmpfs: %d MiB available of %d", before.Available>>20, before.Capacity>>20)
	if before.Available < 44<<20 {
		t.Fatalf("only %d MiB free on the state dir before the writer writes", before.Available>>20)
	}
	if n := h.logCount("eviction: evicting pod"); n != 0 {
		t.Fatalf("%d evictions before the writer wrote\n%s", n, h.agentLog)
	}

	// The node keeps itself healthy with the broker gone.
	b.Stop(t)
	fill := filepath.Join(h.state, "pods", string(writer.UID), "volumes", "data")
	if err := os.WriteFile(filepath.Join(fill, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	writer = h.waitPod("writer", "evicted", evicted)
	if !strings.HasPrefix(writer.Status.Message, "The node was low on resource: ephemeral-storage. Threshold quantity: 20Mi, available: ") {
		t.Errorf("writer's status message = %q", writer.Status.Message)
	}
	// Its emptyDir is freed (as kubelet tears a terminated pod's volumes down), which is what ends
	// the pressure.
	waitFor(t, "writer's emptyDir freed", func() bool {
		_, err := os.Stat(filepath.Join(fill, "fill"))
		return os.IsNotExist(err)
	})
	// Its dead container (with its writable layer) and its logs go too, as kubelet's container GC
	// removes an evicted pod's; the pod and its Failed/Evicted status stay until it is deleted.
	var writerIDs []string
	for _, cs := range writer.Status.ContainerStatuses {
		writerIDs = append(writerIDs, strings.TrimPrefix(cs.ContainerID, "containerd://"))
	}
	if len(writerIDs) != 1 || writerIDs[0] == "" {
		t.Fatalf("writer's container IDs from its status: %q", writerIDs)
	}
	waitFor(t, "writer's container removed from containerd", func() bool { return !slices.Contains(h.containerIDs(), writerIDs[0]) })
	logDir := filepath.Join(h.state, "logs", "default_writer_"+string(writer.UID))
	waitFor(t, "writer's log dir removed", func() bool {
		_, err := os.Stat(logDir)
		return os.IsNotExist(err)
	})
	h.waitLog("DiskPressure cleared", "node condition changed", "DiskPressure", "status=false")
	h.logEviction()
	if p, err := h.getPod("writer"); err != nil || !evicted(p) {
		t.Errorf("writer after its containers were removed: %v, %v; want it still listed Failed/Evicted", p, err)
	}
	after, _ := hw.Filesystem(h.state)
	if after.Available < 40<<20 {
		t.Errorf("state dir still has only %d MiB available after the eviction", after.Available>>20)
	}
	if n := h.logCount("eviction: evicting pod"); n != 1 {
		t.Errorf("%d evictions, want 1 (the writer)\n%s", n, h.agentLog)
	}
	for name, want := range map[string]map[string]uint32{"static": staticTasks, "bystander": bystanderTasks} {
		p, err := h.getPod(name)
		if err != nil {
			t.Fatal(err)
		}
		if !allRunning(p) || !equalPids(h.podTasks(p), want) {
			t.Errorf("%s disturbed: %s, tasks %v -> %v", name, podSummaryForTest(p), want, h.podTasks(p))
		}
	}
	// The control plane learns of the eviction once the broker is back.
	b.Start(t)
	waitRetained(t, b.Plain, topics.PodStatus(e2eNode, "default", "writer"), "writer reported evicted", func(p []byte) bool {
		st, err := protocol.DecodePodStatus(p, 0)
		return err == nil && st.Object != nil && evicted(st.Object)
	})
	// The manifest-dir pod's and the bystander's files are still there.
	for _, p := range []*v1.Pod{static, bystander} {
		if _, err := os.Stat(filepath.Join(h.state, "pods", string(p.UID), "volumes", "data", "f")); err != nil {
			t.Errorf("%s's emptyDir touched: %v", p.Name, err)
		}
	}
}

// limits.ephemeral-storage enforced by eviction (kubelet's local storage isolation) on the real
// containerd: a pod whose container writes 16 MiB into its root file system (its writable layer,
// which only the snapshotter can measure) with an 8Mi limit is evicted with kubelet's message,
// whatever the node's thresholds; a pod that stays within the same limit keeps running.
func TestEphemeralStorageLimitForReal(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	cp := newControlPlane(t, b.Plain)
	h.startMQTTAgent(b.Plain, "--eviction-monitoring-period", "1s")
	pod := func(name, mib string) string {
		return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "dd if=/dev/zero of=/fill bs=1M count=` + mib + ` 2>/dev/null; exec sleep 3600"]
    resources: {limits: {ephemeral-storage: 8Mi}}
`
	}
	cp.applyYAML(pod("within", "2"), pod("writer", "16"))
	within := h.waitPod("within", "running", allRunning)
	writer := h.waitPod("writer", "evicted", evicted)
	if want := "Pod ephemeral local storage usage exceeds the total limit of containers 8Mi. "; writer.Status.Message != want {
		t.Errorf("writer's status message %q, want %q", writer.Status.Message, want)
	}
	h.logEviction()
	if n := h.logCount("eviction: evicting pod"); n != 1 {
		t.Errorf("%d evictions, want 1 (the writer)\n%s", n, h.agentLog)
	}
	if p, err := h.getPod("within"); err != nil || !allRunning(p) || !equalPids(h.podTasks(p), h.podTasks(within)) {
		t.Errorf("within its limit but disturbed: %v %v", p, err)
	}
}
