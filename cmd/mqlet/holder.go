package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// CgroupHolderCmd is the process that keeps the systemd scope of the pods' cgroups alive when no
// pod runs (agent/cgroup/delegate): `mqlet cgroup-holder` starts `mqlet cgroup-holder --hold` in a
// session of its own, prints its pid and exits, so the holder is init's child, not the agent's
// (nothing for the agent to reap, no goroutine waiting on it).
type CgroupHolderCmd struct {
	Hold bool `help:"Be the holder: sleep until SIGTERM."`
}

// Run starts the holder, or is it.
func (c CgroupHolderCmd) Run(env *ctlEnv) error {
	if c.Hold {
		// SIGTERM is how systemd ends the scope (mqlet uninstall, or the host's shutdown); a
		// hangup or ^C of whoever started it is not.
		signal.Ignore(syscall.SIGHUP, syscall.SIGINT)
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM)
		<-stop
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("cgroup-holder: find the mqlet binary: %w", err)
	}
	cmd := exec.Command(exe, "cgroup-holder", "--hold")
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cgroup-holder: start %s cgroup-holder --hold: %w", exe, err)
	}
	_, err = fmt.Fprintln(env.out, cmd.Process.Pid)
	return err
}
