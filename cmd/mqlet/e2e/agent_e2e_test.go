package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/hw"
	"github.com/mqlet/mqlet/internal/testenv"
	v1 "k8s.io/api/core/v1"
)

const twoContainers = `apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: server
    image: mqlet.test/busybox:1
    command: ["httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/etc"]
    resources:
      limits: {memory: 32Mi, cpu: 250m}
  - name: client
    image: mqlet.test/busybox:1
    env:
    - {name: TARGET, value: "http://localhost:8080/hosts"}
    - {name: POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    command: ["sh", "-c"]
    args: ["while true; do wget -q -O /tmp/got $(TARGET) && echo fetched-by-$(POD) && grep -q localhost /tmp/got && echo reached-server; sleep 1; done"]
`

// Pod start and status; two containers of one pod reach each other on localhost; limits land in
// the container's cgroup; logs are written.
func TestPodRunsAndContainersShareLocalhost(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("web.yaml", twoContainers)
	h.startAgent()
	p := h.waitPod("web", "running", allRunning)

	if p.Spec.NodeName != "e2e-node" || p.Status.StartTime == nil || p.Status.QOSClass != v1.PodQOSBurstable {
		t.Errorf("status fields: node=%q start=%v qos=%q", p.Spec.NodeName, p.Status.StartTime, p.Status.QOSClass)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if !strings.HasPrefix(cs.ContainerID, "containerd://") || cs.ImageID == "" || cs.State.Running.StartedAt.IsZero() {
			t.Errorf("container %s status incomplete: %+v", cs.Name, cs)
		}
	}
	ready := false
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady && c.Status == v1.ConditionTrue {
			ready = true
		}
	}
	if !ready {
		t.Errorf("pod not Ready: %+v", p.Status.Conditions)
	}
	// The client container fetches from the server container over the pod's localhost.
	h.waitPod("web", "reaching its server over localhost", func(p *v1.Pod) bool {
		return strings.Contains(h.logOf(p, "client"), "reached-server")
	})
	if log := h.logOf(p, "client"); !strings.Contains(log, "fetched-by-web") {
		t.Errorf("env expansion: client log lacks fetched-by-web:\n%s", log)
	}
	// The memory limit is in the container's cgroup.
	pid := h.tasks()[strings.TrimPrefix(containerStatus(p, "server").ContainerID, "containerd://")]
	if pid == 0 {
		t.Fatalf("no running task for server; tasks: %v", h.tasks())
	}
	if lim := cgroupValue(t, pid, "memory", "memory.limit_in_bytes", "memory.max"); lim != strconv.Itoa(32<<20) {
		t.Errorf("server memory limit = %s, want %d", lim, 32<<20)
	}
	// 250m of cpu: a CFS quota of 25 ms per 100 ms period.
	if quota := cgroupValue(t, pid, "cpu", "cpu.cfs_quota_us", "cpu.max"); quota != "25000" {
		t.Errorf("server cpu quota = %s, want 25000", quota)
	}
	out := h.mqlet("pods")
	if !strings.Contains(out, "web") || !strings.Contains(out, "2/2") || !strings.Contains(out, "Running") {
		t.Errorf("mqlet pods:\n%s", out)
	}
	if out := h.mqlet("describe", "pod", "web"); !strings.Contains(out, "Limits:") || !strings.Contains(out, "32Mi") {
		t.Errorf("mqlet describe pod:\n%s", out)
	}
}

// cgroupValue reads a limit of the cgroup of pid: v1File in the v1 controller's hierarchy, or
// v2File in the unified one (cgroup v2 hosts). The first field of the file is returned.
func cgroupValue(t *testing.T, pid uint32, controller, v1File, v2File string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var file string
		switch {
		case strings.Contains(","+parts[1]+",", ","+controller+","):
			file = filepath.Join("/sys/fs/cgroup", parts[1], parts[2], v1File)
		case parts[0] == "0" && parts[1] == "":
			file = filepath.Join("/sys/fs/cgroup", parts[2], v2File)
			if _, err := os.Stat(file); err != nil {
				continue
			}
		default:
			continue
		}
		v, err := os.ReadFile(file)
		if err != nil {
			t.Fatalf("%s of pid %d: %v", controller, pid, err)
		}
		return strings.Fields(string(v))[0]
	}
	t.Fatalf("no %s cgroup for pid %d in:\n%s", controller, pid, b)
	return ""
}

