package kubetest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// process is one component of the cluster: a binary run directly (no shell in between, so the pid
// we hold is the component's own), with its output in a log file that outlives it.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	exited  chan struct{} // closed when Wait returned; err is set before
	err     error
}

// spawner starts processes from one OS thread that it holds locked until close. Pdeathsig is
// tied to the thread that forked the child, not to the process: a thread the Go runtime throws
// away (the agent's namespace code ends goroutines still locked, on purpose) would take with it
// every component it had forked, in a test that runs the agent and a cluster in one process.
type spawner struct {
	jobs chan func()
	done chan struct{}
}

func newSpawner() *spawner {
	s := &spawner{jobs: make(chan func()), done: make(chan struct{})}
	go func() {
		runtime.LockOSThread()
		for job := range s.jobs {
			job()
		}
		// Every child is gone by now (close is called after Stop ended them): the thread may
		// be reused.
		runtime.UnlockOSThread()
		close(s.done)
	}()
	return s
}

func (s *spawner) start(dir, name, bin string, args, env []string) (*process, error) {
	var p *process
	var err error
	ran := make(chan struct{})
	s.jobs <- func() {
		p, err = startProcess(dir, name, bin, args, env)
		close(ran)
	}
	<-ran
	return p, err
}

func (s *spawner) close() {
	close(s.jobs)
	<-s.done
}

// startProcess runs bin with args, stdout and stderr going to dir/<name>.log. The child gets
// SIGKILL when the thread that started it dies (see spawner), so a test binary killed by
// `go test -timeout` leaves no control plane behind.
func startProcess(dir, name, bin string, args, env []string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	fmt.Fprintf(logFile, "### %s %s\n", bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, logFile: logFile, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.exited)
	}()
	return p, nil
}

// running reports an error naming the exit status when the process has ended.
func (p *process) running() error {
	select {
	case <-p.exited:
		return fmt.Errorf("%s exited during start-up (%v)", p.name, p.err)
	default:
		return nil
	}
}

// stop asks the process to end (SIGTERM) and kills it when it has not after grace. It signals
// only this process's pid.
func (p *process) stop(grace time.Duration) error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %s (pid %d): %w", p.name, p.cmd.Process.Pid, err)
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s (pid %d): %w", p.name, p.cmd.Process.Pid, err)
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) still running 10s after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

// tail returns the last n lines of the process's log.
func (p *process) tail(n int) string {
	return tailFile(p.logPath, n)
}

func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// freePorts returns n distinct loopback ports that were free a moment ago. Another process can
// still take one before the component binds it; StartCluster retries a start that lost the race.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free loopback port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
