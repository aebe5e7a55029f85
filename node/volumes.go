package node

import (
	"context"
	"log/slog"
	"runtime"
	"sync"

	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/nodestatus"
	v1 "k8s.io/api/core/v1"
)

// allocatable is node allocatable (capacity less the reservations and the hard eviction
// threshold, as the node status computes it), read once at first use: the size of a memory-backed
// emptyDir that neither its pod nor its sizeLimit bounds more tightly, and the downward API's
// limits of a container without them. Memory 0 when the machine's memory cannot be read (the
// runtime then uses what it read itself).
func allocatable(cfg config.Config, log *slog.Logger) func() v1.ResourceList {
	return sync.OnceValue(func() v1.ResourceList {
		m := nodeConfig(cfg).Machine()
		capacity, err := m.Capacity()
		if err != nil {
			log.Warn("node capacity partly unknown; memory-backed emptyDirs are sized from the machine's memory", "err", err)
		}
		return m.Allocatable(capacity)
	})
}

// configNode is the node as the config gives it, for admission's nodeSelector, node affinity and
// taint checks until the node status has been computed (and in --once mode): the labels (hostname,
// os, arch, nodeLabels) and taints (nodeTaints).
func configNode(cfg config.Config) *v1.Node {
	n := &v1.Node{}
	nc := nodeConfig(cfg)
	for _, set := range []nodestatus.Setter{
		nodestatus.Labels(nc.NodeName, runtime.GOOS, runtime.GOARCH, nc.NodeLabels),
		nodestatus.Taints(nc.Taints),
	} {
		set(context.Background(), n) // neither reads anything
	}
	return n
}