// An edit of one container recreates that container only; the other keeps its PID.
func TestManifestEditRecreatesOnlyChangedContainer(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("web.yaml", twoContainers)
	h.startAgent()
	before := h.waitPod("web", "running", allRunning)
	tasks := h.tasks()
	serverID := strings.TrimPrefix(containerStatus(before, "server").ContainerID, "containerd://")
	clientID := strings.TrimPrefix(containerStatus(before, "client").ContainerID, "containerd://")
	serverPid := tasks[serverID]

	h.writeManifest("web.yaml", strings.Replace(twoContainers, "sleep 1; done", "sleep 2; done", 1))
	after := h.waitPod("web", "running with a new client", func(p *v1.Pod) bool {
		return allRunning(p) && containerStatus(p, "client").ContainerID != "containerd://"+clientID
	})
	if got := containerStatus(after, "server").ContainerID; got != "containerd://"+serverID {
		t.Errorf("server was recreated: %s -> %s", serverID, got)
	}
	if pid := h.tasks()[serverID]; pid != serverPid {
		t.Errorf("server pid changed: %d -> %d", serverPid, pid)
	}
	if rc := containerStatus(after, "client").RestartCount; rc != 1 {
		t.Errorf("client restartCount = %d, want 1", rc)
	}
	if _, still := h.tasks()[clientID]; still {
		t.Errorf("old client container %s still running", clientID)
	}
}

// kill -9 of the agent leaves containers running with the same PIDs; the restarted agent adopts them.
func TestAgentKill9AdoptsRunningContainers(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("web.yaml", twoContainers)
	h.startAgent()
	before := h.waitPod("web", "running", allRunning)
	pids := h.tasks()
	if len(pids) != 2 {
		t.Fatalf("want 2 running tasks, got %v", pids)
	}
	h.kill9Agent()
	if now := h.tasks(); !equalPids(now, pids) {
		t.Fatalf("tasks changed when the agent died: %v -> %v", pids, now)
	}
	h.startAgent()
	after := h.waitPod("web", "running", allRunning)
	if now := h.tasks(); !equalPids(now, pids) {
		t.Errorf("tasks changed after agent restart: %v -> %v", pids, now)
	}
	for _, name := range []string{"server", "client"} {
		b, a := containerStatus(before, name), containerStatus(after, name)
		if a.ContainerID != b.ContainerID || a.RestartCount != 0 || !a.State.Running.StartedAt.Equal(&b.State.Running.StartedAt) {
			t.Errorf("%s not adopted: before %s rc=%d started=%v, after %s rc=%d started=%v", name,
				b.ContainerID, b.RestartCount, b.State.Running.StartedAt, a.ContainerID, a.RestartCount, a.State.Running.StartedAt)
		}
	}
	// SIGTERM, too, leaves pods running.
	h.stopAgent()
	if now := h.tasks(); !equalPids(now, pids) {
		t.Errorf("tasks changed after SIGTERM to the agent: %v -> %v", pids, now)
	}
}

