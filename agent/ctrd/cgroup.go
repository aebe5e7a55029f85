package ctrd

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// podCgroupUIDs lists the UIDs of the pods that have a cgroup directory at the legacy path
// (legacyPodCgroup) in any hierarchy; the cgroup manager lists those in its tiers.
func podCgroupUIDs(namespace string) ([]string, error) {
	mounts, err := cgroupMounts("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, m := range mounts {
		names, err := dirNames(filepath.Join(m, "mqlet", namespace))
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			if uid, ok := strings.CutPrefix(n, "pod"); ok && uid != "" && !seen[uid] {
				seen[uid] = true
				out = append(out, uid)
			}
		}
	}
	return out, nil
}

// RemoveCgroup removes the (empty) cgroup directory rel in every mounted cgroup hierarchy, v1 and
// v2. runc deletes a container's own cgroup but not the parents mqlet put it under, so without this
// every pod would leave a directory per hierarchy behind.
func RemoveCgroup(rel string) error {
	mounts, err := cgroupMounts("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		err := os.Remove(filepath.Join(m, rel))
		if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.EBUSY) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cgroupMounts lists the mount points of cgroup and cgroup2 file systems.
func cgroupMounts(mountinfo string) ([]string, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		// "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw": fields after "-"
		// are fstype, source, options; field 5 is the mount point.
		fields := strings.Fields(s.Text())
		for i, f := range fields {
			if f == "-" && i+1 < len(fields) && len(fields) > 4 {
				if fs := fields[i+1]; fs == "cgroup" || fs == "cgroup2" {
					out = append(out, fields[4])
				}
				break
			}
		}
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", mountinfo, err)
	}
	return out, nil
}

// RemoveCgroupTree removes rel and every cgroup below it, deepest first, in every hierarchy. The
// cgroups must hold no processes: it runs once a pod's processes are gone.
func RemoveCgroupTree(rel string) error {
	mounts, err := cgroupMounts("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		var dirs []string
		filepath.WalkDir(filepath.Join(m, rel), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// swapAccounting reports whether the kernel lets a cgroup limit swap (cgroup v1 memsw, or v2
// memory.swap.max); runc fails a container whose spec limits swap where it cannot.
func swapAccounting() bool {
	mounts, err := cgroupMounts("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, m := range mounts {
		if _, err := os.Stat(filepath.Join(m, "memory.memsw.limit_in_bytes")); err == nil {
			return true
		}
		if found, _ := filepath.Glob(filepath.Join(m, "*", "memory.swap.max")); len(found) > 0 {
			return true
		}
	}
	return false
}

// EnterCgroup moves pid into the cgroup rel in every mounted hierarchy, making it (and its parents)
// where missing. A new cpuset cgroup of v1 starts with no CPUs and no memory nodes and takes no
// process, so each level made here gets its parent's. Every hierarchy is tried; the error names
// those that failed.
func EnterCgroup(rel string, pid int) error {
	mounts, err := cgroupMounts("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		if err := enterCgroupIn(m, rel, pid); err != nil {
			errs = append(errs, fmt.Errorf("cgroup %s in %s: %w", rel, m, err))
		}
	}
	return errors.Join(errs...)
}

func enterCgroupIn(mount, rel string, pid int) error {
	dir := mount
	for _, elem := range strings.Split(strings.Trim(filepath.Clean(rel), "/"), "/") {
		parent := dir
		dir = filepath.Join(dir, elem)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if _, err := os.Stat(filepath.Join(dir, "cgroup.controllers")); err == nil {
			continue // v2: an empty cpuset means the parent's
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if err := inheritEmpty(filepath.Join(parent, f), filepath.Join(dir, f)); err != nil {
				return err
			}
		}
	}
	return os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
}

// inheritEmpty copies the parent's value of a cgroup file into the child's when the child's is
// empty; a hierarchy without the file (not cpuset) is skipped.
func inheritEmpty(parent, child string) error {
	cur, err := os.ReadFile(child)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	if strings.TrimSpace(string(cur)) != "" {
		return nil
	}
	val, err := os.ReadFile(parent)
	if err != nil {
		return err
	}
	if err := os.WriteFile(child, val, 0o644); err != nil {
		return fmt.Errorf("%s = %q: %w", child, strings.TrimSpace(string(val)), err)
	}
	return nil
}

// unifiedCgroups reports whether /sys/fs/cgroup is a cgroup2 file system: the test runc uses to
// manage containers' cgroups the v2 way, and so whether the spec's unified settings apply.
func unifiedCgroups() bool {
	var st unix.Statfs_t
	return unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// cgroup2HostOptions returns the super options of a cgroup2 file system mounted at /sys/fs/cgroup
// that a container in the host's cgroup namespace must repeat when it mounts cgroup2 (it shares the
// host's superblock, and a mount without them would drop them for the host too); none on v1.
func cgroup2HostOptions(mountinfo string) []string {
	b, err := os.ReadFile(mountinfo)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		i := slices.Index(fields, "-")
		if len(fields) < 5 || fields[4] != "/sys/fs/cgroup" || i < 0 || i+3 >= len(fields) || fields[i+1] != "cgroup2" {
			continue
		}
		out = nil // the last mount at the path is the one seen
		for _, o := range strings.Split(fields[i+3], ",") {
			if o == "nsdelegate" || o == "memory_recursiveprot" {
				out = append(out, o)
			}
		}
	}
	return out
}
