package hw

// The pressure signals of the eviction manager, read the way kubelet (through cAdvisor and runc)
// reads them. Every reader takes the root of the tree that holds proc/ and sys/ ("/" on a node, a
// fixture tree in tests) and says clearly when the kernel does not offer what it reads.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MemoryStats is the node's memory as kubelet's memory.available signal sees it: capacity minus the
// root cgroup's working set (usage minus inactive file pages, which the kernel can drop at once).
// This is not MemAvailable: kubelet counts active page cache as used.
type MemoryStats struct {
	Capacity     int64 // MemTotal
	Usage        int64 // the root memory cgroup's usage
	InactiveFile int64
	WorkingSet   int64 // Usage - InactiveFile, never negative
	Available    int64 // Capacity - WorkingSet, never negative
	// Source says where Usage came from: "cgroup v1", "cgroup v2" (the v2 root has no
	// memory.current: MemTotal - MemFree, as runc reports the v2 root) or "meminfo" (no memory
	// controller mounted, e.g. Raspberry Pi OS without cgroup_enable=memory).
	Source string
}

const cgroupMount = "sys/fs/cgroup"

// NodeMemory reads memory.available's inputs under root.
//   - cgroup v1 (also hybrid): usage is memory.usage_in_bytes of the memory hierarchy's root and
//     inactive file is total_inactive_file of its memory.stat.
//   - cgroup v2: the root cgroup has no memory.current, so usage is MemTotal - MemFree of
//     /proc/meminfo (as runc and cAdvisor report the v2 root) and inactive file is inactive_file of
//     the root memory.stat.
//   - no memory controller: usage as on v2, inactive file from meminfo's Inactive(file).
func NodeMemory(root string) (MemoryStats, error) {
	meminfo := filepath.Join(root, "proc/meminfo")
	mi, err := sigMeminfo(meminfo)
	if err != nil {
		return MemoryStats{}, err
	}
	total, ok := mi["MemTotal"]
	if !ok {
		return MemoryStats{}, fmt.Errorf("%s: no MemTotal line", meminfo)
	}
	s := MemoryStats{Capacity: total}
	v1 := filepath.Join(root, cgroupMount, "memory")
	switch {
	case sigExists(filepath.Join(v1, "memory.usage_in_bytes")):
		s.Source = "cgroup v1"
		if s.Usage, err = sigReadInt(filepath.Join(v1, "memory.usage_in_bytes")); err != nil {
			return MemoryStats{}, err
		}
		stat, err := sigKeyedInts(filepath.Join(v1, "memory.stat"))
		if err != nil {
			return MemoryStats{}, err
		}
		s.InactiveFile = stat["total_inactive_file"]
	case sigExists(filepath.Join(root, cgroupMount, "memory.stat")):
		s.Source = "cgroup v2"
		free, ok := mi["MemFree"]
		if !ok {
			return MemoryStats{}, fmt.Errorf("%s: no MemFree line", meminfo)
		}
		s.Usage = total - free
		stat, err := sigKeyedInts(filepath.Join(root, cgroupMount, "memory.stat"))
		if err != nil {
			return MemoryStats{}, err
		}
		s.InactiveFile = stat["inactive_file"]
	default:
		s.Source = "meminfo"
		free, ok := mi["MemFree"]
		if !ok {
			return MemoryStats{}, fmt.Errorf("%s: no MemFree line", meminfo)
		}
		s.Usage = total - free
		s.InactiveFile = mi["Inactive(file)"]
	}
	s.WorkingSet = max(s.Usage-s.InactiveFile, 0)
	s.Available = max(s.Capacity-s.WorkingSet, 0)
	return s, nil
}

// CgroupMemoryStats is one cgroup's memory use; WorkingSet is what eviction ranks pods by.
type CgroupMemoryStats struct {
	Usage        int64
	InactiveFile int64
	WorkingSet   int64
	// Limit is the cgroup's own memory limit (memory.limit_in_bytes on v1, memory.max on v2);
	// 0 when it has none.
	Limit int64
}