func equalPids(a, b map[string]uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Removing the manifest stops the pod and deletes its containers.
func TestRemovingManifestRemovesContainers(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("web.yaml", twoContainers)
	h.startAgent()
	h.waitPod("web", "running", allRunning)
	if err := os.Remove(filepath.Join(h.manifests, "web.yaml")); err != nil {
		t.Fatal(err)
	}
	// Containers go first, then the sandbox, then the pod leaves the API: wait for the last.
	waitFor(t, "containers removed and the pod gone from the API", func() bool {
		_, err := h.getPod("web")
		return len(h.containerIDs()) == 0 && err != nil
	})
	if _, err := os.Stat(filepath.Join(h.state, "netns")); err == nil {
		if left, _ := os.ReadDir(filepath.Join(h.state, "netns")); len(left) != 0 {
			t.Errorf("network namespaces left behind: %v", left)
		}
	}
}

// Images come from the local registry when not present.
func TestPullFromLocalRegistry(t *testing.T) {
	h := newHarness(t)
	ref := h.env.RegistryRef(testenv.RegistryBusybox2)
	h.writeManifest("pulled.yaml", `apiVersion: v1
kind: Pod
metadata: {name: pulled}
spec:
  containers:
  - name: main
    image: `+ref+`
    command: ["sh", "-c", "echo version=$MQLET_IMAGE_VERSION; sleep 3600"]
`)
	h.startAgent()
	p := h.waitPod("pulled", "running", allRunning)
	if !strings.Contains(containerStatus(p, "main").ImageID, "sha256:") {
		t.Errorf("imageID %q carries no digest", containerStatus(p, "main").ImageID)
	}
	if out := h.mqlet("image", "ls"); !strings.Contains(out, ref) {
		t.Errorf("image ls lacks %s:\n%s", ref, out)
	}
	h.waitPod("pulled", "logging the image env", func(p *v1.Pod) bool { return strings.Contains(h.logOf(p, "main"), "version=2") })
}

// A missing image with pullPolicy Never is reported with kubelet's reason, and the pod never runs.
func TestImageNeverPullReported(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("never.yaml", `apiVersion: v1
kind: Pod
metadata: {name: never}
spec:
  containers:
  - name: main
    image: mqlet.test/absent:1
    imagePullPolicy: Never
`)
	h.startAgent()
	h.waitPod("never", "ErrImageNeverPull", func(p *v1.Pod) bool {
		w := containerStatus(p, "main").State.Waiting
		return p.Status.Phase == v1.PodPending && w != nil && w.Reason == "ErrImageNeverPull"
	})
}

// Archives import with `mqlet image import` (docker-archive and OCI) without an agent, and the
// preload dir imports at agent start.
func TestImageImportAndPreload(t *testing.T) {
	h := newHarness(t)
	out := h.mqlet("image", "import", h.env.Image(testenv.Echo), h.env.Image(testenv.BusyboxOCI))
	for _, want := range []string{testenv.EchoRef, testenv.BusyboxOCIRef} {
		if !strings.Contains(out, want) {
			t.Errorf("import output lacks %s:\n%s", want, out)
		}
	}
	// -o json lists them with their digests, read from containerd. The shape a script reads:
	// an object with the list, so fields can be added beside it.
	type imageJSON struct {
		Name   string `json:"name"`
		Digest string `json:"digest"`
		Size   int64  `json:"size"`
	}
	var l struct {
		Images []imageJSON `json:"images"`
	}
	if err := json.Unmarshal([]byte(h.mqlet("image", "ls", "-o", "json")), &l); err != nil {
		t.Fatalf("image ls -o json: %v", err)
	}
	listed := map[string]imageJSON{}
	for _, i := range l.Images {
		listed[i.Name] = i
	}
	for _, want := range []string{testenv.EchoRef, testenv.BusyboxOCIRef} {
		if i, ok := listed[want]; !ok || !strings.HasPrefix(i.Digest, "sha256:") || i.Size <= 0 {
			t.Errorf("image ls -o json: %s is %+v (listed: %v)", want, i, l.Images)
		}
	}
	if out, err := h.mqletErr("image", "import", "/etc/hostname"); err == nil || !strings.Contains(out, "/etc/hostname") {
		t.Errorf("importing a non-archive: err=%v out=%s", err, out)
	}
	preload := filepath.Join(h.dir, "preload")
	os.MkdirAll(preload, 0o755)
	data, err := os.ReadFile(h.env.Image(testenv.Busybox2))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(preload, "b2.tar"), data, 0o644)
	// The echo image: Kubernetes args replace the image's cmd and keep its entrypoint.
	h.writeManifest("echo.yaml", `apiVersion: v1
kind: Pod
metadata: {name: echo}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: mqlet.test/echo:1
    imagePullPolicy: Never
    args: ["from", "args"]
  - name: preloaded
    image: mqlet.test/busybox:2
    imagePullPolicy: Never
    command: ["true"]
`)
	h.startAgent()
	p := h.waitPod("echo", "Succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	if log := h.logOf(p, "main"); strings.TrimSpace(log) != "from args" {
		t.Errorf("echo log = %q, want %q", log, "from args")
	}
	if out := h.mqlet("logs", "echo", "-c", "main"); strings.TrimSpace(out) != "from args" {
		t.Errorf("mqlet logs echo -c main = %q", out)
	}
	if out, err := h.mqletErr("logs", "echo"); err == nil || !strings.Contains(out, "choose one of") {
		t.Errorf("mqlet logs of a two-container pod without -c: err=%v\n%s", err, out)
	}
	term := containerStatus(p, "main").State.Terminated
	if term == nil || term.Reason != "Completed" || term.ExitCode != 0 {
		t.Errorf("main terminated state: %+v", term)
	}
}

