package main

import (
	"fmt"
	"log/slog"
	goruntime "runtime"

	"github.com/mqlet/mqlet/agent/cgroup"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/eviction"
	"github.com/mqlet/mqlet/agent/resources"
	"github.com/mqlet/mqlet/hw"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// newCgroupManager detects the host's cgroups, refuses a host that lacks a controller pods need
// (the error names it and the kernel command line that enables it), and makes the QoS hierarchy
// pods run in, with node allocatable enforced on its top.
func newCgroupManager(cfg config.Config, log *slog.Logger) (*cgroup.Manager, error) {
	capacity, err := cgroupCapacity("/")
	if err != nil {
		return nil, err
	}
	m, err := cgroup.New(cgroup.Options{
		CgroupRoot:  cfg.CgroupRoot,
		Namespace:   cfg.ContainerdNamespace,
		Allocatable: podsAllocatable(cfg, capacity),
		Log:         log,
	})
	if err != nil {
		return nil, fmt.Errorf("refusing to start: %w", err)
	}
	return m, nil
}

// cgroupCapacity is the machine's cpu, memory and pid capacity. The node status will own capacity
// once it exists; until then the cgroups are sized from the same sources kubelet uses.
func cgroupCapacity(root string) (v1.ResourceList, error) {
	mem, err := hw.MemoryCapacity()
	if err != nil {
		return nil, fmt.Errorf("memory capacity for node allocatable: %w", err)
	}
	out := v1.ResourceList{
		v1.ResourceCPU:    *resource.NewMilliQuantity(int64(goruntime.NumCPU())*1000, resource.DecimalSI),
		v1.ResourceMemory: *resource.NewQuantity(mem, resource.BinarySI),
	}
	if pids, err := cgroup.PIDCapacity(root); err == nil {
		out[cgroup.ResourcePID] = *resource.NewQuantity(pids, resource.DecimalSI)
	}
	return out, nil
}

// podsAllocatable is what all pods together get on the hierarchy's top cgroup. With
// enforceNodeAllocatable: capacity minus systemReserved, agentReserved and the hard eviction
// thresholds, with pids.max only when a pid reservation is given. Without: the cpu capacity
// alone, which sets only the top's weight (kubelet sizes its kubepods cgroup from capacity then).
func podsAllocatable(cfg config.Config, capacity v1.ResourceList) v1.ResourceList {
	if !cfg.EnforceNodeAllocatable {
		return v1.ResourceList{v1.ResourceCPU: capacity[v1.ResourceCPU]}
	}
	sys, agent := cfg.Reservations()
	alloc := resources.Allocatable(capacity, sys, agent, eviction.HardReserve(cfg.Thresholds(), capacity))
	_, sysPID := sys[config.ResourcePID]
	_, agentPID := agent[config.ResourcePID]
	if !sysPID && !agentPID {
		delete(alloc, cgroup.ResourcePID)
	}
	return alloc
}
