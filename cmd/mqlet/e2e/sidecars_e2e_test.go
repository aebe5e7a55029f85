package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// Sidecars (init containers with restartPolicy Always) against the real containerd, through the
// real agent: kubelet's order, restarts, completion, termination order and status.

func initStatus(p *v1.Pod, name string) v1.ContainerStatus {
	for _, cs := range p.Status.InitContainerStatuses {
		if cs.Name == name {
			return cs
		}
	}
	return v1.ContainerStatus{}
}

func isStarted(cs v1.ContainerStatus) bool { return cs.Started != nil && *cs.Started }

func podConditionMessage(p *v1.Pod, t v1.PodConditionType) string {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Message
		}
	}
	return ""
}

// The init container after a sidecar starts once the sidecar runs (it waits for a file the sidecar
// writes, which a sidecar run as a plain init container would never let it see), and, when the
// sidecar has a startup probe, only once that probe passed: the init container after "probed"
// fails at once if the file the probe tests is missing, and the pod's restartPolicy Never would
// make that fatal.
func TestSidecarStartsBeforeNextInitContainer(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("order.yaml", `apiVersion: v1
kind: Pod
metadata: {name: order}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  volumes:
  - {name: shared, emptyDir: {}}
  initContainers:
  - name: plain
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "echo plain >> /shared/order"]
    volumeMounts: [{name: shared, mountPath: /shared}]
  - name: side
    image: mqlet.test/busybox:1
    restartPolicy: Always
    command: ["sh", "-c", "echo side >> /shared/order; exec sleep 3600"]
    volumeMounts: [{name: shared, mountPath: /shared}]
  - name: waits
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "i=0; until grep -q side /shared/order; do i=$((i+1)); [ $i -lt 300 ] || exit 1; sleep 0.1; done; echo waits >> /shared/order"]
    volumeMounts: [{name: shared, mountPath: /shared}]
  - name: probed
    image: mqlet.test/busybox:1
    restartPolicy: Always
    command: ["sh", "-c", "sleep 3; echo probed >> /shared/order; exec sleep 3600"]
    volumeMounts: [{name: shared, mountPath: /shared}]
    startupProbe:
      exec: {command: ["grep", "-q", "probed", "/shared/order"]}
      periodSeconds: 1
      failureThreshold: 30
  - name: after
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "grep -q probed /shared/order && echo after >> /shared/order"]
    volumeMounts: [{name: shared, mountPath: /shared}]
  containers:
  - name: app
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "cat /shared/order; exec sleep 3600"]
    volumeMounts: [{name: shared, mountPath: /shared}]
`)
	h.startAgent()
	sawUnstarted := false
	var early []string
	p := h.waitPod("order", "running with both sidecars (or failed)", func(p *v1.Pod) bool {
		if cs := initStatus(p, "probed"); cs.State.Running != nil && !isStarted(cs) {
			sawUnstarted = true
			if s := initStatus(p, "after"); s.State.Running != nil || s.State.Terminated != nil {
				early = append(early, fmt.Sprintf("init container after ran while the sidecar before it was not started: %+v", s.State))
			}
			if msg := podConditionMessage(p, v1.PodInitialized); !strings.Contains(msg, "probed") || podCondition(p, v1.PodInitialized) != v1.ConditionFalse {
				early = append(early, fmt.Sprintf("Initialized while probed was not started: %s %q", podCondition(p, v1.PodInitialized), msg))
			}
		}
		return p.Status.Phase == v1.PodFailed || p.Status.Phase == v1.PodRunning && containerStatus(p, "app").State.Running != nil
	})
	if len(early) > 0 {
		t.Errorf("%s", early[0])
	}
	if p.Status.Phase != v1.PodRunning {
		t.Fatalf("pod %s; want Running: %s", p.Status.Phase, podSummaryForTest(p))
	}
	if !sawUnstarted {
		t.Errorf("never saw sidecar probed running and not started while its startup probe failed")
	}
	for _, name := range []string{"side", "probed"} {
		cs := initStatus(p, name)
		if cs.State.Running == nil || !isStarted(cs) || !cs.Ready || cs.RestartCount != 0 {
			t.Errorf("sidecar %s: running %v started %v ready %v restarts %d; want running, started, ready, 0", name, cs.State.Running != nil, cs.Started, cs.Ready, cs.RestartCount)
		}
	}
	for _, name := range []string{"plain", "waits", "after"} {
		if cs := initStatus(p, name); cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 0 || !cs.Ready {
			t.Errorf("init container %s: %+v; want terminated with 0 and ready", name, cs.State)
		}
	}
	if podCondition(p, v1.PodInitialized) != v1.ConditionTrue || podCondition(p, v1.PodReady) != v1.ConditionTrue {
		t.Errorf("conditions %+v; want Initialized and Ready", p.Status.Conditions)
	}
	got := h.waitPod("order", "app's log written", func(p *v1.Pod) bool { return strings.Contains(h.logOf(p, "app"), "after") })
	if log := strings.Fields(h.logOf(got, "app")); strings.Join(log, " ") != "plain side waits probed after" {
		t.Errorf("order the containers wrote: %q; want plain side waits probed after", log)
	}
}

