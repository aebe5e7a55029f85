package cgroup

// Tests on this machine's real cgroups (v1 hybrid: the controllers in v1 hierarchies, a cgroup2
// hierarchy without them at /sys/fs/cgroup/unified). Each test works under a cgroup root of its own
// and removes it when it ends.

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// realLayout skips (or fails, with MQLET_TEST_REQUIRE=1) where the test cannot make cgroups.
func realLayout(t *testing.T) Layout {
	t.Helper()
	skip := func(why string) {
		if os.Getenv("MQLET_TEST_REQUIRE") == "1" {
			t.Fatalf("real cgroups required: %s", why)
		}
		t.Skip(why)
	}
	if os.Geteuid() != 0 {
		skip("needs root to make cgroups")
	}
	l, err := Detect("/proc/self/mountinfo", "/")
	if err != nil {
		t.Fatal(err)
	}
	if l.Mode != Legacy && l.Mode != Hybrid {
		skip("these tests are for a cgroup v1 host; this one is " + l.Mode.String())
	}
	return l
}

// testRoot is a cgroup root of this test's own, removed (with everything below) at the end.
func testRoot(t *testing.T, l Layout) string {
	b := make([]byte, 4)
	rand.Read(b)
	root := "/mqlet-cgtest-" + hex.EncodeToString(b)
	t.Cleanup(func() {
		m := &Manager{layout: l}
		if err := m.removeTree(root); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		for _, mnt := range l.Mounts {
			if _, err := os.Stat(filepath.Join(mnt, root)); err == nil {
				t.Errorf("cleanup left %s", filepath.Join(mnt, root))
			}
		}
	})
	return root
}

