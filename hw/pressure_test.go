package hw

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestNodeMemoryFixtures(t *testing.T) {
	// Expected values are worked out from the fixture files by hand: available = MemTotal -
	// (usage - inactive_file), with usage from the v1 root cgroup or, on v2, MemTotal - MemFree.
	tests := []struct {
		tree string
		want MemoryStats
	}{
		{"rpi4", MemoryStats{Capacity: 3882236 << 10, Usage: (3882236 - 2769152) << 10, InactiveFile: 422195200,
			WorkingSet: 1139798016 - 422195200, Available: 3975409664 - 717602816, Source: "cgroup v2"}},
		{"rpi5", MemoryStats{Capacity: 8245616 << 10, Usage: (8245616 - 6920432) << 10, InactiveFile: 408289280,
			WorkingSet: 1356988416 - 408289280, Available: 8443510784 - 948699136, Source: "cgroup v2"}},
		// MemFree would give a different answer here: v1 takes the root cgroup's usage.
		{"x86", MemoryStats{Capacity: 32780412 << 10, Usage: 11874336768, InactiveFile: 3195330560,
			WorkingSet: 11874336768 - 3195330560, Available: 33567141888 - 8679006208, Source: "cgroup v1"}},
	}
	for _, tt := range tests {
		t.Run(tt.tree, func(t *testing.T) {
			got, err := NodeMemory(filepath.Join("testdata", tt.tree))
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("NodeMemory =\n %+v\nwant\n %+v", got, tt.want)
			}
		})
	}
}

func TestNodeMemoryWithoutMemoryController(t *testing.T) {
	// Raspberry Pi OS without cgroup_enable=memory: no memory.stat at the v2 root. The signal falls
	// back to meminfo alone (usage MemTotal - MemFree, inactive file Inactive(file)).
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"proc/meminfo":                     "MemTotal: 1000 kB\nMemFree: 300 kB\nMemAvailable: 900 kB\nInactive(file): 100 kB\n",
		"sys/fs/cgroup/cgroup.controllers": "cpuset cpu io pids\n",
	})
	got, err := NodeMemory(root)
	if err != nil {
		t.Fatal(err)
	}
	want := MemoryStats{Capacity: 1000 << 10, Usage: 700 << 10, InactiveFile: 100 << 10, WorkingSet: 600 << 10,
		Available: 400 << 10, Source: "meminfo"}
	if got != want {
		t.Errorf("NodeMemory = %+v, want %+v", got, want)
	}
}

func TestNodeMemoryErrors(t *testing.T) {
	if _, err := NodeMemory(t.TempDir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no meminfo: err %v, want not-exist", err)
	}
	root := t.TempDir()
	writeTree(t, root, map[string]string{"proc/meminfo": "MemFree: 1 kB\n"})
	if _, err := NodeMemory(root); err == nil {
		t.Errorf("meminfo without MemTotal: no error")
	}
	root = t.TempDir()
	writeTree(t, root, map[string]string{
		"proc/meminfo": "MemTotal: 1000 kB\nMemFree: 300 kB\n",
		"sys/fs/cgroup/memory/memory.usage_in_bytes": "lots\n",
	})
	if _, err := NodeMemory(root); err == nil {
		t.Errorf("unreadable usage_in_bytes: no error")
	}
}

// A usage below inactive_file (the counters are read at different instants) is a working set of 0,
// not a negative one that would make available exceed capacity.
func TestNodeMemoryClampsWorkingSet(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"proc/meminfo": "MemTotal: 1000 kB\nMemFree: 300 kB\n",
		"sys/fs/cgroup/memory/memory.usage_in_bytes": "1000\n",
		"sys/fs/cgroup/memory/memory.stat":           "total_inactive_file 5000\n",
	})
	got, err := NodeMemory(root)
	if err != nil {
		t.Fatal(err)
	}
	if got.WorkingSet != 0 || got.Available != 1000<<10 {
		t.Errorf("NodeMemory = %+v, want working set 0 and available = capacity", got)
	}
}

