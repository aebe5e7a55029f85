// Package resources holds the resource arithmetic that admission, pod cgroups, node allocatable and
// eviction share, written once with kubelet's rules: what a pod requests and limits in total, what
// the node has left for pods, and which pods are critical.
package resources

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// SystemCriticalPriority is the lowest priority Kubernetes treats as system-critical (the
// system-cluster-critical class); system-node-critical is 2000001000.
const SystemCriticalPriority int32 = 2000000000

// Priority class names that Kubernetes defines for pods the node must keep.
const (
	PriorityClassNodeCritical    = "system-node-critical"
	PriorityClassClusterCritical = "system-cluster-critical"
)

// IsCriticalPriority reports whether the pod's priority class or priority makes it critical, as
// kubelet judges it for eviction and for the order of a node shutdown. (kubelet also treats static
// pods as critical; for mqlet those are manifest-dir pods, which only the caller can tell.)
func IsCriticalPriority(pod *v1.Pod) bool {
	switch pod.Spec.PriorityClassName {
	case PriorityClassNodeCritical, PriorityClassClusterCritical:
		return true
	}
	return pod.Spec.Priority != nil && *pod.Spec.Priority >= SystemCriticalPriority
}

// Priority is the pod's priority, 0 when unset, for eviction ranking.
func Priority(pod *v1.Pod) int32 {
	if pod.Spec.Priority != nil {
		return *pod.Spec.Priority
	}
	switch pod.Spec.PriorityClassName {
	case PriorityClassNodeCritical:
		return SystemCriticalPriority + 1000
	case PriorityClassClusterCritical:
		return SystemCriticalPriority
	}
	return 0
}

// containerRequests is what one container requests: its requests, with a limit standing in for a
// request it does not state (the API server's defaulting, which manifests skip).
func containerRequests(c *v1.Container) v1.ResourceList {
	out := v1.ResourceList{}
	for name, q := range c.Resources.Limits {
		out[name] = q.DeepCopy()
	}
	for name, q := range c.Resources.Requests {
		out[name] = q.DeepCopy()
	}
	return out
}

func containerLimits(c *v1.Container) v1.ResourceList {
	out := v1.ResourceList{}
	for name, q := range c.Resources.Limits {
		out[name] = q.DeepCopy()
	}
	return out
}

// PodRequests is kubelet's effective request of a pod: for each resource, the larger of the sum over
// app containers (plus restartable init containers, the sidecars, which run beside them) and the
// largest need of any one init container while it runs (with the sidecars started before it), plus
// the pod's overhead.
func PodRequests(spec *v1.PodSpec) v1.ResourceList { return podTotal(spec, containerRequests) }

// PodLimits is PodRequests' rule applied to limits. A resource is present only where some container
// limits it; see LimitedByAll for whether every container does.
func PodLimits(spec *v1.PodSpec) v1.ResourceList { return podTotal(spec, containerLimits) }

func podTotal(spec *v1.PodSpec, of func(*v1.Container) v1.ResourceList) v1.ResourceList {
	sum := v1.ResourceList{}
	for i := range spec.Containers {
		Add(sum, of(&spec.Containers[i]))
	}
	initMax := v1.ResourceList{}
	sidecars := v1.ResourceList{}
	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		r := of(c)
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			Add(sidecars, r)
			Add(sum, r)
			Max(initMax, sidecars)
			continue
		}
		during := sidecars.DeepCopy()
		Add(during, r)
		Max(initMax, during)
	}
	Max(sum, initMax)
	Add(sum, spec.Overhead)
	return sum
}

// LimitedByAll reports whether every container of the pod (init ones included) sets a non-zero
// limit on name: only then does the pod as a whole have that limit, as kubelet sizes a pod cgroup.
func LimitedByAll(spec *v1.PodSpec, name v1.ResourceName) bool {
	all := append(append([]v1.Container{}, spec.InitContainers...), spec.Containers...)
	for _, c := range all {
		q, ok := c.Resources.Limits[name]
		if !ok || q.IsZero() {
			return false
		}
	}
	return len(all) > 0
}

// Add adds b into a.
func Add(a, b v1.ResourceList) {
	for name, q := range b {
		cur := a[name]
		cur.Add(q)
		a[name] = cur
	}
}

// Max raises each of a's quantities to b's where b's is larger.
func Max(a, b v1.ResourceList) {
	for name, q := range b {
		if cur, ok := a[name]; !ok || q.Cmp(cur) > 0 {
			a[name] = q.DeepCopy()
		}
	}
}

// Allocatable is what the node offers pods: capacity minus each reservation (systemReserved,
// agentReserved, and the hard eviction thresholds as eviction.HardReserve turns them into
// quantities), never below zero. Resources absent from capacity are not invented.
func Allocatable(capacity v1.ResourceList, reserved ...v1.ResourceList) v1.ResourceList {
	out := capacity.DeepCopy()
	for _, r := range reserved {
		for name, q := range r {
			cur, ok := out[name]
			if !ok {
				continue
			}
			cur.Sub(q)
			if cur.Sign() < 0 {
				cur = *resource.NewQuantity(0, cur.Format)
			}
			out[name] = cur
		}
	}
	return out
}
