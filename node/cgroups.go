package node

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/cgroup"
	"github.com/mqlet/mqlet/agent/cgroup/delegate"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/nodestatus"
	"github.com/mqlet/mqlet/agent/resources"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/hw"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// newCgroupManager detects the host's cgroups, refuses a host that lacks a controller pods need
// (the error names it and the kernel command line that enables it), puts the pods' tree where
// cgroupDriver says (asking systemd for its delegated scope), and makes the QoS hierarchy pods
// run in, with node allocatable enforced on its top.
// keep, nil for the cgroupfs driver, keeps systemd's scope and its holder (see cgroupConverge).
func newCgroupManager(ctx context.Context, cfg config.Config, exe string, log *slog.Logger) (m *cgroup.Manager, keep func(context.Context), err error) {
	capacity, err := cgroupCapacity(nodeConfig(cfg).Machine(), "/")
	if err != nil {
		return nil, nil, err
	}
	layout, err := cgroup.Detect("/proc/self/mountinfo", "/")
	if err != nil {
		return nil, nil, fmt.Errorf("refusing to start: %w", err)
	}
	driver, why, err := CgroupDriver(cfg, layout, delegate.Booted("/"))
	if err != nil {
		return nil, nil, fmt.Errorf("refusing to start: %w", err)
	}
	log.Info("cgroup driver", "driver", driver, "why", why)
	root, delegated := cfg.CgroupRoot, ""
	if driver == config.CgroupDriverSystemd {
		o := delegate.Options{Unified: layout.Unified, Holder: delegate.HolderCommand(exe), Log: log}
		scope, err := delegate.Ensure(ctx, o)
		if err != nil {
			return nil, nil, fmt.Errorf("refusing to start: cgroupDriver %s: %w", cfg.CgroupDriver, err)
		}
		root, delegated = path.Join(scope, cfg.CgroupRoot), scope
		keep = func(ctx context.Context) {
			restarted, err := delegate.Keep(ctx, o, scope)
			if err == nil && restarted {
				err = m.Restore()
			}
			if err != nil {
				log.Error("pod cgroups: keep systemd's scope (retried)", "unit", delegate.Unit, "err", err)
			}
		}
	}
	m, err = cgroup.New(cgroup.Options{
		CgroupRoot:   root,
		Delegated:    delegated,
		Namespace:    cfg.ContainerdNamespace,
		Allocatable:  podsAllocatable(cfg, capacity),
		NodeName:     cfg.NodeName,
		PodPidsLimit: cfg.PodPidsLimit,
		Log:          log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("refusing to start: %w", err)
	}
	return m, keep, nil
}

// CgroupDriver resolves the cgroupDriver setting on a host with layout, booted by systemd or not
// (`mqlet check` reports it as the agent's start would choose).
// auto is systemd on a cgroup v2 host booted by systemd, unless pods already run in a cgroupfs
// tree at the hierarchy's root (an upgrade from a release without the scope): they stay there,
// since moving them would restart every container, until a start finds none.
func CgroupDriver(cfg config.Config, l cgroup.Layout, booted bool) (driver, why string, err error) {
	switch cfg.CgroupDriver {
	case config.CgroupDriverCgroupfs:
		return config.CgroupDriverCgroupfs, "set in the config", nil
	case config.CgroupDriverSystemd:
		if !booted {
			return "", "", fmt.Errorf("cgroupDriver systemd: systemd is not this host's init system (no /run/systemd/system); use cgroupfs or auto")
		}
		if l.Mode != cgroup.Unified {
			return "", "", fmt.Errorf("cgroupDriver systemd: needs cgroup v2, this host has cgroup %s; use cgroupfs or auto", l.Mode)
		}
		return config.CgroupDriverSystemd, "set in the config", nil
	}
	switch {
	case !booted:
		return config.CgroupDriverCgroupfs, "auto: systemd is not the init system", nil
	case l.Mode != cgroup.Unified:
		return config.CgroupDriverCgroupfs, "auto: cgroup " + l.Mode.String() + ", systemd delegates only on v2", nil
	case populated(filepath.Join(l.Unified, cfg.CgroupRoot, cfg.ContainerdNamespace)):
		return config.CgroupDriverCgroupfs, "auto: pods run in the cgroupfs tree at " + path.Join(cfg.CgroupRoot, cfg.ContainerdNamespace) + " already", nil
	}
	return config.CgroupDriverSystemd, "auto: cgroup v2 host booted by systemd", nil
}

// populated reports whether a cgroup v2 directory holds a process in its subtree.
func populated(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	return err == nil && strings.Contains(string(b), "populated 1")
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
// enforceNodeAllocatable: capacity minus systemReserved and agentReserved, kubelet's enforced
// limit. The hard eviction thresholds are not subtracted: they only lower the allocatable the node
// status reports and admission uses, so eviction acts before the kernel's limit is reached (with
// them in the limit, raising evictionHard shrank the cgroup under running pods). pids.max only when
// a pid reservation is given. Without: the cpu capacity alone, which sets only the top's weight
// (kubelet sizes its kubepods cgroup from capacity then).
func podsAllocatable(cfg config.Config, capacity v1.ResourceList) v1.ResourceList {
	if !cfg.EnforceNodeAllocatable {
		return v1.ResourceList{v1.ResourceCPU: capacity[v1.ResourceCPU]}
	}
	m := nodeConfig(cfg).Machine()
	alloc := resources.Allocatable(capacity, m.SystemReserved, m.AgentReserved)
	_, sysPID := m.SystemReserved[config.ResourcePID]
	_, agentPID := m.AgentReserved[config.ResourcePID]
	if !sysPID && !agentPID {
		delete(alloc, cgroup.ResourcePID)
	}
	return alloc
}

// cgroupConvergePeriod is how often limits held above their target (node allocatable lowered
// below the pods' usage, a pod's lowered limit) are tried again as usage falls.
const cgroupConvergePeriod = 10 * time.Second

// cgroupConverge sends the cgroup manager's node events to report and is the part that retries
// its held limits every cgroupConvergePeriod until ctx ends. With keep (the systemd driver) it
// also puts a new holder in systemd's scope when its holder is gone, and starts the scope and makes
// the tree again when the scope went (its holder killed while no pod ran): a pod start in between
// fails and is retried.
func cgroupConverge(m *cgroup.Manager, report agent.Reporter, keep func(context.Context)) func(ctx context.Context) error {
	m.SetEvents(report.Emit)
	return func(ctx context.Context) error {
		t := time.NewTicker(cgroupConvergePeriod)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				if keep != nil {
					keep(ctx)
				}
				m.Converge()
			}
		}
	}
}

// ReasonSwapOn is the node's Warning that the host has swap on.
const ReasonSwapOn = "SwapOn"

// swapWarning is the node event for a host with swap on (read under root), where kubelet's
// failSwapOn would refuse to start: mqlet runs, its containers cannot swap (memory.swap.max=0, or
// memory+swap = limit on v1), but the system and its services can, so memory pressure shows late.
// ok is false when swap is off or /proc/swaps is unreadable (err).
func swapWarning(root, node string) (ev event.Event, ok bool, err error) {
	devices, err := hw.SwapDevices(root)
	if err != nil || len(devices) == 0 {
		return event.Event{}, false, err
	}
	return event.Event{Time: time.Now(), Type: event.Warning, Reason: ReasonSwapOn,
		Message: fmt.Sprintf("swap is on (%s): pods' containers are kept from swapping, but the rest of the system is not, "+
			"so memory pressure and eviction come late while the disk thrashes (kubelet refuses to start with swap on unless "+
			"failSwapOn is false); turn it off: swapoff -a and remove it from /etc/fstab "+
			"(Raspberry Pi OS: dphys-swapfile swapoff && systemctl disable dphys-swapfile)", strings.Join(devices, ", ")),
		Object: event.NodeObject(node)}, true, nil
}
