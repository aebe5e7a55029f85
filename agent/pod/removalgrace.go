package pod

import (
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	v1 "k8s.io/api/core/v1"
)

// removalGrace is the grace period a removal stops the pod's containers with, decided as kubelet's
// pod workers decide it (calculateEffectiveGracePeriod): the API's metadata.deletionGracePeriodSeconds
// when the pod is being deleted and carries one (the API server's word: a graceful delete's
// --grace-period, 0 for an immediate one), else the spec's terminationGracePeriodSeconds, raised
// to kubelet's minimum. prev is the grace an earlier pass of the same removal used (0: none yet):
// once a removal has begun its grace can only get shorter, so a later delete with a smaller grace
// shortens it and nothing lengthens it.
func removalGrace(pod *v1.Pod, prev time.Duration) time.Duration {
	g := ctrd.PodGrace(pod)
	if pod.DeletionTimestamp != nil && pod.DeletionGracePeriodSeconds != nil {
		g = time.Duration(max(*pod.DeletionGracePeriodSeconds, 0)) * time.Second
	}
	g = max(g, MinGrace)
	if prev > 0 && prev < g {
		return prev
	}
	return g
}