// A sidecar that exits is restarted (with back-off), even in a pod with restartPolicy Never, and its
// exits do not fail the pod; its readiness counts for the pod's Ready.
func TestSidecarRestartsUnderNeverAndGatesReady(t *testing.T) {
	h := newHarness(t)
	flag := filepath.Join(h.dir, "flag")
	os.MkdirAll(flag, 0o755)
	h.writeManifest("restart.yaml", `apiVersion: v1
kind: Pod
metadata: {name: restart}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  volumes:
  - {name: flag, hostPath: {path: "`+flag+`"}}
  initContainers:
  - name: side
    image: mqlet.test/busybox:1
    restartPolicy: Always
    command: ["sh", "-c", "echo run >> /flag/runs; [ $(wc -l < /flag/runs) -ge 2 ] || exit 3; exec sleep 3600"]
    volumeMounts: [{name: flag, mountPath: /flag}]
    readinessProbe:
      exec: {command: ["test", "-f", "/flag/ready"]}
      periodSeconds: 1
  containers:
  - name: app
    image: mqlet.test/busybox:1
    command: ["sleep", "3600"]
`)
	h.startAgent()
	p := h.waitPod("restart", "running with its sidecar restarted once", func(p *v1.Pod) bool {
		cs := initStatus(p, "side")
		return p.Status.Phase == v1.PodRunning && cs.State.Running != nil && cs.RestartCount == 1 &&
			containerStatus(p, "app").State.Running != nil
	})
	cs := initStatus(p, "side")
	if last := cs.LastTerminationState.Terminated; last == nil || last.ExitCode != 3 {
		t.Errorf("sidecar's lastState %+v; want terminated with 3", cs.LastTerminationState)
	}
	if cs.Ready || podCondition(p, v1.PodReady) != v1.ConditionFalse || podCondition(p, v1.ContainersReady) != v1.ConditionFalse {
		t.Errorf("sidecar ready %v, conditions %+v; want the unready sidecar to hold Ready and ContainersReady", cs.Ready, p.Status.Conditions)
	}
	if msg := podConditionMessage(p, v1.PodReady); msg != "containers with unready status: [side]" {
		t.Errorf("Ready's message %q; want it to name the sidecar", msg)
	}
	os.WriteFile(filepath.Join(flag, "ready"), nil, 0o644)
	p = h.waitPod("restart", "ready", func(p *v1.Pod) bool {
		return initStatus(p, "side").Ready && podCondition(p, v1.PodReady) == v1.ConditionTrue
	})
	if p.Status.Phase != v1.PodRunning || initStatus(p, "side").RestartCount != 1 {
		t.Errorf("phase %s, sidecar restarts %d; want Running, 1", p.Status.Phase, initStatus(p, "side").RestartCount)
	}

	// An agent restart adopts the running sidecar: same container and process, no restart. The
	// readiness that turns false comes from the new agent's own probe, so its worker has synced
	// (and would have replaced the sidecar by then).
	id := initStatus(p, "side").ContainerID
	pid := h.tasks()[strings.TrimPrefix(id, "containerd://")]
	h.stopAgent()
	h.startAgent()
	os.Remove(filepath.Join(flag, "ready"))
	p = h.waitPod("restart", "unready by the new agent's probe", func(p *v1.Pod) bool {
		return podCondition(p, v1.PodReady) == v1.ConditionFalse && !initStatus(p, "side").Ready
	})
	if cs := initStatus(p, "side"); cs.ContainerID != id || cs.RestartCount != 1 || cs.State.Running == nil {
		t.Errorf("after the agent's restart the sidecar is %s with %d restarts (%+v); want %s adopted, running, with 1", cs.ContainerID, cs.RestartCount, cs.State, id)
	}
	if now := h.tasks()[strings.TrimPrefix(id, "containerd://")]; pid == 0 || now != pid {
		t.Errorf("sidecar's process %d before the agent's restart, %d after", pid, now)
	}
}

