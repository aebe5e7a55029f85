package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// ErrNoCgroup is returned by OOMKilled when the container's cgroup is gone (its task was deleted,
// or the host rebooted): the kernel's counters went with it.
var ErrNoCgroup = errors.New("the container's cgroup is gone")

// OOMKilled reports whether the kernel's OOM killer killed a process of the cgroup at path (the
// container's, below each hierarchy's root), from the counters the kernel keeps until the cgroup
// is removed, which runc does only when the task is deleted. That makes it the record of an OOM
// kill whose event nobody saw (the agent was down). The counters:
//
//   - cgroup v2: oom_kill in memory.events (which counts the cgroup's subtree).
//   - cgroup v1: oom_kill in memory.oom_control (kernel 4.13 and later); on older kernels, an exit
//     by SIGKILL (137) while memory.failcnt says the limit was hit.
func (m *Manager) OOMKilled(path string, exitCode int32) (bool, error) {
	// path comes from the container's spec in containerd: it must stay below the hierarchy's root.
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return false, fmt.Errorf("container cgroup %q: must be an absolute, clean cgroup path", path)
	}
	if m.layout.Mode == Unified {
		dir := filepath.Join(m.layout.Unified, path)
		b, err := os.ReadFile(filepath.Join(dir, "memory.events"))
		if err != nil {
			return false, noCgroup(dir, err)
		}
		ev := parseKV(b)
		if n, ok := ev["oom_kill"]; ok {
			return n > 0, nil
		}
		return exitCode == 137 && ev["max"] > 0, nil
	}
	mnt, ok := m.layout.V1["memory"]
	if !ok {
		return false, fmt.Errorf("no memory hierarchy is mounted")
	}
	dir := filepath.Join(mnt, path)
	b, err := os.ReadFile(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		return false, noCgroup(dir, err)
	}
	if n, ok := parseKV(b)["oom_kill"]; ok {
		return n > 0, nil
	}
	if exitCode != 137 {
		return false, nil
	}
	fc, err := os.ReadFile(filepath.Join(dir, "memory.failcnt"))
	if err != nil {
		return false, noCgroup(dir, err)
	}
	var n uint64
	fmt.Sscan(string(fc), &n)
	return n > 0, nil
}

func noCgroup(dir string, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Stat(dir); errors.Is(serr, os.ErrNotExist) {
			return fmt.Errorf("%s: %w", dir, ErrNoCgroup)
		}
	}
	return err
}
