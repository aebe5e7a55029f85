package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"golang.org/x/sys/unix"
)

// daemon is a process the harness started and will stop by its pid, never by name.
type daemon struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	pidFile string
	exited  chan struct{}
	err     error // set before exited is closed
}

// startDaemon starts argv in its own process group, so a Ctrl-C at the terminal reaches only the
// harness, which then stops things in the right order. Output is appended to logPath.
func startDaemon(name, logPath, pidFile string, env []string, cloneflags uintptr, argv ...string) (*daemon, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Cloneflags: cloneflags}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, argv[0], err)
	}
	d := &daemon{name: name, cmd: cmd, logPath: logPath, pidFile: pidFile, exited: make(chan struct{})}
	if pidFile != "" {
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
			d.kill()
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
	}
	go func() {
		d.err = cmd.Wait()
		close(d.exited)
	}()
	return d, nil
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

func (d *daemon) alive() bool {
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM and waits up to grace, then SIGKILLs. It reports an error when the process
// had to be killed, since every daemon here is expected to exit cleanly on SIGTERM.
func (d *daemon) stop(grace time.Duration) error {
	defer d.removePidFile()
	if !d.alive() {
		return nil
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		return nil
	case <-time.After(grace):
	}
	d.kill()
	return fmt.Errorf("%s (pid %d) did not exit within %v of SIGTERM; killed", d.name, d.pid(), grace)
}

func (d *daemon) kill() {
	_ = d.cmd.Process.Kill()
	select {
	case <-d.exited:
	case <-time.After(10 * time.Second):
	}
	d.removePidFile()
}

func (d *daemon) removePidFile() {
	if d.pidFile != "" {
		os.Remove(d.pidFile)
	}
}

// diedErr says that the daemon died early, with the end of its log.
func (d *daemon) diedErr() error {
	return fmt.Errorf("%s (pid %d) exited unexpectedly (%v); last lines of %s:\n%s", d.name, d.pid(), d.err, d.logPath, tail(d.logPath, 20))
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "  (" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + strings.Join(lines, "\n  ")
}

// startContainerd starts the bench's private containerd and waits until it answers.
func (b *bench) startContainerd(ctx context.Context) error {
	d, err := startDaemon("containerd", b.path("containerd.log"), b.runPath("containerd.pid"), os.Environ(), 0,
		b.cfg.containerdBin, "--config", b.cfg.containerdConfig)
	if err != nil {
		return err
	}
	b.ctrd = d
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if !d.alive() {
			return d.diedErr()
		}
		if _, err := os.Stat(b.cfg.socket); err == nil {
			c, err := containerd.New(b.cfg.socket, containerd.WithDefaultNamespace(b.cfg.namespace), containerd.WithTimeout(2*time.Second))
			if err == nil {
				if _, err = c.Version(ctx); err == nil {
					b.client = c
					return nil
				}
				c.Close()
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("containerd on %s did not answer within 30s; log %s:\n%s", b.cfg.socket, d.logPath, tail(d.logPath, 20))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (b *bench) stopContainerd() error {
	if b.client != nil {
		b.client.Close()
		b.client = nil
	}
	if b.ctrd == nil {
		return nil
	}
	err := b.ctrd.stop(30 * time.Second)
	b.ctrd = nil
	return err
}

// agentArgs is the agent's command line; every path is the bench's own.
func (b *bench) agentArgs() []string {
	return append([]string{b.cfg.mqlet, "agent",
		"--node-name", nodeName,
		"--state-dir", b.path("agent-state"),
		"--containerd-address", b.cfg.socket,
		"--containerd-namespace", b.cfg.namespace,
		"--manifest-dir", b.manifestDir(),
		"--api-socket", b.apiSocket(),
		"--image-preload-dir", b.path("preload"),
		"--relist-period", "10s",
		"--secret-key-file", b.path("node.key"), // every node makes one; not /etc/mqlet's
		"--cni-conf-dir", b.cniConfDir(),
	}, b.agentExtra...)
}

// startAgent starts the agent; noNetwork puts it in a fresh network namespace holding only a
// loopback that is down, to prove it needs no network to bring its pods back.
func (b *bench) startAgent(noNetwork bool) (time.Time, error) {
	if b.agent != nil && b.agent.alive() {
		return time.Time{}, fmt.Errorf("agent already running (pid %d)", b.agent.pid())
	}
	env := append(os.Environ(), b.cfg.agentEnv...)
	var flags uintptr
	if noNetwork {
		flags = syscall.CLONE_NEWNET
	}
	start := time.Now()
	d, err := startDaemon("mqlet agent", b.path("agent.log"), b.runPath("agent.pid"), env, flags, b.agentArgs()...)
	if err != nil {
		return time.Time{}, err
	}
	b.agent = d
	return start, nil
}

func (b *bench) stopAgent() error {
	if b.agent == nil {
		return nil
	}
	err := b.agent.stop(30 * time.Second)
	b.agent = nil
	return err
}

// leftoverPid returns the pid in pidFile when it names a live process running exe (basename), so a
// recycled pid of another program is never signalled.
func leftoverPid(pidFile, exe string) (int, bool) {
	data, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 1 {
		return 0, false
	}
	target, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || filepath.Base(strings.TrimSuffix(target, " (deleted)")) != exe {
		return 0, false
	}
	return pid, true
}

func waitGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
		if isZombieOrGone(pid) {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

func isZombieOrGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name, which is in parentheses and may contain spaces.
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// shimPids finds containerd shims serving the bench's containerd: they outlive containerd by design
// and are recognised by the bench socket on their command line, never by name alone.
func shimPids(socket string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if len(args) == 0 || !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		if i := slices.Index(args, "-address"); i >= 0 && i+1 < len(args) && args[i+1] == socket {
			out = append(out, pid)
		}
	}
	return out
}

// unmountUnder detaches every mount at or below one of dirs (deepest first): pod network namespaces
// the agent pinned, container rootfs mounts left by a killed run. Removing the directories with
// those still mounted would fail or, worse, recurse into a live filesystem.
func unmountUnder(dirs ...string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var targets []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		for _, d := range dirs {
			if mp == d || strings.HasPrefix(mp, d+"/") {
				targets = append(targets, mp)
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	slices.SortFunc(targets, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, t := range targets {
		if err := unix.Unmount(t, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
