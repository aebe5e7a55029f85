package pod

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/agent/podspec"
	"github.com/mqlet/mqlet/agent/qos"
	"github.com/mqlet/mqlet/core/event"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// In-place resize as kubelet 1.37 does it, in two steps. Allocation: the agent decides whether the
// node can give a pod the cpu and memory a new spec asks for (agent/resize.go); until it can, the
// worker keeps running the pod with what was allocated before and reports PodResizePending
// (Deferred: the node has not enough left now; Infeasible: it never will). Actuation: the worker
// brings each running container to its allocation, in place when the changed resources'
// resizePolicy is NotRequired (ctrd.Runtime.ResizeContainer), by a restart when it is
// RestartContainer; while a container runs with other resources than allocated (an in-place
// update that failed, such as a memory limit below the usage), the pod reports PodResizeInProgress,
// with reason Error and the failure while it fails.

// resizer is the runtime's in-place resize (ctrd.Runtime.ResizeContainer). On a runtime without it a
// resize is Infeasible (the agent checks CanResize).
type resizer interface {
	ResizeContainer(ctx context.Context, pod *v1.Pod, c *v1.Container, id string) error
}

// resizeRetry is how soon an in-place resize that failed is tried again (kubelet retries it at the
// pod's next sync).
const resizeRetry = 10 * time.Second

// allocation is the cpu and memory requests and limits the node set aside for each container of a
// pod, by container name (kubelet's allocated resources).
type allocation map[string]v1.ResourceRequirements

// allocationOf is what pod's spec asks for, as an allocation.
func allocationOf(pod *v1.Pod) allocation {
	out := allocation{}
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			out[cs[i].Name] = cpuMem(cs[i].Resources)
		}
	}
	return out
}

// cpuMem keeps the cpu and memory entries of r; an empty list is nil.
func cpuMem(r v1.ResourceRequirements) v1.ResourceRequirements {
	pick := func(l v1.ResourceList) v1.ResourceList {
		var out v1.ResourceList
		for _, n := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory} {
			if q, ok := l[n]; ok {
				if out == nil {
					out = v1.ResourceList{}
				}
				out[n] = q.DeepCopy()
			}
		}
		return out
	}
	return v1.ResourceRequirements{Requests: pick(r.Requests), Limits: pick(r.Limits)}
}

// withCPUMem is r with its cpu and memory entries replaced by a's; an empty list is nil.
func withCPUMem(r v1.ResourceRequirements, a v1.ResourceRequirements) v1.ResourceRequirements {
	set := func(l, from v1.ResourceList) v1.ResourceList {
		out := v1.ResourceList{}
		for n, q := range l {
			if n != v1.ResourceCPU && n != v1.ResourceMemory {
				out[n] = q.DeepCopy()
			}
		}
		for n, q := range from {
			out[n] = q.DeepCopy()
		}
		if len(out) == 0 {
			return nil
		}
		return out
	}
	r.Requests, r.Limits = set(r.Requests, a.Requests), set(r.Limits, a.Limits)
	return r
}

// sameCPUMem compares the cpu and memory requests and limits of a and b by value (1000m is 1).
func sameCPUMem(a, b v1.ResourceRequirements) bool {
	x, y := cpuMem(a), cpuMem(b)
	eq := func(l, m v1.ResourceList) bool {
		if len(l) != len(m) {
			return false
		}
		for n, q := range l {
			if o, ok := m[n]; !ok || q.Cmp(o) != 0 {
				return false
			}
		}
		return true
	}
	return eq(x.Requests, y.Requests) && eq(x.Limits, y.Limits)
}

// resizeRequested reports whether pod's spec asks any container for other cpu or memory than alloc
// gives it. A container alloc does not know (a new one: the spec changed more than its resources)
// takes its spec's resources and asks for nothing.
func (alloc allocation) resizeRequested(pod *v1.Pod) bool {
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if a, ok := alloc[cs[i].Name]; ok && !sameCPUMem(a, cs[i].Resources) {
				return true
			}
		}
	}
	return false
}

// apply returns pod with each container's cpu and memory set to alloc's (a copy), or pod itself when
// they are already.
func (alloc allocation) apply(pod *v1.Pod) *v1.Pod {
	if !alloc.resizeRequested(pod) {
		return pod
	}
	p := pod.DeepCopy()
	for _, cs := range [][]v1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range cs {
			if a, ok := alloc[cs[i].Name]; ok {
				cs[i].Resources = withCPUMem(cs[i].Resources, a)
			}
		}
	}
	return p
}

// ResizeRequested reports whether pod (a new version of the worker's pod) asks for other cpu or
// memory than the worker's allocation: a resize for the agent to judge.
func (w *Worker) ResizeRequested(pod *v1.Pod) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.alloc.resizeRequested(pod)
}

// Allocate makes pod's cpu and memory the worker's allocation (the agent found that they fit) and
// clears a pending resize; the next sync brings the containers to it.
func (w *Worker) Allocate(pod *v1.Pod) {
	w.mu.Lock()
	a := allocationOf(pod)
	if !equality.Semantic.DeepEqual(a, w.alloc) {
		w.alloc = a
		w.allocGen++
	}
	w.pending = nil
	w.mu.Unlock()
	w.Nudge()
}

