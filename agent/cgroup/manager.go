package cgroup

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/mqlet/mqlet/core/event"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
)

// Options configures a Manager.
type Options struct {
	Mountinfo string // default /proc/self/mountinfo
	Root      string // where mount points are found; default "/" (a fixture tree in tests)
	// CgroupRoot is the cgroup mqlet owns (cgroupRoot in the config, e.g. /mqlet); pods live in
	// CgroupRoot/Namespace, so agents of different containerd namespaces stay apart.
	CgroupRoot string
	// Delegated is a cgroup above CgroupRoot (or CgroupRoot itself) that was delegated to mqlet
	// (systemd's scope, see package delegate): it and the levels below it are mqlet's to enable
	// controllers in, though they existed before. "" when nothing was delegated.
	Delegated string
	Namespace string
	// Allocatable is enforced on CgroupRoot/Namespace (see NodeLimits): with enforceNodeAllocatable,
	// capacity minus the reservations; without it, just the cpu capacity, so pods together are
	// not starved by the kernel's default weight. Holding "pid" sets pids.max.
	Allocatable v1.ResourceList
	// PodPidsLimit is kubelet's podPidsLimit: pids.max of every pod's cgroup; 0 or negative is
	// none (kubelet's default -1).
	PodPidsLimit int64
	// NodeName names the node in the events the manager emits (see SetEvents).
	NodeName string
	Log      *slog.Logger
}

// MemoryMargin is the headroom above current usage that a memory limit being lowered on a cgroup
// with running processes is held at (see applyNode). Writing a limit below what processes use
// makes the kernel reclaim and then, on cgroup v2, OOM-kill until usage fits; v1 refuses (EBUSY)
// after reclaiming what it can.
const MemoryMargin = 32 << 20

// Manager makes, sizes and removes pod cgroups in the QoS hierarchy:
//
//	<CgroupRoot>/<Namespace>                   node allocatable; Guaranteed pods: pod<uid>
//	<CgroupRoot>/<Namespace>/burstable         shares = the Burstable pods' cpu requests; pod<uid>
//	<CgroupRoot>/<Namespace>/besteffort        shares = 2; pod<uid>
//
// The Guaranteed path is the one every pod had before the tiers existed, so pods a previous
// release started are found there and removed. It is safe for concurrent use.
type Manager struct {
	layout Layout
	base   string   // CgroupRoot/Namespace, as a path below each hierarchy's root
	top    string   // CgroupRoot
	v2     []string // controllers enabled for mqlet's own levels on cgroup v2
	node   Limits
	log    *slog.Logger
	// delegated is Options.Delegated, for Restore.
	delegated string

	// mu guards pods and serialises writes of the Burstable tier's shares, so that the last
	// write is always computed from the latest set of pods. Nothing the agent's event routing or
	// API needs waits on it.
	mu   sync.Mutex
	pods map[string]podCgroup // by pod UID: what EnsurePod last set up
	// nodePending: node allocatable could not be set on the existing base (pods already use more
	// memory than a lowered limit); retried by Tidy as containers go, and by Converge.
	nodePending bool
	// nodeHeld is the memory limit written on the base instead of node allocatable's while pods
	// use more than it (0: none), for the events that say so.
	nodeHeld int64
	podPids  *int64 // pids.max of every pod cgroup (podPidsLimit), nil for none
	nodeName string

	// evMu guards the events sink; events made before SetEvents are queued. Emitting happens
	// outside both locks.
	evMu   sync.Mutex
	emit   func(event.Event)
	queued []event.Event
}

type podCgroup struct {
	dir       string // path of the pod's cgroup below the hierarchy roots
	burstable int64  // milli-CPU the pod adds to the Burstable tier
	limits    Limits
	// pending: the limits are not all written yet (a lowered memory limit is held while the pod's
	// processes use more than it, or the kernel refused an update); retried by Tidy and Converge.
	pending bool
}

