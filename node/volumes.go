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

// allocatableMemory is node allocatable memory in bytes (capacity less the reservations and the
// hard eviction threshold, as the node status computes it), read once at first use: the size of a
// memory-backed emptyDir that neither its pod nor its sizeLimit bounds more tightly. 0 when the
// machine's memory cannot be read (the runtime then uses what it read itself).
func allocatableMemory(cfg config.Config, log *slog.Logger) func() int64 {
	return sync.OnceValue(func() int64 {
		m := nodeConfig(cfg).Machine()
		capacity, err := m.Capacity()
		if err != nil {
			log.Warn("node capacity partly unknown; memory-backed emptyDirs are sized from the machine's memory", "err", err)
		}
		alloc := m.Allocatable(capacity)
		return alloc.Memory().Value()
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
