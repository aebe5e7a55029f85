package e2e

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// failingStart is one `mqlet agent` the test expects to fail at start.
type failingStart struct {
	t      *testing.T
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan error
}

// startFailing runs `mqlet agent` with args and the extra environment; it must fail to start.
func (h *harness) startFailing(env []string, args ...string) *failingStart {
	h.t.Helper()
	f := &failingStart{t: h.t, out: &syncBuffer{}, exited: make(chan error, 1)}
	f.cmd = exec.Command(h.bin, append([]string{"agent"}, args...)...)
	f.cmd.Stdout, f.cmd.Stderr = f.out, f.out
	f.cmd.Env = append(os.Environ(), env...)
	if err := f.cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	go func() { f.exited <- f.cmd.Wait() }()
	h.t.Cleanup(func() {
		f.cmd.Process.Kill() // by pid; a no-op once it has exited
		<-f.exited
		f.exited <- nil
	})
	return f
}

// wait waits for the agent to exit and returns its output; it must have failed.
func (f *failingStart) wait(what string) string {
	f.t.Helper()
	select {
	case err := <-f.exited:
		f.exited <- err // for the cleanup
		if err == nil {
			f.t.Fatalf("%s: agent exited 0, want a failure\n%s", what, f.out)
		}
	case <-time.After(90 * time.Second): // a bound on a hang, not a speed check
		f.t.Fatalf("%s: agent still running after 90s\n%s", what, f.out)
	}
	return f.out.String()
}

