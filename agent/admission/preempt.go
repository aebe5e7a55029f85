package admission

import (
	"maps"
	"math"
	"slices"

	"github.com/mqlet/mqlet/agent/qos"
	"github.com/mqlet/mqlet/agent/resources"
	v1 "k8s.io/api/core/v1"
)

// Critical pod admission, kubelet's CriticalPodAdmissionHandler: a critical pod (a manifest-dir
// pod, like kubelet's static pods, or a critical priority) that does not fit what the node has left
// does not wait for room that may never come (MQTT pods holding the allocatable); the node makes
// room by stopping non-critical pods, the fewest and smallest that free enough.

// ReasonPreempting is the reason (kubelet's) a pod stopped to make room for a critical pod ends
// Failed with, and of the event on it.
const ReasonPreempting = "Preempting"

// PreemptedMessage is the status and event message of a pod preempted for the critical pod named
// namespace/name (kubelet's "Preempted in order to admit critical pod", naming the pod).
func PreemptedMessage(namespace, name string) string {
	return "Preempted in order to admit critical pod " + namespace + "/" + name
}

// requirement is how much more of one resource the critical pod needs than the node has left.
type requirement struct {
	name     v1.ResourceName
	quantity int64 // millicores for cpu, else the value; 1 for the pod count
}

type requirements []requirement

// shortfall lists what the pod needs beyond what allocatable has left once the admitted pods'
// requests are taken: each resource Fit would refuse it for, with the missing amount.
func shortfall(requests v1.ResourceList, admitted []*v1.Pod, allocatable v1.ResourceList) requirements {
	var out requirements
	if q, ok := allocatable[v1.ResourcePods]; ok && int64(len(admitted))+1 > q.Value() {
		out = append(out, requirement{v1.ResourcePods, int64(len(admitted)) + 1 - q.Value()})
	}
	used := v1.ResourceList{}
	for _, p := range admitted {
		resources.Add(used, resources.PodRequests(&p.Spec))
	}
	for _, name := range slices.Sorted(maps.Keys(requests)) {
		if name == v1.ResourcePods {
			continue
		}
		capacity, listed := allocatable[name]
		if !listed && (name == v1.ResourceCPU || name == v1.ResourceMemory || name == v1.ResourceEphemeralStorage) {
			continue
		}
		req, use, have := amount(name, requests[name]), amount(name, used[name]), amount(name, capacity)
		if req > 0 && req > have-use {
			out = append(out, requirement{name, req - (have - use)})
		}
	}
	return out
}

// request is what pod asks of the requirement's resource, in its unit (1 for the pod count).
func request(pod *v1.Pod, name v1.ResourceName) int64 {
	if name == v1.ResourcePods {
		return 1
	}
	q := resources.PodRequests(&pod.Spec)[name]
	return amount(name, q)
}

// minus is what is still needed once pods are gone.
func (rs requirements) minus(pods ...*v1.Pod) requirements {
	var out requirements
	for _, r := range rs {
		left := r.quantity
		for _, p := range pods {
			left -= request(p, r.name)
		}
		if left > 0 {
			out = append(out, requirement{r.name, left})
		}
	}
	return out
}

// distance is how far the requirements stay from met once pod is gone (kubelet's: the sum of the
// squared fractions left, each at most 1).
func (rs requirements) distance(pod *v1.Pod) float64 {
	d := 0.0
	for _, r := range rs {
		if left := float64(r.quantity - request(pod, r.name)); left > 0 {
			d += math.Pow(left/float64(r.quantity), 2)
		}
	}
	return d
}

// Preempt chooses the pods to stop so that the critical pod fits: among candidates (the admitted
// pods that are not critical), as kubelet chooses them, BestEffort before Burstable before
// Guaranteed, in each class the fewest that close the gap, the smaller one on a tie. admitted are
// all the pods the pod is weighed against (candidates among them). It returns nil when the pod
// fits already, or when stopping every candidate would still not make room (then none is stopped).
func Preempt(pod *v1.Pod, admitted, candidates []*v1.Pod, allocatable v1.ResourceList) []*v1.Pod {
	if allocatable == nil {
		return nil
	}
	need := shortfall(resources.PodRequests(&pod.Spec), admitted, allocatable)
	if len(need) == 0 || len(need.minus(candidates...)) > 0 {
		return nil
	}
	var best, burst, guar []*v1.Pod
	for _, p := range candidates {
		switch qos.Class(&p.Spec) {
		case v1.PodQOSBestEffort:
			best = append(best, p)
		case v1.PodQOSBurstable:
			burst = append(burst, p)
		default:
			guar = append(guar, p)
		}
	}
	// The Guaranteed pods needed even if every other pod went, then the Burstable ones needed
	// with every BestEffort one gone, then the BestEffort ones for what is left.
	g := byDistance(guar, need.minus(append(slices.Clone(best), burst...)...))
	b := byDistance(burst, need.minus(append(slices.Clone(best), g...)...))
	e := byDistance(best, need.minus(append(slices.Clone(b), g...)...))
	return append(append(e, b...), g...)
}

// byDistance takes pods, each time the one that leaves need closest to met (the smaller on a tie),
// until need is met.
func byDistance(pods []*v1.Pod, need requirements) []*v1.Pod {
	pods = slices.Clone(pods)
	var out []*v1.Pod
	for len(need) > 0 && len(pods) > 0 {
		bi, bd := 0, math.Inf(1)
		for i, p := range pods {
			d := need.distance(p)
			if d < bd || (d == bd && smaller(p, pods[bi])) {
				bi, bd = i, d
			}
		}
		need = need.minus(pods[bi])
		out = append(out, pods[bi])
		pods = slices.Delete(pods, bi, bi+1)
	}
	return out
}

// smaller orders by memory request, then cpu request (kubelet's smallerResourceRequest).
func smaller(a, b *v1.Pod) bool {
	ra, rb := resources.PodRequests(&a.Spec), resources.PodRequests(&b.Spec)
	for _, n := range []v1.ResourceName{v1.ResourceMemory, v1.ResourceCPU} {
		qa, qb := ra[n], rb[n]
		if c := qa.Cmp(qb); c != 0 {
			return c < 0
		}
	}
	return false
}
