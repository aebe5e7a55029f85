package eviction

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// KernelNotifier wakes the eviction manager when the kernel sees memory move, so a pod allocating
// fast is caught in milliseconds rather than at the next monitoring period. It uses what the kernel
// offers, both where both exist:
//   - cgroup v1: a memory threshold on the root cgroup's memory.usage_in_bytes (cgroup.event_control
//     with an eventfd, as kubelet's memcg notifier does). It fires when usage crosses the level
//     where memory.available meets a threshold. cgroup v2 has no such file at its root.
//   - PSI: a trigger on /proc/pressure/memory ("some 150000 1000000": tasks stalled on memory for
//     150 ms within 1 s). It fires when reclaim starts to hurt, whatever the cgroup version. Without
//     CAP_SYS_RESOURCE the kernel (6.5+) takes only windows in whole multiples of 2 s, so the
//     same share over 2 s is tried next.
//
// One goroutine waits in epoll_wait on the event fds and a stop fd: an idle node costs no wakeups.
type KernelNotifier struct {
	log   *slog.Logger
	memcg string // the v1 memory hierarchy root; "" without one
	c     chan struct{}

	epfd, stopfd int
	usage        *os.File // memory.usage_in_bytes, named by each threshold registration
	psi          *os.File
	psiTrigger   string

	mu     sync.Mutex
	armed  map[int]int64 // eventfd -> usage level it watches
	closed bool
	done   chan struct{}
}

// psiTriggers are tried in order (see KernelNotifier).
var psiTriggers = []string{"some 150000 1000000", "some 300000 2000000"}

// NewKernelNotifier starts a notifier on the machine under root ("/"). Parts the kernel does not
// offer are left out (logged); with neither, the manager polls alone. The error is only for a
// notifier that cannot run at all (no epoll).
func NewKernelNotifier(root string, log *slog.Logger) (*KernelNotifier, error) {
	if log == nil {
		log = slog.Default()
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("eviction notifier: epoll_create1: %w", err)
	}
	stopfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("eviction notifier: eventfd: %w", err)
	}
	n := &KernelNotifier{log: log, c: make(chan struct{}, 1), epfd: epfd, stopfd: stopfd,
		armed: map[int]int64{}, done: make(chan struct{})}
	if err := n.watch(stopfd, unix.EPOLLIN); err != nil {
		n.closeFds()
		return nil, err
	}

	memcg := filepath.Join(root, "sys/fs/cgroup/memory")
	if f, err := os.Open(filepath.Join(memcg, "memory.usage_in_bytes")); err == nil {
		n.usage, n.memcg = f, memcg
	}
	if f, trigger, err := openPSITrigger(filepath.Join(root, "proc/pressure/memory")); err == nil {
		if err := n.watch(int(f.Fd()), unix.EPOLLPRI); err != nil {
			f.Close()
			log.Warn("eviction notifier: PSI trigger not watched", "err", err)
		} else {
			n.psi, n.psiTrigger = f, trigger
		}
	} else {
		log.Info("eviction notifier: no PSI memory trigger", "err", err)
	}
	log.Info("eviction notifier started", "memcg_threshold", n.memcg != "", "psi_trigger", n.psiTrigger)
	go n.loop()
	return n, nil
}

// Kinds reports what the notifier uses: "memcg" and/or "psi" (for logs, tests and the bench).
func (n *KernelNotifier) Kinds() []string {
	var out []string
	if n.memcg != "" {
		out = append(out, "memcg")
	}
	if n.psi != nil {
		out = append(out, "psi:"+n.psiTrigger)
	}
	return out
}

func openPSITrigger(path string) (*os.File, string, error) {
	var errs []error
	for _, t := range psiTriggers {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return nil, "", err
		}
		// The kernel wants the trigger in one write, NUL-terminated.
		if _, err := unix.Write(int(f.Fd()), append([]byte(t), 0)); err != nil {
			f.Close()
			errs = append(errs, fmt.Errorf("%q: %w", t, err))
			continue
		}
		return f, t, nil
	}
	return nil, "", fmt.Errorf("%s: %w", path, errors.Join(errs...))
}