// A bad manifest is rejected with file, document and reason; the running pod is untouched.
func TestBadManifestRejectedOthersUndisturbed(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("web.yaml", twoContainers)
	h.startAgent()
	h.waitPod("web", "running", allRunning)
	pids := h.tasks()

	h.writeManifest("bad.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\nspec:\n  containers:\n  - name: c\n    imagee: busybox\n")
	// web.yaml turns into garbage: its pod must keep running as it was.
	h.writeManifest("web.yaml", "this: [is not: a pod\n")
	waitFor(t, "rejection logged", func() bool {
		l := h.agentLog.String()
		return strings.Contains(l, "bad.yaml") && strings.Contains(l, "imagee") && strings.Contains(l, "web.yaml")
	})
	if _, err := h.getPod("bad"); err == nil {
		t.Errorf("invalid pod was accepted")
	}
	h.waitRejected("bad.yaml", "imagee")
	h.waitRejected("web.yaml", "line")
	h.undisturbed("web", pids)
}

// A restart policy of Always restarts a crashing container with back-off and counts restarts.
func TestCrashingContainerRestarts(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("crash.yaml", `apiVersion: v1
kind: Pod
metadata: {name: crash}
spec:
  containers:
  - name: main
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "echo run; exit 3"]
`)
	h.startAgent()
	p := h.waitPod("crash", "restarted and backing off", func(p *v1.Pod) bool {
		cs := containerStatus(p, "main")
		return cs.RestartCount >= 1 && cs.State.Waiting != nil && cs.State.Waiting.Reason == "CrashLoopBackOff"
	})
	last := containerStatus(p, "main").LastTerminationState.Terminated
	if last == nil || last.ExitCode != 3 || last.Reason != "Error" {
		t.Errorf("lastState: %+v", last)
	}
	if out := h.mqlet("logs", "crash", "--previous"); !strings.Contains(out, "run") {
		t.Errorf("mqlet logs --previous = %q, want the previous attempt's output", out)
	}
}

// hostNetwork pods see the host's interfaces and report the host IP as pod IP; workingDir applies.
func TestHostNetworkAndWorkingDir(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("hostnet.yaml", `apiVersion: v1
kind: Pod
metadata: {name: hostnet}
spec:
  hostNetwork: true
  restartPolicy: Never
  containers:
  - name: main
    image: mqlet.test/busybox:1
    workingDir: /etc
    command: ["sh", "-c", "pwd; cat /proc/net/dev"]
`)
	h.startAgent()
	p := h.waitPod("hostnet", "Succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	log := h.logOf(p, "main")
	if !strings.HasPrefix(log, "/etc\n") {
		t.Errorf("workingDir not applied; log:\n%s", log)
	}
	hostDev, err := os.ReadFile("/proc/net/dev")
	if err != nil {
		t.Fatal(err)
	}
	// Every host interface shows up inside the container.
	for _, line := range strings.Split(string(hostDev), "\n")[2:] {
		if name, _, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.Contains(log, name+":") {
			t.Errorf("host interface %s not visible in the hostNetwork pod:\n%s", name, log)
		}
	}
	if p.Status.PodIP == "" || p.Status.PodIP != p.Status.HostIP {
		t.Errorf("podIP %q, hostIP %q: want equal and set", p.Status.PodIP, p.Status.HostIP)
	}
}

// Containers get kubelet's oom_score_adj by QoS class; where mqlet may not lower scores (no
// CAP_SYS_RESOURCE, as on this CI machine) Guaranteed is raised to what the node allows, with a
// warning, and the pod still runs.
func TestOOMScoreByQoS(t *testing.T) {
	h := newHarness(t)
	pod := func(name, resources string) string {
		return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `}
spec:
  containers:
  - name: main
    image: mqlet.test/busybox:1
    command: ["sleep", "3600"]
` + resources + "---\n"
	}
	h.writeManifest("qos.yaml", pod("guaranteed", "    resources: {limits: {memory: 64Mi, cpu: 100m}}\n")+
		pod("burstable", "    resources: {requests: {memory: 64Mi}}\n")+
		pod("besteffort", ""))
	h.startAgent()
	score := map[string]int{}
	for _, name := range []string{"guaranteed", "burstable", "besteffort"} {
		p := h.waitPod(name, "running", allRunning)
		pid := h.tasks()[strings.TrimPrefix(containerStatus(p, "main").ContainerID, "containerd://")]
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(int(pid)), "oom_score_adj"))
		if err != nil {
			t.Fatal(err)
		}
		score[name], _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if score["besteffort"] != 1000 {
		t.Errorf("BestEffort oom_score_adj = %d, want 1000", score["besteffort"])
	}
	if !(score["guaranteed"] < score["burstable"] && score["burstable"] < score["besteffort"]) {
		t.Errorf("scores not ordered Guaranteed < Burstable < BestEffort: %v", score)
	}
	restricted := !hw.ProcessHasCapability(os.Getpid(), 24) // CAP_SYS_RESOURCE
	warned := strings.Contains(h.agentLog.String(), "oom_score_adj raised")
	switch {
	case restricted && !warned:
		t.Errorf("no CAP_SYS_RESOURCE here, yet no warning that Guaranteed's score was raised")
	case !restricted && score["guaranteed"] != -997:
		t.Errorf("Guaranteed oom_score_adj = %d, want -997", score["guaranteed"])
	}
}