// restoreAllocation takes the allocation an earlier agent left (NewWorker, after a restart): what
// each container ran with, as the stored status says, not what the desired pod asks for. A resize
// that was pending (or allocated and not yet applied) when the agent stopped is then pending again,
// Deferred, so the agent judges it against the node once more (retryResizes) instead of applying it
// unjudged; kubelet keeps its allocation in a checkpoint for the same reason.
func (w *Worker) restoreAllocation(pod *v1.Pod, prev *v1.PodStatus) {
	for _, cs := range podspec.AllStatuses(prev) {
		if _, ok := w.alloc[cs.Name]; ok && cs.Resources != nil {
			w.alloc[cs.Name] = cpuMem(*cs.Resources)
		}
	}
	if !w.alloc.resizeRequested(pod) {
		return
	}
	reason, msg := v1.PodReasonDeferred, "the resize is judged again after the agent restarted"
	for _, c := range prev.Conditions {
		if c.Type == v1.PodResizePending && c.Reason != "" {
			reason, msg = c.Reason, c.Message
		}
	}
	w.pending = &v1.PodCondition{Type: v1.PodResizePending, Status: v1.ConditionTrue, Reason: reason, Message: msg,
		ObservedGeneration: pod.Generation}
}

// DeferResize keeps the allocation as it is and reports the resize pending, with kubelet's reason
// (v1.PodReasonDeferred: retried when the node has more room; v1.PodReasonInfeasible: never) and
// message, for the pod's generation.
func (w *Worker) DeferResize(reason, message string, generation int64) {
	w.mu.Lock()
	w.pending = &v1.PodCondition{Type: v1.PodResizePending, Status: v1.ConditionTrue, Reason: reason, Message: message,
		ObservedGeneration: generation}
	w.mu.Unlock()
	w.Nudge()
}

// ResizePending returns the pending resize's reason ("" when none).
func (w *Worker) ResizePending() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending == nil {
		return ""
	}
	return w.pending.Reason
}

// AllocatedPod is Pod with the resources the node set aside for it: what admission and resizes of
// other pods weigh it at.
func (w *Worker) AllocatedPod() v1.Pod {
	p := w.Pod()
	w.mu.Lock()
	alloc := w.alloc
	w.mu.Unlock()
	return *alloc.apply(&p)
}

// effective is the pod the loop syncs: the desired one with the allocated cpu and memory. The same
// pointer comes back while neither changes, so the sandbox is set up again only for a new one.
func (w *Worker) effective(desired *v1.Pod, alloc allocation, gen int) *v1.Pod {
	if w.eff.src == desired && w.eff.gen == gen && w.eff.pod != nil {
		return w.eff.pod
	}
	w.eff.src, w.eff.gen, w.eff.pod = desired, gen, alloc.apply(desired)
	return w.eff.pod
}

// CanResizeInPlace reports whether the running attempt cur can take container c's new spec in place,
// as kubelet's in-place resize: the spec changed in nothing but the cpu and memory requests and
// limits (added, changed or removed), each changed resource's resizePolicy is NotRequired (the
// default), and the pod's QoS class stays. Otherwise it says why not, and the container is
// replaced. A container made before mqlet resized in place (no labels for it) is replaced too.
func CanResizeInPlace(pod *v1.Pod, c *v1.Container, cur *ctrd.Container) (bool, string) {
	if cur.ResizeBase == "" || cur.Resources == "" {
		return false, "the container was made before in-place resize"
	}
	if cur.ResizeBase != ctrspec.ResizeBase(pod, c) {
		return false, "more than its resources changed"
	}
	if cur.QOSClass != string(qos.Class(&pod.Spec)) {
		return false, "the pod's QoS class changed"
	}
	old, ok := cur.RecordedResources()
	if !ok {
		return false, "its recorded resources are unreadable"
	}
	now := c.Resources
	if !equality.Semantic.DeepEqual(old.Claims, now.Claims) {
		return false, "its resource claims changed"
	}
	for _, name := range keys(old.Requests, now.Requests, old.Limits, now.Limits) {
		reqOld, inOldReq := old.Requests[name]
		reqNew, inNewReq := now.Requests[name]
		limOld, inOldLim := old.Limits[name]
		limNew, inNewLim := now.Limits[name]
		if inOldReq == inNewReq && reqOld.Cmp(reqNew) == 0 && inOldLim == inNewLim && limOld.Cmp(limNew) == 0 {
			continue
		}
		if name != v1.ResourceCPU && name != v1.ResourceMemory {
			return false, fmt.Sprintf("its %s changed (only cpu and memory resize in place)", name)
		}
		if p := policy(c, name); p != v1.NotRequired {
			return false, fmt.Sprintf("its %s resizePolicy is %s", name, p)
		}
	}
	return true, ""
}

