package eviction

import (
	"cmp"
	"slices"

	"github.com/mqlet/mqlet/agent/resources"
	"github.com/mqlet/mqlet/core/source"
	v1 "k8s.io/api/core/v1"
)

// Pod is a pod the node runs, as the manager sees it.
type Pod struct {
	Pod    *v1.Pod // spec and latest status
	Source source.Ref
}

// candidate is a pod with what it uses of the resource being reclaimed.
type candidate struct {
	Pod
	found   bool  // usage could be read
	usage   int64 // bytes, inodes or processes
	request int64 // the pod's request of that resource (0 for inodes and processes)
}

func (c candidate) exceeds() bool { return c.usage > c.request }

// active reports whether the pod still runs or may run: terminal and deleted pods are not
// candidates (kubelet ranks its active pods only).
func active(p *v1.Pod) bool {
	return p.DeletionTimestamp == nil && p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed
}

// rank orders candidates for eviction, first to go first, as kubelet ranks them:
//   - memory and disk: pods without stats first, then pods using more than they request, then lower
//     priority, then the larger use above the request;
//   - pids: pods without stats first, then lower priority, then more processes.
func rank(r v1.ResourceName, cs []candidate) {
	slices.SortStableFunc(cs, func(a, b candidate) int {
		if a.found != b.found {
			return boolFirst(!a.found, !b.found)
		}
		if r != resourcePIDs {
			if c := boolFirst(a.exceeds(), b.exceeds()); c != 0 {
				return c
			}
		}
		if c := cmp.Compare(resources.Priority(a.Pod.Pod), resources.Priority(b.Pod.Pod)); c != 0 {
			return c
		}
		return cmp.Compare(b.usage-b.request, a.usage-a.request)
	})
}

// boolFirst orders true before false.
func boolFirst(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

// requestOf is the pod's effective request of r (kubelet's, init containers and overhead included).
func requestOf(p *v1.Pod, r v1.ResourceName) int64 {
	switch r {
	case v1.ResourceMemory, v1.ResourceEphemeralStorage:
		q, ok := resources.PodRequests(&p.Spec)[r]
		if ok {
			return q.Value()
		}
	}
	return 0
}
