package pod

import (
	"context"
	"fmt"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/podspec"
	"github.com/mqlet/mqlet/agent/probe"
	"github.com/mqlet/mqlet/core/event"
	v1 "k8s.io/api/core/v1"
)

// What the worker does for probes and lifecycle hooks. The probes themselves run in a probe.Set,
// one goroutine per probe; the worker only starts and stops them (syncProbes), reads their results
// (status, and killUnhealthy for a failed liveness or startup probe) and runs the hooks, which
// belong to a container's start and stop.

// killer is the runtime's KillContainer: a stop that keeps the exit visible, so the kill is
// handled as an exit under the pod's restart policy. Runtimes without it fall back to StopContainer.
type killer interface {
	KillContainer(ctx context.Context, id string, grace time.Duration) error
}

// startProbes makes the pod's probe set for the worker's run; the returned func stops its probes
// and waits for their goroutines.
func (w *Worker) startProbes(ctx context.Context) func() {
	w.probes = w.env.Prober.NewSet(ctx, w.Nudge, func(container string, warning bool, reason, message string) {
		typ := event.Normal
		if warning {
			typ = event.Warning
		}
		w.mu.Lock()
		pod := w.desired.Pod
		w.mu.Unlock()
		w.report(pod, typ, reason, message, "container", container)
	}, w.env.Log)
	return w.probes.Stop
}

// target is how a probe or hook reaches container c's attempt cur. sb is the pod's sandbox when the
// worker has set it up; without it (a pod deleted before its first sync after an agent restart)
// the container's own process names the network namespace.
func (w *Worker) target(pod *v1.Pod, sb *ctrd.Sandbox, c *v1.Container, cur *ctrd.Container) probe.Target {
	t := probe.Target{Pod: pod, Container: c, ContainerID: cur.ID}
	t.Exec, _ = w.env.Runtime.(probe.Execer)
	if pod.Spec.HostNetwork {
		t.PodIP = w.hostIP()
		return t
	}
	if sb != nil && sb.Ref.UID == pod.UID {
		t.NetNS = sb.NetNS
		if len(sb.PodIPs) > 0 {
			t.PodIP = sb.PodIPs[0]
		}
	}
	if t.NetNS == "" && cur.Pid != 0 {
		t.NetNS = fmt.Sprintf("/proc/%d/ns/net", cur.Pid)
	}
	return t
}

// syncProbes runs the probes of the pod's running app containers and sidecars and stops the
// others.
func (w *Worker) syncProbes(pod *v1.Pod, newest map[string]*ctrd.Container) {
	if w.probes == nil {
		return
	}
	var running []probe.Running
	for _, c := range probed(pod) {
		cur := newest[c.Name]
		if cur == nil || cur.State != ctrd.StateRunning || (c.LivenessProbe == nil && c.ReadinessProbe == nil && c.StartupProbe == nil) {
			continue
		}
		running = append(running, probe.Running{Target: w.target(pod, w.sb, c, cur), StartedAt: w.rec(c.Name).startTime(cur)})
	}
	w.probes.Sync(running)
}

// probed lists the containers probes apply to: the sidecars and the app containers (a regular init
// container has none: the API refuses them).
func probed(pod *v1.Pod) []*v1.Container {
	var out []*v1.Container
	for i := range pod.Spec.InitContainers {
		if c := &pod.Spec.InitContainers[i]; podspec.IsSidecar(c) {
			out = append(out, c)
		}
	}
	for i := range pod.Spec.Containers {
		out = append(out, &pod.Spec.Containers[i])
	}
	return out
}

// probeStatus is containerStatus' started and ready for a running attempt.
func (w *Worker) probeStatus(c *v1.Container, id string) (*bool, bool) {
	started, ready := w.probes.Status(c, id)
	return &started, ready
}

// killUnhealthy kills a running container that a health hook (probeKillHook) finds unhealthy, as
// kubelet does: a Killing event, the prekill hooks (preStop), then the stop signal with the grace
// period the hook gives, or the pod's. The exit then goes the way of any exit: restart policy and
// back-off. It reports whether the container was (or is being) killed and when to look again.
func (w *Worker) killUnhealthy(ctx context.Context, pod *v1.Pod, c *v1.Container, cur *ctrd.Container) (bool, time.Duration) {
	a := attempt{pod: pod, spec: c, cur: *cur, target: w.target(pod, w.sb, c, cur)}
	for _, h := range w.hooks {
		hc, ok := h.(healthChecker)
		if !ok {
			continue
		}
		msg, hookGrace, kill := hc.Unhealthy(a)
		if !kill {
			continue
		}
		w.report(pod, event.Normal, "Killing", msg, "container", c.Name)
		g := grace(pod)
		if hookGrace != nil {
			g = *hookGrace
		}
		w.mutations++
		if err := w.withPreStop(pod, *cur).kill(ctx, cur.ID, g); err != nil {
			w.env.Log.Error("kill unhealthy container", "container", cur.ID, "hook", h.Name(), "err", err)
			return true, relistRetry
		}
		w.Nudge() // restart (or not) at once, on the exit the next sync sees
		return true, 0
	}
	return false, 0
}

