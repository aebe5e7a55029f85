package ctrd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/mqlet/mqlet/core/logs"
	"golang.org/x/sys/unix"
)

// Container output reaches its log file through the agent: the shim writes the container's stdout
// and stderr into two FIFOs below the pod dir, and the agent reads them (two goroutines per
// container, parked in the poller while the container is quiet) into the CRI-format log with
// rotation (core/logs). A restarted agent attaches to the FIFOs of the containers it adopts.
//
// The other way, a logging binary run by the shim for each container (containerd's binary:// IO,
// `mqlet log-driver`), would go on copying while the agent is down, but costs a process per
// container, several MiB of resident memory each on the boards mqlet runs on. Here the cost of the
// agent being down is bounded instead: what a container writes meanwhile waits in the pipe (64 KiB
// on Linux), then its writes block until the agent is back, the way containerd's own CRI plugin
// behaves while containerd restarts. Nothing is lost while the container runs. What is lost: a line
// the agent had read but not finished when it was killed (kill -9 mid-line; a clean stop writes it
// as a P record that the rest of the line completes), and the last bytes of a container that exits
// while the agent is down, if they still sit in the pipe when the shim closes it.

// DefaultLogMaxSize and DefaultLogMaxFiles are kubelet's containerLogMaxSize and
// containerLogMaxFiles defaults, used when Options leave them zero.
const (
	DefaultLogMaxSize  = 10 << 20
	DefaultLogMaxFiles = 5
)

// logCopiers are the copies of container output going on, by container ID.
type logCopiers struct {
	mu     sync.Mutex
	m      map[string]*logCopier
	closed bool // the runtime is closing: attach nothing more
	wg     sync.WaitGroup
	// bufs are the buffers reads from FIFOs go to. They are taken only once data is there, so a
	// quiet container holds none.
	bufs sync.Pool
}

func (l *logCopiers) buf() *[]byte {
	if b, ok := l.bufs.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 32<<10)
	return &b
}

// logCopier copies one container's two FIFOs into its log file.
type logCopier struct {
	files []*os.File    // the read ends; closing them stops the copy
	done  chan struct{} // closed once both streams ended and the log file is closed
	left  atomic.Int32  // streams still copying

	// subs are the attaches taking a copy of the output as it comes (attach.go).
	mu    sync.Mutex
	subs  map[*outputSub]struct{}
	ended bool // the output ended: subscribe nothing more
}

// outputSub is one attach's share of a container's output from the moment it subscribed.
type outputSub struct {
	ch     chan outChunk // closed when the output ends, or when the attach fell behind (lagged)
	lagged bool          // set before ch is closed for falling behind
	queued atomic.Int64  // bytes in ch: added by fan, taken off by the reader (took)
}

// took is the attach's note that it took chunk c off its channel.
func (s *outputSub) took(c outChunk) { s.queued.Add(-int64(len(c.b))) }

// outChunk is one read of a stream (0 stdout, 1 stderr).
type outChunk struct {
	stream int
	b      []byte
}

// subLen and subBytes bound what an attach may fall behind by: this many reads, this many bytes
// (at most 4 sessions per node, so a few MiB at worst). An attach that falls further behind (a
// client slower than the container's output) is cut off rather than hold up the container or its
// log, which kubelet's runtime would do instead.
const (
	subLen   = 256
	subBytes = 1 << 20
)

// subscribe adds an attach; nil when the output has ended already.
func (c *logCopier) subscribe() *outputSub {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return nil
	}
	if c.subs == nil {
		c.subs = map[*outputSub]struct{}{}
	}
	s := &outputSub{ch: make(chan outChunk, subLen)}
	c.subs[s] = struct{}{}
	return s
}

// unsubscribe takes an attach off (it went away); its channel is closed if not already.
func (c *logCopier) unsubscribe(s *outputSub) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.subs[s]; ok {
		delete(c.subs, s)
		close(s.ch)
	}
}

// fan hands a copy of one read to every attach, never waiting: one that is full is cut off.
func (c *logCopier) fan(stream int, p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for s := range c.subs {
		if s.queued.Load()+int64(len(p)) <= subBytes {
			select {
			case s.ch <- outChunk{stream, append([]byte(nil), p...)}:
				s.queued.Add(int64(len(p)))
				continue
			default:
			}
		}
		s.lagged = true
		delete(c.subs, s)
		close(s.ch)
	}
}

// end closes every attach's channel: the output ended.
func (c *logCopier) end() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ended = true
	for s := range c.subs {
		close(s.ch)
	}
	c.subs = nil
}

func (r *Runtime) logRotation() (int64, int) {
	size, files := r.opts.LogMaxSize, r.opts.LogMaxFiles
	if size <= 0 {
		size = DefaultLogMaxSize
	}
	if files <= 0 {
		files = DefaultLogMaxFiles
	}
	return size, files
}

// fifoDir is where the shim finds the FIFOs of container id of pod podUID.
func (r *Runtime) fifoDir(podUID, id string) (string, error) {
	if err := checkPathElem("pod UID", podUID); err != nil {
		return "", err
	}
	return joinUnder(r.opts.StateDir, "pods", podUID, "io", id)
}

