package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// Probes and lifecycle hooks against the real containerd, through the real agent.

// logLine reports whether one line of the agent's log holds every part.
func (h *harness) logLine(parts ...string) bool {
	for _, line := range strings.Split(h.agentLog.String(), "\n") {
		ok := true
		for _, p := range parts {
			if !strings.Contains(line, p) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func podCondition(p *v1.Pod, t v1.PodConditionType) v1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

// A container whose liveness probe fails is killed and restarted under the pod's restart policy:
// restartCount grows, the killed attempt shows as lastState, and the reason is told.
func TestProbeLivenessFailureRestartsContainer(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("liveexec.yaml", `apiVersion: v1
kind: Pod
metadata: {name: liveexec}
spec:
  containers:
  - name: app
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "touch /tmp/healthy; sleep 2; rm /tmp/healthy; exec sleep 3600"]
    livenessProbe:
      exec: {command: ["cat", "/tmp/healthy"]}
      periodSeconds: 1
      failureThreshold: 2
      terminationGracePeriodSeconds: 1
`)
	// tcpSocket: the liveness probe's port has nothing listening; readiness's has httpd.
	h.writeManifest("livetcp.yaml", `apiVersion: v1
kind: Pod
metadata: {name: livetcp}
spec:
  containers:
  - name: web
    image: mqlet.test/busybox:1
    command: ["httpd", "-f", "-p", "8080"]
    ports: [{name: http, containerPort: 8080}]
    livenessProbe:
      tcpSocket: {port: 8081}
      initialDelaySeconds: 1
      periodSeconds: 1
      failureThreshold: 1
      terminationGracePeriodSeconds: 1
`)
	h.startAgent()
	p := h.waitPod("liveexec", "restarted after its liveness probe failed", func(p *v1.Pod) bool {
		cs := containerStatus(p, "app")
		return cs.RestartCount >= 1 && cs.LastTerminationState.Terminated != nil
	})
	last := containerStatus(p, "app").LastTerminationState.Terminated
	// sleep as PID 1 ignores SIGTERM: the kill ends it with SIGKILL once the probe's grace is over.
	if last.ExitCode != 137 {
		t.Errorf("lastState.terminated exit code %d, want 137 (killed)", last.ExitCode)
	}
	if !h.logLine("pod=default/liveexec", "reason=Unhealthy", "Liveness probe failed") {
		t.Errorf("no Unhealthy event with the probe's failure for liveexec:\n%s", h.agentLog)
	}
	if !h.logLine("pod=default/liveexec", "Container app failed liveness probe, will be restarted") {
		t.Errorf("no Killing reason for liveexec:\n%s", h.agentLog)
	}
	h.waitPod("livetcp", "restarted after its tcpSocket liveness probe failed", func(p *v1.Pod) bool {
		return containerStatus(p, "web").RestartCount >= 1
	})
	if !h.logLine("pod=default/livetcp", "Liveness probe failed", "8081", "connection refused") {
		t.Errorf("no Unhealthy event naming the refused port for livetcp:\n%s", h.agentLog)
	}
}

// A readiness probe drives the container's ready and the pod's Ready and ContainersReady, both
// ways. httpGet, by port name, against busybox httpd serving a directory the test fills.
func TestProbeReadinessFlipsReady(t *testing.T) {
	h := newHarness(t)
	www := filepath.Join(h.dir, "www")
	os.MkdirAll(www, 0o755)
	h.writeManifest("ready.yaml", `apiVersion: v1
kind: Pod
metadata: {name: ready}
spec:
  volumes:
  - {name: www, hostPath: {path: "`+www+`"}}
  containers:
  - name: web
    image: mqlet.test/busybox:1
    command: ["httpd", "-f", "-p", "8080", "-h", "/www"]
    ports: [{name: http, containerPort: 8080}]
    volumeMounts: [{name: www, mountPath: /www}]
    readinessProbe:
      httpGet: {path: /ready, port: http, httpHeaders: [{name: X-Probe, value: mqlet}]}
      periodSeconds: 1
      failureThreshold: 1
  - name: tcp
    image: mqlet.test/busybox:1
    command: ["httpd", "-f", "-p", "9090"]
    readinessProbe:
      tcpSocket: {port: 9090}
      periodSeconds: 1
`)
	h.startAgent()
	notReady := func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodRunning && !containerStatus(p, "web").Ready &&
			podCondition(p, v1.PodReady) == v1.ConditionFalse && podCondition(p, v1.ContainersReady) == v1.ConditionFalse
	}
	h.waitPod("ready", "running but not ready", notReady)
	// The probe ran and saw 404: not ready because of it, not because nothing was probed yet.
	waitFor(t, "readiness failure logged", func() bool {
		return h.logLine("pod=default/ready", "Readiness probe failed", "statuscode: 404")
	})
	h.waitPod("ready", "tcp container ready", func(p *v1.Pod) bool { return containerStatus(p, "tcp").Ready })

	os.WriteFile(filepath.Join(www, "ready"), []byte("ok\n"), 0o644)
	p := h.waitPod("ready", "ready", func(p *v1.Pod) bool {
		return containerStatus(p, "web").Ready && podCondition(p, v1.PodReady) == v1.ConditionTrue &&
			podCondition(p, v1.ContainersReady) == v1.ConditionTrue
	})
	if cs := containerStatus(p, "web"); cs.Started == nil || !*cs.Started || cs.RestartCount != 0 {
		t.Errorf("web: started %v restarts %d, want started and never restarted", cs.Started, cs.RestartCount)
	}

	os.Remove(filepath.Join(www, "ready"))
	h.waitPod("ready", "not ready again", notReady)
	if cs := containerStatus(h.waitPod("ready", "listed", func(*v1.Pod) bool { return true }), "web"); cs.State.Running == nil {
		t.Errorf("web is no longer running; readiness must not touch the container: %+v", cs.State)
	}
}

// A startup probe holds off liveness: a liveness probe that fails until the app has started does
// not kill it, as long as the startup probe has not passed.
func TestProbeStartupDelaysLiveness(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("slow.yaml", `apiVersion: v1
kind: Pod
metadata: {name: slow}
spec:
  containers:
  - name: app
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "sleep 4; touch /tmp/started; exec sleep 3600"]
    startupProbe:
      exec: {command: ["test", "-f", "/tmp/started"]}
      periodSeconds: 1
      failureThreshold: 30
    livenessProbe:
      exec: {command: ["test", "-f", "/tmp/started"]}
      periodSeconds: 1
      failureThreshold: 1
      terminationGracePeriodSeconds: 1
`)
	h.startAgent()
	sawUnstarted := false
	p := h.waitPod("slow", "started and ready", func(p *v1.Pod) bool {
		cs := containerStatus(p, "app")
		if cs.State.Running != nil && cs.Started != nil && !*cs.Started && !cs.Ready {
			sawUnstarted = true
		}
		return cs.Started != nil && *cs.Started && cs.Ready
	})
	if !sawUnstarted {
		t.Errorf("never saw the running container reported as not started while its startup probe failed")
	}
	if n := containerStatus(p, "app").RestartCount; n != 0 {
		t.Errorf("restartCount %d: liveness killed the container before its startup probe passed\n%s", n, h.agentLog)
	}
	if !h.logLine("pod=default/slow", "Startup probe failed") {
		t.Errorf("the startup probe never failed, so the test proved nothing:\n%s", h.agentLog)
	}
	if h.logLine("pod=default/slow", "Liveness probe failed") {
		t.Errorf("the liveness probe ran before the startup probe passed:\n%s", h.agentLog)
	}
}

// preStop runs before the stop signal: its line comes first in the file, although it takes a
// second and the container writes its own line as soon as it sees SIGTERM.
func TestPreStopRunsBeforeSIGTERM(t *testing.T) {
	h := newHarness(t)
	out := filepath.Join(h.dir, "out")
	os.MkdirAll(out, 0o777)
	h.writeManifest("stopper.yaml", `apiVersion: v1
kind: Pod
metadata: {name: stopper}
spec:
  terminationGracePeriodSeconds: 10
  volumes:
  - {name: out, hostPath: {path: "`+out+`"}}
  containers:
  - name: app
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "trap 'echo term >> /out/order; exit 0' TERM; while true; do sleep 0.1; done"]
    volumeMounts: [{name: out, mountPath: /out}]
    lifecycle:
      preStop:
        exec: {command: ["sh", "-c", "sleep 1; echo prestop >> /out/order"]}
  - name: sleeper
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "trap 'echo sleeper-term >> /out/sleeper; exit 0' TERM; while true; do sleep 0.1; done"]
    volumeMounts: [{name: out, mountPath: /out}]
    lifecycle:
      preStop:
        sleep: {seconds: 1}
`)
	h.startAgent()
	h.waitPod("stopper", "running", allRunning)
	os.Remove(filepath.Join(h.manifests, "stopper.yaml"))
	waitFor(t, "containers removed", func() bool { return len(h.containerIDs()) == 0 })
	b, err := os.ReadFile(filepath.Join(out, "order"))
	if err != nil || string(b) != "prestop\nterm\n" {
		t.Errorf("order of preStop and SIGTERM: %q (%v), want \"prestop\\nterm\\n\"\n%s", b, err, h.agentLog)
	}
	if b, err := os.ReadFile(filepath.Join(out, "sleeper")); err != nil || string(b) != "sleeper-term\n" {
		t.Errorf("container with a sleep preStop did not get SIGTERM after it: %q (%v)", b, err)
	}
}

// A postStart hook runs in the started container; one that fails kills the container, which the
// restart policy then restarts.
func TestPostStartHook(t *testing.T) {
	h := newHarness(t)
	out := filepath.Join(h.dir, "out")
	os.MkdirAll(out, 0o777)
	h.writeManifest("hooks.yaml", `apiVersion: v1
kind: Pod
metadata: {name: hooks}
spec:
  volumes:
  - {name: out, hostPath: {path: "`+out+`"}}
  containers:
  - name: good
    image: mqlet.test/busybox:1
    command: ["sleep", "3600"]
    volumeMounts: [{name: out, mountPath: /out}]
    lifecycle:
      postStart:
        exec: {command: ["sh", "-c", "echo started-by-hook > /out/poststart"]}
`)
	h.writeManifest("badhook.yaml", `apiVersion: v1
kind: Pod
metadata: {name: badhook}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: mqlet.test/busybox:1
    command: ["sleep", "3600"]
    lifecycle:
      postStart:
        exec: {command: ["sh", "-c", "echo no-way; exit 3"]}
`)
	h.startAgent()
	p := h.waitPod("hooks", "running", allRunning)
	if b, err := os.ReadFile(filepath.Join(out, "poststart")); err != nil || string(b) != "started-by-hook\n" {
		t.Errorf("postStart's file: %q (%v)", b, err)
	}
	if n := containerStatus(p, "good").RestartCount; n != 0 {
		t.Errorf("a container with a good postStart hook restarted %d times", n)
	}
	p = h.waitPod("badhook", "restarted after its postStart hook failed", func(p *v1.Pod) bool {
		cs := containerStatus(p, "app")
		return cs.RestartCount >= 1 && cs.LastTerminationState.Terminated != nil
	})
	if code := containerStatus(p, "app").LastTerminationState.Terminated.ExitCode; code != 137 {
		t.Errorf("killed attempt's exit code %d, want 137", code)
	}
	if !h.logLine("pod=default/badhook", "FailedPostStartHook") || !h.logLine("reason=FailedPostStartHook", "exited with 3", "no-way") {
		t.Errorf("no FailedPostStartHook with the hook's exit and output:\n%s", h.agentLog)
	}
}

// A postStart hook that never returns does not hold off the pod's deletion: the hook is given up
// when the pod goes, as kubelet gives it up when it kills the pod.
func TestHangingPostStartDoesNotBlockDeletion(t *testing.T) {
	h := newHarness(t)
	out := filepath.Join(h.dir, "out")
	os.MkdirAll(out, 0o777)
	h.writeManifest("hang.yaml", `apiVersion: v1
kind: Pod
metadata: {name: hang}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - {name: out, hostPath: {path: "`+out+`"}}
  containers:
  - name: app
    image: mqlet.test/busybox:1
    command: ["sleep", "3600"]
    volumeMounts: [{name: out, mountPath: /out}]
    lifecycle:
      postStart:
        exec: {command: ["sh", "-c", "touch /out/hook-running; sleep 3600"]}
`)
	h.startAgent()
	waitFor(t, "the postStart hook running", func() bool {
		_, err := os.Stat(filepath.Join(out, "hook-running"))
		return err == nil
	})
	if err := os.Remove(filepath.Join(h.manifests, "hang.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pod hang and its container gone while its postStart hook hung", func() bool {
		_, err := h.getPod("hang")
		return err != nil && len(h.tasks()) == 0
	})
}
