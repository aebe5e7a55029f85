package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/mqlet/mqlet/core/execio"
)

// execProvider is fakeProvider that can exec: its commands are Go functions standing in for what
// a container would run (the runtime's own exec is tested against containerd in agent/ctrd).
type execProvider struct {
	fakeProvider
	ended chan error // what each ExecStream returned
}

func (e *execProvider) ExecTarget(ns, name, container string) (string, error) {
	if ns != "default" || name != "web" {
		return "", fmt.Errorf("pod %s/%s not found", ns, name)
	}
	if container != "" && container != "c" {
		return "", fmt.Errorf("container %s is not valid for pod %s/%s", container, ns, name)
	}
	return "ctr-id", nil
}

func (e *execProvider) ExecStream(ctx context.Context, id string, cmd []string, s execio.Streams) (code int, err error) {
	defer func() { e.ended <- err }()
	if id != "ctr-id" {
		return -1, fmt.Errorf("exec on %q, not the id ExecTarget gave", id)
	}
	switch cmd[0] {
	case "cat": // stdin to stdout until EOF, a word on stderr, exit 7
		if s.Stdin == nil {
			return -1, errors.New("no stdin")
		}
		if _, err := io.Copy(s.Stdout, s.Stdin); err != nil {
			return -1, err
		}
		fmt.Fprint(s.Stderr, "on-stderr")
		return 7, nil
	case "size": // the tty's size, then the first resize
		fmt.Fprintf(s.Stdout, "tty=%v %dx%d\n", s.TTY, s.Size.Width, s.Size.Height)
		sz := <-s.Resize
		fmt.Fprintf(s.Stdout, "resized %dx%d\n", sz.Width, sz.Height)
		return 0, nil
	case "block": // runs until the exec is ended from outside
		fmt.Fprintln(s.Stdout, "started")
		<-ctx.Done()
		return -1, ctx.Err()
	}
	return -1, fmt.Errorf("no command %q", cmd[0])
}

// lockedBuffer is a bytes.Buffer safe for a writer and a concurrent reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
	wr chan struct{} // signalled on each write
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.wr != nil {
		select {
		case l.wr <- struct{}{}:
		default:
		}
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestExec(t *testing.T) {
	p := &execProvider{ended: make(chan error, 1)}
	c := NewClient(startServer(t, p))
	ctx := context.Background()

	t.Run("stdin, stdout, stderr, exit code", func(t *testing.T) {
		var out, errOut lockedBuffer
		// More than one frame of input, to see frames reassembled in order.
		in := strings.Repeat("0123456789", 20000)
		code, err := c.Exec(ctx, "default", "web", ExecOptions{Command: []string{"cat"},
			Streams: execio.Streams{Stdin: strings.NewReader(in), Stdout: &out, Stderr: &errOut}})
		if err != nil {
			t.Fatal(err)
		}
		<-p.ended
		if code != 7 {
			t.Errorf("exit code %d, want 7", code)
		}
		if out.String() != in {
			t.Errorf("stdout has %d bytes, want the %d of stdin back", len(out.String()), len(in))
		}
		if errOut.String() != "on-stderr" {
			t.Errorf("stderr %q, want on-stderr", errOut.String())
		}
	})

	t.Run("tty size and resize", func(t *testing.T) {
		var out lockedBuffer
		resize := make(chan execio.TermSize, 1)
		resize <- execio.TermSize{Width: 120, Height: 40}
		code, err := c.Exec(ctx, "default", "web", ExecOptions{Command: []string{"size"},
			Streams: execio.Streams{Stdout: &out, TTY: true, Size: execio.TermSize{Width: 80, Height: 24}, Resize: resize}})
		if err != nil || code != 0 {
			t.Fatalf("code %d, err %v", code, err)
		}
		<-p.ended
		if want := "tty=true 80x24\nresized 120x40\n"; out.String() != want {
			t.Errorf("output %q, want %q", out.String(), want)
		}
	})

	t.Run("a client that goes away ends the command", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		out := lockedBuffer{wr: make(chan struct{}, 1)}
		errc := make(chan error, 1)
		go func() {
			_, err := c.Exec(cctx, "default", "web", ExecOptions{Command: []string{"block"}, Streams: execio.Streams{Stdout: &out}})
			errc <- err
		}()
		<-out.wr // "started": the command runs
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("client err %v, want context.Canceled", err)
		}
		// The agent side's command was ended, not left blocked: without the cancel on the
		// connection's end this would wait forever (the test's timeout).
		if err := <-p.ended; !errors.Is(err, context.Canceled) {
			t.Errorf("command ended with %v, want context.Canceled", err)
		}
	})

	t.Run("unknown pod and container are refused before the upgrade", func(t *testing.T) {
		_, err := c.Exec(ctx, "default", "nope", ExecOptions{Command: []string{"cat"}})
		if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "pod default/nope not found") {
			t.Errorf("err %v, want not found naming the pod", err)
		}
		_, err = c.Exec(ctx, "default", "web", ExecOptions{Container: "x", Command: []string{"cat"}})
		if err == nil || !strings.Contains(err.Error(), "container x is not valid") {
			t.Errorf("err %v, want one naming the container", err)
		}
		_, err = c.Exec(ctx, "default", "web", ExecOptions{})
		if err == nil || !strings.Contains(err.Error(), "no command") {
			t.Errorf("err %v, want one saying no command", err)
		}
	})
}
