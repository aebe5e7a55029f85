package eviction

// A test on a real cgroup v2 hierarchy (the lane's guest, `make test-vm`). It skips elsewhere;
// MQLET_TEST_REQUIRE_V2=1 (set by scripts/vm/guest.sh) turns the skip into a failure.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

func requireV2(t *testing.T) {
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
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		skip("/sys/fs/cgroup is not a cgroup v2 hierarchy")
	}
}

// onePod is the agent for one real process in a pod cgroup: Evict kills it, as the worker would
// stop its containers.
type onePod struct {
	mu      sync.Mutex
	pod     *v1.Pod
	proc    *os.Process
	evicted []string
}

func (o *onePod) List() []Pod {
	o.mu.Lock()
	defer o.mu.Unlock()
	return []Pod{{Pod: o.pod.DeepCopy()}}
}

func (o *onePod) Evict(_ types.UID, msg string, _ *time.Duration) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.evicted = append(o.evicted, msg)
	o.pod.Status.Phase, o.pod.Status.Reason = v1.PodFailed, Reason
	o.proc.Kill()
	return true
}

func (o *onePod) Release(*v1.Pod) error { return nil }

// allocatableMemory.available on the real kernel: a pod whose memory grows in a pods' cgroup with
// a 128 MiB memory.max (node allocatable enforced; the node itself has plenty, so memory.available
// never crosses) is evicted with kubelet's memory message before the kernel OOM-kills anything in
// that cgroup (its memory.events oom_kill stays 0). Without the signal the kernel kills it.
func TestAllocatableMemoryEvictionRealV2(t *testing.T) {
	requireV2(t)
	const fs = "/sys/fs/cgroup"
	write := func(path, s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatalf("write %q to %s: %v", s, path, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(fs, "cgroup.subtree_control")); !strings.Contains(string(b), "memory") {
		write(filepath.Join(fs, "cgroup.subtree_control"), "+memory")
	}
	rel := fmt.Sprintf("/mqlet-evict-test-%d", os.Getpid())
	podRel := rel + "/pod1"
	if err := os.Mkdir(fs+rel, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(fs + podRel); os.Remove(fs + rel) })
	write(fs+rel+"/memory.max", "134217728")
	write(fs+rel+"/cgroup.subtree_control", "+memory")
	if err := os.Mkdir(fs+podRel, 0o755); err != nil {
		t.Fatal(err)
	}
	// 4 MiB more every half second, each in its own variable (no copy of the whole), until
	// stopped: past the pods' cgroup limit within a minute if nothing intervenes. No swap in the
	// guest, so the limit cannot be met by swapping instead.
	script := "echo $$ > " + fs + podRel + "/cgroup.procs && x=$(head -c 4194304 /dev/zero | tr '\\0' x) && i=0 && " +
		"while true; do eval \"v$i=\\$x\"; i=$((i+1)); sleep 0.5; done"
	cmd := exec.Command("sh", "-c", script)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })

	p := &v1.Pod{}
	p.Name, p.Namespace, p.UID = "grower", "default", "uid-grower"
	p.Spec.Containers = []v1.Container{{Name: "c"}}
	p.Status.Phase = v1.PodRunning
	pods := &onePod{pod: p, proc: cmd.Process}
	ts, err := ParseThresholds(map[string]string{"memory.available": "32Mi"}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := New(Options{
		NodeName:   "n",
		Thresholds: append(ts, AllocatableThresholds(ts)...),
		// Polled often so that a 4 MiB step cannot cross both the threshold and the limit
		// between two looks (kubelet's 10 s period meets 32 MiB of headroom on a real node
		// only with the kernel notifier; this test is about the signal).
		MonitoringPeriod: 100 * time.Millisecond,
		Observer:         &NodeObserver{Root: "/", NodeFsDir: t.TempDir(), AllocatableCgroup: rel, Log: quietLog()},
		Usage: NodeUsage{Root: "/", PodCgroup: func(*v1.Pod) (string, error) { return podRel, nil },
			PodDirs: func(*v1.Pod) ([]string, error) { return nil, nil }},
		Pods:           pods,
		CleanupTimeout: time.Second,
		Log:            quietLog(),
	})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); m.Run(ctx) }()
	defer func() { cancel(); <-stopped }()

	select {
	case err = <-done:
	case <-time.After(3 * time.Minute):
		// A bound so that a broken limit fails the test instead of hanging it.
		t.Fatalf("the growing process in %s was neither evicted nor killed in 3 minutes", podRel)
	}
	events, _ := os.ReadFile(fs + rel + "/memory.events")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the grower ended with %v, want SIGKILL", err)
	}
	pods.mu.Lock()
	defer pods.mu.Unlock()
	if len(pods.evicted) != 1 || !strings.HasPrefix(pods.evicted[0], "The node was low on resource: memory. Threshold quantity: 32Mi, available: ") {
		t.Errorf("evictions %q, want one with kubelet's memory message; pods' cgroup memory.events:\n%s", pods.evicted, events)
	}
	if !strings.Contains(string(events), "oom_kill 0") {
		t.Errorf("the kernel OOM-killed in the pods' cgroup; memory.events:\n%s", events)
	}
	if got := m.Evictions()[SignalAllocatableMemoryAvailable]; got != 1 {
		t.Errorf("allocatableMemory.available evictions = %d, want 1", got)
	}
}
