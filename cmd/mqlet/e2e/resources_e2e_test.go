package e2e

import (
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func resizePod(memory string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: sized}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: mqlet.test/busybox:1
    command: ["sleep", "3600"]
    resources:
      requests: {cpu: 100m}
      limits: {cpu: 250m, memory: ` + memory + `}
`
}

// A container's status reports the requests and limits it runs with (status.resources) and the
// requests the node set aside for it (allocatedResources), as kubelet does. A change of resources
// (what the API's resize subresource makes) is applied by replacing the container, not in place:
// the new container runs with, and reports, the new limits.
func TestContainerStatusResourcesAndResizeByRestart(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("sized.yaml", resizePod("32Mi"))
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
	}
	check(p, "32Mi")

	h.writeManifest("sized.yaml", resizePod("48Mi"))
	p = h.waitPod("sized", "running with the new limit", func(p *v1.Pod) bool {
		cs := containerStatus(p, "app")
		return allRunning(p) && cs.RestartCount == 1 && cs.Resources != nil && cs.Resources.Limits.Memory().String() == "48Mi"
	})
	check(p, "48Mi")
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
