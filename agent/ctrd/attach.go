package ctrd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// Attach (kubectl attach, kubectl run -it, kubectl debug -it) joins a container's own process: its
// output from now on, as the agent copies it to the log (logio.go: each attach takes a copy of
// every read, bounded by subLen and subBytes), and, for a container whose spec has stdin, its stdin FIFO. The
// shim holds that FIFO's write end itself, so the container's stdin stays open between attaches
// and while the agent restarts; with stdinOnce it is closed when the first attach ends, as kubelet
// does (containerd's CRI), unless the container has a terminal. A container with a terminal (tty) is resized to the attach's size.

// ErrAttachLagged ends an attach that fell behind the container's output by more than subLen
// reads or subBytes: the log and the container never wait for an attach.
var ErrAttachLagged = errors.New("the attach fell too far behind the container's output and was cut off; the log has all of it (kubectl logs)")

// AttachStream connects s to container id's process until the process's output ends (it exited)
// or ctx ends (the client went away). It returns the process's exit code once it exited, -1 with
// ctx's error when the client left first.
func (r *Runtime) AttachStream(ctx context.Context, id string, s ExecStreams) (int, error) {
	ctx = r.ctx(ctx)
	ctr, task, err := r.runningTask(ctx, id)
	if err != nil {
		return -1, fmt.Errorf("attach to %s: %w", id, err)
	}
	labels, err := ctr.Labels(ctx)
	if err != nil {
		return -1, fmt.Errorf("attach to %s: %w", id, err)
	}
	r.logIO.mu.Lock()
	c := r.logIO.m[id]
	r.logIO.mu.Unlock()
	if c == nil {
		return -1, fmt.Errorf("attach to %s: this agent does not follow the container's output (made by an older mqlet, or its output ended)", id)
	}
	sub := c.subscribe()
	if sub == nil {
		return -1, fmt.Errorf("attach to %s: the container's output has ended", id)
	}
	defer c.unsubscribe(sub)

	wctx, cancelWait := context.WithCancel(r.ctx(context.Background()))
	defer cancelWait()
	exited, err := task.Wait(wctx)
	if err != nil {
		return -1, fmt.Errorf("attach to %s: wait: %w", id, err)
	}

	done := make(chan struct{})
	var helpers sync.WaitGroup
	defer helpers.Wait()
	defer close(done)

	mode := labels[LabelStdin]
	if mode == "once" && labels[LabelTTY] == "true" {
		// stdinOnce with a terminal (kubectl run -it): the stdin stays open when an attach ends,
		// as containerd's CRI keeps it, so a session cut (the link, a closed laptop) leaves the
		// shell running for `kubectl attach -it` to resume, as kubectl offers.
		mode = "open"
	}
	var f *os.File
	if s.Stdin != nil && mode != "" {
		dir, err := r.fifoDir(labels[LabelPodUID], id)
		if err != nil {
			return -1, fmt.Errorf("attach to %s: %w", id, err)
		}
		// The shim has the read end open: a non-blocking open succeeds at once, and Go's poller
		// makes the writes wait for room instead of failing.
		f, err = os.OpenFile(filepath.Join(dir, stdinFIFO), os.O_WRONLY|unix.O_NONBLOCK, 0)
		switch {
		case errors.Is(err, unix.ENXIO):
			// Nobody reads the FIFO: the container's stdin was closed (stdinOnce, after its first
			// attach). The attach follows the output without stdin, as containerd's CRI does.
			r.log.Debug("attach: the container's stdin is closed; attached without it", "container", id)
			f = nil
		case err != nil:
			return -1, fmt.Errorf("attach to %s: open its stdin: %w", id, err)
		}
	}
	if f != nil {
		if mode == "once" {
			defer r.closeStdin(task, id)
		}
		// The copy ends at the caller's EOF, or when done closes f under a write; a Read still
		// blocked then ends when the caller closes s.Stdin (execio.Streams), nothing waits for it.
		var closeOnce sync.Once
		closeF := func() { closeOnce.Do(func() { f.Close() }) }
		go func() {
			_, err := io.Copy(f, s.Stdin)
			closeF()
			if err == nil && mode == "once" {
				r.closeStdin(task, id)
			}
		}()
		helpers.Go(func() {
			<-done
			closeF()
		})
	}
	if labels[LabelTTY] == "true" {
		resize := func(w, h uint32) error { return task.Resize(wctx, w, h) }
		log := r.log.With("attach to", id)
		applySize(s.Size, resize, log)
		if s.Resize != nil {
			helpers.Go(func() { followSizes(done, s.Resize, resize, log) })
		}
	}

	outs := []io.Writer{s.Stdout, s.Stderr}
	for {
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case ch, ok := <-sub.ch:
			if !ok {
				if sub.lagged {
					return -1, fmt.Errorf("attach to %s: %w", id, ErrAttachLagged)
				}
				// The output ended: the process exited (or closed its output); its status follows.
				select {
				case st := <-exited:
					if err := st.Error(); err != nil {
						return -1, fmt.Errorf("attach to %s: %w", id, err)
					}
					return int(st.ExitCode()), nil
				case <-ctx.Done():
					return -1, ctx.Err()
				}
			}
			sub.took(ch)
			if w := outs[ch.stream]; w != nil {
				if _, err := w.Write(ch.b); err != nil {
					return -1, fmt.Errorf("attach to %s: write output: %w", id, err)
				}
			}
		}
	}
}

// closeStdin closes a container's stdin through the shim (the FIFO's other writer): stdinOnce.
func (r *Runtime) closeStdin(task containerd.Task, id string) {
	cctx, cancel := context.WithTimeout(r.ctx(context.Background()), 10*time.Second)
	defer cancel()
	if err := task.CloseIO(cctx, containerd.WithStdinCloser); err != nil && !errdefs.IsNotFound(err) {
		r.log.Debug("attach: close stdin", "container", id, "err", err)
	}
}
