package cgroup

// Lowering memory limits under running processes, on real cgroups: TestNodeAllocatableConverges*
// and TestPodMemoryLimitDrop* run the same checks on the v1 host (realLayout) and on the v2 lane's
// guest (realV2Layout). On v2 the kernel accepts a memory.max below usage and OOM-kills until
// usage fits, which is what the checks catch: the memory-holding process must survive.

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/event"
	v1 "k8s.io/api/core/v1"
)

// memFile is the path of a memory controller file of the cgroup rel; v1 names are given, v2's
// are derived (usage_in_bytes -> current, limit_in_bytes -> max).
func memFile(l Layout, rel, v1Name string) string {
	if l.Mode == Unified {
		v2Name := map[string]string{"memory.usage_in_bytes": "memory.current", "memory.limit_in_bytes": "memory.max",
			"cgroup.procs": "cgroup.procs"}[v1Name]
		return filepath.Join(l.Unified, rel, v2Name)
	}
	return filepath.Join(l.V1["memory"], rel, v1Name)
}

func readInt(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return n
}

// memHog starts, in the (memory) cgroup rel, a dd that fills a 64 MiB buffer and then blocks
// writing it into a pipe nobody reads, holding the memory until killed. It returns once the
// cgroup's usage shows it, with a function that kills it and reports whether it was still alive
// and holding its memory (not OOM-killed) until then.
func memHog(t *testing.T, l Layout, rel string) (stop func() (aliveUntilNow bool)) {
	t.Helper()
	script := "echo $$ > " + memFile(l, rel, "cgroup.procs") + " && dd if=/dev/zero bs=64M count=1 2>/dev/null | sleep 100000"
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	// kill ends the shell, dd and sleep, and waits until the cgroup holds no process: dd and sleep
	// are not this process's children, and a v1 cgroup keeps their charge (and refuses rmdir)
	// until they are reaped.
	kill := func() {
		once.Do(func() {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
			deadline := time.Now().Add(time.Minute)
			for {
				b, err := os.ReadFile(memFile(l, rel, "cgroup.procs"))
				if err != nil || strings.TrimSpace(string(b)) == "" {
					return
				}
				if time.Now().After(deadline) {
					t.Errorf("the memory hog's processes are still in %s: %s", rel, b)
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	t.Cleanup(kill)
	// A bound, not a timing assertion: a hog that never gets its memory fails the test instead of
	// hanging it.
	deadline := time.Now().Add(2 * time.Minute)
	for readInt(t, memFile(l, rel, "memory.usage_in_bytes")) < 60<<20 {
		select {
		case <-done:
			t.Fatalf("the memory hog in %s ended before holding 64MiB: %v", rel, waitErr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the memory hog in %s never used 64MiB", rel)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Alive means the 64 MiB are still held: the shell and sleep outlive a dd the kernel killed.
	return func() bool {
		held := readInt(t, memFile(l, rel, "memory.usage_in_bytes")) >= 60<<20
		select {
		case <-done:
			return false
		default:
		}
		kill()
		return held
	}
}

type eventLog struct {
	mu sync.Mutex
	ev []event.Event
}

func (e *eventLog) emit(ev event.Event) { e.mu.Lock(); e.ev = append(e.ev, ev); e.mu.Unlock() }

func (e *eventLog) reasons() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.ev {
		out = append(out, string(ev.Type)+" "+ev.Reason+": "+ev.Message)
	}
	return out
}

// Node allocatable lowered below what the pods use (an agent restarted with a higher
// systemReserved): the base's memory limit is held at their usage plus the margin, the pods keep
// running, a Warning node event says so; once usage falls, Converge writes the target and a
// Normal event follows.
func testNodeAllocatableConverges(t *testing.T, l Layout) {
	top := testRoot(t, l)
	alloc := func(mem string) v1.ResourceList {
		return v1.ResourceList{v1.ResourceCPU: quantity("1"), v1.ResourceMemory: quantity(mem)}
	}
	quiet := slog.New(slog.DiscardHandler)
	m1, err := New(Options{CgroupRoot: top, Namespace: "ns", Allocatable: alloc("1Gi"), Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	p := pod("conv-1", ctr("a", rl("100m", ""), nil)) // Burstable, no memory limit of its own
	dir, err := m1.EnsurePod(p)
	if err != nil {
		t.Fatal(err)
	}
	stop := memHog(t, l, dir)
	base := top + "/ns"

	// The agent restarts with 16Mi of node allocatable: far below the pods' 64Mi.
	m2, err := New(Options{CgroupRoot: top, Namespace: "ns", Allocatable: alloc("16Mi"), NodeName: "n1", Log: quiet})
	if err != nil {
		t.Fatalf("New with node allocatable below usage: %v", err)
	}
	var evs eventLog
	m2.SetEvents(evs.emit) // gets the event New queued
	usage := readInt(t, memFile(l, base, "memory.usage_in_bytes"))
	limit := readInt(t, memFile(l, base, "memory.limit_in_bytes"))
	if limit < usage || limit > usage+MemoryMargin+1<<20 {
		t.Errorf("%s memory limit = %d with usage %d; want held at usage + %d", base, limit, usage, MemoryMargin)
	}
	if got := evs.reasons(); len(got) != 1 || !strings.HasPrefix(got[0], "Warning "+ReasonFailedNodeAllocatableEnforcement+": node allocatable memory 16.0Mi not enforced yet") {
		t.Errorf("events after the restart = %q, want one Warning %s", got, ReasonFailedNodeAllocatableEnforcement)
	}
	m2.Converge() // usage unchanged: still held, no second event
	if got := evs.reasons(); len(got) != 1 {
		t.Errorf("events after a Converge with usage unchanged = %q, want still one", got)
	}
	if !stop() {
		t.Fatalf("the pod's process died when node allocatable was lowered below its usage (OOM-killed?)")
	}
	m2.Converge()
	if got := readInt(t, memFile(l, base, "memory.limit_in_bytes")); got != 16<<20 {
		t.Errorf("after the pod's usage fell: %s memory limit = %d, want %d", base, got, 16<<20)
	}
	if got := evs.reasons(); len(got) != 2 || !strings.HasPrefix(got[1], "Normal "+ReasonNodeAllocatableEnforced+": ") {
		t.Errorf("events after converging = %q, want a Normal %s second", got, ReasonNodeAllocatableEnforced)
	}
	if err := m2.RemovePod("conv-1"); err != nil {
		t.Fatal(err)
	}
}

// A pod whose memory limit drops while its old container uses more than the new one: the pod
// cgroup keeps its limit (the worker replaces the container, stopping it with its grace period),
// and Tidy, after the container is removed, writes the new one.
func testPodMemoryLimitDrop(t *testing.T, l Layout) {
	top := testRoot(t, l)
	m, err := New(Options{CgroupRoot: top, Namespace: "ns", Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := m.EnsurePod(pod("drop-1", ctr("a", nil, rl("100m", "128Mi"))))
	if err != nil {
		t.Fatal(err)
	}
	stop := memHog(t, l, dir)
	if _, err := m.EnsurePod(pod("drop-1", ctr("a", nil, rl("100m", "16Mi")))); err != nil {
		t.Fatalf("EnsurePod with a lower memory limit: %v", err)
	}
	if got := readInt(t, memFile(l, dir, "memory.limit_in_bytes")); got != 128<<20 {
		t.Errorf("%s memory limit = %d while the old container runs, want the old %d", dir, got, 128<<20)
	}
	m.Tidy("drop-1") // another container went: the old one still uses too much
	if got := readInt(t, memFile(l, dir, "memory.limit_in_bytes")); got != 128<<20 {
		t.Errorf("after Tidy with the old container running: %s memory limit = %d, want %d", dir, got, 128<<20)
	}
	if !stop() {
		t.Fatalf("the old container's process died when its pod's memory limit dropped (OOM-killed?)")
	}
	m.Tidy("drop-1")
	if got := readInt(t, memFile(l, dir, "memory.limit_in_bytes")); got != 16<<20 {
		t.Errorf("after the old container went: %s memory limit = %d, want %d", dir, got, 16<<20)
	}
	if err := m.RemovePod("drop-1"); err != nil {
		t.Fatal(err)
	}
}

func TestNodeAllocatableConvergesRealV2(t *testing.T) {
	testNodeAllocatableConverges(t, realV2Layout(t))
}
func TestNodeAllocatableConvergesRealV1(t *testing.T) { testNodeAllocatableConverges(t, realLayout(t)) }
func TestPodMemoryLimitDropRealV2(t *testing.T)       { testPodMemoryLimitDrop(t, realV2Layout(t)) }
func TestPodMemoryLimitDropRealV1(t *testing.T)       { testPodMemoryLimitDrop(t, realLayout(t)) }

// podPidsLimit on a real pod cgroup: a loop that starts 20 background sleeps in a pod limited to 5
// processes gets no more than 5 (the forks past it fail), and pids.events counts the refusals.
func testPodPidsLimit(t *testing.T, l Layout) {
	top := testRoot(t, l)
	m, err := New(Options{CgroupRoot: top, Namespace: "ns", PodPidsLimit: 5, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := m.EnsurePod(pod("pids-1", ctr("a", nil, rl("100m", "32Mi"))))
	if err != nil {
		t.Fatal(err)
	}
	pidsDir := filepath.Join(l.Unified, dir)
	if l.Mode != Unified {
		pidsDir = filepath.Join(l.V1["pids"], dir)
	}
	if got := readInt(t, filepath.Join(pidsDir, "pids.max")); got != 5 {
		t.Fatalf("%s/pids.max = %d, want 5 (podPidsLimit)", pidsDir, got)
	}
	// The shell counts as one; the sleeps it manages to start stay until killed (their output goes
	// to /dev/null, so the pipe ends with the shell). dash gives up at the first fork refused and
	// exits; a shell that goes on prints "started": either way the loop is over at EOF or that.
	script := "echo $$ > " + filepath.Join(pidsDir, "cgroup.procs") + "; for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do sleep 100000 >/dev/null 2>&1 & done; echo started; exec sleep 100000 >/dev/null"
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if b, err := os.ReadFile(filepath.Join(pidsDir, "cgroup.procs")); err != nil || len(strings.TrimSpace(string(b))) == 0 {
				break
			}
		}
		if err := m.RemovePod("pids-1"); err != nil {
			t.Error(err)
		}
	}()
	buf := make([]byte, 8)
	n, _ := out.Read(buf)
	t.Logf("the fork loop said %q (nothing: the shell gave up at a refused fork)", buf[:n])
	if got := readInt(t, filepath.Join(pidsDir, "pids.current")); got > 5 || got < 2 {
		t.Errorf("%s/pids.current = %d after trying 21 processes, want at most 5 (and some)", pidsDir, got)
	}
	ev, err := os.ReadFile(filepath.Join(pidsDir, "pids.events"))
	if err != nil {
		t.Fatal(err)
	}
	if refused := parseKV(ev)["max"]; refused == 0 {
		t.Errorf("%s/pids.events = %q, want the forks refused at the limit counted", pidsDir, ev)
	}
}

func TestPodPidsLimitRealV2(t *testing.T) { testPodPidsLimit(t, realV2Layout(t)) }
func TestPodPidsLimitRealV1(t *testing.T) { testPodPidsLimit(t, realLayout(t)) }
