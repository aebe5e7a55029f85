package eviction

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The helper process of TestKernelNotifierMemcgThreshold: on a line from stdin it allocates and
// touches MQLET_NOTIFY_ALLOC_MIB MiB, says "allocated", and holds it until stdin closes.
func TestMain(m *testing.M) {
	if mib := os.Getenv("MQLET_NOTIFY_ALLOC_MIB"); mib != "" {
		n, _ := strconv.Atoi(mib)
		in := bufio.NewReader(os.Stdin)
		in.ReadString('\n')
		buf := make([]byte, n<<20)
		for i := 0; i < len(buf); i += 4096 {
			buf[i] = 1
		}
		fmt.Println("allocated")
		in.ReadString('\n')
		os.Exit(int(buf[0]) - 1)
	}
	os.Exit(m.Run())
}

// A memcg threshold fires when the cgroup's usage crosses it, on this machine's cgroup v1 memory
// hierarchy. The notifier is pointed at a child cgroup of our own (through a tree whose
// sys/fs/cgroup/memory is a link to it), so the rest of the machine cannot fire it.
func TestKernelNotifierMemcgThreshold(t *testing.T) {
	const v1 = "/sys/fs/cgroup/memory"
	if _, err := os.Stat(filepath.Join(v1, "cgroup.event_control")); err != nil {
		if os.Getenv("MQLET_TEST_REQUIRE") != "" && os.Geteuid() == 0 {
			t.Fatalf("no cgroup v1 memory hierarchy: %v", err)
		}
		t.Skipf("no cgroup v1 memory hierarchy here: %v", err)
	}
	cg := filepath.Join(v1, fmt.Sprintf("mqlet-notify-test-%d", os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Skipf("cannot make a memory cgroup (needs root): %v", err)
	}
	t.Cleanup(func() {
		// The helper is gone by now (stdin closed, waited); an empty cgroup can be removed.
		for i := 0; i < 50; i++ {
			if err := os.Remove(cg); err == nil || os.IsNotExist(err) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("cgroup %s left behind", cg)
	})
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "sys/fs/cgroup"), 0o755)
	if err := os.Symlink(cg, filepath.Join(root, "sys/fs/cgroup/memory")); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "MQLET_NOTIFY_ALLOC_MIB=96")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}

	n, err := NewKernelNotifier(root, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if got := n.Kinds(); len(got) != 1 || got[0] != "memcg" {
		t.Fatalf("notifier kinds = %v, want memcg only (the test tree has no /proc/pressure)", got)
	}
	b, err := os.ReadFile(filepath.Join(cg, "memory.usage_in_bytes"))
	if err != nil {
		t.Fatal(err)
	}
	usage, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	level := usage + 32<<20
	n.Arm([]int64{level + 1<<20}) // replaced by the next Arm: that one must be dropped
	n.Arm([]int64{level})
	n.mu.Lock()
	armed := len(n.armed)
	n.mu.Unlock()
	if armed != 1 {
		t.Errorf("%d thresholds armed, want the last one only", armed)
	}
	select {
	case <-n.C():
		t.Fatalf("notified before anything was allocated")
	default:
	}
	start := time.Now()
	fmt.Fprintln(stdin, "go")
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "allocated\n" {
		t.Fatalf("helper: %q, %v", line, err)
	}
	select {
	case <-n.C():
		t.Logf("notified %v after the helper was told to allocate 96 MiB past a level 32 MiB above its usage", time.Since(start))
	case <-time.After(10 * time.Second):
		t.Fatalf("no notification within 10s of crossing %d bytes", level)
	}
}

// On this machine (PSI, root without CAP_SYS_RESOURCE) the PSI trigger arms, with the 2 s window if
// the 1 s one is refused. A stall cannot be made on demand without harming the machine, so only
// the arming is checked.
func TestKernelNotifierPSITriggerArms(t *testing.T) {
	if _, err := os.Stat("/proc/pressure/memory"); err != nil {
		t.Skipf("no PSI: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("PSI triggers need write access to /proc/pressure/memory")
	}
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "proc"), 0o755)
	os.Symlink("/proc/pressure", filepath.Join(root, "proc/pressure"))
	n, err := NewKernelNotifier(root, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	got := n.Kinds()
	if len(got) != 1 || !strings.HasPrefix(got[0], "psi:some ") {
		t.Errorf("kinds = %v, want a PSI trigger", got)
	}
	t.Logf("PSI trigger armed: %v", got)
	done := make(chan struct{})
	go func() { n.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
}
