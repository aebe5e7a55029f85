package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The Go holder of the pods' systemd scope (used where the host has no sleep): `mqlet
// cgroup-holder` prints the pid of a `cgroup-holder --hold` in a session of its own, which sleeps
// through SIGHUP and SIGINT and ends on SIGTERM (how systemd stops the scope).
func TestCgroupHolder(t *testing.T) {
	status, stdout, stderr := mqletProcess(t, "cgroup-holder")
	if status != 0 {
		t.Fatalf("mqlet cgroup-holder exited %d: %s", status, stderr)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(stdout))
	if err != nil || pid <= 1 {
		t.Fatalf("mqlet cgroup-holder printed %q, not a pid", stdout)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	// running reports whether pid is alive and not a zombie waiting for init to reap it.
	running := func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		return err == nil && !strings.Contains(string(b), ") Z ")
	}
	// Until the holder's signal handlers are in place a signal would end it: wait for its
	// cmdline and for the Go runtime's threads before sending any.
	deadline := time.Now().Add(30 * time.Second)
	for {
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if strings.Contains(string(cmdline), "cgroup-holder\x00--hold") && strings.Contains(string(b), "SigIgn:") &&
			sigIgnored(string(b), syscall.SIGINT) && sigIgnored(string(b), syscall.SIGHUP) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("holder pid %d never ignored SIGINT and SIGHUP: cmdline %q", pid, cmdline)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if sid, err := unix.Getsid(pid); err != nil || sid != pid {
		t.Errorf("holder's session = %d, %v; want a session of its own (%d)", sid, err, pid)
	}
	syscall.Kill(pid, syscall.SIGINT)
	syscall.Kill(pid, syscall.SIGHUP)
	syscall.Kill(pid, syscall.SIGTERM)
	for running() {
		if time.Now().After(deadline) {
			t.Fatalf("holder pid %d still runs after SIGTERM", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sigIgnored reads the SigIgn mask of a /proc/<pid>/status.
func sigIgnored(status string, sig syscall.Signal) bool {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<(uint(sig)-1)) != 0
		}
	}
	return false
}