// New detects the host's cgroup mode, refuses a host that lacks a controller pods need (the error
// names it and the kernel option that enables it), and makes the hierarchy's top levels.
func New(o Options) (*Manager, error) {
	if o.Mountinfo == "" {
		o.Mountinfo = "/proc/self/mountinfo"
	}
	if o.Root == "" {
		o.Root = "/"
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if elems := splitPath(o.CgroupRoot); len(elems) == 0 || filepath.Clean(o.CgroupRoot) != o.CgroupRoot || !filepath.IsAbs(o.CgroupRoot) {
		return nil, fmt.Errorf("cgroup root %q: must be an absolute, clean cgroup path below the root, such as /mqlet", o.CgroupRoot)
	}
	if err := checkElem("containerd namespace", o.Namespace); err != nil {
		return nil, err
	}
	node := NodeLimits(o.Allocatable)
	if node.Memory != nil && *node.Memory <= 0 {
		return nil, fmt.Errorf("node allocatable memory is %d bytes: systemReserved and agentReserved leave nothing for pods", *node.Memory)
	}
	if node.Pids != nil && *node.Pids <= 0 {
		return nil, fmt.Errorf("node allocatable pids is %d: the pid reservations leave nothing for pods", *node.Pids)
	}
	l, err := Detect(o.Mountinfo, o.Root)
	if err != nil {
		return nil, err
	}
	m := &Manager{layout: l, top: o.CgroupRoot, base: filepath.Join(o.CgroupRoot, o.Namespace), node: node, log: o.Log,
		pods: map[string]podCgroup{}, nodeName: o.NodeName, delegated: o.Delegated}
	if o.PodPidsLimit > 0 {
		m.podPids = &o.PodPidsLimit
	}
	switch l.Mode {
	case Unified:
		if m.v2, err = l.delegateV2(o.CgroupRoot, o.Delegated); err != nil {
			return nil, err
		}
	default:
		if err := l.Check(o.CgroupRoot); err != nil {
			return nil, err
		}
	}
	if err := m.makeTop(); err != nil {
		return nil, err
	}
	m.log.Info("pod cgroups", "mode", l.Mode.String(), "base", m.base, "allocatable", allocatableString(o.Allocatable))
	return m, nil
}

// makeTop makes the hierarchy's top levels: CgroupRoot, the base with node allocatable, the tiers.
func (m *Manager) makeTop() error {
	// CgroupRoot itself only gets a weight, so mqlet's pods as a whole are not starved by the
	// kernel's default next to system services; the limits go one level down.
	if err := m.apply(m.top, Limits{CPUShares: m.node.CPUShares}); err != nil {
		return err
	}
	if err := m.applyNode(); err != nil {
		return err
	}
	if err := m.apply(filepath.Join(m.base, "besteffort"), Limits{CPUShares: MinShares}); err != nil {
		return err
	}
	return m.apply(filepath.Join(m.base, "burstable"), Limits{CPUShares: MinShares})
}

// Restore makes the top levels again on cgroup v2 after the delegated cgroup was made anew (the
// systemd scope ended when its last process did, and systemd removed its cgroup with mqlet's tree
// below it): controllers enabled down to CgroupRoot, node allocatable, the tiers. Pods' cgroups
// are made again as their containers start.
func (m *Manager) Restore() error {
	if m.layout.Mode != Unified {
		return nil
	}
	if _, err := m.layout.delegateV2(m.top, m.delegated); err != nil {
		return err
	}
	if err := m.makeTop(); err != nil {
		return err
	}
	m.log.Warn("pod cgroups made again: the delegated cgroup had gone", "delegated", m.delegated, "base", m.base)
	return nil
}

// applyNode sets node allocatable on the base. When the base exists and pods already use more
// memory than a lowered limit (raising evictionHard or systemReserved by an update of the config,
// say), writing it would make a v2 kernel OOM-kill pods until usage fits (v1 refuses with EBUSY).
// Instead the limit is held at the pods' usage plus MemoryMargin (never above the limit already
// there), a Warning node event says so, and Converge and Tidy lower it towards node allocatable as
// usage falls (kubelet writes its limit outright).
func (m *Manager) applyNode() error {
	_, statErr := os.Stat(m.someDir(m.base))
	existed := statErr == nil
	lim := m.node
	var held, usage int64
	if existed && lim.Memory != nil {
		var ok bool
		if held, usage, ok = m.memoryHold(m.base, *lim.Memory, true); ok {
			lim.Memory = &held
		} else {
			held = 0
		}
	}
	err := m.apply(m.base, lim)
	m.mu.Lock()
	wasHeld := m.nodeHeld
	m.nodePending = existed && (err != nil || held != 0)
	if err == nil {
		m.nodeHeld = held
	}
	m.mu.Unlock()
	if err != nil && existed {
		m.log.Warn("node allocatable not enforced yet; retried as pods' usage falls", "cgroup", m.base, "err", err)
		return nil
	}
	if err != nil {
		return err
	}
	switch {
	case held != 0 && wasHeld == 0:
		msg := fmt.Sprintf("node allocatable memory %s not enforced yet: pods use %s, so the memory limit of cgroup %s is held at %s "+
			"(their usage plus %s) instead of being written below it, which would OOM-kill pods; it is lowered as their usage falls",
			mib(*m.node.Memory), mib(usage), m.base, mib(held), mib(MemoryMargin))
		m.log.Warn(msg)
		m.event(event.Warning, ReasonFailedNodeAllocatableEnforcement, msg)
	case held == 0 && wasHeld != 0:
		msg := fmt.Sprintf("Updated Node Allocatable limit across pods: memory limit of cgroup %s lowered to %s", m.base, mib(*m.node.Memory))
		m.log.Info(msg)
		m.event(event.Normal, ReasonNodeAllocatableEnforced, msg)
	}
	return nil
}

// Reasons of the node events about enforcing node allocatable, kubelet's.
const (
	ReasonFailedNodeAllocatableEnforcement = "FailedNodeAllocatableEnforcement"
	ReasonNodeAllocatableEnforced          = "NodeAllocatableEnforced"
)

// memoryHold tells whether the existing cgroup dir uses too much memory for target: its usage is
// at or above it, so the kernel could meet it only by reclaiming, and then killing. It then
// returns the limit to write instead, and the usage: for the node (intermediate), usage plus
// MemoryMargin; for a pod, the limit it has now (its containers are being replaced; the new limit
// is written once the old ones are gone). It never returns more than the limit the cgroup has now.
func (m *Manager) memoryHold(dir string, target int64, intermediate bool) (hold, usage int64, held bool) {
	usage, cur, err := m.memoryUsage(dir)
	if err != nil || usage < target || (cur >= 0 && cur <= target) {
		return 0, usage, false
	}
	switch {
	case cur < 0 && !intermediate:
		return math.MaxInt64, usage, true // no limit now: keep none
	case cur < 0:
		return usage + MemoryMargin, usage, true
	case intermediate:
		return min(cur, usage+MemoryMargin), usage, true
	}
	return cur, usage, true
}

// memoryUsage reads the memory a cgroup uses and its limit (-1 for none).
func (m *Manager) memoryUsage(dir string) (usage, limit int64, err error) {
	var usageFile, limitFile string
	if m.layout.Mode == Unified {
		usageFile = filepath.Join(m.layout.Unified, dir, "memory.current")
		limitFile = filepath.Join(m.layout.Unified, dir, "memory.max")
	} else {
		root, err := m.layout.v1Root("memory")
		if err != nil {
			return 0, 0, err
		}
		usageFile = filepath.Join(root, "memory", dir, "memory.usage_in_bytes")
		limitFile = filepath.Join(root, "memory", dir, "memory.limit_in_bytes")
	}
	read := func(path string) (int64, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, err
		}
		v := strings.TrimSpace(string(b))
		if v == "max" {
			return -1, nil
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", path, err)
		}
		if n >= math.MaxInt64/2 { // v1's "unlimited" is a page-rounded 2^63-1
			return -1, nil
		}
		return int64(n), nil
	}
	if usage, err = read(usageFile); err != nil {
		return 0, 0, err
	}
	limit, err = read(limitFile)
	return usage, limit, err
}

