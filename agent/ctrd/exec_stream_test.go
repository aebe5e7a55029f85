package ctrd_test

import (
	"context"
	"errors"
	"github.com/mqlet/mqlet/internal/testbuf"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
)

// waitFor waits (bounded) until buf holds want.
func waitFor(t *testing.T, buf *testbuf.Buffer, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(buf.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output never showed %q; it has %q", want, buf.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestExecStream(t *testing.T) {
	rt, env, ns := newRuntime(t)
	logPath := filepath.Join(t.TempDir(), "log")
	const id = "exec-stream-target"
	env.RunBusybox(t, ns, id, logPath, "echo inside > /tmp/marker; echo ready; exec sleep 3600")
	waitLog(t, logPath, "ready")
	ctx := context.Background()

	t.Run("stdin, stdout, stderr and exit code", func(t *testing.T) {
		var out, errOut testbuf.Buffer
		// cat ends only if the stdin EOF reaches the command: without CloseIO it would hang.
		code, err := rt.ExecStream(ctx, id, []string{"sh", "-c", "cat; cat /tmp/marker; echo to-stderr >&2; exit 3"},
			ctrd.ExecStreams{Stdin: strings.NewReader("from-stdin\n"), Stdout: &out, Stderr: &errOut})
		if err != nil {
			t.Fatal(err)
		}
		if code != 3 {
			t.Errorf("exit code %d, want 3", code)
		}
		if got := out.String(); got != "from-stdin\ninside\n" {
			t.Errorf("stdout %q, want stdin echoed and the container's file", got)
		}
		if got := errOut.String(); got != "to-stderr\n" {
			t.Errorf("stderr %q, want to-stderr", got)
		}
	})

	t.Run("a slow reader gets every byte", func(t *testing.T) {
		// The output backs up behind the reader while cat runs; containerd 1.6 drops what is
		// still in the exec's pipes when it exits (~50 KiB here, every time) unless it is
		// taken off them at once, which the spool does.
		in := strings.Repeat("0123456789abcdef", 40000)
		var out testbuf.Buffer
		slow := writerFunc(func(p []byte) (int, error) { time.Sleep(5 * time.Millisecond); return out.Write(p) })
		code, err := rt.ExecStream(ctx, id, []string{"sh", "-c", "cat; exit 3"}, ctrd.ExecStreams{Stdin: strings.NewReader(in), Stdout: slow})
		if err != nil || code != 3 {
			t.Fatalf("exit %d, err %v", code, err)
		}
		if got := out.String(); got != in {
			t.Errorf("%d bytes came out, want the %d that went in", len(got), len(in))
		}
	})

	t.Run("tty with size and resize", func(t *testing.T) {
		var out testbuf.Buffer
		resize := make(chan ctrd.TermSize, 1)
		type result struct {
			code int
			err  error
		}
		res := make(chan result, 1)
		go func() {
			code, err := rt.ExecStream(ctx, id, []string{"sh", "-c", "tty; stty size; echo go; while [ \"$(stty size)\" = '30 100' ]; do sleep 0.05; done; stty size; exit 5"},
				ctrd.ExecStreams{Stdout: &out, TTY: true, Size: ctrd.TermSize{Width: 100, Height: 30}, Resize: resize})
			res <- result{code, err}
		}()
		waitFor(t, &out, "go")
		resize <- ctrd.TermSize{Width: 120, Height: 40}
		r := <-res
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.code != 5 {
			t.Errorf("exit code %d, want 5", r.code)
		}
		got := out.String()
		if !strings.Contains(got, "/dev/pts/") || !strings.Contains(got, "30 100") || !strings.Contains(got, "40 120") {
			t.Errorf("output %q lacks a pts, the initial size 30 100 or the resized 40 120", got)
		}
	})

	t.Run("context end kills the command", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		var out testbuf.Buffer
		inR, inW := io.Pipe() // a stdin that never ends: its Read must not hold ExecStream
		defer inW.Close()
		errc := make(chan error, 1)
		go func() {
			_, err := rt.ExecStream(cctx, id, []string{"sh", "-c", "echo started; exec sleep 3600"},
				ctrd.ExecStreams{Stdin: inR, Stdout: &out})
			errc <- err
		}()
		waitFor(t, &out, "started")
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want context.Canceled", err)
		}
		if n := env.Processes(t, ns, id); n != 1 {
			t.Errorf("%d processes in the container after the cancel, want 1", n)
		}
	})

	t.Run("container not running", func(t *testing.T) {
		if _, err := rt.ExecStream(ctx, "no-such-container", []string{"true"}, ctrd.ExecStreams{}); err == nil || !strings.Contains(err.Error(), "no-such-container") {
			t.Errorf("err %v, want one naming the container", err)
		}
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
