package pod

import (
	"context"
	"sync"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Reasons a pod is failed by the node rather than by its containers, as kubelet spells them.
const (
	// ReasonEvicted: the eviction manager took the pod to relieve a resource (kubelet's "Evicted").
	ReasonEvicted = "Evicted"
	// ReasonNodeShutdown: the pod was stopped for a system shutdown (kubelet's "Terminated"). Unlike
	// the others it does not outlive the agent: at the next start the pod runs again as desired.
	ReasonNodeShutdown = "Terminated"
)

// Failure is the node's verdict that a pod must stop and stay stopped: evicted, refused at admission
// (OutOfmemory, OutOfcpu, ...), or stopped for a node shutdown. The pod ends in phase Failed with
// Reason and Message, its containers stopped, and nothing of it starts again: no call lifts a
// verdict, because a pod never leaves a terminal phase under the same UID (kubelet's rule, and the
// bridge's, which keeps such a pod Failed in Kubernetes while its controller replaces it). A new
// run is a new worker (see Agent.applyVerdictLocked).
type Failure struct {
	Reason  string
	Message string
	// Grace is how long each container gets between its stop signal and SIGKILL; nil means the
	// pod's own grace period (raised to MinGrace). A hard eviction passes 0: on a node out of
	// memory, waiting is what lets the kernel's OOM killer pick a victim instead.
	Grace *time.Duration
}

// Fail stops the pod for good with f (see Failure). A second call keeps the first verdict: a pod
// evicted during a shutdown stays evicted.
func (w *Worker) Fail(f Failure) {
	w.apply(input{op: opFail, failure: &f})
}

// Refuse holds the pod Failed with f in place of any verdict it is held under: admission's answer
// to a new spec replaces its answer to the old one (Fail would keep the first). A pod being removed
// is not judged any more (see transition).
func (w *Worker) Refuse(f Failure) {
	w.apply(input{op: opRefuse, failure: &f})
}

// Failed returns the verdict the pod is held under, or nil.
func (w *Worker) Failed() *Failure {
	return w.State().Failure
}

// restoredFailure reads the verdict back from a stored status: a pod that was failed by the node
// stays failed across an agent restart or a reboot, except one stopped for a node shutdown.
func restoredFailure(prev *v1.PodStatus) *Failure {
	if prev == nil || prev.Phase != v1.PodFailed || prev.Reason == "" || prev.Reason == ReasonNodeShutdown {
		return nil
	}
	return &Failure{Reason: prev.Reason, Message: prev.Message}
}

// syncFailed is the sync of a pod the node failed. While it is Terminating (kill set) it stops
// every running container (in parallel, each with the verdict's grace); in both phases it publishes
// the Failed status. Containers are stopped, not removed: their exit stays visible, as kubelet leaves
// an evicted pod's containers to garbage collection. A Terminated pod's containers are all stopped
// already and are left alone, so the exits recorded when they were stopped stay as they were. It
// returns when to look again and whether no container is left running.
func (w *Worker) syncFailed(ctx context.Context, pod *v1.Pod, f *Failure, kill bool) (time.Duration, bool) {
	observed, err := w.env.Runtime.ListContainers(ctx, string(pod.UID))
	if err != nil {
		w.env.Log.Error("failed pod: list containers", "err", err)
		return relistRetry, false
	}
	g := grace(pod)
	if f.Grace != nil {
		g = *f.Grace
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var stopped []*ctrd.Container
	failed := false
	var running []ctrd.Container
	for _, c := range observed {
		if c.State != ctrd.StateExited && kill {
			running = append(running, c)
		}
	}
	rt := w.withOrderedStop(pod, running...) // sidecars after the app containers
	for i := range observed {
		c := &observed[i]
		if c.State == ctrd.StateExited || !kill {
			continue
		}
		w.killing(pod, *c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := rt.StopContainer(ctx, c.ID, g)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				w.env.Log.Error("failed pod: stop container", "container", c.Name, "reason", f.Reason, "err", err)
				failed = true
				return
			}
			stopped = append(stopped, c)
		}()
	}
	wg.Wait()
	now := time.Now()
	for _, c := range stopped {
		// containerd forgets a stopped task's exit status with the task; what the node did to it
		// is what the pod's status keeps (kubelet shows such containers terminated with 137).
		r := w.rec(c.Name)
		started := r.startedAt
		if r.startedID != c.ID || started.IsZero() {
			started = c.CreatedAt
		}
		r.terminated = &v1.ContainerStateTerminated{ExitCode: 137, Signal: 9, Reason: "Error",
			Message: "stopped by the node: " + f.Reason, ContainerID: ctrd.StatusContainerID(c.ID),
			StartedAt: metav1.NewTime(started), FinishedAt: metav1.NewTime(now)}
	}
	if len(stopped) > 0 {
		w.mutations++
		if observed, err = w.env.Runtime.ListContainers(ctx, string(pod.UID)); err != nil {
			return relistRetry, false
		}
	}
	w.finishSync(pod, observed, newestAttempts(observed), now)
	if failed {
		return relistRetry, false
	}
	return 0, true
}
