package hw

import (
	"strings"
	"testing"
)

func usageTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	writeTree(t, root, files)
	return root
}

// A container's CPU time and working set read from a v1 tree (cpuacct co-mounted with cpu, as
// Raspberry Pi OS in v1 mode mounts it) and from a v2 tree, with the values a real kernel prints.
func TestCgroupUsageV1AndV2(t *testing.T) {
	const rel = "/mqlet/default/burstable/pod1/abc"
	v1 := usageTree(t, map[string]string{
		"sys/fs/cgroup/cpu,cpuacct/cpuacct.usage":               "999\n",
		"sys/fs/cgroup/cpu,cpuacct" + rel + "/cpuacct.usage":    "2500000000\n",
		"sys/fs/cgroup/memory/memory.usage_in_bytes":            "1\n",
		"sys/fs/cgroup/memory" + rel + "/memory.usage_in_bytes": "10485760\n",
		"sys/fs/cgroup/memory" + rel + "/memory.stat":           "cache 4096\ninactive_file 1\ntotal_inactive_file 2097152\n",
	})
	v2 := usageTree(t, map[string]string{
		"sys/fs/cgroup/memory.stat":               "anon 1\n",
		"sys/fs/cgroup" + rel + "/cpu.stat":       "usage_usec 1250000\nuser_usec 1000000\nsystem_usec 250000\n",
		"sys/fs/cgroup" + rel + "/memory.current": "8388608\n",
		"sys/fs/cgroup" + rel + "/memory.stat":    "anon 4194304\nfile 4194304\ninactive_file 1048576\n",
	})
	for name, tc := range map[string]struct {
		root string
		cpu  float64
		ws   int64
	}{
		"v1": {v1, 2.5, 10485760 - 2097152},
		"v2": {v2, 1.25, 8388608 - 1048576},
	} {
		cpu, err := CgroupCPUSeconds(tc.root, rel)
		if err != nil || cpu != tc.cpu {
			t.Errorf("%s: CgroupCPUSeconds = %v, %v; want %v", name, cpu, err, tc.cpu)
		}
		mem, err := CgroupMemory(tc.root, rel)
		if err != nil || mem.WorkingSet != tc.ws {
			t.Errorf("%s: working set = %v, %v; want %v", name, mem.WorkingSet, err, tc.ws)
		}
		if _, err := CgroupCPUSeconds(tc.root, rel+"x"); !IsGone(err) {
			t.Errorf("%s: a missing cgroup: %v, want one IsGone knows", name, err)
		}
	}
	// A v2 cpu.stat without usage_usec is an error naming the file.
	bad := usageTree(t, map[string]string{"sys/fs/cgroup" + rel + "/cpu.stat": "user_usec 1\n"})
	if _, err := CgroupCPUSeconds(bad, rel); err == nil || !strings.Contains(err.Error(), "cpu.stat") {
		t.Errorf("cpu.stat without usage_usec: %v", err)
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || len(s) >= len(sub) && (s[:len(sub)] == sub || contains(s[1:], sub))
}

func TestNodeCPUSeconds(t *testing.T) {
	root := usageTree(t, map[string]string{"proc/stat": "cpu  100 20 30 4000 50 6 7 8 90 10\n" +
		"cpu0 50 10 15 2000 25 3 3 4 45 5\ncpu1 50 10 15 2000 25 3 4 4 45 5\nintr 1 2 3\nctxt 5\n"})
	got, err := NodeCPUSeconds(root)
	// user+nice+system+irq+softirq+steal = 100+20+30+6+7+8 = 171 ticks
	if err != nil || got.Seconds != 1.71 || got.CPUs != 2 {
		t.Errorf("NodeCPUSeconds = %+v, %v; want 1.71 s on 2 CPUs", got, err)
	}
	if _, err := NodeCPUSeconds(usageTree(t, map[string]string{"proc/stat": "cpu 1 x 3 4 5 6 7 8\n"})); err == nil {
		t.Error("a malformed cpu line was accepted")
	}
	// This machine's own figures: the kernel's format is what the parser expects.
	if real, err := NodeCPUSeconds("/"); err != nil || real.Seconds <= 0 || real.CPUs < 1 {
		t.Errorf("NodeCPUSeconds(/) = %+v, %v", real, err)
	}
}
