package cgroup

import (
	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/mqlet/mqlet/agent/qos"
	"github.com/mqlet/mqlet/agent/resources"
	v1 "k8s.io/api/core/v1"
)

// kubelet's CPU constants (pkg/kubelet/cm/helpers_linux.go), bounded by the kernel's range of
// cpu.shares.
const (
	MinShares    = 2
	MaxShares    = 262144
	SharesPerCPU = 1024
	QuotaPeriod  = 100000 // µs: a 100 ms CFS period
	MinQuota     = 1000   // µs: the kernel's smallest quota
)

// ResourcePID is the key of process IDs in an allocatable list, as kubelet (and mqlet's
// systemReserved/agentReserved settings) spell it.
const ResourcePID v1.ResourceName = "pid"

// Limits is what one cgroup of the hierarchy gets. A nil limit is none: "max" is written, so a
// limit that a pod or the node no longer has is lifted rather than left behind.
type Limits struct {
	// CPUShares is cgroup v1's cpu.shares; v2's cpu.weight is converted from it (SharesToWeight).
	// 0 leaves the kernel's default.
	CPUShares uint64
	CPUQuota  *int64 // CFS quota in µs per QuotaPeriod
	Memory    *int64 // bytes
	Pids      *int64
}

// MilliCPUToShares is kubelet's conversion: 1024 shares per CPU, at least 2 (also for no request:
// the kernel's default of 1024 would give a pod that asks for nothing a full CPU's weight).
func MilliCPUToShares(milli int64) uint64 {
	if milli <= 0 {
		return MinShares
	}
	shares := milli * SharesPerCPU / 1000
	return uint64(min(max(shares, MinShares), MaxShares))
}

// MilliCPUToQuota is kubelet's CFS quota for a CPU limit over a 100 ms period, at least 1 ms.
func MilliCPUToQuota(milli int64) int64 {
	return max(milli*QuotaPeriod/1000, MinQuota)
}

// SharesToWeight converts cpu.shares to cgroup v2's cpu.weight the way runc (and so the
// containers below the pod) converts them, so pod and container weights agree.
func SharesToWeight(shares uint64) uint64 {
	return cgroup2.ConvertCPUSharesToCgroupV2Value(shares)
}

// Tier is the directory below the pods' base cgroup that holds pods of a QoS class: Guaranteed
// pods sit directly in the base, as in kubelet's hierarchy.
func Tier(class v1.PodQOSClass) string {
	switch class {
	case v1.PodQOSBurstable:
		return "burstable"
	case v1.PodQOSBestEffort:
		return "besteffort"
	}
	return ""
}

// tiers lists every tier directory, Guaranteed's ("") first.
var tiers = []string{"", "burstable", "besteffort"}

// PodLimits sizes a pod's cgroup as kubelet does: shares from the pod's cpu requests; a CFS quota
// and a memory limit from the sum of its containers' limits, for a Burstable pod only where every
// container (init containers too) has that limit, since one unlimited container makes the pod
// unlimited; a BestEffort pod gets the minimum shares and nothing else.
func PodLimits(pod *v1.Pod) Limits {
	spec := &pod.Spec
	class := qos.Class(spec)
	if class == v1.PodQOSBestEffort {
		return Limits{CPUShares: MinShares}
	}
	reqs, lims := resources.PodRequests(spec), resources.PodLimits(spec)
	out := Limits{CPUShares: MilliCPUToShares(reqs.Cpu().MilliValue())}
	if class == v1.PodQOSGuaranteed || resources.LimitedByAll(spec, v1.ResourceCPU) {
		if cpu := lims.Cpu().MilliValue(); cpu > 0 {
			q := MilliCPUToQuota(cpu)
			out.CPUQuota = &q
		}
	}
	if class == v1.PodQOSGuaranteed || resources.LimitedByAll(spec, v1.ResourceMemory) {
		if mem := lims.Memory().Value(); mem > 0 {
			out.Memory = &mem
		}
	}
	return out
}

// burstableMilliCPU is what a pod adds to the Burstable tier's shares: its cpu requests when it is
// Burstable, else nothing.
func burstableMilliCPU(pod *v1.Pod) int64 {
	if qos.Class(&pod.Spec) != v1.PodQOSBurstable {
		return 0
	}
	reqs := resources.PodRequests(&pod.Spec)
	return reqs.Cpu().MilliValue()
}

// NodeLimits sizes the cgroup above all pods from node allocatable, as kubelet sizes kubepods:
// cpu shares from its cpu, a memory limit of its memory, pids.max of its "pid" entry. A resource
// the list does not hold gets no limit.
func NodeLimits(allocatable v1.ResourceList) Limits {
	var out Limits
	if cpu, ok := allocatable[v1.ResourceCPU]; ok {
		out.CPUShares = MilliCPUToShares(cpu.MilliValue())
	}
	if mem, ok := allocatable[v1.ResourceMemory]; ok {
		v := mem.Value()
		out.Memory = &v
	}
	if pids, ok := allocatable[ResourcePID]; ok {
		v := pids.Value()
		out.Pids = &v
	}
	return out
}

func classOf(pod *v1.Pod) v1.PodQOSClass { return qos.Class(&pod.Spec) }
