// Package qos classifies pods into Kubernetes' quality-of-service classes and derives what the
// classes decide on the node: which containers the kernel's OOM killer takes first.
package qos

import (
	"github.com/mqlet/mqlet/agent/podspec"
	v1 "k8s.io/api/core/v1"
)

// Class follows Kubernetes' rules: Guaranteed when every container has equal cpu and memory
// requests and limits, BestEffort when none has any, Burstable otherwise.
func Class(spec *v1.PodSpec) v1.PodQOSClass {
	any, guaranteed := false, true
	all := podspec.AllContainers(spec)
	for _, c := range all {
		for _, r := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory} {
			// Zero quantities count as unset, as in Kubernetes.
			l, hasL := c.Resources.Limits[r]
			hasL = hasL && !l.IsZero()
			q, hasQ := c.Resources.Requests[r]
			hasQ = hasQ && !q.IsZero()
			if hasL || hasQ {
				any = true
			}
			if !hasQ {
				q, hasQ = l, hasL // requests default to limits
			}
			if !hasL || !hasQ || l.Cmp(q) != 0 {
				guaranteed = false
			}
		}
	}
	switch {
	case !any:
		return v1.PodQOSBestEffort
	case guaranteed:
		return v1.PodQOSGuaranteed
	}
	return v1.PodQOSBurstable
}

// kubelet's OOM score adjustments by QoS class.
const (
	guaranteedOOMScoreAdj = -997
	besteffortOOMScoreAdj = 1000
)

// OOMScoreAdj is kubelet's oom_score_adj for a container: Guaranteed pods are killed last,
// BestEffort first, Burstable by how much of the machine's memory they request.
func OOMScoreAdj(qos v1.PodQOSClass, c *v1.Container, memCapacity int64) int {
	switch qos {
	case v1.PodQOSGuaranteed:
		return guaranteedOOMScoreAdj
	case v1.PodQOSBestEffort:
		return besteffortOOMScoreAdj
	}
	req := c.Resources.Requests.Memory().Value()
	if req == 0 {
		req = c.Resources.Limits.Memory().Value()
	}
	adj := besteffortOOMScoreAdj
	if memCapacity > 0 {
		adj = 1000 - int(1000*req/memCapacity)
	}
	// A Burstable container must stay above Guaranteed ones and below BestEffort ones.
	return min(max(adj, 1000+guaranteedOOMScoreAdj), besteffortOOMScoreAdj-1)
}