// A manifest that is unreadable when the agent starts (half-written at power loss) does not take
// down the pod it declared before: the stored pod keeps running.
func TestBrokenManifestAtStartKeepsStoredPod(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("web.yaml", twoContainers)
	h.startAgent()
	h.waitPod("web", "running", allRunning)
	pids := h.tasks()
	h.stopAgent()
	h.writeManifest("web.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: web\n")
	h.startAgent()
	// The rejection is listed once the change is applied; checks past the grace period follow.
	h.waitRejected("web.yaml", "line")
	h.undisturbed("web", pids)
	// Deleting the file is a real removal.
	os.Remove(filepath.Join(h.manifests, "web.yaml"))
	waitFor(t, "containers removed", func() bool { return len(h.containerIDs()) == 0 })
}

// imagePullPolicy Always with the registry unreachable runs the local copy (an edge node rebooted
// offline keeps running what it ran), where kubelet would fail the pod.
func TestAlwaysPullFallsBackToLocalCopyOffline(t *testing.T) {
	h := newHarness(t)
	// The busybox image under a name whose registry refuses connections (port 1 on loopback).
	const offline = "127.0.0.1:1/mqlet/busybox:1"
	h.tagBusybox(offline)
	h.writeManifest("offline.yaml", `apiVersion: v1
kind: Pod
metadata: {name: offline}
spec:
  containers:
  - {name: main, image: "`+offline+`", imagePullPolicy: Always, command: ["sleep", "3600"]}
`)
	h.startAgent()
	h.waitPod("offline", "running from the local copy", allRunning)
	if !strings.Contains(h.agentLog.String(), "using the local copy") {
		t.Errorf("no warning that the local copy was used:\n%s", h.agentLog)
	}
}

// Removing a pod stops it gracefully: SIGTERM first (the container sees it), SIGKILL after
// terminationGracePeriodSeconds for one that ignores it.
func TestRemovalSendsSIGTERMThenKills(t *testing.T) {
	h := newHarness(t)
	out := filepath.Join(h.dir, "out")
	os.MkdirAll(out, 0o777)
	h.writeManifest("graceful.yaml", `apiVersion: v1
kind: Pod
metadata: {name: graceful}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - {name: out, hostPath: {path: "`+out+`"}}
  containers:
  - name: polite
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "trap 'echo got-term > /out/term; exit 0' TERM; while true; do sleep 0.2; done"]
    volumeMounts: [{name: out, mountPath: /out}]
  - name: stubborn
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "trap '' TERM; while true; do sleep 0.2; done"]
`)
	h.startAgent()
	h.waitPod("graceful", "running", allRunning)
	os.Remove(filepath.Join(h.manifests, "graceful.yaml"))
	waitFor(t, "containers removed", func() bool { return len(h.containerIDs()) == 0 })
	if b, err := os.ReadFile(filepath.Join(out, "term")); err != nil || strings.TrimSpace(string(b)) != "got-term" {
		t.Errorf("the container did not see SIGTERM: %q, %v", b, err)
	}
	if !strings.Contains(h.agentLog.String(), "grace period over, killing") {
		t.Errorf("the container ignoring SIGTERM was not killed after the grace period:\n%s", h.agentLog)
	}
}