func TestCgroupMemoryFixtures(t *testing.T) {
	tests := []struct {
		tree, rel string
		want      CgroupMemoryStats
		procs     int64
	}{
		// No pids controller in this pod cgroup: the processes of every cgroup.procs below it.
		{"rpi4", "/mqlet/default/pod0b7c5e7e-5d1a-4c0b-9d3e-6f1f0b2a4c11",
			CgroupMemoryStats{Usage: 52428800, InactiveFile: 6291456, WorkingSet: 52428800 - 6291456}, 3},
		{"rpi5", "/mqlet/default/besteffort/pod5e2d8a41-7c3b-4f6e-8a1d-2b9c0e4f7a33",
			CgroupMemoryStats{Usage: 157286400, InactiveFile: 20971520, WorkingSet: 157286400 - 20971520, Limit: 200 << 20}, 7},
		// v1's "no limit" (the page-rounded maximum) is no limit; rpi4's pod has no memory.max file.
		{"x86", "mqlet/default/pod9a3f1c2e-1111-4e5f-8c9d-0a1b2c3d4e5f",
			CgroupMemoryStats{Usage: 734003200, InactiveFile: 146800640, WorkingSet: 734003200 - 146800640}, 12},
	}
	for _, tt := range tests {
		t.Run(tt.tree, func(t *testing.T) {
			root := filepath.Join("testdata", tt.tree)
			got, err := CgroupMemory(root, tt.rel)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("CgroupMemory = %+v, want %+v", got, tt.want)
			}
			n, err := CgroupProcesses(root, tt.rel)
			if err != nil || n != tt.procs {
				t.Errorf("CgroupProcesses = %d, %v; want %d", n, err, tt.procs)
			}
			if _, err := CgroupMemory(root, "/mqlet/default/podgone"); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("CgroupMemory of a missing cgroup: err %v, want not-exist", err)
			}
			if _, err := CgroupProcesses(root, "/mqlet/default/podgone"); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("CgroupProcesses of a missing cgroup: err %v, want not-exist", err)
			}
		})
	}
}

// A cgroup path from a pod cannot make the reader climb out of the hierarchy.
func TestCgroupMemoryStaysInHierarchy(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{
		"sys/fs/cgroup/memory.current": "1\n",
		"sys/fs/cgroup/memory.stat":    "inactive_file 0\n",
		"memory.current":               "999\n",
		"memory.stat":                  "inactive_file 0\n",
	})
	got, err := CgroupMemory(root, "../../..")
	if err != nil || got.Usage != 1 {
		t.Errorf("CgroupMemory(../../..) = %+v, %v; want the hierarchy root's usage 1", got, err)
	}
}

func TestPIDsFixtures(t *testing.T) {
	tests := []struct {
		tree string
		want PIDStats
	}{
		{"rpi4", PIDStats{Max: 30185, Running: 187, Available: 30185 - 187}},    // threads-max below pid_max
		{"rpi5", PIDStats{Max: 63704, Running: 214, Available: 63704 - 214}},    // the same on a 64-bit pid_max
		{"x86", PIDStats{Max: 255731, Running: 3518, Available: 255731 - 3518}}, // total, not runnable, of 2/3518
	}
	for _, tt := range tests {
		got, err := PIDs(filepath.Join("testdata", tt.tree))
		if err != nil || got != tt.want {
			t.Errorf("%s: PIDs = %+v, %v; want %+v", tt.tree, got, err, tt.want)
		}
	}
	root := t.TempDir()
	writeTree(t, root, map[string]string{"proc/sys/kernel/pid_max": "100\n", "proc/loadavg": "0.1 0.1 0.1 7 9\n"})
	if _, err := PIDs(root); err == nil {
		t.Errorf("loadavg without runnable/total: no error")
	}
	// threads-max absent: pid_max alone.
	writeTree(t, root, map[string]string{"proc/loadavg": "0.1 0.1 0.1 1/9 9\n"})
	if got, err := PIDs(root); err != nil || got.Available != 91 {
		t.Errorf("PIDs without threads-max = %+v, %v; want available 91", got, err)
	}
	if _, err := PIDs(t.TempDir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("PIDs of an empty tree: err %v, want not-exist", err)
	}
}

