package main

import (
	"path/filepath"
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
