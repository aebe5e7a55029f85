package ctrd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	"github.com/mqlet/mqlet/core/execio"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TermSize and ExecStreams are execio's, named here for the runtime's callers.
type (
	TermSize    = execio.TermSize
	ExecStreams = execio.Streams
)

// ExecStream runs cmd in the running task of container id, as Exec does, with its stdio connected
// to s, and returns its exit code once it has ended and its output has been written out. When ctx
// ends first the command is killed, its end waited for (bounded), and the error is ctx's. Nothing
// stays behind in either case: the exec process is deleted, which closes its FIFOs.
func (r *Runtime) ExecStream(ctx context.Context, id string, cmd []string, s ExecStreams) (int, error) {
	ctx = r.ctx(ctx)
	if len(cmd) == 0 {
		return -1, fmt.Errorf("exec in %s: empty command", id)
	}
	ctr, task, err := r.runningTask(ctx, id)
	if err != nil {
		return -1, fmt.Errorf("exec in %s: %w", id, err)
	}
	spec, err := ctr.Spec(ctx)
	if err != nil {
		return -1, fmt.Errorf("exec in %s: read spec: %w", id, err)
	}
	if spec.Process == nil {
		return -1, fmt.Errorf("exec in %s: spec has no process", id)
	}
	pspec := *spec.Process
	pspec.Args = cmd
	pspec.Terminal = s.TTY
	pspec.ConsoleSize = nil
	if s.TTY && s.Size.Width > 0 && s.Size.Height > 0 {
		pspec.ConsoleSize = &specs.Box{Width: uint(s.Size.Width), Height: uint(s.Size.Height)}
	}

	execID, err := newExecID()
	if err != nil {
		return -1, err
	}
	stdout, stderr := s.Stdout, s.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	outSpool, errSpool := newSpool(stdout, execSpoolLimit), newSpool(stderr, execSpoolLimit)
	defer func() { outSpool.abort(); errSpool.abort() }() // no-ops once they are done
	stdout, stderr = outSpool, errSpool
	// stdin goes through a pipe we own, so the copy containerd's cio runs ends when we close it
	// (after the command ended), whatever the caller's reader does. That copy starts before
	// task.Exec returns; it meets the caller's EOF only after writing everything before it to the
	// FIFO, and then closes the command's stdin through containerd (closing the FIFO alone does not
	// end the process's stdin: the shim holds it open), once the process exists.
	var (
		stdinW    *io.PipeWriter
		procReady = make(chan containerd.Process, 1)
		done      = make(chan struct{}) // closed when the command ended or ExecStream returns
		stop      = sync.OnceFunc(func() { close(done) })
	)
	defer stop()
	opts := []cio.Opt{}
	if s.Stdin != nil {
		var stdinR *io.PipeReader
		stdinR, stdinW = io.Pipe()
		defer stdinW.CloseWithError(errExecEnded)
		closeStdin := func() {
			select {
			case p := <-procReady:
				cctx, cancel := context.WithTimeout(r.ctx(context.Background()), 10*time.Second)
				defer cancel()
				if err := p.CloseIO(cctx, containerd.WithStdinCloser); err != nil && !errdefs.IsNotFound(err) {
					r.log.Debug("exec close stdin", "container", id, "err", err)
				}
			case <-done:
			}
		}
		opts = append(opts, cio.WithStreams(&eofReader{r: stdinR, onEOF: closeStdin}, stdout, stderr))
	} else {
		opts = append(opts, cio.WithStreams(nil, stdout, stderr))
	}
	if s.TTY {
		opts = append(opts, cio.WithTerminal)
	}
	// Create and start on a context that ctx's end does not cut short: a start the shim carried out
	// while our call gave up would leave a process nobody kills. ctx's end is seen after the start
	// and kills it as usual.
	sctx := context.WithoutCancel(ctx)
	proc, err := task.Exec(sctx, execID, &pspec, cio.NewCreator(opts...))
	if err != nil {
		return -1, fmt.Errorf("exec %q in %s: %w", cmd[0], id, err)
	}
	del := r.execDeleter(proc, execID)
	defer func() {
		if err := del(); err != nil {
			r.log.Warn("exec process left behind", "container", id, "err", err)
		}
	}()
	wctx, cancelWait := context.WithCancel(r.ctx(context.Background())) // outlives ctx: we wait for the kill
	defer cancelWait()
	exited, err := proc.Wait(wctx)
	if err != nil {
		return -1, fmt.Errorf("exec %q in %s: wait: %w", cmd[0], id, err)
	}
	if err := proc.Start(sctx); err != nil {
		return -1, fmt.Errorf("exec %q in %s: start: %w", cmd[0], id, err)
	}
	procReady <- proc

	// The helpers below end with done: the command's end or ctx's.
	var helpers sync.WaitGroup
	defer helpers.Wait()
	defer stop()
	if s.Stdin != nil {
		go feedStdin(s.Stdin, stdinW, done)
	}
	if s.TTY && s.Resize != nil {
		helpers.Go(func() {
			followSizes(done, s.Resize, func(w, h uint32) error { return proc.Resize(wctx, w, h) }, r.log.With("exec in", id))
		})
	}

	var st containerd.ExitStatus
	select {
	case st = <-exited:
	case <-ctx.Done():
		kctx, cancel := context.WithTimeout(r.ctx(context.Background()), 10*time.Second)
		defer cancel()
		if err := proc.Kill(kctx, syscall.SIGKILL); err != nil && !errdefs.IsNotFound(err) {
			return -1, fmt.Errorf("%w; and killing exec %q in %s failed: %w", ctx.Err(), cmd[0], id, err)
		}
		select {
		case <-exited:
		case <-kctx.Done():
			return -1, fmt.Errorf("%w; exec %q in %s still running 10s after SIGKILL", ctx.Err(), cmd[0], id)
		}
		return -1, ctx.Err()
	}
	if err := st.Error(); err != nil {
		return -1, fmt.Errorf("exec %q in %s: %w", cmd[0], id, err)
	}
	// Delete waits for the output copies into the spools; then the spools are written out, so
	// every byte the command wrote is out when we return.
	if err := del(); err != nil {
		return -1, fmt.Errorf("exec %q in %s: %w", cmd[0], id, err)
	}
	outSpool.close()
	errSpool.close()
	for _, sp := range []*spool{outSpool, errSpool} {
		select {
		case <-sp.done:
		case <-ctx.Done():
			return -1, ctx.Err()
		}
	}
	return int(st.ExitCode()), nil
}

