package hw

// CPU time used, read the way cAdvisor (and so kubelet's resource metrics) read it, from the
// same trees as the pressure readers: a cgroup's cumulative CPU time, and the node's.

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// v1CPUAcct are where the cpuacct controller's hierarchy is mounted under sys/fs/cgroup: on its
// own (this build machine), or co-mounted with cpu (Debian, Raspberry Pi OS in v1 mode), which
// systemd links as both cpuacct and cpu,cpuacct.
var v1CPUAcct = []string{"cpuacct", "cpu,cpuacct", "cpuacct,cpu"}

// CgroupCPUSeconds reads the cumulative CPU time, in seconds, of the cgroup rel (its path below
// each hierarchy's root, such as /mqlet/default/pod<uid>/<container id>) under root: cpuacct.usage
// (nanoseconds) in the v1 cpuacct hierarchy, else usage_usec of cpu.stat in the v2 hierarchy, as
// cAdvisor reads container_cpu_usage_seconds_total. rel cannot climb out of the hierarchy.
func CgroupCPUSeconds(root, rel string) (float64, error) {
	base := filepath.Join(root, cgroupMount)
	for _, h := range v1CPUAcct {
		if !sigExists(filepath.Join(base, h, "cpuacct.usage")) {
			continue
		}
		ns, err := sigReadInt(filepath.Join(sigJoin(filepath.Join(base, h), rel), "cpuacct.usage"))
		if err != nil {
			return 0, err
		}
		return float64(ns) / 1e9, nil
	}
	path := filepath.Join(sigJoin(base, rel), "cpu.stat")
	stat, err := sigKeyedInts(path)
	if err != nil {
		return 0, err
	}
	usec, ok := stat["usage_usec"]
	if !ok {
		return 0, fmt.Errorf("%s: no usage_usec line", path)
	}
	return float64(usec) / 1e6, nil
}

// userHZ is the unit of /proc/stat's CPU times: USER_HZ, 100 on every architecture Linux runs Go
// binaries on (it is fixed in the kernel's ABI, whatever CONFIG_HZ is).
const userHZ = 100

// NodeCPU is the node's CPU time since boot, from the first line of /proc/stat.
type NodeCPU struct {
	// Seconds is the time all CPUs spent on something other than idle and iowait: user, nice,
	// system, irq, softirq and steal (guest time is already in user and nice).
	Seconds float64
	// CPUs is how many cpuN lines /proc/stat has: the online CPUs.
	CPUs int
}

// NodeCPUSeconds reads root/proc/stat.
func NodeCPUSeconds(root string) (NodeCPU, error) {
	path := filepath.Join(root, "proc/stat")
	f, err := os.Open(path)
	if err != nil {
		return NodeCPU{}, err
	}
	defer f.Close()
	var out NodeCPU
	found := false
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) == 0 || !strings.HasPrefix(fields[0], "cpu") {
			continue
		}
		if fields[0] != "cpu" {
			out.CPUs++
			continue
		}
		// cpu user nice system idle iowait irq softirq steal guest guest_nice
		if len(fields) < 8 {
			return NodeCPU{}, fmt.Errorf("%s: cpu line %q has %d fields, want at least 8", path, s.Text(), len(fields)-1)
		}
		var busy uint64
		for i, f := range fields[1:] {
			if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest times are counted in user and nice
				continue
			}
			n, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return NodeCPU{}, fmt.Errorf("%s: cpu line %q: field %d is not a number", path, s.Text(), i+1)
			}
			busy += n
		}
		out.Seconds = float64(busy) / userHZ
		found = true
	}
	if err := s.Err(); err != nil {
		return NodeCPU{}, fmt.Errorf("%s: %w", path, err)
	}
	if !found {
		return NodeCPU{}, fmt.Errorf("%s: no cpu line: %w", path, fs.ErrNotExist)
	}
	return out, nil
}

// IsGone reports whether err means a cgroup that is not there (any more): its container exited
// and runc removed it between listing and reading. Such a reading is skipped, not reported.
func IsGone(err error) bool { return errors.Is(err, fs.ErrNotExist) }
