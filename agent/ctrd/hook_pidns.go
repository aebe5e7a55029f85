package ctrd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/internal/atomicfile"
)

// A pod with shareProcessNamespace has one PID namespace for all its containers. Unlike a network
// namespace, a PID namespace cannot be kept by a bind mount alone: once its PID 1 exits, the kernel
// kills everything in it and lets no new process in. kubelet's PID 1 is the pause container; mqlet
// has no pause image, so it re-executes its own binary as `mqlet sandbox-pause` in a new PID
// namespace (the "holder"). The holder is a plain host process, not a container: it survives agent
// restarts (KillMode=process, and it is moved to the pod's cgroup) and is found again from a record
// in the pod dir. It is stopped only by its recorded pid, after its start time and boot id say the
// process is still the one mqlet started.

// PauseCommand is the hidden subcommand of the mqlet binary that runs the holder (RunPause).
const PauseCommand = "sandbox-pause"

// RunPause is the holder's body: PID 1 of a pod's PID namespace. It ignores the signals a terminal
// or a careless kill would send, reaps every child (as PID 1 it inherits the namespace's orphans)
// and never returns; only SIGKILL from outside the namespace (mqlet's Destroy) ends it.
func RunPause() error {
	if os.Getpid() != 1 {
		return fmt.Errorf("%s must run as PID 1 of a new PID namespace (mqlet starts it for pods with shareProcessNamespace); this process is pid %d", PauseCommand, os.Getpid())
	}
	signal.Ignore(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	for {
		// Reap before waiting, so a child that exited before Notify took effect is not left a zombie.
		for {
			pid, err := unix.Wait4(-1, nil, unix.WNOHANG, nil)
			if pid <= 0 && !errors.Is(err, unix.EINTR) {
				break
			}
		}
		<-chld
	}
}

// pidNS is where a pod's shared PID namespace is pinned: a bind mount of the holder's
// /proc/<pid>/ns/pid. Containers join the pin rather than /proc/<pid>/ns/pid, so a pid reused by an
// unrelated process after the holder died can never hand them someone else's namespace; a pin
// whose holder died is a namespace that takes no process, and runc fails clearly.
func pidNS() podNS { return podNS{dir: "pidns", flag: unix.CLONE_NEWPID, proc: "pid"} }

// holderFile, in the pod dir, records the holder as "<pid> <start time> <boot id>".
const holderFile = "pidns-holder"

// holderCgroup is the leaf below the pod's cgroup the holder lives in. A leaf, not the pod cgroup
// itself: on cgroup v2 a cgroup with processes cannot enable controllers for its children, which
// runc does for the containers below the pod cgroup.
const holderCgroup = "sandbox-pause"

// holder identifies one process across pid reuse: the kernel never gives the same pid and start
// time (clock ticks since boot) to two processes within one boot.
type holder struct {
	pid   int
	start uint64
	boot  string
}

func (h holder) String() string { return fmt.Sprintf("%d %d %s\n", h.pid, h.start, h.boot) }

func parseHolder(b []byte) (holder, error) {
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return holder{}, fmt.Errorf("want \"<pid> <start time> <boot id>\", got %q", b)
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil || pid <= 0 {
		return holder{}, fmt.Errorf("bad pid %q", f[0])
	}
	start, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return holder{}, fmt.Errorf("bad start time %q", f[1])
	}
	return holder{pid: pid, start: start, boot: f[2]}, nil
}

// procStat returns a process's state (field 3 of /proc/PID/stat) and start time (field 22).
func procStat(pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command (field 2) is in parentheses and may hold spaces and ')': split after the last one.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no command field in %q", pid, b)
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields after the command, want at least 20", pid, len(f))
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: start time %q: %w", pid, f[19], err)
	}
	return f[0][0], start, nil
}

// alive reports whether the recorded holder still runs: same boot, same pid and start time, and not
// a zombie (a dead holder whose parent has not reaped it yet).
func (h holder) alive() bool {
	if h.boot != bootID() {
		return false
	}
	state, start, err := procStat(h.pid)
	return err == nil && start == h.start && state != 'Z' && state != 'X'
}

// exists reports whether the recorded holder's process is still there, alive or a zombie not yet
// reaped. A zombie still holds its cgroup: it must be gone before the cgroup can be removed.
func (h holder) exists() bool {
	if h.boot != bootID() {
		return false
	}
	_, start, err := procStat(h.pid)
	return err == nil && start == h.start
}

// bootID is the kernel's id of this boot; "-" when the kernel has none (the start time alone then
// tells processes apart, which is right within a boot).
func bootID() string {
	b, err := os.ReadFile(bootIDFile)
	if err != nil {
		return "-"
	}
	return strings.TrimSpace(string(b))
}

// pidnsHook owns the holder of the pod's shared PID namespace and its pin. Only pods with
// shareProcessNamespace (and not hostPID) have one.
type pidnsHook struct {
	dirs       stateDir
	executable string // the mqlet binary, run as `<executable> sandbox-pause`; "": no holder
	log        *slog.Logger
}

func (pidnsHook) Name() string { return "shared PID namespace" }

