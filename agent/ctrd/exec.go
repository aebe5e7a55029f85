package ctrd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
)

// ExecOutputLimit bounds what Exec keeps of a command's output, as kubelet bounds an exec probe's:
// a command that writes without end must not grow the agent.
const ExecOutputLimit = 10 << 10

// ErrExecTimeout marks an Exec whose command did not finish within its timeout; it was killed.
var ErrExecTimeout = errors.New("command timed out")

// ExecResult is how a command run in a container ended.
type ExecResult struct {
	ExitCode int
	// Output is stdout and stderr interleaved as they arrived, cut at ExecOutputLimit.
	Output    []byte
	Truncated bool
}

// Exec runs cmd in the running task of container id, as that container's process would run (its
// user, env, working dir and capabilities, from the container's spec), and waits for it. A
// timeout > 0 bounds the run: the command is killed when it is over, or when ctx ends, and the
// error is ErrExecTimeout (or ctx's). A non-zero exit is not an error; it is in ExitCode.
func (r *Runtime) Exec(ctx context.Context, id string, cmd []string, timeout time.Duration) (ExecResult, error) {
	ctx = r.ctx(ctx)
	if len(cmd) == 0 {
		return ExecResult{}, fmt.Errorf("exec in %s: empty command", id)
	}
	ctr, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec in %s: %w", id, err)
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec in %s: container has no running task: %w", id, err)
	}
	spec, err := ctr.Spec(ctx)
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec in %s: read spec: %w", id, err)
	}
	if spec.Process == nil {
		return ExecResult{}, fmt.Errorf("exec in %s: spec has no process", id)
	}
	pspec := *spec.Process
	pspec.Args = cmd
	pspec.Terminal = false
	pspec.ConsoleSize = nil

	execID, err := newExecID()
	if err != nil {
		return ExecResult{}, err
	}
	out := &boundedBuffer{limit: ExecOutputLimit}
	proc, err := task.Exec(ctx, execID, &pspec, cio.NewCreator(cio.WithStreams(nil, out, out)))
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec %q in %s: %w", cmd[0], id, err)
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
		return ExecResult{}, fmt.Errorf("exec %q in %s: wait: %w", cmd[0], id, err)
	}
	if err := proc.Start(ctx); err != nil {
		return ExecResult{}, fmt.Errorf("exec %q in %s: start: %w", cmd[0], id, err)
	}
	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	var st containerd.ExitStatus
	select {
	case st = <-exited:
	case <-deadline:
		return r.killExec(proc, exited, out, del, ErrExecTimeout)
	case <-ctx.Done():
		return r.killExec(proc, exited, out, del, ctx.Err())
	}
	if err := st.Error(); err != nil {
		return ExecResult{}, fmt.Errorf("exec %q in %s: %w", cmd[0], id, err)
	}
	if err := del(); err != nil {
		return ExecResult{}, fmt.Errorf("exec %q in %s: %w", cmd[0], id, err)
	}
	b, trunc := out.result()
	return ExecResult{ExitCode: int(st.ExitCode()), Output: b, Truncated: trunc}, nil
}

// killExec kills an exec that ran too long and waits (bounded) for its end, so nothing is left
// running in the container behind the caller's back.
func (r *Runtime) killExec(proc containerd.Process, exited <-chan containerd.ExitStatus, out *boundedBuffer, del func() error, why error) (ExecResult, error) {
	kctx, cancel := context.WithTimeout(r.ctx(context.Background()), 10*time.Second)
	defer cancel()
	if err := proc.Kill(kctx, syscall.SIGKILL); err != nil && !errdefs.IsNotFound(err) {
		return ExecResult{}, fmt.Errorf("%w; and killing it failed: %w", why, err)
	}
	select {
	case <-exited:
	case <-kctx.Done():
		return ExecResult{}, fmt.Errorf("%w; still running 10s after SIGKILL", why)
	}
	if err := del(); err != nil {
		r.log.Warn("exec process left behind", "err", err)
	}
	b, trunc := out.result()
	return ExecResult{ExitCode: -1, Output: b, Truncated: trunc}, why
}

// execDeleter returns a function that deletes the exec once (killing it if it still runs), on a
// context of its own: the exec's record and FIFOs must go even when the caller's context has ended.
// Delete also closes the FIFOs and waits for the output copies, so the output is whole after it.
func (r *Runtime) execDeleter(proc containerd.Process, execID string) func() error {
	deleted := false
	return func() error {
		if deleted {
			return nil
		}
		deleted = true
		dctx, cancel := context.WithTimeout(r.ctx(context.Background()), 10*time.Second)
		defer cancel()
		if _, err := proc.Delete(dctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete exec %s: %w", execID, err)
		}
		return nil
	}
}

func newExecID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("exec id: %w", err)
	}
	// The agent process's pid and start time, so that the execs of an agent killed meanwhile are
	// found (exec_sweep.go).
	return execIDPrefix + execOwner() + "-" + hex.EncodeToString(b[:]), nil
}

// boundedBuffer keeps the first limit bytes written to it and drops the rest, while still
// accepting every write so the command never blocks on a full pipe. stdout and stderr are copied
// into it from two goroutines.
type boundedBuffer struct {
	mu        sync.Mutex
	limit     int
	buf       []byte
	truncated bool
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	room := b.limit - len(b.buf)
	if len(p) > room {
		b.truncated = true
		b.buf = append(b.buf, p[:max(room, 0)]...)
	} else {
		b.buf = append(b.buf, p...)
	}
	return len(p), nil
}

func (b *boundedBuffer) result() ([]byte, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf...), b.truncated
}

// KillContainer stops the container's task as StopContainer does (stop signal, grace, SIGKILL) but
// keeps the stopped task, so its exit code and time stay readable (ListContainers reports it
// exited). The pod worker uses it for kills it then treats as exits under the pod's restart policy:
// a failed liveness or startup probe, a failed postStart hook.
func (r *Runtime) KillContainer(ctx context.Context, id string, grace time.Duration) error {
	ctx = r.ctx(ctx)
	ctr, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("kill %s: %w", id, err)
	}
	task, err := ctr.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("kill %s: %w", id, err)
	}
	st, err := task.Status(ctx)
	if err == nil && st.Status == containerd.Stopped {
		return nil
	}
	if err := r.signalAndWait(ctx, ctr, task, grace); err != nil {
		return fmt.Errorf("kill %s: %w", id, err)
	}
	return nil
}
