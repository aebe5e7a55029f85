package node

import (
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/devices"
	"github.com/mqlet/mqlet/agent/resources"
	"github.com/mqlet/mqlet/agent/shutdown"
	v1 "k8s.io/api/core/v1"
)

// interimAllocatable is node allocatable for admission until the node status has been computed
// (and in --once mode): the node status's capacity and allocatable (nodeConfig), read once, plus
// the devices.
func interimAllocatable(cfg config.Config, devs *devices.Manager, log *slog.Logger) func() v1.ResourceList {
	m := nodeConfig(cfg).Machine()
	capacity, err := m.Capacity()
	if err != nil {
		log.Warn("node capacity partly unknown; pods' requests of what is missing are not checked at admission", "err", err)
	}
	alloc := m.NodeAllocatable(capacity)
	log.Debug("node allocatable for admission", "allocatable", quantities(alloc))
	return func() v1.ResourceList {
		out := alloc.DeepCopy()
		if devs != nil {
			resources.Add(out, devs.Allocatable())
		}
		return out
	}
}

// quantities prints a resource list as "cpu=2 memory=24Gi ...".
func quantities(l v1.ResourceList) string {
	parts := make([]string, 0, len(l))
	for _, name := range slices.Sorted(maps.Keys(l)) {
		q := l[name]
		parts = append(parts, string(name)+"="+q.String())
	}
	return strings.Join(parts, " ")
}

// newNodeShutdown makes graceful node shutdown (logind's inhibitor lock where there is a system
// bus, and shutdownSignal), which runs beside the agent.
func newNodeShutdown(cfg config.Config, a *agent.Agent, log *slog.Logger) *shutdown.Manager {
	var sig os.Signal
	if s := cfg.ShutdownSignalNumber(); s != 0 {
		sig = s
	}
	return shutdown.New(shutdown.Options{
		GracePeriod:         cfg.ShutdownGracePeriod.Duration,
		CriticalGracePeriod: cfg.ShutdownGracePeriodCriticalPods.Duration,
		Signal:              sig,
		Log:                 log,
	}, a)
}
