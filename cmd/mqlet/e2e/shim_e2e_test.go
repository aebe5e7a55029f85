package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/mqlet/mqlet/agent/ctrd"
	v1 "k8s.io/api/core/v1"
)

// parentPid reads the parent of process pid from /proc.
func parentPid(t *testing.T, pid uint32) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(int(pid)), "stat"))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ppid ...; comm may hold spaces, so count from the last ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("stat of %d: %v", pid, err)
	}
	return ppid
}

// A container id whose shim bundle dir containerd left behind (containerd killed mid-start: the
// dir stays, and every shim start under that id fails with "file exists") does not hold the
// container back: the failed try is followed by a new attempt with a new id. Before, every retry
// used the same id and the container never ran again.
func TestStaleShimDirDoesNotStickContainer(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("sleeper.yaml", busyboxSleeper)
	h.startAgent()
	p := h.waitPod("sleeper", "running", allRunning)
	id0 := ctrd.ContainerID(string(p.UID), "main", 0)
	pid, ok := h.tasks()[id0]
	if !ok {
		t.Fatalf("no running task %s", id0)
	}
	// The shim runs in its container's bundle dir, which sits in containerd's state dir under the
	// namespace: the stale dir of the next attempt goes beside it.
	bundle, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(parentPid(t, pid)), "cwd"))
	if err != nil || filepath.Base(bundle) != id0 {
		t.Fatalf("the shim's dir is %q (%v), want the bundle of %s", bundle, err, id0)
	}
	stale := filepath.Join(filepath.Dir(bundle), ctrd.ContainerID(string(p.UID), "main", 1))
	if err := os.Mkdir(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(stale) })

	if err := syscall.Kill(int(pid), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Back-off 10 s, attempt 1 fails on the stale dir, back-off 20 s, attempt 2 runs.
	p = h.waitPod("sleeper", "running again as attempt 2", func(p *v1.Pod) bool {
		cs := containerStatus(p, "main")
		return allRunning(p) && cs.RestartCount == 2
	})
	if !strings.Contains(h.agentLog.String(), "file exists") {
		t.Errorf("attempt 1 did not fail on the stale shim dir (the test set-up did not take):\n%s", h.agentLog)
	}
	if _, ok := h.tasks()[ctrd.ContainerID(string(p.UID), "main", 2)]; !ok {
		t.Errorf("attempt 2 has no running task: %v", h.tasks())
	}
}

// alive reports whether process pid exists (and is not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// A shim whose container record is gone (containerd killed mid-start leaves such shims, ~13 MB
// each, with nothing left in containerd to delete them through) is killed by the agent's sweep,
// with what it still runs; the pod runs on as a new attempt.
func TestStaleShimReaped(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("sleeper.yaml", busyboxSleeper)
	h.startAgent()
	p := h.waitPod("sleeper", "running", allRunning)
	id0 := ctrd.ContainerID(string(p.UID), "main", 0)
	pid, ok := h.tasks()[id0]
	if !ok {
		t.Fatalf("no running task %s", id0)
	}
	shim := parentPid(t, pid)
	h.stopAgent()

	// The record goes, the shim and its container's process stay: what a crash leaves.
	c, err := containerd.New(h.env.ContainerdAddress)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.ContainerService().Delete(namespaces.WithNamespace(context.Background(), h.ns), id0); err != nil {
		t.Fatal(err)
	}
	// Should the agent not reap them, the test does; by pid, and only while the pids are still
	// the shim of id0 and its sleep (a pid may be reused once they are gone).
	t.Cleanup(func() {
		for p, want := range map[int]string{shim: id0, int(pid): "sleep"} {
			if b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "cmdline")); err == nil && strings.Contains(string(b), want) {
				syscall.Kill(p, syscall.SIGKILL)
			}
		}
	})
	if !alive(shim) || !alive(int(pid)) {
		t.Fatalf("shim %d or task %d gone with the record alone; the set-up did not take", shim, pid)
	}

	h.startAgent()
	h.waitPod("sleeper", "running again", allRunning)
	waitFor(t, "the stale shim and its process killed", func() bool { return !alive(shim) && !alive(int(pid)) })
	if log := h.agentLog.String(); !strings.Contains(log, "containerd shim whose container has no record") || !strings.Contains(log, id0) {
		t.Errorf("agent log does not report the reaped shim of %s:\n%s", id0, log)
	}
	if _, ok := h.tasks()[id0]; ok {
		t.Errorf("task %s still listed", id0)
	}
}
