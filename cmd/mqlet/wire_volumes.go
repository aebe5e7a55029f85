package main

import (
	"log/slog"
	"sync"

	"github.com/mqlet/mqlet/agent/config"
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
