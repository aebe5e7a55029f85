package mqtttest

import "syscall"

// sysProcAttr puts the broker in its own process group (a ^C meant for the
// test binary does not race the harness's own shutdown) and has the kernel
// SIGKILL it when the thread that started it dies, so a test binary that is
// killed outright (go test -timeout, SIGKILL) leaves no broker behind.
// startProcess forks from a fresh, unlocked goroutine: the Go runtime only
// ends a thread whose goroutine exits while locked to it, so the parent
// thread lives as long as the test binary.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
