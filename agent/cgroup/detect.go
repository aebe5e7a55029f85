// Package cgroup puts pods in a cgroup hierarchy with Kubernetes' QoS tiers, the way kubelet's
// container manager does: node allocatable on the top cgroup, Guaranteed pods directly below it,
// Burstable and BestEffort pods in tiers of their own, and one cgroup per pod sized from its
// containers. It detects cgroup v1, hybrid and v2 hosts, refuses to start on one that lacks a
// controller pods need (instead of failing every pod at runc), and reads the kernel's OOM counters
// of a container's cgroup. Every path it reads comes from a mountinfo file and a root directory it
// is given, so fixture trees can stand in for a Raspberry Pi or an x86 server.
package cgroup

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Mode is how the host mounts its cgroups.
type Mode int

const (
	// Unavailable: no cgroup file system is mounted.
	Unavailable Mode = iota
	// Legacy: cgroup v1 only, one hierarchy per controller (or group of controllers).
	Legacy
	// Hybrid: the controllers in v1 hierarchies, plus a cgroup2 hierarchy (usually
	// /sys/fs/cgroup/unified) that systemd uses for tracking only.
	Hybrid
	// Unified: cgroup v2 only, every controller in one hierarchy.
	Unified
)

func (m Mode) String() string {
	switch m {
	case Legacy:
		return "v1 (legacy)"
	case Hybrid:
		return "v1 (hybrid, with a cgroup2 hierarchy for tracking)"
	case Unified:
		return "v2 (unified)"
	}
	return "unavailable"
}

// Layout is where the cgroup hierarchies of a host are mounted, as seen from root.
type Layout struct {
	Mode Mode
	// Root is the directory the mount points are taken relative to: "/" on a real host, a fixture
	// tree in tests.
	Root string
	// Unified is the cgroup2 mount point (under Root); "" when there is none.
	Unified string
	// V1 maps each v1 controller (and named hierarchy, as "name=systemd") to its mount point.
	V1 map[string]string
	// Mounts lists every cgroup and cgroup2 mount point, for removing a cgroup from all of them:
	// runc puts a container in every mounted hierarchy, not only those of the controllers mqlet sets.
	Mounts []string
}

// Detect reads the cgroup mounts from a mountinfo file (/proc/self/mountinfo) and joins their
// mount points under root. It does not rely on containerd/cgroups' Mode(), which looks at the
// real /sys/fs/cgroup only.
func Detect(mountinfo, root string) (Layout, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return Layout{}, fmt.Errorf("detect cgroup mode: %w", err)
	}
	defer f.Close()
	l := Layout{Root: root, V1: map[string]string{}}
	var unified []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for s.Scan() {
		// "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu": field 5 is the
		// mount point; after the "-" come the fs type, the source and the super options.
		fields := strings.Fields(s.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || sep+3 >= len(fields) {
			continue
		}
		fstype, opts := fields[sep+1], fields[sep+3]
		mnt := filepath.Join(root, unescapeMount(fields[4]))
		switch fstype {
		case "cgroup2":
			unified = append(unified, mnt)
			l.Mounts = append(l.Mounts, mnt)
		case "cgroup":
			l.Mounts = append(l.Mounts, mnt)
			for _, o := range strings.Split(opts, ",") {
				if !isV1Controller(o) {
					continue
				}
				// A hierarchy mounted twice (bind mounts in containers): the shortest path is
				// the canonical one, as kubelet picks it.
				if cur, ok := l.V1[o]; !ok || len(mnt) < len(cur) {
					l.V1[o] = mnt
				}
			}
		}
	}
	if err := s.Err(); err != nil {
		return Layout{}, fmt.Errorf("detect cgroup mode: read %s: %w", mountinfo, err)
	}
	l.Unified = pickUnified(unified, root)
	controllers := 0
	for name := range l.V1 {
		if !strings.HasPrefix(name, "name=") {
			controllers++
		}
	}
	switch {
	case controllers > 0 && l.Unified != "":
		l.Mode = Hybrid
	case controllers > 0:
		l.Mode = Legacy
	case l.Unified != "":
		l.Mode = Unified
	}
	return l, nil
}

// v1Controllers are the controllers a v1 hierarchy can carry; a mount's other super options
// (rw, xattr, seclabel, release_agent=...) are not hierarchies.
var v1Controllers = []string{"cpuset", "cpu", "cpuacct", "blkio", "io", "memory", "devices", "freezer", "net_cls",
	"perf_event", "net_prio", "hugetlb", "pids", "rdma", "misc", "debug"}

// isV1Controller tells a controller or named hierarchy from the other super options of a v1 mount.
func isV1Controller(o string) bool {
	return strings.HasPrefix(o, "name=") || slices.Contains(v1Controllers, o)
}

// pickUnified chooses the cgroup2 mount to use: /sys/fs/cgroup (v2) or /sys/fs/cgroup/unified
// (hybrid) when present, else the shortest path.
func pickUnified(mounts []string, root string) string {
	for _, want := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if p := filepath.Join(root, want); slices.Contains(mounts, p) {
			return p
		}
	}
	best := ""
	for _, m := range mounts {
		if best == "" || len(m) < len(best) {
			best = m
		}
	}
	return best
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space) in a mount point.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// v1Root is the directory containerd/cgroups' v1 controllers are rooted at for controller name:
// they join the root with the controller's name, so the mount (or a symlink to it, as distributions
// make for "cpu" -> "cpu,cpuacct") must be found there.
func (l Layout) v1Root(name string) (string, error) {
	mnt, ok := l.V1[name]
	if !ok {
		return "", fmt.Errorf("no %s hierarchy is mounted", name)
	}
	dir := filepath.Dir(mnt)
	if filepath.Base(mnt) == name {
		return dir, nil
	}
	link, err := filepath.EvalSymlinks(filepath.Join(dir, name))
	if err == nil {
		if real, err2 := filepath.EvalSymlinks(mnt); err2 == nil && real == link {
			return dir, nil
		}
	}
	return "", fmt.Errorf("the %s hierarchy is mounted at %s and %s does not lead there; mqlet expects each v1 controller at <dir>/<controller> (a symlink will do, as systemd makes for cpu -> cpu,cpuacct)",
		name, mnt, filepath.Join(dir, name))
}
