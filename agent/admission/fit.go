package admission

import (
	"fmt"
	"slices"
	"strings"

	"github.com/mqlet/mqlet/agent/qos"
	"github.com/mqlet/mqlet/agent/resources"
	"github.com/mqlet/mqlet/core/source"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Reasons a pod is refused when it comes to the node, as kubelet spells them, so a control plane
// (or a person used to `kubectl get pods`) reads them the same.
const (
	// ReasonOutOfPrefix starts the reason for a resource that does not fit: OutOfcpu, OutOfmemory,
	// OutOfpods, OutOfephemeral-storage, OutOfmqlet.io/serial...
	ReasonOutOfPrefix = "OutOf"
	// ReasonNodePorts: a hostPort the pod wants is taken (kubelet's name for the check).
	ReasonNodePorts = "NodePorts"
	// ReasonPressure: the node is under resource pressure (kubelet's eviction manager refuses with
	// the same reason it evicts with).
	ReasonPressure = "Evicted"
	// ReasonNodeShutdown: the node is shutting down.
	ReasonNodeShutdown = "NodeShutdown"
)

// Messages kubelet gives with those reasons; tools match on them.
const (
	pressureMessagePrefix = "The node had condition: "
	nodePortsMessage      = "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"
	nodeShutdownMessage   = "Pod was rejected as the node is shutting down."
)

// Refusal is why a pod may not run on this node. The pod stays desired and is held Failed with
// Reason and Message, as kubelet keeps a rejected pod, until its spec changes.
type Refusal struct {
	Reason  string
	Message string
}

func (r *Refusal) Error() string { return r.Reason + ": " + r.Message }

// Node is what admission weighs a new pod against, read once per source change.
type Node struct {
	// Allocatable is what the node offers pods; nil skips the fit check. cpu, memory,
	// ephemeral-storage and pods are only checked when listed (a reader that failed must not refuse
	// every pod); any other resource a pod requests and the node does not list has none.
	Allocatable v1.ResourceList
	// Pressure holds the node's pressure conditions that are true now (MemoryPressure,
	// DiskPressure, PIDPressure).
	Pressure []v1.NodeConditionType
	// ShuttingDown refuses every new pod.
	ShuttingDown bool

	// Labels and Taints are the node's, for nodeSelector, required node affinity and NoExecute
	// taints (nodeaffinity.go).
	Labels map[string]string
	Taints []v1.Taint
}

// Check decides whether pod may join the pods already admitted (running or about to: not
// terminal, not being deleted, not refused), with kubelet's checks in kubelet's order: node
// pressure, then resources, then host ports, then shutdown. critical pods (manifest-dir pods,
// like kubelet's static pods, and critical priorities) are admitted under pressure. It returns
// nil when the pod may run. Host ports bound by something outside the node's pods are not seen
// here: that takes I/O (ProbeHostPorts).
func Check(pod *v1.Pod, critical bool, admitted []*v1.Pod, node Node) *Refusal {
	if r := checkPressure(pod, critical, node.Pressure); r != nil {
		return r
	}
	if node.Allocatable != nil {
		if r := Fit(resources.PodRequests(&pod.Spec), admitted, node.Allocatable); r != nil {
			return r
		}
	}
	if r := checkNodeAffinity(pod, pod.Spec.NodeName, node.Labels); r != nil {
		return r
	}
	if r := checkPorts(pod, admitted); r != nil {
		return r
	}
	if r := checkTaints(pod, critical, node.Taints); r != nil {
		return r
	}
	if node.ShuttingDown {
		return &Refusal{Reason: ReasonNodeShutdown, Message: nodeShutdownMessage}
	}
	return nil
}

// CriticalReason says why a pod is one of kubelet's critical pods, or "" when it is not.
// Manifest-dir pods are the node's own, like kubelet's static pods (which kubelet counts as
// critical); critical-priority pods keep the node and the cluster working. Critical pods pass
// admission under pressure, are never evicted and stop last at a node shutdown.
func CriticalReason(pod *v1.Pod, src source.Ref) string {
	switch {
	case src.Kind == source.File:
		return "manifest-dir pod"
	case resources.IsCriticalPriority(pod):
		return "critical priority"
	}
	return ""
}

// checkPressure is kubelet's eviction admission: under memory pressure alone only BestEffort pods
// are refused (unless they tolerate the memory-pressure taint); any other pressure refuses every
// pod. Critical pods always pass: the node needs them most when it is short.
func checkPressure(pod *v1.Pod, critical bool, pressure []v1.NodeConditionType) *Refusal {
	if len(pressure) == 0 || critical {
		return nil
	}
	if len(pressure) == 1 && pressure[0] == v1.NodeMemoryPressure {
		if qos.Class(&pod.Spec) != v1.PodQOSBestEffort || toleratesMemoryPressure(pod.Spec.Tolerations) {
			return nil
		}
	}
	return &Refusal{Reason: ReasonPressure, Message: fmt.Sprintf("%s%v. ", pressureMessagePrefix, pressure)}
}

// toleratesMemoryPressure reports whether one of ts tolerates the node.kubernetes.io/memory-pressure
// NoSchedule taint (a taint with that key and no value).
func toleratesMemoryPressure(ts []v1.Toleration) bool {
	for _, t := range ts {
		if t.Effect != "" && t.Effect != v1.TaintEffectNoSchedule {
			continue
		}
		switch t.Operator {
		case v1.TolerationOpExists:
			if t.Key == "" || t.Key == v1.TaintNodeMemoryPressure {
				return true
			}
		case v1.TolerationOpEqual, "":
			if t.Key == v1.TaintNodeMemoryPressure && t.Value == "" {
				return true
			}
		}
	}
	return false
}

// Fit checks requests against what allocatable has left once the admitted pods' requests are taken,
// with kubelet's arithmetic: the pod count first, then cpu (in millicores), memory,
// ephemeral-storage and every other resource in name order; a resource the pod does not request
// never refuses it, even on an overcommitted node. The first shortfall is returned, with kubelet's
// OutOf<resource> reason and its message.
func Fit(requests v1.ResourceList, admitted []*v1.Pod, allocatable v1.ResourceList) *Refusal {
	if q, ok := allocatable[v1.ResourcePods]; ok && int64(len(admitted))+1 > q.Value() {
		return outOf(v1.ResourcePods, 1, int64(len(admitted)), q.Value())
	}
	used := v1.ResourceList{}
	for _, p := range admitted {
		resources.Add(used, resources.PodRequests(&p.Spec))
	}
	names := make([]v1.ResourceName, 0, len(requests))
	for name := range requests {
		if name != v1.ResourcePods {
			names = append(names, name)
		}
	}
	order := func(n v1.ResourceName) int {
		switch n {
		case v1.ResourceCPU:
			return 0
		case v1.ResourceMemory:
			return 1
		case v1.ResourceEphemeralStorage:
			return 2
		}
		return 3
	}
	slices.SortFunc(names, func(a, b v1.ResourceName) int {
		if d := order(a) - order(b); d != 0 {
			return d
		}
		return strings.Compare(string(a), string(b))
	})
	for _, name := range names {
		capacity, listed := allocatable[name]
		if !listed && order(name) < 3 {
			continue
		}
		req, use, have := amount(name, requests[name]), amount(name, used[name]), amount(name, capacity)
		if req > 0 && req > have-use {
			return outOf(name, req, use, have)
		}
	}
	return nil
}

// amount is a quantity in the unit kubelet's messages use: millicores for cpu, else the value
// (bytes, counts).
func amount(name v1.ResourceName, q resource.Quantity) int64 {
	if name == v1.ResourceCPU {
		return q.MilliValue()
	}
	return q.Value()
}

func outOf(name v1.ResourceName, requested, used, capacity int64) *Refusal {
	return &Refusal{Reason: ReasonOutOfPrefix + string(name),
		Message: fmt.Sprintf("Node didn't have enough resource: %s, requested: %d, used: %d, capacity: %d", name, requested, used, capacity)}
}

// IsRefusal reports whether a pod status records a refusal at admission (as opposed to an eviction
// or a shutdown): such a pod is admitted afresh when its spec changes.
func IsRefusal(reason, message string) bool {
	switch {
	case strings.HasPrefix(reason, ReasonOutOfPrefix), reason == ReasonNodePorts, reason == ReasonNodeShutdown,
		reason == ReasonNodeAffinity, reason == ReasonTaintToleration:
		return true
	case reason == ReasonPressure:
		// Evictions share the reason; only admission's message names the node's conditions.
		return strings.HasPrefix(message, pressureMessagePrefix)
	}
	return false
}
