package e2e

import (
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func resizePod(memory, policy string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: sized}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: mqlet.test/busybox:1
    command: ["sleep", "3600"]
    resizePolicy: [{resourceName: memory, restartPolicy: ` + policy + `}]
    resources:
      requests: {cpu: 100m}
      limits: {cpu: 250m, memory: ` + memory + `}
`
}

// A container's status reports the requests and limits it runs with (status.resources) and the
// requests the node set aside for it (allocatedResources), as kubelet does. A change of its memory
// limit (what the API's resize subresource makes) is applied in place with resizePolicy
// NotRequired: same process, new cgroup limit, new status; with RestartContainer the container is
// replaced and the new one runs with the new limit.
func TestContainerStatusResourcesAndResize(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("sized.yaml", resizePod("32Mi", "NotRequired"))
	h.startAgent()
	p := h.waitPod("sized", "running", allRunning)
	check := func(p *v1.Pod, memory string) {
		t.Helper()
		cs := containerStatus(p, "app")
		want := v1.ResourceRequirements{
			Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse(memory)},
			Limits:   v1.ResourceList{v1.ResourceCPU: resource.MustParse("250m"), v1.ResourceMemory: resource.MustParse(memory)},
		}
		if cs.Resources == nil || !resourceListsEqual(cs.Resources.Requests, want.Requests) || !resourceListsEqual(cs.Resources.Limits, want.Limits) {
			t.Errorf("status.resources %+v; want %+v (the memory request defaulted from the limit)", cs.Resources, want)
		}
		if !resourceListsEqual(cs.AllocatedResources, want.Requests) {
			t.Errorf("allocatedResources %v; want %v", cs.AllocatedResources, want.Requests)
		}
		pid := h.tasks()[strings.TrimPrefix(cs.ContainerID, "containerd://")]
		if pid == 0 {
			t.Fatalf("no running task for app; tasks: %v", h.tasks())
		}
		q := resource.MustParse(memory)
		if lim := cgroupValue(t, pid, "memory", "memory.limit_in_bytes", "memory.max"); lim != strconv.FormatInt(q.Value(), 10) {
			t.Errorf("app's cgroup memory limit %s; want %d", lim, q.Value())
		}
		// The pod's cgroup (the container's parent) follows: its limit is the sum of its one
		// container's, or the container's would be capped by the old one.
		if lim := cgroupValue(t, pid, "memory", "../memory.limit_in_bytes", "../memory.max"); lim != strconv.FormatInt(q.Value(), 10) {
			t.Errorf("pod's cgroup memory limit %s; want %d", lim, q.Value())
		}
	}
	check(p, "32Mi")
	id := containerStatus(p, "app").ContainerID
	pid := h.tasks()[strings.TrimPrefix(id, "containerd://")]

	h.writeManifest("sized.yaml", resizePod("48Mi", "NotRequired"))
	p = h.waitPod("sized", "resized in place", func(p *v1.Pod) bool {
		cs := containerStatus(p, "app")
		return allRunning(p) && cs.Resources != nil && cs.Resources.Limits.Memory().String() == "48Mi"
	})
	check(p, "48Mi")
	if cs := containerStatus(p, "app"); cs.ContainerID != id || cs.RestartCount != 0 || h.tasks()[strings.TrimPrefix(id, "containerd://")] != pid {
		t.Errorf("resize with NotRequired: container %s restarts %d pid %d; want %s, 0, %d (in place)", cs.ContainerID, cs.RestartCount, h.tasks()[strings.TrimPrefix(id, "containerd://")], id, pid)
	}
	if !h.logLine("pod=default/sized", "reason=ResizeCompleted") {
		t.Errorf("no ResizeCompleted event")
	}

	// After an agent restart the resized container is adopted (its labels say what it runs with)
	// and resized in place again: the new agent's ResizeCompleted shows it synced.
	h.stopAgent()
	h.startAgent()
	h.writeManifest("sized.yaml", strings.Replace(resizePod("48Mi", "NotRequired"), "cpu: 250m", "cpu: 300m", 1))
	p = h.waitPod("sized", "cpu resized in place by the new agent", func(p *v1.Pod) bool {
		cs := containerStatus(p, "app")
		return h.logLine("pod=default/sized", "reason=ResizeCompleted") && cs.Resources != nil && cs.Resources.Limits.Cpu().String() == "300m"
	})
	if cs := containerStatus(p, "app"); cs.ContainerID != id || cs.RestartCount != 0 || h.tasks()[strings.TrimPrefix(id, "containerd://")] != pid {
		t.Errorf("after the agent's restart: container %s restarts %d; want %s with pid %d kept", cs.ContainerID, cs.RestartCount, id, pid)
	}
	if quota := cgroupValue(t, pid, "cpu", "cpu.cfs_quota_us", "cpu.max"); quota != "30000" {
		t.Errorf("cpu quota %s after the cpu resize; want 30000", quota)
	}

	// RestartContainer (and a resizePolicy change alone, which replaces the container) first.
	h.writeManifest("sized.yaml", resizePod("48Mi", "RestartContainer"))
	h.waitPod("sized", "replaced for its new resizePolicy", func(p *v1.Pod) bool {
		return allRunning(p) && containerStatus(p, "app").RestartCount == 1
	})
	h.writeManifest("sized.yaml", resizePod("40Mi", "RestartContainer"))
	p = h.waitPod("sized", "replaced with the new limit", func(p *v1.Pod) bool {
		cs := containerStatus(p, "app")
		return allRunning(p) && cs.RestartCount == 2 && cs.Resources != nil && cs.Resources.Limits.Memory().String() == "40Mi"
	})
	check(p, "40Mi")
	if !h.logLine("pod=default/sized", "reason=ResizeByRestart", "memory resizePolicy is RestartContainer") {
		t.Errorf("no ResizeByRestart event saying why")
	}
}

func resourceListsEqual(a, b v1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, q := range a {
		if o, ok := b[k]; !ok || o.Cmp(q) != 0 {
			return false
		}
	}
	return true
}
