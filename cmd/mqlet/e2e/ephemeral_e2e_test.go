package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// Ephemeral containers (kubectl debug) against the real containerd, through the real agent: one
// added to a running pod's spec runs in the pod's network and IPC namespaces, with its hostname, and in its
// target's PID namespace, without disturbing the other container, and goes with the pod.

const debugTarget = `apiVersion: v1
kind: Pod
metadata: {name: debugged}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "for n in net ipc pid; do echo app-$n=$(readlink /proc/self/ns/$n); done; echo app-host=$(hostname); exec sleep 7777"]
`

const debugger = `  ephemeralContainers:
  - name: debugger
    image: mqlet.test/busybox:1
    targetContainerName: app
    command: ["sh", "-c", "for n in net ipc pid; do echo dbg-$n=$(readlink /proc/self/ns/$n); done; echo dbg-host=$(hostname); echo dbg-pid1=$(tr '\\0' ' ' < /proc/1/cmdline); exec sleep 3600"]
`

func ephemeralStatusOf(p *v1.Pod, name string) v1.ContainerStatus {
	for _, cs := range p.Status.EphemeralContainerStatuses {
		if cs.Name == name {
			return cs
		}
	}
	return v1.ContainerStatus{}
}

// logLines maps "key=value" lines of a container's log to their values.
func logLines(log string) map[string]string {
	out := map[string]string{}
	for _, l := range strings.Split(log, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

func TestEphemeralContainerJoinsRunningPod(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("debugged.yaml", debugTarget)
	h.startAgent()
	p := h.waitPod("debugged", "running with the app's namespaces logged", func(p *v1.Pod) bool {
		return allRunning(p) && strings.Contains(h.logOf(p, "app"), "app-pid=")
	})
	app := containerStatus(p, "app")
	appID := strings.TrimPrefix(app.ContainerID, "containerd://")
	appPid := h.tasks()[appID]
	if appPid == 0 {
		t.Fatalf("app's task %s not running in containerd", appID)
	}

	h.writeManifest("debugged.yaml", debugTarget+debugger)
	p = h.waitPod("debugged", "debugger running and its namespaces logged", func(p *v1.Pod) bool {
		return ephemeralStatusOf(p, "debugger").State.Running != nil && strings.Contains(h.logOf(p, "debugger"), "dbg-pid1=")
	})
	dbg := ephemeralStatusOf(p, "debugger")
	if dbg.Image != "mqlet.test/busybox:1" || dbg.ImageID == "" || !strings.HasPrefix(dbg.ContainerID, "containerd://") || dbg.RestartCount != 0 || dbg.Ready {
		t.Errorf("debugger status %+v; want its image and image id, a containerd id, no restarts, not ready", dbg)
	}
	if p.Status.Phase != v1.PodRunning || podCondition(p, v1.PodReady) != v1.ConditionTrue {
		t.Errorf("pod %s, Ready %s with the debugger added; want Running and Ready", p.Status.Phase, podCondition(p, v1.PodReady))
	}
	appLog, dbgLog := logLines(h.logOf(p, "app")), logLines(h.logOf(p, "debugger"))
	// Each container has a UTS namespace of its own, with the pod's hostname (ctrspec.NamespaceOpts).
	for _, n := range []string{"net", "ipc", "pid", "host"} {
		if a, d := appLog["app-"+n], dbgLog["dbg-"+n]; a == "" || a != d {
			t.Errorf("%s: app %q, debugger %q; want the same", n, a, d)
		}
	}
	if got := dbgLog["dbg-pid1"]; got != "sleep 7777" {
		t.Errorf("debugger's /proc/1/cmdline %q; want the target's process, sleep 7777", got)
	}
	// The app was not touched: the same container, the same task, no restart.
	if now := containerStatus(p, "app"); now.ContainerID != app.ContainerID || now.RestartCount != 0 || now.State.Running == nil {
		t.Errorf("app after the debugger was added: %+v; want the same running container %s", now, app.ContainerID)
	}
	if pid := h.tasks()[appID]; pid != appPid {
		t.Errorf("app's task pid %d, was %d: the app was restarted", pid, appPid)
	}

	if out := h.mqlet("describe", "pod", "debugged"); !strings.Contains(out, "Ephemeral Containers:") || !strings.Contains(out, "debugger") {
		t.Errorf("mqlet describe pod lists no ephemeral container:\n%s", out)
	}

	// An agent restart adopts the debugger as it adopts the app: the same task, not run again.
	dbgID := strings.TrimPrefix(dbg.ContainerID, "containerd://")
	dbgPid := h.tasks()[dbgID]
	h.stopAgent()
	h.startAgent()
	p = h.waitPod("debugged", "debugger reported running by the restarted agent", func(p *v1.Pod) bool {
		return ephemeralStatusOf(p, "debugger").State.Running != nil && allRunning(p)
	})
	if now := ephemeralStatusOf(p, "debugger"); now.ContainerID != dbg.ContainerID || now.RestartCount != 0 {
		t.Errorf("debugger after an agent restart: %+v; want the same container %s", now, dbg.ContainerID)
	}
	if tasks := h.tasks(); dbgPid == 0 || tasks[dbgID] != dbgPid || tasks[appID] != appPid {
		t.Errorf("task pids after an agent restart: debugger %d (was %d), app %d (was %d); want both unchanged", tasks[dbgID], dbgPid, tasks[appID], appPid)
	}

	// The ephemeral container goes with the pod.
	if err := os.Remove(filepath.Join(h.manifests, "debugged.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "containers removed and the pod gone from the API", func() bool {
		_, err := h.getPod("debugged")
		return len(h.containerIDs()) == 0 && err != nil
	})
}
