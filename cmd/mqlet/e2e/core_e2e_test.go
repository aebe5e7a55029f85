package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/api"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
)

// rejected returns what the agent's API lists as refused.
func (h *harness) rejected() []api.Rejected {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rs, err := h.client.Rejected(ctx)
	if err != nil {
		h.t.Fatalf("list rejected: %v", err)
	}
	return rs
}

// waitRejected waits until a rejection of file (base name) whose reason contains want is listed.
func (h *harness) waitRejected(file, want string) api.Rejected {
	h.t.Helper()
	var found api.Rejected
	waitFor(h.t, "rejection of "+file+" ("+want+") listed by the API", func() bool {
		for _, r := range h.rejected() {
			if filepath.Base(r.Origin) == file && strings.Contains(r.Reason, want) {
				found = r
				return true
			}
		}
		return false
	})
	return found
}

// undisturbed checks that the pod is not being deleted and that its tasks are the same ones, and
// checks again once the pod's grace period (2 s in twoContainers) has passed: a pod wrongly
// marked for deletion would be gone by then.
func (h *harness) undisturbed(name string, pids map[string]uint32) {
	h.t.Helper()
	for _, wait := range []time.Duration{0, 3 * time.Second} {
		time.Sleep(wait)
		p, err := h.getPod(name)
		if err != nil {
			h.t.Fatalf("pod %s: %v", name, err)
		}
		if p.DeletionTimestamp != nil {
			h.t.Fatalf("pod %s is being deleted\nagent log:\n%s", name, h.agentLog)
		}
		if now := h.tasks(); !equalPids(now, pids) {
			h.t.Fatalf("pod %s disturbed: tasks %v -> %v\nagent log:\n%s", name, pids, now, h.agentLog)
		}
	}
}

// A manifest UID that climbs out of the state dir is refused; nothing outside is touched, now or
// when the manifest is removed (before the fix the pod dir was the victim, and removal ran
// RemoveAll on it).
func TestHostileUIDRefused(t *testing.T) {
	h := newHarness(t)
	victim := filepath.Join(h.dir, "victim")
	os.MkdirAll(victim, 0o755)
	os.WriteFile(filepath.Join(victim, "keep"), []byte("x"), 0o644)
	h.writeManifest("evil.yaml", `apiVersion: v1
kind: Pod
metadata: {name: evil, uid: "../../victim"}
spec:
  containers:
  - {name: c, image: mqlet.test/busybox:1, command: ["sleep", "3600"]}
`)
	h.writeManifest("web.yaml", twoContainers)
	h.startAgent()
	h.waitPod("web", "running", allRunning)
	h.waitRejected("evil.yaml", "metadata.uid")
	if _, err := h.getPod("evil"); err == nil {
		t.Errorf("pod with a hostile uid was accepted")
	}
	out, _ := h.mqletErr("pods")
	if !strings.Contains(out, "evil.yaml") || !strings.Contains(out, "metadata.uid") {
		t.Errorf("mqlet pods does not show the rejection:\n%s", out)
	}
	os.Remove(filepath.Join(h.manifests, "evil.yaml"))
	waitFor(t, "rejection cleared", func() bool { return len(h.rejected()) == 0 })
	if _, err := os.Stat(filepath.Join(victim, "keep")); err != nil {
		t.Fatalf("a directory outside the state dir was touched: %v", err)
	}
}