func keys(lists ...v1.ResourceList) []v1.ResourceName {
	seen := map[v1.ResourceName]bool{}
	var out []v1.ResourceName
	for _, l := range lists {
		for k := range l {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	return out
}

// policy is container c's resizePolicy for resource name; NotRequired when it sets none (the API's
// default).
func policy(c *v1.Container, name v1.ResourceName) v1.ResourceResizeRestartPolicy {
	for _, p := range c.ResizePolicy {
		if p.ResourceName == name {
			return p.RestartPolicy
		}
	}
	return v1.NotRequired
}

// resizeInPlace applies container c's new resources to its running attempt cur when it can
// (CanResizeInPlace). It reports whether it took the change: done, or failed and to be tried again
// after the returned delay (the container keeps running as it was, and the pod reports the resize
// in progress with the error, as kubelet does). When it did not take it, the caller replaces the
// container as for any other change.
func (w *Worker) resizeInPlace(ctx context.Context, pod *v1.Pod, c *v1.Container, cur *ctrd.Container) (bool, time.Duration) {
	rz, ok := w.env.Runtime.(resizer)
	if !ok || cur.State != ctrd.StateRunning {
		return false, 0
	}
	if ok, why := CanResizeInPlace(pod, c, cur); !ok {
		if cur.ResizeBase == ctrspec.ResizeBase(pod, c) { // only its resources changed: say why it restarts
			w.report(pod, event.Normal, "ResizeByRestart", fmt.Sprintf("Container %s is replaced to resize it: %s", c.Name, why), "container", c.Name)
		}
		return false, 0
	}
	if err := rz.ResizeContainer(ctx, pod, c, cur.ID); err != nil {
		msg := err.Error()
		if w.resizeErrs[c.Name] != msg {
			w.report(pod, event.Warning, "ResizeError", fmt.Sprintf("Container %s could not be resized in place: %s", c.Name, msg), "container", c.Name)
		}
		if w.resizeErrs == nil {
			w.resizeErrs = map[string]string{}
		}
		w.resizeErrs[c.Name] = msg
		if !errors.Is(err, ctrd.ErrBelowUsage) {
			w.env.Log.Warn("in-place resize failed; trying again later", "container", c.Name, "err", err)
		}
		return true, resizeRetry
	}
	delete(w.resizeErrs, c.Name)
	w.mutations++ // look again: its labels changed
	w.report(pod, event.Normal, "ResizeCompleted", fmt.Sprintf("Container %s resized in place: %s", c.Name, describeResources(c.Resources)), "container", c.Name)
	return true, 0
}

// resizeConditions are kubelet's resize conditions for the pod the loop synced (allocated resources)
// and its newest attempts: PodResizePending as the agent judged the resize, and PodResizeInProgress
// while a running container's resources (as its labels record them) are not its allocation, with
// reason Error and the failure while the in-place update fails. Transition times carry over from
// prev.
func (w *Worker) resizeConditions(pod *v1.Pod, newest map[string]*ctrd.Container, prev []v1.PodCondition, now metav1.Time) []v1.PodCondition {
	w.mu.Lock()
	pending := w.pending
	w.mu.Unlock()
	var out []v1.PodCondition
	if pending != nil {
		c := *pending
		c.LastTransitionTime = now
		out = append(out, c)
	}
	var inProgress *v1.PodCondition
	for _, cs := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			c := &cs[i]
			cur := newest[c.Name]
			if cur == nil || cur.State != ctrd.StateRunning {
				continue
			}
			if actual, ok := cur.RecordedResources(); !ok || sameCPUMem(actual, c.Resources) {
				continue
			}
			if inProgress == nil {
				inProgress = &v1.PodCondition{Type: v1.PodResizeInProgress, Status: v1.ConditionTrue, ObservedGeneration: pod.Generation}
			}
			if msg := w.resizeErrs[c.Name]; msg != "" && inProgress.Reason == "" {
				inProgress.Reason, inProgress.Message = v1.PodReasonError, msg
			}
		}
	}
	if inProgress != nil {
		inProgress.LastTransitionTime = now
		out = append(out, *inProgress)
	}
	for i := range out {
		for _, p := range prev {
			if p.Type == out[i].Type && p.Status == out[i].Status {
				out[i].LastTransitionTime = p.LastTransitionTime
			}
		}
	}
	return out
}

func describeResources(r v1.ResourceRequirements) string {
	b, _ := json.Marshal(struct {
		Requests v1.ResourceList `json:"requests,omitempty"`
		Limits   v1.ResourceList `json:"limits,omitempty"`
	}{r.Requests, r.Limits})
	return string(b)
}

// tookResize is resizeInPlace for reconcile: it reports whether the change was taken in place (done
// or to be retried) and sets *next to when to look again.
func (w *Worker) tookResize(ctx context.Context, pod *v1.Pod, c *v1.Container, cur *ctrd.Container, next *time.Duration) bool {
	took, after := w.resizeInPlace(ctx, pod, c, cur)
	*next = after
	return took
}

// CanResize reports whether rt resizes running containers in place; on one that does not, a
// resize is Infeasible.
func CanResize(rt Runtime) bool {
	_, ok := rt.(resizer)
	return ok
}