// Converge retries what is not enforced yet: node allocatable or a pod's limit held above its
// target while usage was above it. Call it now and then (the agent does every few seconds).
func (m *Manager) Converge() {
	m.mu.Lock()
	nodePending := m.nodePending
	var uids []string
	for uid, p := range m.pods {
		if p.pending {
			uids = append(uids, uid)
		}
	}
	m.mu.Unlock()
	if nodePending {
		m.applyNode()
	}
	for _, uid := range uids {
		m.retryPod(uid)
	}
}

// SetEvents sets where the manager's node events go, and hands it those made before.
func (m *Manager) SetEvents(emit func(event.Event)) {
	m.evMu.Lock()
	m.emit = emit
	queued := m.queued
	m.queued = nil
	m.evMu.Unlock()
	for _, e := range queued {
		emit(e)
	}
}

func (m *Manager) event(typ event.Type, reason, msg string) {
	e := event.Event{Time: time.Now(), Type: typ, Reason: reason, Message: msg, Object: event.NodeObject(m.nodeName)}
	m.evMu.Lock()
	emit := m.emit
	if emit == nil {
		m.queued = append(m.queued, e)
	}
	m.evMu.Unlock()
	if emit != nil {
		emit(e)
	}
}

func mib(b int64) string { return fmt.Sprintf("%.1fMi", float64(b)/(1<<20)) }

