package pod

import (
	"context"
	"sync"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/podspec"
	v1 "k8s.io/api/core/v1"
)

// Sidecars (init containers with restartPolicy Always), as kubelet runs them since Kubernetes
// 1.33: each starts in the init containers' order, and the next init container waits until it is
// started (running, its postStart hook done and its startup probe passed), not until it exits. It
// then runs for the pod's life, restarted with back-off whenever it exits whatever the pod's
// restartPolicy, until the pod is done (its app containers finished for good): then it is stopped
// and stays stopped. A pod's stop takes the app containers first and the sidecars after them, in
// reverse spec order.

// policyFor is the restart policy container c lives under: the pod's, except for a sidecar, which
// restarts until the pod is done.
func (w *Worker) policyFor(pod *v1.Pod, c *v1.Container) v1.RestartPolicy {
	if podspec.Ephemeral(&pod.Spec, c.Name) != nil {
		return v1.RestartPolicyNever // an ephemeral container runs once, whatever the pod's policy (ephemeral.go)
	}
	if podspec.Sidecar(&pod.Spec, c.Name) == nil {
		return pod.Spec.RestartPolicy
	}
	if w.done {
		return v1.RestartPolicyNever
	}
	return v1.RestartPolicyAlways
}

// finished reports whether the pod has run to its end, as kubelet's phase says Succeeded or Failed:
// a Never or OnFailure pod whose app containers all finished for good, or one whose regular init
// container failed for good. Its sidecars are then stopped and not started again.
func (w *Worker) finished(pod *v1.Pod) bool {
	policy := pod.Spec.RestartPolicy
	if policy == v1.RestartPolicyAlways {
		return false
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if t := w.rec(c.Name).terminated; !podspec.IsSidecar(c) && t != nil && t.ExitCode != 0 && !shouldRestart(policy, t.ExitCode) {
			return true
		}
	}
	for i := range pod.Spec.Containers {
		if t := w.rec(pod.Spec.Containers[i].Name).terminated; t == nil || shouldRestart(policy, t.ExitCode) {
			return false
		}
	}
	return true
}

// appsRan reports whether an app container of the pod is in containerd (running or exited): the
// pod was initialized in this sandbox, so a sidecar that restarts holds nothing up (kubelet's
// HasAnyRegularContainerStarted). A sandbox made anew after a reboot has none: its init
// containers, sidecars included, run in order again.
func (w *Worker) appsRan(pod *v1.Pod, newest map[string]*ctrd.Container) bool {
	for i := range pod.Spec.Containers {
		if newest[pod.Spec.Containers[i].Name] != nil {
			return true
		}
	}
	return false
}

// sidecarStarted reports whether sidecar c's attempt cur counts as started for the next init
// container: running, and its startup probe (if any) passed.
func (w *Worker) sidecarStarted(c *v1.Container, cur *ctrd.Container) bool {
	if cur == nil || cur.State != ctrd.StateRunning {
		return false
	}
	started, _ := w.probes.Status(c, cur.ID)
	return started
}

// stopSidecars stops the running sidecars of a pod that is done, in reverse spec order, each with
// the pod's grace period, keeping their exits visible; its running ephemeral containers stop with
// them, as kubelet stops everything of a pod that finished. It reports whether it stopped any; the
// next sync records their exits as final.
func (w *Worker) stopSidecars(ctx context.Context, pod *v1.Pod, newest map[string]*ctrd.Container) bool {
	var running []ctrd.Container
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if cur := newest[c.Name]; podspec.IsSidecar(c) && cur != nil && cur.State == ctrd.StateRunning {
			running = append(running, *cur)
		}
	}
	for _, ec := range pod.Spec.EphemeralContainers {
		if cur := newest[ec.Name]; cur != nil && cur.State == ctrd.StateRunning {
			running = append(running, *cur)
		}
	}
	if len(running) == 0 {
		return false
	}
	w.env.Log.Info("pod done; stopping its sidecars and ephemeral containers", "containers", len(running))
	w.killing(pod, running...)
	w.mutations++
	rt := w.withOrderedStop(pod, running...)
	g := grace(pod)
	var wg sync.WaitGroup
	for _, c := range running {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rt.kill(ctx, c.ID, g); err != nil {
				w.env.Log.Error("stop sidecar or ephemeral container of a finished pod", "container", c.Name, "err", err)
			}
		}()
	}
	wg.Wait()
	w.Nudge() // the next sync records their exits, whether or not containerd's exit events come first
	return true
}

// withOrderedStop is withPreStop for stopping ctrs all at once in kubelet's termination order
// (stopOrder).
func (w *Worker) withOrderedStop(pod *v1.Pod, ctrs ...ctrd.Container) preStopRuntime {
	h := w.withPreStop(pod, ctrs...)
	h.order = newStopOrder(pod, ctrs)
	return h
}

// stopOrder is kubelet's termination ordering for containers stopped together: every container's
// preStop hook runs at once, then the app containers (and anything that is not a sidecar) get
// their stop signal, and each sidecar gets its own once those and the sidecars after it in the
// spec are stopped. The wait comes out of the container's grace period, never under MinGrace.
type stopOrder struct {
	mu    sync.Mutex
	done  map[string]chan struct{} // container id -> closed once its stop returned
	after map[string][]string      // container id -> ids that must be stopped before it
}

func newStopOrder(pod *v1.Pod, ctrs []ctrd.Container) *stopOrder {
	o := &stopOrder{done: map[string]chan struct{}{}, after: map[string][]string{}}
	var first []string                // ids of what is not a sidecar
	sidecars := map[string][]string{} // sidecar name -> its attempts' ids
	for _, c := range ctrs {
		o.done[c.ID] = make(chan struct{})
		if podspec.Sidecar(&pod.Spec, c.Name) != nil {
			sidecars[c.Name] = append(sidecars[c.Name], c.ID)
		} else {
			first = append(first, c.ID)
		}
	}
	before := first
	for i := len(pod.Spec.InitContainers) - 1; i >= 0; i-- {
		ids := sidecars[pod.Spec.InitContainers[i].Name]
		if len(ids) == 0 {
			continue
		}
		for _, id := range ids {
			o.after[id] = before
		}
		before = append(append([]string(nil), before...), ids...)
	}
	return o
}

// wait blocks until the containers that stop before id are stopped, for at most left, and returns
// what is left of it.
func (o *stopOrder) wait(ctx context.Context, id string, left time.Duration) time.Duration {
	deps := o.after[id]
	if len(deps) == 0 {
		return left
	}
	start := time.Now()
	t := time.NewTimer(left)
	defer t.Stop()
	for _, dep := range deps {
		select {
		case <-o.done[dep]:
		case <-t.C:
			return MinGrace
		case <-ctx.Done():
			return MinGrace
		}
	}
	return max(left-time.Since(start), MinGrace)
}

// stopped marks id's stop as returned (done or failed: a failed stop holds no one up past it).
func (o *stopOrder) stopped(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if ch, ok := o.done[id]; ok {
		select {
		case <-ch:
		default:
			close(ch)
		}
	}
}
