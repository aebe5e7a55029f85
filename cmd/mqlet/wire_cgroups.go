package main

import (
	"fmt"
	"log/slog"

	"github.com/mqlet/mqlet/agent/cgroup"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/nodestatus"
	"github.com/mqlet/mqlet/hw"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// newCgroupManager detects the host's cgroups, refuses a host that lacks a controller pods need
// (the error names it and the kernel command line that enables it), and makes the QoS hierarchy
// pods run in, with node allocatable enforced on its top.
func newCgroupManager(cfg config.Config, log *slog.Logger) (*cgroup.Manager, error) {
	capacity, err := cgroupCapacity(nodeConfig(cfg).Machine(), "/")
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

// cgroupCapacity is the machine's cpu and memory capacity as the node status reads it (m), and
// its pid capacity (read under root), which the node status does not publish.
func cgroupCapacity(m nodestatus.Machine, root string) (v1.ResourceList, error) {
	all, err := m.Capacity()
	mem, ok := all[v1.ResourceMemory]
	if !ok {
		return nil, fmt.Errorf("node allocatable: %w", err)
	}
	out := v1.ResourceList{v1.ResourceMemory: mem}
	if cpu, ok := all[v1.ResourceCPU]; ok {
		out[v1.ResourceCPU] = cpu
	}
	if pids, err := hw.PIDMax(root); err == nil {
		out[cgroup.ResourcePID] = *resource.NewQuantity(pids, resource.DecimalSI)
	}
	return out, nil
}

// podsAllocatable is what all pods together get on the hierarchy's top cgroup. With
// enforceNodeAllocatable: capacity minus systemReserved, agentReserved and the hard eviction
// thresholds (as the node status computes allocatable), with pids.max only when a pid reservation
// is given. Without: the cpu capacity alone, which sets only the top's weight (kubelet sizes its
// kubepods cgroup from capacity then).
func podsAllocatable(cfg config.Config, capacity v1.ResourceList) v1.ResourceList {
	if !cfg.EnforceNodeAllocatable {
		return v1.ResourceList{v1.ResourceCPU: capacity[v1.ResourceCPU]}
	}
	m := nodeConfig(cfg).Machine()
	alloc := m.Allocatable(capacity)
	_, sysPID := m.SystemReserved[config.ResourcePID]
	_, agentPID := m.AgentReserved[config.ResourcePID]
	if !sysPID && !agentPID {
		delete(alloc, cgroup.ResourcePID)
	}
	return alloc
}
