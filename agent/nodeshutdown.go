package agent

import (
	"context"
	"strings"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/pod"
	"github.com/mqlet/mqlet/core/event"
	v1 "k8s.io/api/core/v1"
)

// nodeShutdownMessage is kubelet's status message for a pod stopped for a node shutdown.
const nodeShutdownMessage = "Pod was terminated in response to imminent node shutdown."

// shutdownPoll is how often ShutdownPods looks whether a group of pods has stopped.
const shutdownPoll = 100 * time.Millisecond

// ShutdownPods stops every running pod because the machine is going down: first the pods that are
// not critical, each with otherGrace (or its own grace period when shorter), then the critical ones
// (manifest-dir pods and critical priorities) with criticalGrace, as kubelet's graceful node
// shutdown does. It waits for a group until its pods have stopped or its grace has passed. Each
// pod ends Failed with reason Terminated and kubelet's message; the verdict does not outlive the
// agent, so the next start (the next boot) runs them again. From the call on, the node refuses
// new pods (NodeShutdown) and ShuttingDown reports true. It returns early when ctx or the agent
// ends.
func (a *Agent) ShutdownPods(ctx context.Context, criticalGrace, otherGrace time.Duration) {
	a.shuttingDown.Store(true)
	if a.opts.OnShutdownChange != nil {
		a.opts.OnShutdownChange()
	}
	a.report.Emit(event.Event{Time: time.Now(), Type: event.Normal, Reason: "NodeShutdown",
		Message: "Node is shutting down: stopping pods, critical pods last",
		Object:  event.NodeObject(a.opts.NodeName)})
	if a.runCtx != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(a.runCtx, cancel)
		defer stop()
	}
	var crit, other []*pod.Worker
	a.mu.Lock()
	for uid, w := range a.workers {
		d, ok := a.desired[uid]
		if !ok {
			continue // being deleted: its own termination is under way
		}
		if critical(d) {
			crit = append(crit, w)
		} else {
			other = append(other, w)
		}
	}
	a.mu.Unlock()
	a.stopForShutdown(ctx, "pods", other, otherGrace)
	a.stopForShutdown(ctx, "critical pods", crit, criticalGrace)
}

// ShuttingDown reports whether a node shutdown has begun (ShutdownPods) and not been called off;
// the node's Ready condition reads it.
func (a *Agent) ShuttingDown() bool { return a.shuttingDown.Load() }

// CancelShutdown says the shutdown was called off (logind's PrepareForShutdown(false)): new pods
// are admitted again. Pods already stopped stay stopped until the agent restarts, as with kubelet.
func (a *Agent) CancelShutdown() {
	a.shuttingDown.Store(false)
	if a.opts.OnShutdownChange != nil {
		a.opts.OnShutdownChange()
	}
}

// stopForShutdown fails the group's running pods with the node-shutdown verdict and waits until
// they have stopped or grace has passed.
func (a *Agent) stopForShutdown(ctx context.Context, what string, ws []*pod.Worker, grace time.Duration) {
	var stopping []*pod.Worker
	var names []string
	for _, w := range ws {
		p := w.Pod()
		if w.Failed() != nil || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue // already ended, or held by another verdict (an eviction keeps its own)
		}
		// kubelet gives each pod the group's time or its own grace period when shorter, never
		// under kubelet's minimum.
		g := max(min(grace, ctrd.PodGrace(&p)), pod.MinGrace)
		w.Fail(pod.Failure{Reason: pod.ReasonNodeShutdown, Message: nodeShutdownMessage, Grace: &g})
		stopping = append(stopping, w)
		names = append(names, p.Namespace+"/"+p.Name)
	}
	if len(stopping) == 0 {
		return
	}
	a.log.Info("node shutdown: stopping "+what, "pods", strings.Join(names, " "), "grace", grace)
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	tick := time.NewTicker(shutdownPoll)
	defer tick.Stop()
	for {
		left := 0
		for _, w := range stopping {
			if ph := w.Pod().Status.Phase; ph != v1.PodFailed && ph != v1.PodSucceeded {
				left++
			}
		}
		if left == 0 {
			a.log.Info("node shutdown: "+what+" stopped", "pods", len(stopping))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			a.log.Warn("node shutdown: "+what+" still stopping after their grace period; going on", "left", left, "grace", grace)
			return
		case <-tick.C:
		}
	}
}