// waitFor polls the agent's output until it holds s (bounded).
func (f *failingStart) waitFor(s string) {
	f.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(f.out.String(), s) {
		if time.Now().After(deadline) {
			f.t.Fatalf("no %q in the agent's output within 60s:\n%s", s, f.out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Under systemd (issue 22 point 6), an agent that cannot start backs off by itself, since the unit's
// RestartSteps needs systemd 254 and Debian 12 / Raspberry Pi OS bookworm have 252: after its Nth
// failed start in a row it waits 0 s, 5 s, 10 s, ... (at most 5 min) before exiting, counted in a
// file under $RUNTIME_DIRECTORY (/run/mqlet in the unit) that outlives the process. The wait comes
// after the attempt; READY=1 forgets the count; SIGTERM ends the wait and forgets it too; run by
// hand (no $NOTIFY_SOCKET) the agent fails at once; a counter it cannot write is a warning. The
// test stands in for systemd: it runs the agent again after each exit, with its own notify socket.
func TestStartBackoffUnderSystemd(t *testing.T) {
	h := newHarness(t)
	sockPath := filepath.Join(h.dir, "notify")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sockPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	var mu sync.Mutex
	var msgs []string
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := notify.Read(buf)
			if err != nil {
				return
			}
			mu.Lock()
			msgs = append(msgs, string(buf[:n]))
			mu.Unlock()
		}
	}()
	notified := func(s string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			if strings.Contains(m, s) {
				return true
			}
		}
		return false
	}

	runDir := filepath.Join(h.dir, "run")
	counter := filepath.Join(runDir, "start-failures")
	systemd := []string{"NOTIFY_SOCKET=" + sockPath, "RUNTIME_DIRECTORY=" + runDir}
	badConfig := filepath.Join(h.dir, "bad.yaml")
	os.WriteFile(badConfig, []byte("nodeName: n1\nstateDirectory: /var/lib/mqlet\n"), 0o644)
	count := func() string {
		b, err := os.ReadFile(counter)
		if os.IsNotExist(err) {
			return "none"
		}
		return strings.TrimSpace(string(b))
	}
	// The failure, its attempt number and its wait, on one line of the log.
	failedLine := func(out, attempt, wait string) {
		t.Helper()
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "failed to start") && strings.Contains(line, "attempt="+attempt+" wait="+wait+" ") &&
				strings.Contains(line, "stateDirectory") {
				return
			}
		}
		t.Fatalf("no log line of failed start %s naming the bad key and a wait of %s:\n%s", attempt, wait, out)
	}

	// 1st failure: no wait beyond the unit's RestartSec.
	out := h.startFailing(systemd, "--config", badConfig).wait("1st failed start")
	failedLine(out, "1", "0s")
	if strings.Contains(out, "back-off over") || count() != "1" {
		t.Fatalf("1st failed start: count %s (want 1), a wait was logged:\n%s", count(), out)
	}
	// 2nd: it waits 5 s, then exits by itself.
	out = h.startFailing(systemd, "--config", badConfig).wait("2nd failed start")
	failedLine(out, "2", "5s")
	if i, j := strings.Index(out, "attempt=2 wait=5s"), strings.Index(out, "back-off over"); j < i || count() != "2" {
		t.Fatalf("2nd failed start: count %s (want 2), want the failure and then the end of the wait:\n%s", count(), out)
	}
	if !notified("EXTEND_TIMEOUT_USEC=35000000\nSTATUS=start failed (attempt 2") {
		t.Errorf("systemd was not told of the wait (EXTEND_TIMEOUT_USEC and STATUS): %q", msgs)
	}
	// 3rd: 10 s, cut short by a stop, which also forgets the count (as systemd does for its own
	// restart counter on a manual stop).
	f := h.startFailing(systemd, "--config", badConfig)
	f.waitFor("attempt=3 wait=10s")
	if c := count(); c != "3" {
		t.Fatalf("during the 3rd wait the count is %s, want 3", c)
	}
	f.cmd.Process.Signal(syscall.SIGTERM)
	out = f.wait("3rd failed start, stopped during its wait")
	failedLine(out, "3", "10s")
	if strings.Contains(out, "back-off over") || !strings.Contains(out, "stopped while waiting") || count() != "none" {
		t.Fatalf("SIGTERM during the wait: count %s (want none), want the wait ended by the stop:\n%s", count(), out)
	}

	// A failure after the config is read (containerd unreachable) counts the same way, in the
	// configured log.
	noContainerd := append(h.flags(), "--containerd-address", filepath.Join(h.dir, "no-containerd.sock"), "--containerd-timeout", "1s")
	out = h.startFailing(systemd, noContainerd...).wait("containerd unreachable")
	if !strings.Contains(out, "attempt=1 wait=0s") || !strings.Contains(out, "no-containerd.sock") || count() != "1" {
		t.Fatalf("containerd unreachable: count %s (want 1), want attempt 1 naming the socket:\n%s", count(), out)
	}
	out = h.startFailing(systemd, noContainerd...).wait("containerd unreachable again")
	if !strings.Contains(out, "attempt=2 wait=5s") || count() != "2" {
		t.Fatalf("containerd unreachable again: count %s (want 2), want attempt 2:\n%s", count(), out)
	}

	// A start that succeeds forgets the failures once it is READY.
	os.WriteFile(counter, []byte("7\n"), 0o644)
	h.agentEnv = systemd
	h.startAgent()
	deadline := time.Now().Add(60 * time.Second)
	for count() != "none" || !notified("READY=1") {
		if time.Now().After(deadline) {
			t.Fatalf("agent started (READY=1 sent: %v) but the count is still %s\n%s", notified("READY=1"), count(), h.agentLog)
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.stopAgent()
	out = h.startFailing(systemd, "--config", badConfig).wait("failed start after a good one")
	failedLine(out, "1", "0s")

	// By hand: the error at once, no wait, the counter left alone (at 7 it would wait 5 min).
	os.WriteFile(counter, []byte("7\n"), 0o644)
	out = h.startFailing(nil, "--config", badConfig).wait("by hand")
	if !strings.Contains(out, "mqlet: ") || !strings.Contains(out, "stateDirectory") || strings.Contains(out, "attempt=") || count() != "7" {
		t.Fatalf("run by hand: count %s (want 7 untouched), want the error alone:\n%s", count(), out)
	}

	// A runtime directory that cannot be written: a warning, and the start's own error.
	notDir := filepath.Join(h.dir, "not-a-dir")
	os.WriteFile(notDir, nil, 0o644)
	out = h.startFailing([]string{"NOTIFY_SOCKET=" + sockPath, "RUNTIME_DIRECTORY=" + notDir}, "--config", badConfig).wait("unwritable counter")
	failedLine(out, "1", "0s")
	if !strings.Contains(out, "cannot keep the count of failed starts") {
		t.Fatalf("unwritable counter: no warning:\n%s", out)
	}
}