// stdinFIFO is the name of a container's stdin FIFO in its FIFO dir, made only for a container
// whose spec asks for stdin. The shim reads it into the container and holds a write end of its
// own, so the container's stdin stays open while nobody is attached (and across agent restarts)
// until the agent closes it (stdinOnce).
const stdinFIFO = "stdin"

// openFIFOs opens the read ends of a container's stdout and stderr FIFOs, without waiting for a
// writer. A container with a terminal has one stream only (the terminal's): stdout.
func openFIFOs(dir string) ([]*os.File, error) {
	var files []*os.File
	for _, name := range []string{logs.Stdout, logs.Stderr} {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDONLY|unix.O_NONBLOCK, 0)
		if name == logs.Stderr && errors.Is(err, os.ErrNotExist) && len(files) == 1 {
			break // a terminal's container
		}
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// newContainerIO makes the FIFOs of a new container, starts copying them to logPath and returns
// what NewTask needs. release must be called once NewTask returned: until then the agent holds the
// write ends too, so the copy does not see an end before the shim opened them.
//
// stdin gives the container a stdin FIFO (its spec's stdin), tty a terminal (its spec's tty), whose
// output is the one stream, stdout.
func (r *Runtime) newContainerIO(podUID, id, logPath string, stdin, tty bool) (cio.Creator, func(), error) {
	dir, err := r.fifoDir(podUID, id)
	if err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("container output of %s: %w", id, err)
	}
	// A leftover of an attempt cut short is removed first: its FIFOs may be of the other shape
	// (a stderr beside a terminal's stdout would be taken for a second stream).
	for _, name := range []string{logs.Stdout, logs.Stderr, stdinFIFO} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("container output of %s: %w", id, err)
		}
	}
	cfg := cio.Config{Stdout: filepath.Join(dir, logs.Stdout), Terminal: tty}
	outs := []string{cfg.Stdout}
	if !tty {
		cfg.Stderr = filepath.Join(dir, logs.Stderr)
		outs = append(outs, cfg.Stderr)
	}
	fifos := outs
	if stdin {
		cfg.Stdin = filepath.Join(dir, stdinFIFO)
		fifos = append(fifos, cfg.Stdin)
	}
	for _, p := range fifos {
		if err := unix.Mkfifo(p, 0o600); err != nil {
			return nil, nil, fmt.Errorf("container output of %s: mkfifo %s: %w", id, p, err)
		}
	}
	files, err := openFIFOs(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("container output of %s: %w", id, err)
	}
	var holds []*os.File
	for _, p := range outs {
		w, err := os.OpenFile(p, os.O_WRONLY|unix.O_NONBLOCK, 0)
		if err != nil {
			for _, f := range append(files, holds...) {
				f.Close()
			}
			return nil, nil, fmt.Errorf("container output of %s: %w", id, err)
		}
		holds = append(holds, w)
	}
	release := func() {
		for _, f := range holds {
			f.Close()
		}
	}
	if err := r.startCopier(id, logPath, files); err != nil {
		release()
		return nil, nil, err
	}
	creator := func(string) (cio.IO, error) { return fifoIO{cfg}, nil }
	return creator, release, nil
}

// fifoIO hands the shim the FIFO paths; the copying is the agent's (startCopier), not the task's.
type fifoIO struct{ cfg cio.Config }

func (f fifoIO) Config() cio.Config { return f.cfg }
func (fifoIO) Cancel()              {}
func (fifoIO) Wait()                {}
func (fifoIO) Close() error         { return nil }

// startCopier registers and starts the copy of files (stdout, stderr) into the log at logPath. When
// a copy of the container is registered already, files are closed and nothing starts.
func (r *Runtime) startCopier(id, logPath string, files []*os.File) error {
	size, keep := r.logRotation()
	w, err := logs.OpenWriter(logPath, size, keep)
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	if err != nil {
		closeAll()
		return fmt.Errorf("container output of %s: %w", id, err)
	}
	r.logIO.mu.Lock()
	defer r.logIO.mu.Unlock()
	if r.logIO.closed || r.logIO.m[id] != nil {
		closeAll()
		w.Close()
		if r.logIO.closed {
			return errors.New("the runtime is closing")
		}
		return nil
	}
	if r.logIO.m == nil {
		r.logIO.m = map[string]*logCopier{}
	}
	c := &logCopier{files: files, done: make(chan struct{})}
	c.left.Store(int32(len(files)))
	r.logIO.m[id] = c
	var warned atomic.Bool
	for i, f := range files {
		name := []string{logs.Stdout, logs.Stderr}[i]
		r.logIO.wg.Add(1)
		go func() {
			defer r.logIO.wg.Done()
			s := logs.NewStream(w, name)
			err := copyFIFO(f, s, &r.logIO, func(p []byte) { c.fan(i, p) })
			err = errors.Join(err, s.Close())
			if err != nil && warned.CompareAndSwap(false, true) {
				r.log.Warn("container output: lines may be missing from its log", "container", id, "stream", name, "err", err)
			}
			if c.left.Add(-1) == 0 {
				w.Close()
				c.end()
				close(c.done)
			}
		}()
	}
	return nil
}