var errExecEnded = errors.New("exec ended")

// followSizes applies each terminal size from sizes with resize until done or sizes closes; an
// empty size (a client that does not know it) is skipped.
func followSizes(done <-chan struct{}, sizes <-chan TermSize, resize func(w, h uint32) error, log *slog.Logger) {
	for {
		select {
		case <-done:
			return
		case sz, ok := <-sizes:
			if !ok {
				return
			}
			applySize(sz, resize, log)
		}
	}
}

// applySize resizes a terminal to sz, unless sz is empty.
func applySize(sz TermSize, resize func(w, h uint32) error, log *slog.Logger) {
	if sz.Width == 0 || sz.Height == 0 {
		return
	}
	if err := resize(uint32(sz.Width), uint32(sz.Height)); err != nil && !errdefs.IsNotFound(err) {
		log.Debug("terminal resize", "err", err)
	}
}

// runningTask loads container id and its task, which must be running (ctx carries the namespace).
func (r *Runtime) runningTask(ctx context.Context, id string) (containerd.Container, containerd.Task, error) {
	ctr, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("container has no running task: %w", err)
	}
	if st, err := task.Status(ctx); err != nil {
		return nil, nil, fmt.Errorf("task status: %w", err)
	} else if st.Status != containerd.Running {
		return nil, nil, fmt.Errorf("container is %s, not running", st.Status)
	}
	return ctr, task, nil
}

// feedStdin copies the caller's stdin into w until its EOF (passed on as EOF) or until done
// closes (passed on as an error, so no stdin close is asked for an exec that is gone). A Read on in
// still blocked then ends when the caller closes in; nothing else waits for it.
func feedStdin(in io.Reader, w *io.PipeWriter, done <-chan struct{}) {
	copied := make(chan error, 1)
	go func() {
		_, err := io.Copy(w, in)
		copied <- err
	}()
	select {
	case <-done:
		w.CloseWithError(errExecEnded)
	case err := <-copied:
		w.CloseWithError(err)
	}
}

// eofReader calls onEOF once, when its reader reaches EOF.
type eofReader struct {
	r     io.Reader
	onEOF func()
	once  sync.Once
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		e.once.Do(e.onEOF)
	}
	return n, err
}

// TaskPid is the pid of container id's running task (its network namespace is the pod's).
func (r *Runtime) TaskPid(ctx context.Context, id string) (uint32, error) {
	ctx = r.ctx(ctx)
	ctr, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return 0, fmt.Errorf("container %s: %w", id, err)
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("container %s has no running task: %w", id, err)
	}
	return task.Pid(), nil
}
