package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a process the harness started; it is stopped by its own pid, never by name.
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has been reaped
	err     error         // its exit status, valid once done is closed
}

func startProc(name, logPath string, argv ...string) (*proc, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("%s log: %w", name, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, so a Ctrl-C at the terminal reaches the harness only, which then
	// stops each process in order (fleet-sim before the bridge and the broker).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, argv[0], err)
	}
	p := &proc{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited returns an error when the process is no longer running.
func (p *proc) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s (pid %d) exited: %v; log tail (%s):\n%s", p.name, p.pid(), p.err, p.logPath, tail(p.logPath, 20))
	default:
		return nil
	}
}

// stop sends SIGTERM and waits up to grace, then SIGKILLs. It reports a process that needed
// SIGKILL, and a non-zero exit after SIGTERM.
func (p *proc) stop(grace time.Duration) error {
	select {
	case <-p.done:
		return nil // already gone; exited() reported it if that mattered
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		var ee *exec.ExitError
		if p.err != nil && !(errors.As(p.err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled()) {
			return fmt.Errorf("%s (pid %d) after SIGTERM: %v", p.name, p.pid(), p.err)
		}
		return nil
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s (pid %d) did not stop within %s of SIGTERM; killed", p.name, p.pid(), grace)
}

// cpuTicks is utime + stime of pid from /proc/PID/stat, in clock ticks.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return parseStatTicks(pid, string(b))
}

// parseStatTicks is utime + stime from the text of /proc/PID/stat.
func parseStatTicks(pid int, s string) (int64, error) {
	// The command name (field 2) may hold spaces; the fields after its closing paren are fixed.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return u + st, nil
}

// clockTick is USER_HZ: 100 on every Linux architecture Go supports (sysconf(_SC_CLK_TCK)).
const clockTick = 100

// rssMiB is VmRSS of pid from /proc/PID/status.
func rssMiB(pid int) (float64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kib, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status VmRSS %q: %w", pid, v, err)
			}
			return kib / 1024, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}

// loadAvg is the first three fields of /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// countLines counts the lines of path that contain s.
func countLines(path, s string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			n++
		}
	}
	return n
}