// unlimited is where a v1 memory.limit_in_bytes means "no limit": the kernel reports its
// page-rounded maximum (9223372036854771712) rather than a distinct word.
const unlimited = 1 << 62

// CgroupMemory reads the memory use of the cgroup rel (its path below each hierarchy's root, such as
// /mqlet/default/pod<uid>) under root: memory.usage_in_bytes and total_inactive_file on v1,
// memory.current and inactive_file on v2, with the cgroup's limit. rel cannot climb out of the
// hierarchy.
func CgroupMemory(root, rel string) (CgroupMemoryStats, error) {
	var s CgroupMemoryStats
	v1 := filepath.Join(root, cgroupMount, "memory")
	if sigExists(filepath.Join(v1, "memory.usage_in_bytes")) {
		dir := sigJoin(v1, rel)
		var err error
		if s.Usage, err = sigReadInt(filepath.Join(dir, "memory.usage_in_bytes")); err != nil {
			return s, err
		}
		stat, err := sigKeyedInts(filepath.Join(dir, "memory.stat"))
		if err != nil {
			return s, err
		}
		s.InactiveFile = stat["total_inactive_file"]
		if s.Limit, err = sigReadInt(filepath.Join(dir, "memory.limit_in_bytes")); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return s, err
		}
	} else {
		dir := sigJoin(filepath.Join(root, cgroupMount), rel)
		var err error
		if s.Usage, err = sigReadInt(filepath.Join(dir, "memory.current")); err != nil {
			return s, err
		}
		stat, err := sigKeyedInts(filepath.Join(dir, "memory.stat"))
		if err != nil {
			return s, err
		}
		s.InactiveFile = stat["inactive_file"]
		if s.Limit, err = sigReadInt(filepath.Join(dir, "memory.max")); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return s, err
		}
	}
	if s.Limit >= unlimited {
		s.Limit = 0
	}
	s.WorkingSet = max(s.Usage-s.InactiveFile, 0)
	return s, nil
}

// CgroupProcesses counts the tasks of the cgroup rel and its children under root: pids.current of
// the pids controller (v1 hierarchy or v2), else the lines of every cgroup.procs below rel in the
// memory (v1) or unified (v2) hierarchy.
func CgroupProcesses(root, rel string) (int64, error) {
	base := filepath.Join(root, cgroupMount)
	for _, dir := range []string{sigJoin(filepath.Join(base, "pids"), rel), sigJoin(base, rel)} {
		n, err := sigReadInt(filepath.Join(dir, "pids.current"))
		if err == nil {
			return n, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return 0, err
		}
	}
	dir := sigJoin(base, rel)
	if sigExists(filepath.Join(base, "memory", "memory.usage_in_bytes")) {
		dir = sigJoin(filepath.Join(base, "memory"), rel)
	}
	if !sigExists(dir) {
		return 0, fmt.Errorf("cgroup %s: %w", dir, fs.ErrNotExist)
	}
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil // a child cgroup removed meanwhile has no processes left
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		n += int64(bytes.Count(b, []byte("\n")))
		return nil
	})
	return n, err
}

// PIDStats is kubelet's pid.available: the most process IDs the kernel hands out (pid_max, or
// threads-max when lower) minus the tasks that exist now.
type PIDStats struct {
	Max       int64
	Running   int64
	Available int64
}

// PIDMax is the most process IDs the kernel hands out, which kubelet counts as the node's "pid"
// capacity: proc/sys/kernel/pid_max under root, or proc/sys/kernel/threads-max when that is lower.
func PIDMax(root string) (int64, error) {
	path := filepath.Join(root, "proc/sys/kernel/pid_max")
	maxPID, err := sigReadInt(path)
	if err != nil {
		return 0, err
	}
	if maxPID <= 0 {
		return 0, fmt.Errorf("%s: %d is not a positive number", path, maxPID)
	}
	if threads, err := sigReadInt(filepath.Join(root, "proc/sys/kernel/threads-max")); err == nil && threads > 0 && threads < maxPID {
		maxPID = threads
	}
	return maxPID, nil
}