// Two manifests with the same explicit UID: the second is refused with a reason, and every other
// manifest change still applies (before the fix the store refused the whole set, freezing them).
func TestDuplicateUIDRefusedOthersApplied(t *testing.T) {
	h := newHarness(t)
	pod := func(name, uid, arg string) string {
		return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + uid + `}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - {name: c, image: mqlet.test/busybox:1, command: ["sleep", "` + arg + `"]}
`
	}
	const uid = ", uid: 6f1d9a2e-0d4b-4c1f-9a55-3c1e7b2a9f00"
	h.writeManifest("a.yaml", pod("one", uid, "3600"))
	h.writeManifest("b.yaml", pod("two", uid, "3600"))
	h.writeManifest("c.yaml", pod("three", "", "3600"))
	h.startAgent()
	h.waitPod("one", "running", allRunning)
	h.waitPod("three", "running", allRunning)
	r := h.waitRejected("b.yaml", "already used by pod default/one")
	if r.Pod != "default/two" {
		t.Errorf("rejection names pod %q, want default/two", r.Pod)
	}
	if _, err := h.getPod("two"); err == nil {
		t.Errorf("second pod with the same uid was accepted")
	}
	out, err := h.mqletErr("describe", "pod", "two")
	if err == nil || !strings.Contains(out, "rejected") || !strings.Contains(out, "already used") {
		t.Errorf("describe pod two does not say it was rejected (err %v):\n%s", err, out)
	}
	// Other changes are not frozen by the clash.
	h.writeManifest("c.yaml", pod("three", "", "3601"))
	h.waitPod("three", "updated", func(p *v1.Pod) bool {
		return allRunning(p) && len(p.Spec.Containers[0].Command) == 2 && p.Spec.Containers[0].Command[1] == "3601"
	})
	h.writeManifest("d.yaml", pod("four", "", "3600"))
	h.waitPod("four", "running", allRunning)
}

// The recovery step of docs/operations.md: with state.db moved aside, the agent adopts what runs (same tasks)
// and does not run a completed job again. Before the fix the first relist, made before the manifest
// dir was read, removed every container as an orphan.
func TestStateMovedAsideAdoptsPods(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("web.yaml", twoContainers)
	h.writeManifest("job.yaml", `apiVersion: v1
kind: Pod
metadata: {name: job}
spec:
  restartPolicy: Never
  containers:
  - {name: once, image: mqlet.test/busybox:1, command: ["true"]}
`)
	h.startAgent()
	h.waitPod("web", "running", allRunning)
	h.waitPod("job", "succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	pids := h.tasks()
	ids := strings.Join(h.containerIDs(), ",")
	h.stopAgent()

	db := filepath.Join(h.state, store.FileName)
	if err := os.Rename(db, db+".corrupt"); err != nil {
		t.Fatal(err)
	}
	h.startAgent()
	h.waitPod("web", "running", allRunning)
	h.waitPod("job", "succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	// Let a few relists (2 s period) pass: an orphan removal would have started by then.
	time.Sleep(5 * time.Second)
	if now := h.tasks(); !equalPids(now, pids) {
		t.Errorf("running pods restarted after state.db was moved aside: %v -> %v\nagent log:\n%s", pids, now, h.agentLog)
	}
	if now := strings.Join(h.containerIDs(), ","); now != ids {
		t.Errorf("containers changed (a job ran again?): %s -> %s", ids, now)
	}
	if p, _ := h.getPod("job"); p == nil || p.Status.Phase != v1.PodSucceeded {
		t.Errorf("job not reported Succeeded: %s", podSummaryForTest(p))
	}
}

// A manifest truncated to zero bytes at power loss keeps its pod (and its emptyDir), also across an
// agent restart; removing the file is how a pod is deleted.
func TestTruncatedManifestKeepsPod(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("web.yaml", twoContainers)
	h.startAgent()
	h.waitPod("web", "running", allRunning)
	pids := h.tasks()
	file := filepath.Join(h.manifests, "web.yaml")
	if err := os.Truncate(file, 0); err != nil {
		t.Fatal(err)
	}
	r := h.waitRejected("web.yaml", "empty")
	if !r.Kept {
		t.Errorf("rejection of the empty file does not say its pods are kept: %+v", r)
	}
	h.undisturbed("web", pids)

	h.stopAgent()
	h.startAgent()
	h.waitRejected("web.yaml", "empty")
	h.undisturbed("web", pids)

	os.Remove(file)
	waitFor(t, "containers removed", func() bool { return len(h.containerIDs()) == 0 })
}