// copyFIFO copies f into s, and each read to fan, until the writers close f (the container and its
// shim are done) or the agent closes f.
func copyFIFO(f *os.File, s *logs.Stream, l *logCopiers, fan func([]byte)) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	for {
		var n int
		var rerr error
		var buf *[]byte
		err := rc.Read(func(fd uintptr) bool {
			buf = l.buf()
			for {
				n, rerr = unix.Read(int(fd), *buf)
				if rerr != unix.EINTR {
					break
				}
			}
			if rerr == unix.EAGAIN {
				l.bufs.Put(buf)
				buf = nil
				return false
			}
			return true
		})
		if buf != nil {
			if n > 0 {
				if _, err := s.Write((*buf)[:n]); err != nil && werr == nil {
					werr = err // keep reading: a full disk must not block the container
				}
				fan((*buf)[:n])
			}
			l.bufs.Put(buf)
		}
		switch {
		case errors.Is(err, os.ErrClosed) || isFileClosing(err):
			return werr // the agent stops, or the container was removed
		case err != nil:
			return errors.Join(werr, err)
		case rerr != nil:
			return errors.Join(werr, fmt.Errorf("read %s: %w", f.Name(), rerr))
		case n == 0:
			return werr // every writer closed: the output ended
		}
	}
}

// attachLogs resumes the copy of an adopted container's output (an agent restart). Containers an
// older mqlet made log straight to their file and have no FIFOs: there is nothing to attach. Only
// one process may read a container's FIFOs, or each would get some of its lines.
func (r *Runtime) attachLogs(c *Container) {
	if c.LogPath == "" || r.opts.StateDir == "" {
		return // a runtime for CLI commands (no state dir) must not take output from the agent's
	}
	r.logIO.mu.Lock()
	known := r.logIO.closed || r.logIO.m[c.ID] != nil
	r.logIO.mu.Unlock()
	if known {
		return
	}
	dir, err := r.fifoDir(c.PodUID, c.ID)
	if err != nil {
		return
	}
	files, err := openFIFOs(dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			r.log.Warn("container output: cannot attach to its FIFOs", "container", c.ID, "err", err)
		}
		return
	}
	if err := r.startCopier(c.ID, c.LogPath, files); err != nil {
		r.log.Warn("container output: cannot resume its log", "container", c.ID, "err", err)
		return
	}
	r.log.Debug("container output attached", "container", c.ID)
}

// stopCopier stops the copy of container id's output, if any, and waits for it to end.
func (r *Runtime) stopCopier(id string) {
	r.logIO.mu.Lock()
	c := r.logIO.m[id]
	delete(r.logIO.m, id)
	r.logIO.mu.Unlock()
	if c == nil {
		return
	}
	for _, f := range c.files {
		f.Close()
	}
	<-c.done
}

// pruneCopiers forgets finished copies of containers no longer in containerd (removed while an
// attach raced with the removal), given every container that exists.
func (r *Runtime) pruneCopiers(exist map[string]bool) {
	r.logIO.mu.Lock()
	defer r.logIO.mu.Unlock()
	for id, c := range r.logIO.m {
		select {
		case <-c.done:
			if !exist[id] {
				delete(r.logIO.m, id)
			}
		default:
		}
	}
}

// ids is the set of the containers' IDs.
func ids(cs []Container) map[string]bool {
	m := make(map[string]bool, len(cs))
	for _, c := range cs {
		m[c.ID] = true
	}
	return m
}

// releaseContainerIO stops the copy of a removed container's output and removes its FIFOs. The
// copy gets a moment to read what the shim flushed when the task went.
func (r *Runtime) releaseContainerIO(ctx context.Context, ctr containerd.Container) {
	r.waitLogs(ctr.ID(), 500*time.Millisecond)
	r.stopCopier(ctr.ID())
	info, err := ctr.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil {
		return
	}
	if dir, err := r.fifoDir(info.Labels[LabelPodUID], ctr.ID()); err == nil {
		os.RemoveAll(dir)
	}
}

// waitLogs waits up to d for the copy of container id's output to end, so its log is complete.
func (r *Runtime) waitLogs(id string, d time.Duration) {
	r.logIO.mu.Lock()
	c := r.logIO.m[id]
	r.logIO.mu.Unlock()
	if c == nil {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
	}
}

// closeLogs stops every copy (the agent is stopping; the next one attaches again) and waits.
func (r *Runtime) closeLogs() {
	r.logIO.mu.Lock()
	r.logIO.closed = true
	all := r.logIO.m
	r.logIO.m = nil
	r.logIO.mu.Unlock()
	for _, c := range all {
		for _, f := range c.files {
			f.Close()
		}
	}
	r.logIO.wg.Wait()
}

// isFileClosing reports the error a raw read gets from a file closed under it: os.File's
// SyscallConn hands back internal/poll's ErrFileClosing unwrapped, not os.ErrClosed, and it is not
// exported, so its text is all there is to match.
func isFileClosing(err error) bool {
	return err != nil && strings.Contains(err.Error(), "use of closed file")
}