func v1File(t *testing.T, l Layout, controller, rel, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(l.V1[controller], rel, file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func exists(l Layout, controller, rel string) bool {
	_, err := os.Stat(filepath.Join(l.V1[controller], rel))
	return err == nil
}

// The hierarchy on real v1 cgroups: node allocatable on the base, the tiers, a pod of each class
// with kubelet's limits; a pod whose class changes moves, and its old cgroup goes once its last
// process has; RemovePod leaves nothing in any hierarchy.
func TestManagerRealV1(t *testing.T) {
	l := realLayout(t)
	top := testRoot(t, l)
	alloc := v1.ResourceList{v1.ResourceCPU: quantity("1500m"), v1.ResourceMemory: quantity("1Gi"), ResourcePID: quantity("5000")}
	m, err := New(Options{CgroupRoot: top, Namespace: "ns", Allocatable: alloc, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	base := top + "/ns"
	checks := []struct{ controller, rel, file, want string }{
		{"cpu", top, "cpu.shares", "1536"},
		{"cpu", base, "cpu.shares", "1536"},
		{"memory", base, "memory.limit_in_bytes", "1073741824"},
		{"pids", base, "pids.max", "5000"},
		{"cpu", base + "/besteffort", "cpu.shares", "2"},
		{"cpu", base + "/burstable", "cpu.shares", "2"},
	}
	for _, c := range checks {
		if got := v1File(t, l, c.controller, c.rel, c.file); got != c.want {
			t.Errorf("%s %s/%s = %s, want %s", c.controller, c.rel, c.file, got, c.want)
		}
	}
	for _, p := range []*v1.Pod{guaranteed, burstable, besteffort} {
		if _, err := m.EnsurePod(p); err != nil {
			t.Fatalf("EnsurePod %s: %v", p.UID, err)
		}
	}
	checks = append(checks[:0], []struct{ controller, rel, file, want string }{
		{"cpu", base + "/podg-1", "cpu.shares", "512"},
		{"cpu", base + "/podg-1", "cpu.cfs_quota_us", "50000"},
		{"memory", base + "/podg-1", "memory.limit_in_bytes", "67108864"},
		{"cpu", base + "/burstable/podb-1", "cpu.shares", "307"},
		{"cpu", base + "/burstable/podb-1", "cpu.cfs_quota_us", "100000"},
		{"memory", base + "/burstable/podb-1", "memory.limit_in_bytes", "67108864"},
		{"cpu", base + "/burstable", "cpu.shares", "307"},
		{"cpu", base + "/besteffort/pode-1", "cpu.shares", "2"},
		{"cpu", base + "/besteffort/pode-1", "cpu.cfs_quota_us", "-1"},
		{"memory", base + "/besteffort/pode-1", "memory.limit_in_bytes", "9223372036854771712"},
	}...)
	for _, c := range checks {
		if got := v1File(t, l, c.controller, c.rel, c.file); got != c.want {
			t.Errorf("%s %s/%s = %s, want %s", c.controller, c.rel, c.file, got, c.want)
		}
	}
	// A new v1 cpuset has no CPUs; each level got its parent's.
	if _, ok := l.V1["cpuset"]; ok {
		if got, want := v1File(t, l, "cpuset", base+"/burstable/podb-1", "cpuset.cpus"), v1File(t, l, "cpuset", "/", "cpuset.cpus"); got != want {
			t.Errorf("pod cpuset.cpus = %q, want the root's %q", got, want)
		}
	}

	// b-1 turns Guaranteed while a process of its still lives in the Burstable cgroup: the new
	// cgroup is made, the old stays until the process is gone and Tidy runs.
	oldDir := base + "/burstable/podb-1"
	proc := exec.Command("sleep", "60")
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proc.Process.Kill(); proc.Wait() })
	if err := os.WriteFile(filepath.Join(l.V1["memory"], oldDir, "cgroup.procs"), []byte(strconv.Itoa(proc.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	moved := pod("b-1", ctr("a", nil, rl("1", "64Mi")))
	dir, err := m.EnsurePod(moved)
	if err != nil || dir != base+"/podb-1" {
		t.Fatalf("EnsurePod after the class change = %q, %v; want %s/podb-1", dir, err, base)
	}
	if !exists(l, "memory", oldDir) {
		t.Fatal("the old cgroup, still holding a process, was removed")
	}
	if exists(l, "cpu", oldDir) {
		t.Error("the old cgroup in the cpu hierarchy, empty, was kept")
	}
	if got := v1File(t, l, "cpu", base+"/burstable", "cpu.shares"); got != "2" {
		t.Errorf("burstable shares after b-1 left = %s, want 2", got)
	}
	proc.Process.Kill()
	proc.Wait()
	m.Tidy("b-1")
	if exists(l, "memory", oldDir) {
		t.Error("the old cgroup stays after its last process went and Tidy ran")
	}

	for _, uid := range []string{"g-1", "b-1", "e-1"} {
		if err := m.RemovePod(uid); err != nil {
			t.Errorf("RemovePod %s: %v", uid, err)
		}
	}
	for _, mnt := range l.Mounts {
		for _, t2 := range tiers {
			entries, _ := os.ReadDir(filepath.Join(mnt, base, t2))
			for _, e := range entries {
				if e.IsDir() && strings.HasPrefix(e.Name(), "pod") {
					t.Errorf("left after RemovePod: %s", filepath.Join(mnt, base, t2, e.Name()))
				}
			}
		}
	}
	if uids, err := m.PodUIDs(); err != nil || len(uids) != 0 {
		t.Errorf("PodUIDs after removal = %v, %v", uids, err)
	}
}

// A process that allocates past its cgroup's memory limit is killed by the kernel, and the
// cgroup's counters say so after it has died: what the agent reads for a kill it did not see.
func TestOOMKilledRealV1(t *testing.T) {
	l := realLayout(t)
	top := testRoot(t, l)
	m, err := New(Options{CgroupRoot: top, Namespace: "ns", Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	p := pod("oom-1", ctr("a", nil, rl("100m", "16Mi")))
	dir, err := m.EnsurePod(p)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := m.OOMKilled(dir, 0); err != nil || got {
		t.Fatalf("fresh cgroup: OOMKilled = %v, %v", got, err)
	}
	// The shell joins the pod's memory cgroup itself, then becomes dd, which fills a 64 MiB
	// buffer: one process in the cgroup, so it is the one the kernel kills (with a pipeline the
	// kernel could pick the shell and leave the others behind, the cgroup then busy).
	script := "echo $$ > " + filepath.Join(l.V1["memory"], dir, "cgroup.procs") + " && exec dd if=/dev/zero of=/dev/null bs=64M count=1"
	cmd := exec.Command("sh", "-c", script)
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the allocating process was not killed within 30s")
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("dd ended with %v, want killed by SIGKILL (OOM-killed)", err)
	}
	if got, err := m.OOMKilled(dir, 137); err != nil || !got {
		t.Errorf("after the kill: OOMKilled = %v, %v; want true", got, err)
	}
	if err := m.RemovePod("oom-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.OOMKilled(dir, 137); !errors.Is(err, ErrNoCgroup) {
		t.Errorf("removed cgroup: err = %v, want ErrNoCgroup", err)
	}
}

// The machine's real cgroup2 hierarchy has no controllers (they are bound to v1 hierarchies): a
// host that mounted only it would be refused, with the cause read from the real /proc/cgroups.
func TestRealV2WithoutControllersRefused(t *testing.T) {
	l := realLayout(t)
	if l.Unified == "" {
		t.Skip("no cgroup2 hierarchy mounted")
	}
	mi := filepath.Join(t.TempDir(), "mountinfo")
	os.WriteFile(mi, []byte("41 31 0:38 / "+l.Unified+" rw,relatime - cgroup2 cgroup2 rw\n"), 0o644)
	_, err := New(Options{Mountinfo: mi, CgroupRoot: "/mqlet-cgtest-never", Namespace: "ns", Log: slog.New(slog.DiscardHandler)})
	var ce *ControllerError
	if !errors.As(err, &ce) || strings.Join(ce.Missing, ",") != "cpu,memory,pids" {
		t.Fatalf("New on a cgroup2 mount without controllers = %v, want cpu, memory and pids missing", err)
	}
	if !strings.Contains(err.Error(), "attached to a cgroup v1 hierarchy") {
		t.Errorf("error does not say the controllers are in v1 hierarchies:\n%v", err)
	}
	if _, err := os.Stat(filepath.Join(l.Unified, "mqlet-cgtest-never")); err == nil {
		os.Remove(filepath.Join(l.Unified, "mqlet-cgtest-never"))
		t.Error("a refused host got cgroups made anyway")
	}
}

// Node allocatable lowered below what pods already use (an operator raised systemReserved): the
// agent still starts, the limit is held at the pods' usage plus MemoryMargin (the kernel would
// refuse the new one), and the new limit is set once usage went down.
func TestNodeAllocatableBelowUsageRetried(t *testing.T) {
	l := realLayout(t)
	top := testRoot(t, l)
	opts := Options{CgroupRoot: top, Namespace: "ns", Log: slog.New(slog.DiscardHandler),
		Allocatable: v1.ResourceList{v1.ResourceMemory: quantity("1Gi")}}
	m, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := m.EnsurePod(besteffort)
	if err != nil {
		t.Fatal(err)
	}
	// 24 MiB of touched memory, held; the process joins the pod's memory cgroup before allocating.
	procs := filepath.Join(l.V1["memory"], dir, "cgroup.procs")
	cmd := exec.Command("python3", "-c", "import os,time,sys; open(sys.argv[1],'w').write(str(os.getpid())); b=b'a'*(24<<20); print('held', flush=True); time.sleep(60)", procs)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("python3: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	buf := make([]byte, 5)
	if _, err := out.Read(buf); err != nil || string(buf[:4]) != "held" {
		t.Fatalf("allocating process: %q, %v", buf, err)
	}

	opts.Allocatable = v1.ResourceList{v1.ResourceMemory: quantity("8Mi")}
	m2, err := New(opts)
	if err != nil {
		t.Fatalf("New with allocatable below usage: %v (the agent must still start)", err)
	}
	usage, _ := strconv.ParseInt(v1File(t, l, "memory", top+"/ns", "memory.usage_in_bytes"), 10, 64)
	if got, _ := strconv.ParseInt(v1File(t, l, "memory", top+"/ns", "memory.limit_in_bytes"), 10, 64); got < usage || got > usage+MemoryMargin+1<<20 {
		t.Fatalf("base limit = %d with usage %d, want it held at usage + %d while usage is above the new one", got, usage, MemoryMargin)
	}
	cmd.Process.Kill()
	cmd.Wait()
	m2.EnsurePod(besteffort)
	m2.Tidy(string(besteffort.UID))
	if got := v1File(t, l, "memory", top+"/ns", "memory.limit_in_bytes"); got != strconv.Itoa(8<<20) {
		t.Errorf("base limit after usage went down = %s, want %d", got, 8<<20)
	}
}