func (h pidnsHook) Prerun(_ context.Context, pod *v1.Pod, sb *Sandbox) error {
	if !ctrspec.SharesPIDNS(pod) {
		// A holder left from before shareProcessNamespace was turned off is kept until the pod is
		// removed: stopping it here would SIGKILL the old containers still in its namespace before
		// the worker stops them with their grace period.
		return nil
	}
	if h.executable == "" {
		// Without the binary there is no holder; the containers are refused with a clear reason
		// when their spec is built (sb.PIDNS stays empty).
		return nil
	}
	pin, err := h.dirs.nsPath(pidNS(), string(pod.UID))
	if err != nil {
		return err
	}
	record := filepath.Join(sb.Dir, holderFile)
	b, err := os.ReadFile(record)
	switch {
	case err == nil:
		if old, perr := parseHolder(b); perr == nil && old.alive() {
			if !isNS(pin) {
				if err := pinPIDNS(old.pid, pin); err != nil {
					return err
				}
			}
			sb.PIDNS = pin
			return nil
		}
		// The holder died (a reboot, or killed by hand) and its namespace with every process in it:
		// the pod's containers start again from init, as with a lost network namespace. A pod that
		// never had a holder (shareProcessNamespace was just turned on) is not new: its containers
		// are recreated for the spec change anyway.
		sb.Created = true
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("read %s: %w", record, err)
	}

	hd, err := h.startHolder(pod, sb.CgroupParent)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(record, []byte(hd.String()), 0o640); err != nil {
		killHolder(hd)
		return fmt.Errorf("record holder pid %d in %s: %w", hd.pid, record, err)
	}
	if err := pinPIDNS(hd.pid, pin); err != nil {
		return err // the record lets the next Prerun pin it, or Destroy stop it
	}
	sb.PIDNS = pin
	return nil
}

// startHolder runs `<executable> sandbox-pause` as PID 1 of a new PID namespace and moves it to a
// leaf of the pod's cgroup.
func (h pidnsHook) startHolder(pod *v1.Pod, cgroupParent string) (holder, error) {
	cmd := exec.Command(h.executable, PauseCommand)
	cmd.Dir = "/" // hold no directory of the agent's busy
	cmd.Env = []string{}
	// Stdin, stdout and stderr stay nil: /dev/null. Setsid detaches it from the agent's terminal
	// and process group, so a ^C of a foreground agent does not reach it. No Pdeathsig: it must
	// outlive the agent.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Setsid: true}
	if err := cmd.Start(); err != nil {
		return holder{}, fmt.Errorf("start PID namespace holder %s %s: %w", h.executable, PauseCommand, err)
	}
	// Reap it whenever it exits while this agent runs; after an agent restart init does.
	go cmd.Wait()
	_, start, err := procStat(cmd.Process.Pid)
	if err != nil {
		cmd.Process.Kill()
		return holder{}, fmt.Errorf("PID namespace holder pid %d: %w", cmd.Process.Pid, err)
	}
	hd := holder{pid: cmd.Process.Pid, start: start, boot: bootID()}
	if cgroupParent != "" {
		// Best effort: out of the agent's own cgroup, the holder is accounted to the pod and left
		// alone when the agent's service stops. It works without it.
		if err := EnterCgroup(filepath.Join(cgroupParent, holderCgroup), hd.pid); err != nil && h.log != nil {
			h.log.Warn("PID namespace holder stays in the agent's cgroup", "pod", RefOf(pod).String(), "pid", hd.pid, "err", err)
		}
	}
	return hd, nil
}

// pinPIDNS bind-mounts the namespace of pid at pin, replacing an older pin.
func pinPIDNS(pid int, pin string) error {
	if err := unmount(pin); err != nil {
		return err
	}
	if err := pinTarget(pin); err != nil {
		return fmt.Errorf("pin PID namespace: %w", err)
	}
	src := fmt.Sprintf("/proc/%d/ns/pid", pid)
	if err := unix.Mount(src, pin, "none", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("pin PID namespace: bind mount %s at %s: %w", src, pin, err)
	}
	return nil
}

// holderStopWait bounds the wait for a SIGKILLed holder to be gone; only a kernel stuck in
// uninterruptible sleep takes longer.
const holderStopWait = 10 * time.Second

// killHolder SIGKILLs the holder if it is still the process recorded (never another that reused its
// pid), and waits until it is gone. PID 1 of a namespace ignores signals from outside it except
// SIGKILL and SIGSTOP. With it, the kernel kills whatever else is left in the namespace.
func killHolder(hd holder) error {
	if !hd.exists() {
		return nil
	}
	if hd.alive() {
		if err := unix.Kill(hd.pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("kill PID namespace holder pid %d: %w", hd.pid, err)
		}
	}
	// Wait until it is reaped (by this agent's cmd.Wait, or by init after an agent restart), not
	// only dead, so its cgroup can be removed next.
	deadline := time.Now().Add(holderStopWait)
	for hd.exists() {
		if time.Now().After(deadline) {
			return fmt.Errorf("PID namespace holder pid %d is not gone %s after SIGKILL", hd.pid, holderStopWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// Destroy stops the holder recorded in the pod dir, unpins the namespace and removes the record and
// the holder's cgroup. A missing or unreadable record stops nothing: a process is killed only when
// the record proves it is the holder.
func (h pidnsHook) Destroy(_ context.Context, ref PodRef) error {
	dir, err := h.dirs.podDir(ref.UID)
	if err != nil {
		return err
	}
	record := filepath.Join(dir, holderFile)
	var errs []error
	if b, err := os.ReadFile(record); err == nil {
		if hd, err := parseHolder(b); err == nil {
			if err := killHolder(hd); err != nil {
				return err // keep the record: a later Destroy tries again
			}
		} else {
			errs = append(errs, fmt.Errorf("%s: %w (not stopping anything)", record, err))
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read %s: %w", record, err)
	}
	errs = append(errs, h.dirs.removePodNS(pidNS(), string(ref.UID)))
	if err := os.Remove(record); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	// The holder's leaf cgroup goes with the pod cgroup's tree (cgroup hook, destroyed after this).
	return errors.Join(errs...)
}

func (h pidnsHook) List() ([]PodRef, error) {
	names, err := h.dirs.podNSUIDs(pidNS())
	return uidRefs(names), err
}