// postStart runs the poststart hooks (the postStart handler) right after a start; the pod's status
// waits for them, as kubelet's start does. A hook that fails gets its container killed; that exit
// then goes the way of the pod's restart policy.
func (w *Worker) postStart(ctx context.Context, pod *v1.Pod, c *v1.Container, started ctrd.Container) {
	// A hook that hangs must not hold off the pod's termination (a deletion, an eviction), which
	// waits for this sync to end: kubelet too gives up a postStart hook when the pod is killed.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-w.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	a := attempt{pod: pod, spec: c, cur: started, target: w.target(pod, w.sb, c, &started)}
	for _, h := range w.hooks {
		ps, ok := h.(poststarter)
		if !ok {
			continue
		}
		if err := ps.Poststart(ctx, a); err == nil || ctx.Err() != nil {
			continue
		}
		w.report(pod, event.Normal, "Killing", fmt.Sprintf("Container %s failed its %s hook", c.Name, h.Name()), "container", c.Name)
		if err := w.withPreStop(pod, started).kill(ctx, started.ID, grace(pod)); err != nil {
			w.env.Log.Error("kill container after its "+h.Name()+" hook failed", "container", started.ID, "err", err)
		}
		w.Nudge()
		return
	}
}

// preStopRuntime is the worker's Runtime with each running container's prekill hooks (preStop) run
// before its stop signal, inside the same grace period, as kubelet's kill does.
type preStopRuntime struct {
	Runtime
	w    *Worker
	pod  *v1.Pod
	sb   *ctrd.Sandbox
	ctrs map[string]ctrd.Container // the attempts it may stop, by id
	// order, when set, holds each stop signal until the containers that stop before it are
	// stopped (sidecars after the app containers: withOrderedStop).
	order *stopOrder
}

// withPreStop wraps the runtime for stopping ctrs of pod.
func (w *Worker) withPreStop(pod *v1.Pod, ctrs ...ctrd.Container) preStopRuntime {
	h := preStopRuntime{Runtime: w.env.Runtime, w: w, pod: pod, sb: w.sb, ctrs: make(map[string]ctrd.Container, len(ctrs))}
	for _, c := range ctrs {
		h.ctrs[c.ID] = c
	}
	return h
}

func (h preStopRuntime) StopContainer(ctx context.Context, id string, grace time.Duration) error {
	left := h.preStop(ctx, id, grace)
	if h.order != nil {
		defer h.order.stopped(id)
		left = h.order.wait(ctx, id, left)
	}
	return h.Runtime.StopContainer(ctx, id, left)
}

// kill is StopContainer that keeps the exit visible (see killer).
func (h preStopRuntime) kill(ctx context.Context, id string, grace time.Duration) error {
	left := h.preStop(ctx, id, grace)
	if h.order != nil {
		defer h.order.stopped(id)
		left = h.order.wait(ctx, id, left)
	}
	if k, ok := h.Runtime.(killer); ok {
		return k.KillContainer(ctx, id, left)
	}
	return h.Runtime.StopContainer(ctx, id, left)
}

// preStop runs the prekill hooks of attempt id, if it runs, for at most grace. It returns what is
// left of grace for the stop signal, never under kubelet's minimum.
func (h preStopRuntime) preStop(ctx context.Context, id string, grace time.Duration) time.Duration {
	cur, ok := h.ctrs[id]
	if !ok || cur.State != ctrd.StateRunning {
		return grace
	}
	c := containerSpec(h.pod, cur.Name)
	if c == nil {
		return grace
	}
	a := attempt{pod: h.pod, spec: c, cur: cur, target: h.w.target(h.pod, h.sb, c, &cur)}
	start := time.Now()
	ran := false
	hctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	for _, hk := range h.w.hooks {
		if pk, ok := hk.(prekiller); ok && pk.Prekill(hctx, a) {
			ran = true
		}
	}
	if !ran {
		return grace // nothing ran: the stop signal gets the whole grace, even under the minimum
	}
	return max(grace-time.Since(start), MinGrace)
}

// containerSpec is the pod's container (app or init) named name, or nil.
func containerSpec(pod *v1.Pod, name string) *v1.Container {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return &pod.Spec.InitContainers[i]
		}
	}
	return nil
}

// report emits an event about the pod and logs it, so that a node with no uplink shows it too.
func (w *Worker) report(pod *v1.Pod, typ event.Type, reason, message string, attrs ...any) {
	w.env.Log.Info("event", append([]any{"type", string(typ), "reason", reason, "message", message}, attrs...)...)
	w.emit(pod, typ, reason, message)
}