// Mode is the host's cgroup mode as detected at start.
func (m *Manager) Mode() Mode { return m.layout.Mode }

// Base is the cgroup above every pod (CgroupRoot/Namespace), where node allocatable is enforced.
func (m *Manager) Base() string { return m.base }

// PodDir is the path of a pod's cgroup in tier (see tiers), below each hierarchy's root.
func (m *Manager) PodDir(tier, uid string) string { return filepath.Join(m.base, tier, "pod"+uid) }

// PodPath is where EnsurePod puts the pod: the cgroup of its QoS tier, below each hierarchy's root.
func (m *Manager) PodPath(pod *v1.Pod) string { return m.PodDir(Tier(classOf(pod)), string(pod.UID)) }

// EnsurePod makes (or updates) the pod's cgroup in the tier of its QoS class, with its limits, and
// returns its path for the containers' cgroup parent. A pod whose class changed gets a cgroup in
// the new tier; its cgroup in the old one goes once empty (Tidy). Growing the Burstable tier's
// shares follows. A memory limit lowered below what the pod's running processes use is not
// written yet: the worker replaces the containers whose spec changed (stopped with their grace
// period), and Tidy writes it once the old ones are gone, rather than have the kernel OOM-kill
// them (v2) or refuse (v1). Other updates the kernel refuses are retried the same way.
func (m *Manager) EnsurePod(pod *v1.Pod) (string, error) {
	uid := string(pod.UID)
	if err := checkElem("pod UID", uid); err != nil {
		return "", err
	}
	lim := m.podLimits(pod)
	dir := m.PodDir(Tier(classOf(pod)), uid)
	_, statErr := os.Stat(m.someDir(dir))
	existed := statErr == nil
	pending := false
	write := lim
	if existed && lim.Memory != nil {
		if hold, usage, held := m.memoryHold(dir, *lim.Memory, false); held {
			m.log.Info("pod cgroup memory limit lowered once its old containers are gone: they use more than the new one",
				"cgroup", dir, "usage", usage, "limit", *lim.Memory)
			write.Memory = &hold
			if hold == math.MaxInt64 {
				write.Memory = nil
			}
			pending = true
		}
	}
	if err := m.apply(dir, write); err != nil {
		if !existed {
			return "", fmt.Errorf("pod cgroup %s: %w", dir, err)
		}
		m.log.Warn("pod cgroup limits not updated yet; retried as its old containers go", "cgroup", dir, "err", err)
		pending = true
	}
	m.mu.Lock()
	prev, known := m.pods[uid]
	m.pods[uid] = podCgroup{dir: dir, burstable: burstableMilliCPU(pod), limits: lim, pending: pending}
	if !known || prev.burstable != m.pods[uid].burstable {
		m.updateBurstableLocked()
	}
	m.mu.Unlock()
	m.tidyTiers(uid, dir)
	return dir, nil
}

