package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

const initPod = `apiVersion: v1
kind: Pod
metadata:
  name: withinit
spec:
  terminationGracePeriodSeconds: 2
  initContainers:
  - name: setup
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "echo setup-ran"]
  containers:
  - name: app
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]
`

// A reboot takes the pod's network namespace with it; the init containers that set the old one up
// must run again before the app does, with growing restart counts (kubelet's behaviour). The reboot
// is played by killing the agent and unmounting the pinned namespace.
func TestInitContainersRerunWhenSandboxRecreated(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("withinit.yaml", initPod)
	h.startAgent()
	before := h.waitPod("withinit", "running", allRunning)
	oldApp := containerStatus(before, "app").ContainerID

	h.kill9Agent()
	pinned, _ := filepath.Glob(filepath.Join(h.state, "netns", "*"))
	if len(pinned) != 1 {
		t.Fatalf("pinned network namespaces = %v, want one", pinned)
	}
	if err := unix.Unmount(pinned[0], unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	h.startAgent()
	after := h.waitPod("withinit", "init run again and app running", func(p *v1.Pod) bool {
		return allRunning(p) && len(p.Status.InitContainerStatuses) == 1 && p.Status.InitContainerStatuses[0].RestartCount == 1 &&
			containerStatus(p, "app").RestartCount == 1
	})
	if id := containerStatus(after, "app").ContainerID; id == oldApp {
		t.Errorf("app container %s of the old sandbox still the current one", id)
	}
	if _, running := h.tasks()[oldApp[len("containerd://"):]]; running {
		t.Errorf("app container %s of the old sandbox still runs", oldApp)
	}
}

const sharedPIDPod = `apiVersion: v1
kind: Pod
metadata:
  name: sharedpid
spec:
  terminationGracePeriodSeconds: 2
  shareProcessNamespace: true
  containers:
  - name: sleeper
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "exec sleep 3602"]
  - name: looker
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "until ps | grep -q '[s]leep 3602'; do sleep 0.1; done; echo saw-sleeper; echo init=$(tr '\\0' ' ' < /proc/1/cmdline); sleep 3600"]
`

// The agent's own binary holds a shareProcessNamespace pod's PID namespace (mqlet sandbox-pause):
// the containers see each other and the holder as PID 1. A restarted agent keeps holder and
// containers; removing the pod stops the holder.
func TestShareProcessNamespaceThroughAgent(t *testing.T) {
	h := newHarness(t)
	holderPid := func() (pid, start string) {
		recs, _ := filepath.Glob(filepath.Join(h.state, "pods", "*", "pidns-holder"))
		if len(recs) != 1 {
			return "", ""
		}
		b, _ := os.ReadFile(recs[0])
		f := strings.Fields(string(b))
		if len(f) < 2 {
			return "", ""
		}
		return f[0], f[1]
	}
	startTime := func(pid string) string {
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			return ""
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		return f[19]
	}
	t.Cleanup(func() { // a failed test must not leave the holder behind: stop it by its record
		if pid, start := holderPid(); pid != "" && startTime(pid) == start {
			n, _ := strconv.Atoi(pid)
			unix.Kill(n, unix.SIGKILL)
		}
	})
	h.writeManifest("sharedpid.yaml", sharedPIDPod)
	h.startAgent()
	before := h.waitPod("sharedpid", "running", allRunning)
	logs := h.logOf(before, "looker")
	waitFor(t, "looker sees the sleeper and the holder as PID 1", func() bool {
		logs = h.logOf(before, "looker")
		return strings.Contains(logs, "saw-sleeper") && strings.Contains(logs, "mqlet sandbox-pause")
	})
	pid, start := holderPid()
	if pid == "" || startTime(pid) != start {
		t.Fatalf("holder record pid %q start %q; the process's start is %q", pid, start, startTime(pid))
	}
	cmdline, _ := os.ReadFile("/proc/" + pid + "/cmdline")
	if !strings.Contains(string(cmdline), "sandbox-pause") {
		t.Errorf("holder pid %s runs %q, want mqlet sandbox-pause", pid, cmdline)
	}

	tasks := h.tasks()
	h.kill9Agent()
	h.startAgent()
	after := h.waitPod("sharedpid", "running", allRunning)
	for _, name := range []string{"sleeper", "looker"} {
		if b, a := containerStatus(before, name), containerStatus(after, name); a.ContainerID != b.ContainerID || a.RestartCount != 0 {
			t.Errorf("%s not adopted after an agent restart: %s -> %s, restarts %d", name, b.ContainerID, a.ContainerID, a.RestartCount)
		}
	}
	if now := h.tasks(); !equalPids(now, tasks) {
		t.Errorf("tasks changed after an agent restart: %v -> %v", tasks, now)
	}
	if p, s := holderPid(); p != pid || s != start {
		t.Errorf("holder after an agent restart: pid %s start %s, want the same %s %s", p, s, pid, start)
	}

	if err := os.Remove(filepath.Join(h.manifests, "sharedpid.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "containers removed", func() bool { return len(h.containerIDs()) == 0 })
	waitFor(t, "holder stopped", func() bool { return startTime(pid) != start })
}