// PIDMax is the node's pid capacity: pid_max, or threads-max when lower; an error without pid_max.
func TestPIDMax(t *testing.T) {
	for tree, want := range map[string]int64{"rpi4": 30185, "x86": 255731} {
		if got, err := PIDMax(filepath.Join("testdata", tree)); err != nil || got != want {
			t.Errorf("%s: PIDMax = %d, %v; want %d", tree, got, err, want)
		}
	}
	if _, err := PIDMax(t.TempDir()); err == nil {
		t.Error("no error without /proc/sys/kernel")
	}
}

func TestPressureFixtures(t *testing.T) {
	for _, tree := range []string{"rpi4", "rpi5", "x86"} {
		root := filepath.Join("testdata", tree)
		mem, err := Pressure(root, "memory")
		if err != nil {
			t.Fatalf("%s: %v", tree, err)
		}
		want := PSI{Some: PSILine{1.25, 0.50, 0.10, 4125000}, Full: PSILine{0.40, 0.12, 0.02, 1200400}, HasFull: true}
		if mem != want {
			t.Errorf("%s: memory pressure = %+v, want %+v", tree, mem, want)
		}
		io, err := Pressure(root, "io")
		if err != nil || io.Full.TotalMicros != 2200110 {
			t.Errorf("%s: io pressure = %+v, %v", tree, io, err)
		}
	}
	// An older kernel's cpu file has no "full" line.
	cpu, err := Pressure(filepath.Join("testdata", "x86"), "cpu")
	if err != nil || cpu.HasFull || cpu.Some.TotalMicros != 98765432 {
		t.Errorf("x86 cpu pressure = %+v, %v; want some only", cpu, err)
	}
	if _, err := Pressure(t.TempDir(), "memory"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("kernel without PSI: err %v, want not-exist", err)
	}
	root := t.TempDir()
	writeTree(t, root, map[string]string{"proc/pressure/memory": "some avg10=x avg60=0 avg300=0 total=0\n"})
	if _, err := Pressure(root, "memory"); err == nil {
		t.Errorf("bad avg10: no error")
	}
}

// The readers on this machine's own /proc and /sys: they must answer with sane numbers.
func TestSignalsOnThisMachine(t *testing.T) {
	m, err := NodeMemory("/")
	if err != nil {
		t.Fatal(err)
	}
	if m.Capacity <= 0 || m.Available <= 0 || m.Available > m.Capacity || m.Usage <= 0 {
		t.Errorf("NodeMemory(/) = %+v", m)
	}
	p, err := PIDs("/")
	if err != nil || p.Running <= 0 || p.Available <= 0 {
		t.Errorf("PIDs(/) = %+v, %v", p, err)
	}
	if _, err := os.Stat("/proc/pressure/memory"); err == nil {
		if _, err := Pressure("/", "memory"); err != nil {
			t.Errorf("Pressure(/, memory): %v", err)
		}
	}
	// This test's own memory cgroup (v1 "N:memory:/path", else v2 "0::/path").
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	rel := ""
	for _, line := range strings.Split(strings.TrimSpace(string(self)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && (slices.Contains(strings.Split(parts[1], ","), "memory") || (parts[0] == "0" && rel == "")) {
			rel = parts[2]
		}
	}
	cg, err := CgroupMemory("/", rel)
	if err != nil {
		t.Fatalf("CgroupMemory(/, %s): %v", rel, err)
	}
	if cg.Usage <= 0 || cg.WorkingSet > cg.Usage {
		t.Errorf("CgroupMemory(/, %s) = %+v", rel, cg)
	}
}

func writeTree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for rel, content := range files {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