// podLimits is PodLimits with the node's podPidsLimit.
func (m *Manager) podLimits(pod *v1.Pod) Limits {
	lim := PodLimits(pod)
	lim.Pids = m.podPids
	return lim
}

// RemovePod removes the pod's cgroup from every tier (the Guaranteed one is also where a previous
// release put every pod) in every mounted hierarchy, with whatever is left below it. The pod's
// processes must be gone. Missing cgroups are fine.
func (m *Manager) RemovePod(uid string) error {
	if err := checkElem("pod UID", uid); err != nil {
		return err
	}
	var errs []error
	for _, t := range tiers {
		errs = append(errs, m.removeTree(m.PodDir(t, uid)))
	}
	m.mu.Lock()
	if p, ok := m.pods[uid]; ok {
		delete(m.pods, uid)
		if p.burstable != 0 {
			m.updateBurstableLocked()
		}
	}
	m.mu.Unlock()
	return errors.Join(errs...)
}

// Tidy removes the pod's cgroups in tiers it no longer belongs to once they are empty, and retries
// a limit update not written yet (the pod's, or node allocatable's). Call it after removing one of
// the pod's containers.
func (m *Manager) Tidy(uid string) {
	m.mu.Lock()
	p, ok := m.pods[uid]
	nodePending := m.nodePending
	m.mu.Unlock()
	if nodePending {
		m.applyNode()
	}
	if !ok {
		return
	}
	m.tidyTiers(uid, p.dir)
	if p.pending {
		m.retryPod(uid)
	}
}

// retryPod writes the pod's limits if its usage allows them now.
func (m *Manager) retryPod(uid string) {
	m.mu.Lock()
	p, ok := m.pods[uid]
	m.mu.Unlock()
	if !ok || !p.pending {
		return
	}
	if p.limits.Memory != nil {
		if _, usage, held := m.memoryHold(p.dir, *p.limits.Memory, false); held {
			m.log.Debug("pod cgroup memory limit still held: its processes use more", "cgroup", p.dir, "usage", usage)
			return
		}
	}
	if err := m.apply(p.dir, p.limits); err != nil {
		m.log.Debug("pod cgroup limits still not updated", "cgroup", p.dir, "err", err)
		return
	}
	m.mu.Lock()
	if cur, ok := m.pods[uid]; ok && cur.dir == p.dir {
		cur.pending = false
		m.pods[uid] = cur
	}
	m.mu.Unlock()
	m.log.Info("pod cgroup limits updated", "cgroup", p.dir)
}

// PodUIDs lists the UIDs of pods with a cgroup in any tier of any mounted hierarchy.
func (m *Manager) PodUIDs() ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, mnt := range m.layout.Mounts {
		for _, t := range tiers {
			entries, err := os.ReadDir(filepath.Join(mnt, m.base, t))
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					continue
				}
				return nil, err
			}
			for _, e := range entries {
				uid, ok := strings.CutPrefix(e.Name(), "pod")
				if ok && e.IsDir() && uid != "" && !seen[uid] {
					seen[uid] = true
					out = append(out, uid)
				}
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// tidyTiers removes the pod's cgroups other than keep where they are empty. rmdir of a cgroup
// fails while it has children or processes; that is expected until the old containers are gone.
func (m *Manager) tidyTiers(uid, keep string) {
	for _, t := range tiers {
		dir := m.PodDir(t, uid)
		if dir == keep {
			continue
		}
		for _, mnt := range m.layout.Mounts {
			err := os.Remove(filepath.Join(mnt, dir))
			if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.ENOTEMPTY) {
				m.log.Debug("remove old tier's pod cgroup", "cgroup", filepath.Join(mnt, dir), "err", err)
			}
		}
	}
}