// A Never pod whose app container finished is Succeeded while its sidecar still runs, and the
// sidecar is then stopped (and not restarted). One whose regular init container fails after a
// sidecar started is Failed, and that sidecar is stopped too.
func TestSidecarStoppedWhenPodSucceeds(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("initfail.yaml", `apiVersion: v1
kind: Pod
metadata: {name: initfail}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  initContainers:
  - name: side
    image: mqlet.test/busybox:1
    restartPolicy: Always
    command: ["sleep", "3600"]
  - name: fails
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "exit 4"]
  containers:
  - name: app
    image: mqlet.test/busybox:1
    command: ["true"]
`)
	h.writeManifest("job.yaml", `apiVersion: v1
kind: Pod
metadata: {name: job}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  initContainers:
  - name: side
    image: mqlet.test/busybox:1
    restartPolicy: Always
    command: ["sleep", "3600"]
  containers:
  - name: app
    image: mqlet.test/busybox:1
    command: ["true"]
`)
	h.startAgent()
	p := h.waitPod("job", "succeeded with its sidecar stopped", func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodSucceeded && initStatus(p, "side").State.Terminated != nil
	})
	cs := initStatus(p, "side")
	id := strings.TrimPrefix(cs.ContainerID, "containerd://")
	if _, running := h.tasks()[id]; running {
		t.Errorf("sidecar %s still has a running task after the pod succeeded", id)
	}
	if cs.Ready || isStarted(cs) {
		t.Errorf("stopped sidecar: ready %v started %v; want neither", cs.Ready, cs.Started)
	}
	if podCondition(p, v1.PodInitialized) != v1.ConditionTrue {
		t.Errorf("Initialized %s; want True for a pod whose app container ran", podCondition(p, v1.PodInitialized))
	}
	if !h.logLine("pod=default/job", "pod done; stopping its sidecars") {
		t.Errorf("the agent did not say it stopped the sidecars of the finished pod")
	}

	p = h.waitPod("initfail", "failed with its sidecar stopped", func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodFailed && initStatus(p, "side").State.Terminated != nil
	})
	if t4 := initStatus(p, "fails").State.Terminated; t4 == nil || t4.ExitCode != 4 {
		t.Errorf("init container fails: %+v; want terminated with 4", initStatus(p, "fails").State)
	}
	if id := strings.TrimPrefix(initStatus(p, "side").ContainerID, "containerd://"); h.tasks()[id] != 0 {
		t.Errorf("sidecar %s of the failed pod still runs", id)
	}
	if cs := containerStatus(p, "app"); cs.State.Running != nil || cs.State.Terminated != nil {
		t.Errorf("app container of a pod whose init container failed ran: %+v", cs.State)
	}
}

// A pod's deletion stops the app container first, then the sidecars in reverse spec order. Each
// container appends its name to a file on SIGTERM; the app (2 s) and the last sidecar (1 s) wait
// before they do, so stopping them all at once (or the sidecars in spec order) writes another
// order; the app's wait also leaves time for the first sidecar's preStop exec, which runs at the
// start of the stop.
func TestSidecarTerminationOrder(t *testing.T) {
	h := newHarness(t)
	out := filepath.Join(h.dir, "out")
	os.MkdirAll(out, 0o755)
	ctr := func(name, onTerm string) string {
		return `  - name: ` + name + `
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "trap '` + onTerm + `echo ` + name + ` >> /out/order; exit 0' TERM; echo up > /out/` + name + `; sleep 3600 & wait"]
    volumeMounts: [{name: out, mountPath: /out}]
`
	}
	// Sidecars' lifecycle hooks run too: first's preStop (at the start of the stop, as every
	// container's), second's postStart (before the pod goes on).
	sidecar := func(name, hook string) string {
		return strings.Replace(ctr(name, map[string]string{"first": "", "second": "sleep 1; "}[name]), "  - name: "+name+"\n",
			"  - name: "+name+"\n    restartPolicy: Always\n    lifecycle:\n"+hook, 1)
	}
	h.writeManifest("term.yaml", `apiVersion: v1
kind: Pod
metadata: {name: term}
spec:
  terminationGracePeriodSeconds: 20
  volumes:
  - {name: out, hostPath: {path: "`+out+`"}}
  initContainers:
`+sidecar("first", "      preStop: {exec: {command: [sh, -c, 'echo first-prestop >> /out/order']}}\n")+
		sidecar("second", "      postStart: {exec: {command: [sh, -c, 'echo poststarted > /out/poststart']}}\n")+`  containers:
`+ctr("app", "sleep 2; "))
	h.startAgent()
	h.waitPod("term", "running", func(p *v1.Pod) bool {
		return allRunning(p) && initStatus(p, "first").State.Running != nil && initStatus(p, "second").State.Running != nil
	})
	// The traps are set once each container wrote its file.
	waitFor(t, "every container up", func() bool {
		for _, n := range []string{"first", "second", "app"} {
			if _, err := os.Stat(filepath.Join(out, n)); err != nil {
				return false
			}
		}
		return true
	})
	if b, err := os.ReadFile(filepath.Join(out, "poststart")); err != nil || string(b) != "poststarted\n" {
		t.Errorf("sidecar second's postStart hook: %q %v", b, err)
	}
	if err := os.Remove(filepath.Join(h.manifests, "term.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pod gone", func() bool {
		_, err := h.getPod("term")
		return len(h.containerIDs()) == 0 && err != nil
	})
	b, _ := os.ReadFile(filepath.Join(out, "order"))
	if got := strings.Join(strings.Fields(string(b)), " "); got != "first-prestop app second first" {
		t.Errorf("containers stopped in the order %q; want first-prestop app second first", got)
	}
}