func (n *KernelNotifier) watch(fd int, events uint32) error {
	ev := unix.EpollEvent{Events: events, Fd: int32(fd)}
	if err := unix.EpollCtl(n.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("eviction notifier: epoll_ctl add %d: %w", fd, err)
	}
	return nil
}

// C receives when memory should be looked at.
func (n *KernelNotifier) C() <-chan struct{} { return n.c }

// Arm replaces the memcg thresholds with levels (bytes of root cgroup usage). Levels already armed
// stay as they are. Without a v1 memory hierarchy it does nothing.
func (n *KernelNotifier) Arm(levels []int64) {
	if n.memcg == "" {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	for fd, level := range n.armed {
		if !slices.Contains(levels, level) {
			n.disarmLocked(fd)
		}
	}
	for _, level := range levels {
		if slices.ContainsFunc(mapValues(n.armed), func(l int64) bool { return l == level }) || level <= 0 {
			continue
		}
		if err := n.armLocked(level); err != nil {
			n.log.Warn("eviction notifier: memcg threshold not set; memory is polled", "level", level, "err", err)
		} else {
			n.log.Debug("eviction notifier: memcg threshold set", "usage_level", level)
		}
	}
}

func mapValues(m map[int]int64) []int64 {
	out := make([]int64, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func (n *KernelNotifier) armLocked(level int64) error {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("eventfd: %w", err)
	}
	ctl := filepath.Join(n.memcg, "cgroup.event_control")
	line := fmt.Sprintf("%d %d %d", efd, n.usage.Fd(), level)
	if err := os.WriteFile(ctl, []byte(line), 0); err != nil {
		unix.Close(efd)
		return fmt.Errorf("%s: %w", ctl, err)
	}
	if err := n.watch(efd, unix.EPOLLIN); err != nil {
		unix.Close(efd) // closing the eventfd also unregisters the threshold
		return err
	}
	n.armed[efd] = level
	return nil
}

func (n *KernelNotifier) disarmLocked(fd int) {
	unix.EpollCtl(n.epfd, unix.EPOLL_CTL_DEL, fd, nil)
	unix.Close(fd) // the kernel drops the threshold with its eventfd
	delete(n.armed, fd)
}

// Close stops the notifier and releases its thresholds and files.
func (n *KernelNotifier) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	var one [8]byte
	one[0] = 1 // eventfd counters are host-endian; any non-zero value wakes the loop
	unix.Write(n.stopfd, one[:])
	<-n.done
	n.closeFds()
	return nil
}

func (n *KernelNotifier) closeFds() {
	n.mu.Lock()
	for fd := range n.armed {
		n.disarmLocked(fd)
	}
	n.mu.Unlock()
	if n.psi != nil {
		n.psi.Close()
	}
	if n.usage != nil {
		n.usage.Close()
	}
	unix.Close(n.stopfd)
	unix.Close(n.epfd)
}

func (n *KernelNotifier) loop() {
	defer close(n.done)
	events := make([]unix.EpollEvent, 8)
	var buf [8]byte
	for {
		k, err := unix.EpollWait(n.epfd, events, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			n.log.Error("eviction notifier stopped; memory is polled", "err", err)
			return
		}
		wake := false
		n.mu.Lock()
		for _, ev := range events[:k] {
			fd := int(ev.Fd)
			switch {
			case fd == n.stopfd:
				n.mu.Unlock()
				return
			case n.psi != nil && fd == int(n.psi.Fd()):
				if ev.Events&unix.EPOLLERR != 0 {
					// The trigger is gone (it cannot be re-armed in place); polling remains.
					unix.EpollCtl(n.epfd, unix.EPOLL_CTL_DEL, fd, nil)
					n.log.Warn("eviction notifier: PSI trigger failed; memory is polled")
					continue
				}
				n.log.Debug("eviction notifier: PSI memory trigger fired")
				wake = true
			default:
				// Only an fd still armed is read: one closed meanwhile may already be reused.
				if level, ok := n.armed[fd]; ok {
					unix.Read(fd, buf[:])
					n.log.Debug("eviction notifier: memcg threshold crossed", "level", level)
					wake = true
				}
			}
		}
		n.mu.Unlock()
		if wake {
			select {
			case n.c <- struct{}{}:
			default:
			}
		}
	}
}

var _ MemoryNotifier = (*KernelNotifier)(nil)