// updateBurstableLocked sets the Burstable tier's shares to the sum of its pods' cpu requests, as
// kubelet's QoS manager does, so the tier as a whole weighs what its pods asked for.
func (m *Manager) updateBurstableLocked() {
	var milli int64
	for _, p := range m.pods {
		milli += p.burstable
	}
	dir := filepath.Join(m.base, "burstable")
	if err := m.apply(dir, Limits{CPUShares: MilliCPUToShares(milli)}); err != nil {
		m.log.Warn("update the Burstable tier's cpu shares", "cgroup", dir, "err", err)
	}
}

// someDir is dir in one hierarchy that mqlet manages, to tell whether a cgroup exists.
func (m *Manager) someDir(dir string) string {
	if m.layout.Mode == Unified {
		return filepath.Join(m.layout.Unified, dir)
	}
	return filepath.Join(m.layout.V1["memory"], dir)
}

// apply makes the cgroup at dir (and its missing parents) and sets lim on it.
func (m *Manager) apply(dir string, lim Limits) error {
	if m.layout.Mode == Unified {
		return m.applyV2(dir, lim)
	}
	return m.applyV1(dir, lim)
}

// v1Hierarchy is the set of v1 controllers mqlet sizes pod cgroups with, rooted where they are
// mounted under the layout's root (not containerd/cgroups' fixed /sys/fs/cgroup), so fixture trees
// work too. cpuset is made at each level with its parent's CPUs and memory nodes (a new v1 cpuset
// has none and takes no process); the other hierarchies runc fills itself.
func (m *Manager) v1Hierarchy() ([]cgroup1.Subsystem, error) {
	var out []cgroup1.Subsystem
	for _, name := range []string{"cpuset", "cpu", "memory", "pids"} {
		root, err := m.layout.v1Root(name)
		if err != nil {
			if slices.Contains(required, name) {
				return nil, err
			}
			continue
		}
		switch name {
		case "cpuset":
			out = append(out, cgroup1.NewCpuset(root))
		case "cpu":
			out = append(out, cgroup1.NewCpu(root))
		case "memory":
			out = append(out, cgroup1.NewMemory(root))
		case "pids":
			out = append(out, cgroup1.NewPids(root))
		}
	}
	return out, nil
}

func (m *Manager) applyV1(dir string, lim Limits) error {
	quota, period := int64(-1), uint64(QuotaPeriod)
	if lim.CPUQuota != nil {
		quota = *lim.CPUQuota
	}
	memory := int64(-1)
	if lim.Memory != nil {
		memory = *lim.Memory
	}
	res := &specs.LinuxResources{
		CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
		Memory: &specs.LinuxMemory{Limit: &memory},
	}
	if lim.CPUShares != 0 {
		res.CPU.Shares = &lim.CPUShares
	}
	if lim.Pids != nil {
		res.Pids = &specs.LinuxPids{Limit: lim.Pids}
	}
	// New makes the cgroup in each hierarchy where missing and writes res: it serves for an
	// update too.
	if _, err := cgroup1.New(cgroup1.StaticPath(dir), res, cgroup1.WithHierarchy(m.v1Hierarchy)); err != nil {
		return fmt.Errorf("cgroup v1 %s: %w", dir, err)
	}
	if lim.Pids == nil {
		// containerd/cgroups writes only a positive pids limit; lift an old one.
		root, err := m.layout.v1Root("pids")
		if err != nil {
			return err
		}
		if err := writeIfDiffers(filepath.Join(root, "pids", dir, "pids.max"), "max"); err != nil {
			return fmt.Errorf("cgroup v1 %s: %w", dir, err)
		}
	}
	return nil
}

