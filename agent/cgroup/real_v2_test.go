package cgroup

// Tests on a real cgroup v2 hierarchy (a v2-only host: Raspberry Pi OS, Debian 12, the lane's
// guest booted by `make test-vm`). They skip on a v1 or hybrid host; MQLET_TEST_REQUIRE_V2=1 (set
// by the guest's runner, scripts/vm/guest.sh) turns that skip into a failure, so a lane that
// silently booted the wrong kernel command line cannot pass without ever touching v2.

import (
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// realV2Layout returns the host's layout when it is cgroup v2 only and the test runs as root.
func realV2Layout(t *testing.T) Layout {
	t.Helper()
	skip := func(why string) {
		if os.Getenv("MQLET_TEST_REQUIRE_V2") == "1" {
			t.Fatalf("a real cgroup v2 hierarchy is required (MQLET_TEST_REQUIRE_V2=1): %s", why)
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
	if l.Mode != Unified {
		skip("these tests are for a cgroup v2-only host; this one is " + l.Mode.String())
	}
	return l
}

func v2File(t *testing.T, l Layout, rel, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(l.Unified, rel, file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// The hierarchy on the real v2 hierarchy: node allocatable on the base, the controllers enabled
// level by level (a v2 cgroup has the files of only what its parent enables), a pod of each class
// with kubelet's memory.max, cpu.max and cpu.weight, the Burstable tier's weight following its
// pods, and nothing left after RemovePod.
func TestManagerRealV2(t *testing.T) {
	l := realV2Layout(t)
	top := testRoot(t, l)
	alloc := v1.ResourceList{v1.ResourceCPU: quantity("3500m"), v1.ResourceMemory: quantity("1Gi"), ResourcePID: quantity("5000")}
	m, err := New(Options{CgroupRoot: top, Namespace: "ns", Allocatable: alloc, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("New on the real v2 hierarchy %s: %v", l.Unified, err)
	}
	base := top + "/ns"
	// A level enables the controllers for its children when its first child is made.
	delegates := func(dirs ...string) {
		t.Helper()
		for _, dir := range dirs {
			on := strings.Fields(v2File(t, l, dir, "cgroup.subtree_control"))
			for _, c := range required {
				if !slices.Contains(on, c) {
					t.Errorf("%s/cgroup.subtree_control = %v, want %s enabled for its children", dir, on, c)
				}
			}
		}
	}
	delegates(top, base)
	type check struct{ rel, file, want string }
	expect := func(checks []check) {
		t.Helper()
		for _, c := range checks {
			if got := v2File(t, l, c.rel, c.file); got != c.want {
				t.Errorf("%s/%s = %q, want %q", c.rel, c.file, got, c.want)
			}
		}
	}
	expect([]check{
		{top, "cpu.weight", "272"}, // 3584 shares, by runc's conversion (as in TestManagerV2Fixture)
		{base, "cpu.weight", "272"},
		{base, "memory.max", "1073741824"},
		{base, "pids.max", "5000"},
		{base, "cpu.max", "max 100000"},
		{base + "/besteffort", "cpu.weight", "1"},
		{base + "/burstable", "cpu.weight", "1"},
	})
	for _, p := range []*v1.Pod{guaranteed, burstable, partly, besteffort} {
		dir, err := m.EnsurePod(p)
		if err != nil {
			t.Fatalf("EnsurePod %s: %v", p.UID, err)
		}
		if want := filepath.Join(base, Tier(classOf(p)), "pod"+string(p.UID)); dir != want {
			t.Errorf("pod %s in %s, want %s", p.UID, dir, want)
		}
	}
	delegates(base+"/burstable", base+"/besteffort")
	expect([]check{
		{base + "/podg-1", "memory.max", "67108864"},
		{base + "/podg-1", "cpu.max", "50000 100000"},
		{base + "/podg-1", "cpu.weight", "59"}, // 512 shares
		{base + "/burstable/podb-1", "memory.max", "67108864"},
		{base + "/burstable/podb-1", "cpu.max", "100000 100000"},
		{base + "/burstable/podb-2", "memory.max", "max"},
		{base + "/burstable/podb-2", "cpu.max", "max 100000"},
		{base + "/besteffort/pode-1", "memory.max", "max"},
		{base + "/besteffort/pode-1", "cpu.weight", "1"},
		{base + "/burstable", "cpu.weight", "67"}, // 600m of requests -> 614 shares
	})
	if uids, err := m.PodUIDs(); err != nil || strings.Join(uids, ",") != "b-1,b-2,e-1,g-1" {
		t.Errorf("PodUIDs = %v, %v; want b-1,b-2,e-1,g-1", uids, err)
	}

	m.RemovePod("b-1")
	expect([]check{{base + "/burstable", "cpu.weight", "40"}}) // 200m -> 204 shares
	for _, uid := range []string{"g-1", "b-2", "e-1"} {
		if err := m.RemovePod(uid); err != nil {
			t.Errorf("RemovePod %s: %v", uid, err)
		}
	}
	for _, t2 := range tiers {
		entries, _ := os.ReadDir(filepath.Join(l.Unified, base, t2))
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), "pod") {
				t.Errorf("left after RemovePod: %s", filepath.Join(l.Unified, base, t2, e.Name()))
			}
		}
	}
	if uids, err := m.PodUIDs(); err != nil || len(uids) != 0 {
		t.Errorf("PodUIDs after removal = %v, %v; want none", uids, err)
	}
}

// A process that allocates past its pod cgroup's memory.max is killed by the kernel, and
// memory.events says so after it has died: what the agent reads for a kill it did not see.
func TestOOMKilledRealV2(t *testing.T) {
	l := realV2Layout(t)
	top := testRoot(t, l)
	m, err := New(Options{CgroupRoot: top, Namespace: "ns", Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("New on the real v2 hierarchy %s: %v", l.Unified, err)
	}
	p := pod("oom-1", ctr("a", nil, rl("100m", "16Mi")))
	dir, err := m.EnsurePod(p)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := m.OOMKilled(dir, 0); err != nil || got {
		t.Fatalf("fresh cgroup %s: OOMKilled = %v, %v; want false", dir, got, err)
	}
	// The shell joins the pod's cgroup itself, then becomes dd, which fills a 64 MiB buffer: one
	// process in the cgroup, so it is the one the kernel kills. The guest has no swap, so the
	// limit cannot be met by swapping out instead.
	script := "echo $$ > " + filepath.Join(l.Unified, dir, "cgroup.procs") + " && exec dd if=/dev/zero of=/dev/null bs=64M count=1"
	cmd := exec.Command("sh", "-c", script)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		// Not a timing assertion: a bound so a broken limit fails the test instead of hanging it.
		cmd.Process.Kill()
		t.Fatalf("dd allocating 64MiB in %s (memory.max 16MiB) was not killed within 2 minutes", dir)
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("dd in %s ended with %v, want killed by SIGKILL (OOM-killed); memory.events:\n%s", dir, err, v2File(t, l, dir, "memory.events"))
	}
	if got, err := m.OOMKilled(dir, 137); err != nil || !got {
		t.Errorf("after the kill: OOMKilled(%s) = %v, %v; want true; memory.events:\n%s", dir, got, err, v2File(t, l, dir, "memory.events"))
	}
	if err := m.RemovePod("oom-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.OOMKilled(dir, 137); !errors.Is(err, ErrNoCgroup) {
		t.Errorf("removed cgroup %s: err = %v, want ErrNoCgroup", dir, err)
	}
}