// PIDs reads PIDMax and the task count of proc/loadavg under root (its fourth field is
// runnable/total; total is what kubelet counts).
func PIDs(root string) (PIDStats, error) {
	maxPID, err := PIDMax(root)
	if err != nil {
		return PIDStats{}, err
	}
	path := filepath.Join(root, "proc/loadavg")
	b, err := os.ReadFile(path)
	if err != nil {
		return PIDStats{}, err
	}
	fields := strings.Fields(string(b))
	if len(fields) < 4 {
		return PIDStats{}, fmt.Errorf("%s: want 5 fields, got %q", path, strings.TrimSpace(string(b)))
	}
	_, total, ok := strings.Cut(fields[3], "/")
	running, err := strconv.ParseInt(total, 10, 64)
	if !ok || err != nil {
		return PIDStats{}, fmt.Errorf("%s: fourth field %q is not runnable/total", path, fields[3])
	}
	return PIDStats{Max: maxPID, Running: running, Available: maxPID - running}, nil
}

// PSILine is one line of a pressure file: the share of time some (or all) tasks stalled on the
// resource, averaged over 10, 60 and 300 seconds (percent), and the total stall time.
type PSILine struct {
	Avg10, Avg60, Avg300 float64
	TotalMicros          uint64
}

// PSI is the pressure stall information of one resource. Full is absent for the system-wide cpu
// file on kernels before 5.13.
type PSI struct {
	Some    PSILine
	Full    PSILine
	HasFull bool
}

// Pressure reads proc/pressure/<resource> ("memory", "cpu" or "io") under root. A kernel without
// PSI (older than 4.20, or booted with psi=0) has no such file: the error then matches
// fs.ErrNotExist (reading it on such a kernel can also fail with EOPNOTSUPP, reported the same).
func Pressure(root, resource string) (PSI, error) {
	path := filepath.Join(root, "proc/pressure", resource)
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.EOPNOTSUPP) {
			return PSI{}, fmt.Errorf("%s: %w", path, fs.ErrNotExist)
		}
		return PSI{}, err
	}
	var p PSI
	seenSome := false
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		l, err := parsePSILine(fields[1:])
		if err != nil {
			return PSI{}, fmt.Errorf("%s: %q: %w", path, line, err)
		}
		switch fields[0] {
		case "some":
			p.Some, seenSome = l, true
		case "full":
			p.Full, p.HasFull = l, true
		}
	}
	if !seenSome {
		return PSI{}, fmt.Errorf("%s: no \"some\" line", path)
	}
	return p, nil
}

func parsePSILine(kvs []string) (PSILine, error) {
	var l PSILine
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return l, fmt.Errorf("%q is not key=value", kv)
		}
		var err error
		switch k {
		case "avg10":
			l.Avg10, err = strconv.ParseFloat(v, 64)
		case "avg60":
			l.Avg60, err = strconv.ParseFloat(v, 64)
		case "avg300":
			l.Avg300, err = strconv.ParseFloat(v, 64)
		case "total":
			l.TotalMicros, err = strconv.ParseUint(v, 10, 64)
		}
		if err != nil {
			return l, fmt.Errorf("%s: %w", k, err)
		}
	}
	return l, nil
}

// sigMeminfo reads /proc/meminfo into bytes per key.
func sigMeminfo(path string) (map[string]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		// "MemTotal:       24682416 kB"; a few counters (HugePages_*) have no unit.
		fields := strings.Fields(s.Text())
		if len(fields) < 2 {
			continue
		}
		n, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil {
			continue
		}
		if len(fields) > 2 && fields[2] == "kB" {
			n <<= 10
		}
		out[strings.TrimSuffix(fields[0], ":")] = n
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// sigKeyedInts reads a cgroup file of "key value" lines (memory.stat).
func sigKeyedInts(path string) (map[string]int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			out[k] = n
		}
	}
	return out, nil
}

// sigReadInt reads a file holding one integer ("max" reads as the largest int64).
func sigReadInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 1<<63 - 1, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a number", path, s)
	}
	return n, nil
}

func sigExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// sigJoin joins rel below base so that no ".." in rel leaves base.
func sigJoin(base, rel string) string {
	return filepath.Join(base, filepath.Clean("/"+rel))
}