func (m *Manager) applyV2(dir string, lim Limits) error {
	// Make each missing level, with the controllers enabled in its parent first: a v2 cgroup has
	// the interface files of only the controllers its parent enables for it. CgroupRoot's own
	// parent was taken care of at start (delegateV2).
	cur := filepath.Join(m.layout.Unified, m.top)
	rel, err := filepath.Rel(m.top, dir)
	if err != nil || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("cgroup %s is not below %s", dir, m.top)
	}
	for _, elem := range splitPath(rel) {
		if err := enableV2(cur, m.v2); err != nil {
			return err
		}
		cur = filepath.Join(cur, elem)
		if err := os.Mkdir(cur, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cgroup v2: make %s: %w", cur, err)
		}
	}
	cg, err := cgroup2.Load(dir, cgroup2.WithMountpoint(m.layout.Unified))
	if err != nil {
		return fmt.Errorf("cgroup v2 %s: %w", dir, err)
	}
	period := uint64(QuotaPeriod)
	res := &cgroup2.Resources{CPU: &cgroup2.CPU{Max: cgroup2.NewCPUMax(lim.CPUQuota, &period)}}
	if lim.CPUShares != 0 {
		w := SharesToWeight(lim.CPUShares)
		res.CPU.Weight = &w
	}
	if lim.Memory != nil {
		res.Memory = &cgroup2.Memory{Max: lim.Memory}
	}
	if lim.Pids != nil {
		res.Pids = &cgroup2.Pids{Max: *lim.Pids}
	}
	if err := cg.Update(res); err != nil {
		return fmt.Errorf("cgroup v2 %s: %w", dir, err)
	}
	// containerd/cgroups cannot write "max" for memory and pids (its fields are numbers): lift
	// limits the cgroup no longer has here.
	if lim.Memory == nil {
		if err := writeIfDiffers(filepath.Join(m.layout.Unified, dir, "memory.max"), "max"); err != nil {
			return fmt.Errorf("cgroup v2 %s: %w", dir, err)
		}
	}
	if lim.Pids == nil {
		if err := writeIfDiffers(filepath.Join(m.layout.Unified, dir, "pids.max"), "max"); err != nil {
			return fmt.Errorf("cgroup v2 %s: %w", dir, err)
		}
	}
	return nil
}

// writeIfDiffers writes v to a cgroup file unless it already holds it (a file not there yet is
// written: on a real cgroupfs that fails, naming the missing controller's file).
func writeIfDiffers(path, v string) error {
	if cur, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(cur)) == v {
		return nil
	}
	return os.WriteFile(path, []byte(v), 0o644)
}

// removeTree removes the cgroup rel and every cgroup below it, deepest first, in every mounted
// hierarchy. runc makes a container's cgroup in every hierarchy (devices, freezer, systemd's named
// one, the v2 one of a hybrid host), which mqlet never sizes, so removal walks them all rather
// than only the controllers containerd/cgroups was given.
func (m *Manager) removeTree(rel string) error {
	var errs []error
	for _, mnt := range m.layout.Mounts {
		var dirs []string
		filepath.WalkDir(filepath.Join(mnt, rel), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// checkElem refuses what cannot be one element of a cgroup path: a pod UID or namespace that
// climbs out of its parent or names a file.
func checkElem(what, v string) error {
	if v == "" || v == "." || v == ".." || strings.ContainsAny(v, "/\x00") || len(v) > 200 {
		return fmt.Errorf("%s %q cannot name a cgroup", what, v)
	}
	return nil
}

func allocatableString(rl v1.ResourceList) string {
	var parts []string
	for _, name := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory, ResourcePID} {
		if q, ok := rl[name]; ok {
			parts = append(parts, string(name)+"="+q.String())
		}
	}
	if len(parts) == 0 {
		return "not enforced"
	}
	return strings.Join(parts, ",")
}

// parseKV reads a "key value" line file (memory.events, memory.oom_control) into a map.
func parseKV(b []byte) map[string]uint64 {
	out := map[string]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if v, err := strconv.ParseUint(f[1], 10, 64); err == nil {
			out[f[0]] = v
		}
	}
	return out
}
