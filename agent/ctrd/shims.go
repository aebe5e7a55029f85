package ctrd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// StaleShim is a containerd shim process of this runtime's namespace and containerd whose container
// has no record in containerd any more.
type StaleShim struct {
	Pid         int
	ContainerID string
	// Children are the pids of the shim's own child processes (a container's init, a "runc init"
	// left waiting), killed with it.
	Children []int
}

// shimProc is what /proc says of one shim process.
type shimProc struct {
	pid                    int
	cmdline                []byte
	namespace, id, address string
}

// ReapStaleShims kills, by pid, the shims of this runtime's namespace (and of the containerd it
// talks to) whose container has no record: what a containerd killed in the middle of a start
// leaves behind, about 13 MB of memory each, which no containerd call reaches any more (the record
// is what a task delete goes through). Their child processes go with them: nothing in mqlet's
// namespace runs without a container record. Shims of other namespaces, or of another containerd
// with a namespace of the same name, are never touched. procRoot is /proc (a fixture in tests).
//
// Shims are read before the container records, so a container created in between has its record
// in the list and keeps its shim; each pid is opened as a pidfd and its command line read again
// before it is signalled, so a pid reused by another process in the meantime is left alone.
func (r *Runtime) ReapStaleShims(ctx context.Context) ([]StaleShim, error) {
	return r.reapStaleShims(ctx, "/proc")
}

func (r *Runtime) reapStaleShims(ctx context.Context, procRoot string) ([]StaleShim, error) {
	addr := filepath.Clean(strings.TrimPrefix(r.opts.Address, "unix://"))
	shims, parents, err := readShims(procRoot, r.opts.Namespace, addr)
	if err != nil || len(shims) == 0 {
		return nil, err
	}
	recs, err := r.client.ContainerService().List(r.ctx(ctx))
	if err != nil {
		return nil, fmt.Errorf("reap stale shims: list containers of namespace %s: %w", r.opts.Namespace, err)
	}
	known := make(map[string]bool, len(recs))
	for _, c := range recs {
		known[c.ID] = true
	}
	var reaped []StaleShim
	var errs []error
	for _, s := range shims {
		if known[s.id] {
			continue
		}
		st := StaleShim{Pid: s.pid, ContainerID: s.id, Children: parents[s.pid]}
		// The children first: killed after the shim, they would be reparented and lose the link
		// that makes them recognisable.
		for _, c := range st.Children {
			stillChild := func() bool { ppid, ok := parentOf(procRoot, c); return ok && ppid == s.pid }
			if err := killIfSame(c, stillChild); err != nil {
				errs = append(errs, err)
			}
		}
		sameShim := func() bool {
			got, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(s.pid), "cmdline"))
			return err == nil && bytes.Equal(got, s.cmdline)
		}
		if err := killIfSame(s.pid, sameShim); err != nil {
			errs = append(errs, err)
			continue
		}
		reaped = append(reaped, st)
	}
	return reaped, errors.Join(errs...)
}

// readShims lists the shim processes of namespace ns whose containerd address is addr, and the
// children of every process (by parent pid).
func readShims(procRoot, ns, addr string) ([]shimProc, map[int][]int, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, nil, fmt.Errorf("reap stale shims: read %s: %w", procRoot, err)
	}
	var shims []shimProc
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		if ppid, ok := parentOf(procRoot, pid); ok {
			children[ppid] = append(children[ppid], pid)
		}
		cmdline, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cmdline"))
		if err != nil {
			continue // gone meanwhile, or a kernel thread
		}
		s, ok := parseShim(cmdline)
		if !ok || s.namespace != ns || filepath.Clean(strings.TrimPrefix(s.address, "unix://")) != addr {
			continue
		}
		s.pid, s.cmdline = pid, cmdline
		shims = append(shims, s)
	}
	return shims, children, nil
}

// parseShim reads a shim's command line: containerd-shim-runc-v2 (or another containerd-shim-*)
// -namespace NS -id ID -address ADDR, as containerd 1.6 to 2.x start it.
func parseShim(cmdline []byte) (shimProc, bool) {
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if len(args) == 0 || !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim-") {
		return shimProc{}, false
	}
	var s shimProc
	for i := 1; i+1 < len(args); i++ {
		switch strings.TrimLeft(args[i], "-") {
		case "namespace":
			s.namespace = args[i+1]
		case "id":
			s.id = args[i+1]
		case "address":
			s.address = args[i+1]
		default:
			continue
		}
		i++
	}
	return s, s.namespace != "" && s.id != "" && s.address != ""
}

// parentOf reads the parent pid from procRoot/pid/stat.
func parentOf(procRoot string, pid int) (int, bool) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, false
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses, so read after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// killIfSame sends SIGKILL to pid through a pidfd, if same, asked once the pidfd is open, says it
// is still the process that was read: a pid reused since then is not signalled. A process that is
// already gone is not an error.
func killIfSame(pid int, same func() bool) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reap stale shim: open pid %d: %w", pid, err)
	}
	defer unix.Close(fd)
	// The pidfd pins the process: if /proc still reads as before, the fd is the process read.
	if !same() {
		return nil
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("reap stale shim: kill pid %d: %w", pid, err)
	}
	return nil
}
