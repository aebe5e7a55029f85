package agent

import (
	"time"

	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/agent/pod"
	"github.com/mqlet/mqlet/agent/resources"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Allocation of in-place resizes, kubelet 1.37's allocation manager: a new version of a running pod
// that asks for other cpu or memory is a resize. It is allocated (the worker then brings its
// containers to it, agent/pod/resize.go) when the pod, at its new requests, fits what the node
// has left beside the other pods at their allocated requests. Otherwise it is Deferred, with the
// fit's message ("Node didn't have enough resource: ..."), and tried again when a pod leaves and at
// each relist, while the pod keeps running as allocated before; kubelet 1.37 defers a resize beyond
// the node's whole capacity too, rather than calling it Infeasible. It is Infeasible when the
// runtime cannot resize a running container (then nothing is ever applied).

// resizeJob is a pod whose new version may be a resize.
type resizeJob struct {
	w *pod.Worker
	d store.DesiredPod
}

// resizeVerdict is the allocation of a resize: Reason "" allocates it; v1.PodReasonDeferred or
// v1.PodReasonInfeasible keep it pending with Message.
type resizeVerdict struct {
	Reason, Message string
}

// judgeResize decides a resize of p: canResize says whether the runtime resizes in place, others
// are the node's other pods at their allocated resources, allocatable what the node offers (nil
// skips the fit, as for admission).
func judgeResize(p *v1.Pod, canResize bool, others []*v1.Pod, allocatable v1.ResourceList) resizeVerdict {
	if !canResize {
		return resizeVerdict{v1.PodReasonInfeasible, "In-place pod resize is not supported by this node's container runtime"}
	}
	if allocatable != nil {
		if r := admission.Fit(resources.PodRequests(&p.Spec), others, allocatable); r != nil {
			return resizeVerdict{v1.PodReasonDeferred, r.Message}
		}
	}
	return resizeVerdict{}
}

// judgeResizes allocates the resizes among put (pods of a source change) whose worker runs them and
// that admission did not judge (judged: new or refused pods). Called with applyMu held, before the
// workers get the new versions, and without a.mu: reading the node's allocatable may be I/O.
func (a *Agent) judgeResizes(put []store.DesiredPod, del []types.UID, judged verdicts) {
	a.mu.Lock()
	var jobs []resizeJob
	for _, d := range put {
		if _, ok := judged[d.Pod.UID]; ok || d.Pod.DeletionTimestamp != nil {
			continue
		}
		if w := a.workers[d.Pod.UID]; w != nil && !w.State().Removing && w.Failed() == nil {
			jobs = append(jobs, resizeJob{w, d})
		}
	}
	a.mu.Unlock()
	a.allocate(jobs, del)
}

// resizeRetryWait is how soon the relist loop tries deferred resizes again when a source change
// held the desired set.
const resizeRetryWait = time.Second

// retryResizes judges the Deferred resizes again (kubelet retries them when pods leave and
// periodically). It runs on the relist loop, whose heartbeat must not wait for a source change
// being applied: then it does nothing and reports false (the loop tries again shortly).
func (a *Agent) retryResizes() bool {
	if !a.resizesPending() {
		return true
	}
	if !a.applyMu.TryLock() {
		return false
	}
	defer a.applyMu.Unlock()
	a.mu.Lock()
	var jobs []resizeJob
	for uid, w := range a.workers {
		if d, ok := a.desired[uid]; ok && w.ResizePending() == v1.PodReasonDeferred {
			jobs = append(jobs, resizeJob{w, d})
		}
	}
	a.mu.Unlock()
	a.allocate(jobs, nil)
	return true
}

// allocate judges each job in turn, each against the others' allocation as it stands after the
// jobs before it; leaving are pods being deleted by the same change, which count for nothing.
func (a *Agent) allocate(jobs []resizeJob, leaving []types.UID) {
	var resizes []resizeJob
	for _, j := range jobs {
		if !j.w.ResizeRequested(j.d.Pod) {
			j.w.Allocate(j.d.Pod) // what is allocated already: nothing pending any more
			continue
		}
		resizes = append(resizes, j)
	}
	if len(resizes) == 0 {
		return // most updates: the node is not read
	}
	var alloc v1.ResourceList
	if a.opts.Allocatable != nil {
		alloc = a.opts.Allocatable()
	}
	gone := map[types.UID]bool{}
	for _, uid := range leaving {
		gone[uid] = true
	}
	canResize := pod.CanResize(a.rt)
	for _, j := range resizes {
		v := judgeResize(j.d.Pod, canResize, a.allocatedPods(j.d.Pod.UID, gone), alloc)
		if v.Reason != "" {
			if j.w.ResizePending() != v.Reason {
				a.log.Info("pod resize pending", "pod", j.d.Pod.Namespace+"/"+j.d.Pod.Name, "reason", v.Reason, "message", v.Message)
			}
			j.w.DeferResize(v.Reason, v.Message, j.d.Pod.Generation)
			continue
		}
		j.w.Allocate(j.d.Pod)
	}
}

// allocatedPods are the node's pods other than uid that hold resources, at their allocated
// resources: not refused, not being deleted, not finished.
func (a *Agent) allocatedPods(uid types.UID, gone map[types.UID]bool) []*v1.Pod {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []*v1.Pod
	for u, w := range a.workers {
		if u == uid || gone[u] || w.Failed() != nil {
			continue
		}
		p := w.AllocatedPod()
		if p.DeletionTimestamp != nil || p.Status.Phase == v1.PodFailed || p.Status.Phase == v1.PodSucceeded {
			continue
		}
		out = append(out, &p)
	}
	return out
}
