package agent

import (
	"slices"
	"strings"
	"time"

	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/agent/pod"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Admission of pods new to the node, kubelet's second gate after validation: does the pod fit what
// the node has left, may it come under the node's pressure, are its host ports free, is the node
// shutting down. A refused pod stays desired (kubelet keeps the rejected pod object) with a worker
// that holds it Failed with the reason and starts nothing; a new spec of it is judged afresh, and if
// it fits, a file pod is replaced by a new worker while a control plane's pod stays Failed.

// verdicts maps each pod admission looked at to its refusal, nil when admitted.
type verdicts map[types.UID]*pod.Failure

// admitNew judges, in creation order, the pods of put that are new to the node (no worker yet, or
// their worker is being deleted) and the refused pods whose spec changed, each against the pods
// admitted before it: the running ones, minus those that are terminal, refused, being deleted or
// deleted by this very change (del). Pods already running are not judged again, as kubelet does
// not re-admit a pod on update. Called with applyMu held (or before the sources run) and a.mu
// not held: reading the node and probing host ports are I/O.
func (a *Agent) admitNew(put []store.DesiredPod, del []types.UID) verdicts {
	a.mu.Lock()
	var judge []store.DesiredPod
	for _, d := range put {
		if d.Pod.DeletionTimestamp != nil {
			continue // being deleted by its control plane: it starts nothing, so it takes nothing
		}
		w := a.workers[d.Pod.UID]
		if w == nil {
			judge = append(judge, d)
			continue
		}
		cur := w.Pod()
		if cur.DeletionTimestamp != nil {
			judge = append(judge, d)
		} else if f := w.Failed(); f != nil && admission.IsRefusal(f.Reason, f.Message) && !sameConfig(&cur, d.Pod) {
			judge = append(judge, d)
		}
	}
	if len(judge) == 0 {
		a.mu.Unlock()
		return nil
	}
	leaving := map[types.UID]bool{}
	for _, uid := range del {
		leaving[uid] = true
	}
	for _, d := range judge {
		leaving[d.Pod.UID] = true
	}
	var admitted []*v1.Pod
	criticalPod := map[types.UID]bool{} // admitted pods that may not be preempted
	for uid, w := range a.workers {
		if leaving[uid] || w.Failed() != nil {
			continue
		}
		p := w.AllocatedPod() // at the resources it holds, not those of a resize still pending
		if p.DeletionTimestamp != nil || p.Status.Phase == v1.PodFailed || p.Status.Phase == v1.PodSucceeded {
			continue
		}
		admitted = append(admitted, &p)
		if d, ok := a.desired[uid]; !ok || critical(d) {
			criticalPod[uid] = true
		}
	}
	a.mu.Unlock()

	node := admission.Node{ShuttingDown: a.shuttingDown.Load()}
	if a.opts.Allocatable != nil {
		node.Allocatable = a.opts.Allocatable()
	}
	if a.opts.Pressure != nil {
		node.Pressure = a.opts.Pressure()
	}
	if a.opts.Node != nil {
		if n := a.opts.Node(); n != nil {
			node.Labels, node.Taints = n.Labels, n.Spec.Taints
		}
	}
	// kubelet admits in creation order. Manifests rarely carry a creation time: those keep the
	// order their source listed them in and come first (a zero time is the earliest).
	slices.SortStableFunc(judge, func(x, y store.DesiredPod) int {
		return x.Pod.CreationTimestamp.Time.Compare(y.Pod.CreationTimestamp.Time)
	})
	out := verdicts{}
	for _, d := range judge {
		r := admission.Check(d.Pod, critical(d), admitted, node)
		if r != nil && critical(d) && strings.HasPrefix(r.Reason, admission.ReasonOutOfPrefix) {
			admitted = a.preempt(d, admitted, criticalPod, node.Allocatable)
			r = admission.Check(d.Pod, true, admitted, node)
		}
		if r == nil {
			r = admission.ProbeHostPorts(d.Pod)
		}
		if r != nil {
			out[d.Pod.UID] = &pod.Failure{Reason: r.Reason, Message: r.Message}
			a.log.Warn("pod refused at admission", "pod", d.Pod.Namespace+"/"+d.Pod.Name, "source", d.Source.String(),
				"reason", r.Reason, "message", r.Message)
			continue
		}
		out[d.Pod.UID] = nil
		admitted = append(admitted, d.Pod)
		if critical(d) {
			criticalPod[d.Pod.UID] = true
		}
	}
	return out
}

// preempt is kubelet's critical pod admission: the critical pod d does not fit, so the non-critical
// pods admission.Preempt picks are failed (Preempting, naming d, each with its own grace period)
// to make room, with a Warning event on each. It returns admitted without them; when no choice
// makes room, nothing is stopped and admitted is returned as it was (the pod is then refused).
// The victims' containers are stopped by their workers while the critical pod's sandbox is made:
// applyMu is held here, and waiting would stall every source.
func (a *Agent) preempt(d store.DesiredPod, admitted []*v1.Pod, criticalPod map[types.UID]bool, alloc v1.ResourceList) []*v1.Pod {
	var candidates []*v1.Pod
	for _, p := range admitted {
		if !criticalPod[p.UID] {
			candidates = append(candidates, p)
		}
	}
	victims := admission.Preempt(d.Pod, admitted, candidates, alloc)
	if len(victims) == 0 {
		return admitted
	}
	msg := admission.PreemptedMessage(d.Pod.Namespace, d.Pod.Name)
	gone := map[types.UID]bool{}
	for _, v := range victims {
		if !a.Fail(v.UID, pod.Failure{Reason: admission.ReasonPreempting, Message: msg}) {
			continue
		}
		gone[v.UID] = true
		a.log.Warn("pod preempted to admit a critical pod", "pod", v.Namespace+"/"+v.Name, "critical", d.Pod.Namespace+"/"+d.Pod.Name,
			"source", d.Source.String())
		a.report.Emit(event.Event{Time: time.Now(), Type: event.Warning, Reason: admission.ReasonPreempting, Message: msg,
			Object: event.PodObject(v)})
	}
	return slices.DeleteFunc(slices.Clone(admitted), func(p *v1.Pod) bool { return gone[p.UID] })
}

// critical pods pass admission under pressure and stop last at a node shutdown.
func critical(d store.DesiredPod) bool { return admission.CriticalReason(d.Pod, d.Source) != "" }

// applyVerdictLocked hands a judged pod's verdict to its existing worker (a.mu held) and reports
// whether it did; a worker that is being deleted gets it when its replacement starts (onGone).
// A refusal is set before the new spec is handed over, so the new spec never starts; an admission
// never lifts the old refusal of the same worker (see the end).
func (a *Agent) applyVerdictLocked(w *pod.Worker, d store.DesiredPod, f *pod.Failure) {
	if w.State().Removing {
		if a.refusedNext == nil {
			a.refusedNext = map[types.UID]*pod.Failure{}
		}
		a.refusedNext[d.Pod.UID] = f
		a.updateWorkerLocked(w, d)
		return
	}
	if f != nil {
		w.Refuse(*f)
		a.updateWorkerLocked(w, d)
		return
	}
	// Admitted now, but this worker holds the pod Failed (it was refused), and a pod never leaves
	// a terminal phase under the same UID.
	a.updateWorkerLocked(w, d)
	if d.Source.Kind == source.File {
		// The manifest is the only authority over a file pod, and nothing else replaces it: the
		// edit that makes it fit replaces it, as removing the file and adding it again would. The
		// Failed pod is torn down and the new spec runs in a new worker (onGone starts it).
		a.log.Info("refused pod admitted with its new spec: replacing it", "pod", d.Pod.Namespace+"/"+d.Pod.Name, "source", d.Source.String())
		w.Delete()
		return
	}
	// A control plane's pod stays Failed, as kubelet keeps it: the control plane has seen it fail
	// and runs a new pod (a new UID) if it wants one.
	a.log.Info("refused pod stays Failed although its new spec would fit: a failed pod does not run again under the same UID",
		"pod", d.Pod.Namespace+"/"+d.Pod.Name, "source", d.Source.String())
}

// refusalEvent is the Warning a refusal becomes, with kubelet's reason as the event's.
func refusalEvent(d store.DesiredPod, f *pod.Failure, now time.Time) event.Event {
	return event.Event{Time: now, Type: event.Warning, Reason: f.Reason, Message: f.Message,
		Object: event.PodObject(d.Pod),
		Source: d.Source.String()}
}

// restoreWorkers starts a worker for each pod restored from the store, before any source is read.
// Those pods were admitted before and are not judged again (a node that shrank does not refuse what
// it ran), except those refused only because the node was shutting down: that verdict does not
// outlive the shutdown, so they are admitted now, after the others.
func (a *Agent) restoreWorkers(pods []store.DesiredPod, statuses map[types.UID]*v1.PodStatus) {
	var again []store.DesiredPod
	a.mu.Lock()
	for _, d := range pods {
		a.desired[d.Pod.UID] = d
		if st := statuses[d.Pod.UID]; st != nil && st.Phase == v1.PodFailed && st.Reason == admission.ReasonNodeShutdown {
			again = append(again, d)
			continue
		}
		a.startWorker(d, statuses[d.Pod.UID], nil)
	}
	a.mu.Unlock()
	if len(again) == 0 {
		return
	}
	vs := a.admitNew(again, nil)
	now := time.Now()
	var events []event.Event
	a.mu.Lock()
	for _, d := range again {
		f := vs[d.Pod.UID]
		a.startWorker(d, nil, f)
		if f != nil {
			events = append(events, refusalEvent(d, f, now))
		}
	}
	a.mu.Unlock()
	for _, e := range events {
		a.report.Emit(e)
	}
}
