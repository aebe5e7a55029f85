package main

import (
	"context"
	"log/slog"
	"maps"
	"os"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/devices"
	"github.com/mqlet/mqlet/agent/eviction"
	"github.com/mqlet/mqlet/agent/resources"
	"github.com/mqlet/mqlet/agent/shutdown"
	"github.com/mqlet/mqlet/hw"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// interimAllocatable is node allocatable for admission until the node status has been computed
// (and in --once mode): capacity (CPUs, MemTotal, maxPods, the state dir's file system) minus
// systemReserved, agentReserved and the hard eviction thresholds, read once, plus the devices.
func interimAllocatable(cfg config.Config, devs *devices.Manager, log *slog.Logger) func() v1.ResourceList {
	capacity := v1.ResourceList{
		v1.ResourceCPU:  *resource.NewQuantity(int64(goruntime.NumCPU()), resource.DecimalSI),
		v1.ResourcePods: *resource.NewQuantity(cfg.MaxPods, resource.DecimalSI),
	}
	if mem, err := hw.MemoryCapacity(); err == nil {
		capacity[v1.ResourceMemory] = *resource.NewQuantity(mem, resource.BinarySI)
	} else {
		log.Warn("memory capacity unknown; pods' memory requests are not checked at admission", "err", err)
	}
	if fs, err := hw.Filesystem(cfg.StateDir); err == nil {
		capacity[v1.ResourceEphemeralStorage] = *resource.NewQuantity(fs.Capacity, resource.BinarySI)
	}
	system, agentRes := cfg.Reservations()
	alloc := resources.Allocatable(capacity, system, agentRes, eviction.HardReserve(cfg.Thresholds(), capacity))
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

// startNodeShutdown runs graceful node shutdown (logind's inhibitor lock where there is a system
// bus, and shutdownSignal) beside the agent. The returned func ends it and waits.
func startNodeShutdown(ctx context.Context, cfg config.Config, a *agent.Agent, log *slog.Logger) (stop func()) {
	var sig os.Signal
	if s := cfg.ShutdownSignalNumber(); s != 0 {
		sig = s
	}
	m := shutdown.New(shutdown.Options{
		GracePeriod:         cfg.ShutdownGracePeriod.Duration,
		CriticalGracePeriod: cfg.ShutdownGracePeriodCriticalPods.Duration,
		Signal:              sig,
		Log:                 log,
	}, a)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); m.Run(ctx) }()
	return func() { cancel(); wg.Wait() }
}
