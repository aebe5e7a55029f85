package ctrd_test

// Attach on a real containerd: a container's stdin stays open between attaches and across an agent
// restart, stdinOnce closes it after the first attach, a terminal is sized and its exit code comes
// back, and an attach gets the output from its start only.

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/internal/testbuf"
	v1 "k8s.io/api/core/v1"
)

// ttyIO is what a test container's spec asks for: stdin, stdinOnce, a terminal.
type ttyIO struct{ stdin, once, tty bool }

// startWith starts a one-container pod of uid running script with io's stdin and terminal.
func (g *rig) startWith(uid, name, script string, io ttyIO) (*v1.Pod, ctrd.Container) {
	g.t.Helper()
	c := shell(name, script)
	c.Stdin, c.StdinOnce, c.TTY = io.stdin, io.once, io.tty
	p := newPod(uid, c)
	return p, g.start(p, g.sandbox(p), &p.Spec.Containers[0])
}

// attachment is one AttachStream in progress.
type attachment struct {
	out, errs testbuf.Buffer
	stdin     *io.PipeWriter
	cancel    context.CancelFunc
	done      chan struct{}
	code      int
	err       error
}

func (g *rig) attach(id string, s ctrd.ExecStreams) *attachment {
	ctx, cancel := context.WithCancel(context.Background())
	a := &attachment{cancel: cancel, done: make(chan struct{})}
	var in *io.PipeReader
	in, a.stdin = io.Pipe()
	s.Stdin, s.Stdout, s.Stderr = in, &a.out, &a.errs
	go func() {
		defer close(a.done)
		a.code, a.err = g.r.AttachStream(ctx, id, s)
		in.Close()
	}()
	g.t.Cleanup(func() { cancel(); <-a.done })
	return a
}

// waitOut waits until the attach's stdout holds want.
func (a *attachment) waitOut(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !strings.Contains(a.out.String(), want) {
		select {
		case <-a.done:
			t.Fatalf("attach ended (code %d, err %v) before its output held %q; it got %q", a.code, a.err, want, a.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("attach output did not hold %q within %s; it got %q", want, waitLimit, a.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (a *attachment) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(a.stdin, line); err != nil {
		t.Fatalf("attach stdin: %v", err)
	}
}

func (a *attachment) wait(t *testing.T) {
	t.Helper()
	select {
	case <-a.done:
	case <-time.After(waitLimit):
		t.Fatalf("attach did not end within %s; output %q", waitLimit, a.out.String())
	}
}

func TestAttachStdinKeptOpenAcrossAttachesAndRestart(t *testing.T) {
	g := newRig(t)
	p, ctr := g.startWith("a77a0001-attach", "reader", `echo before-any-attach; while read l; do echo "got:$l"; echo "err:$l" >&2; done; echo stdin-closed; sleep 3600`, ttyIO{stdin: true})
	g.waitLog(ctr, "before-any-attach")

	a := g.attach(ctr.ID, ctrd.ExecStreams{})
	a.send(t, "one\n")
	a.waitOut(t, "got:one\n")
	// The output an attach gets starts with it: what the container wrote before is in its log.
	if strings.Contains(a.out.String(), "before-any-attach") {
		t.Errorf("attach got output written before it: %q", a.out.String())
	}
	deadline := time.Now().Add(waitLimit)
	for !strings.Contains(a.errs.String(), "err:one\n") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(a.errs.String(), "err:one\n") {
		t.Errorf("attach stderr %q, want err:one", a.errs.String())
	}
	// The client's stdin ends and it goes away: without stdinOnce the container's stdin stays open.
	a.stdin.Close()
	a.cancel()
	a.wait(t)
	if !errors.Is(a.err, context.Canceled) {
		t.Errorf("attach left by its client: code %d err %v, want context.Canceled", a.code, a.err)
	}

	b := g.attach(ctr.ID, ctrd.ExecStreams{})
	b.send(t, "two\n")
	b.waitOut(t, "got:two\n")
	b.cancel()
	b.wait(t)

	// An agent restart: the next runtime takes the output up again, and the stdin is still open.
	g.restart()
	c3 := g.attach(ctr.ID, ctrd.ExecStreams{})
	c3.send(t, "three\n")
	c3.waitOut(t, "got:three\n")
	c3.cancel()
	c3.wait(t)

	g.waitLog(ctr, "got:three")
	log, err := readLog(ctr.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(log), "stdin-closed") {
		t.Errorf("the container's stdin was closed by an attach that ended; log:\n%s", log)
	}
	cs, err := g.r.ListContainers(context.Background(), string(p.UID))
	if err != nil || len(cs) != 1 || cs[0].State != ctrd.StateRunning {
		t.Errorf("container after three attaches: %+v %v, want it running", cs, err)
	}
}

func TestAttachStdinOnceClosesAfterFirstAttach(t *testing.T) {
	g := newRig(t)
	_, ctr := g.startWith("a77a0002-attach", "once", `echo ready; while read l; do echo "got:$l"; done; echo stdin-closed; exit 3`, ttyIO{stdin: true, once: true})
	g.waitLog(ctr, "ready")

	a := g.attach(ctr.ID, ctrd.ExecStreams{})
	a.send(t, "x\n")
	a.waitOut(t, "got:x\n")
	a.stdin.Close() // the client's EOF: with stdinOnce the container's stdin closes
	a.waitOut(t, "stdin-closed\n")
	a.wait(t)
	if a.err != nil || a.code != 3 {
		t.Errorf("attach ended with code %d err %v, want the container's exit code 3", a.code, a.err)
	}
}

// An attach with stdin after stdinOnce closed the container's stdin (a second kubectl attach -i to a
// kubectl run -i pod) follows the output without stdin, as containerd's CRI does, rather than fail
// on the FIFO nobody reads any more (ENXIO).
func TestAttachAfterStdinOnceClosedFollowsOutput(t *testing.T) {
	g := newRig(t)
	_, ctr := g.startWith("a77a0006-attach", "once", `echo ready; while read l; do echo "got:$l"; done; echo stdin-closed; while true; do echo tick; sleep 0.1; done`, ttyIO{stdin: true, once: true})
	g.waitLog(ctr, "ready")

	a := g.attach(ctr.ID, ctrd.ExecStreams{})
	a.send(t, "x\n")
	a.waitOut(t, "got:x\n")
	a.stdin.Close()
	a.waitOut(t, "stdin-closed\n")
	a.cancel()
	a.wait(t)

	b := g.attach(ctr.ID, ctrd.ExecStreams{})
	b.waitOut(t, "tick\n")
	b.cancel()
	b.wait(t)
	if !errors.Is(b.err, context.Canceled) {
		t.Errorf("second attach ended with code %d err %v, want context.Canceled (left by its client)", b.code, b.err)
	}
}

func TestAttachTerminal(t *testing.T) {
	g := newRig(t)
	_, ctr := g.startWith("a77a0003-attach", "tty", `exec sh`, ttyIO{stdin: true, tty: true})

	resize := make(chan ctrd.TermSize, 1)
	a := g.attach(ctr.ID, ctrd.ExecStreams{TTY: true, Size: ctrd.TermSize{Width: 100, Height: 40}, Resize: resize})
	a.send(t, "tty -s && echo on-a-tty; stty size; echo mark-$((6*7))\n")
	a.waitOut(t, "mark-42")
	if !strings.Contains(a.out.String(), "on-a-tty") || !strings.Contains(a.out.String(), "40 100") {
		t.Errorf("terminal output %q, want on-a-tty and the size 40 100", a.out.String())
	}
	resize <- ctrd.TermSize{Width: 120, Height: 50}
	deadline := time.Now().Add(waitLimit)
	for !strings.Contains(a.out.String(), "50 120") && time.Now().Before(deadline) {
		a.send(t, "stty size\n")
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(a.out.String(), "50 120") {
		t.Errorf("terminal not resized to 120x50: %q", a.out.String())
	}
	if a.errs.String() != "" {
		t.Errorf("a terminal has one stream, but stderr got %q", a.errs.String())
	}
	a.send(t, "exit 5\n")
	a.wait(t)
	if a.err != nil || a.code != 5 {
		t.Errorf("attach ended with code %d err %v, want the shell's exit code 5", a.code, a.err)
	}
	log, _ := readLog(ctr.LogPath)
	if !strings.Contains(string(log), "mark-42") {
		t.Errorf("the terminal's output is not in the log:\n%s", log)
	}
}

func TestAttachRefusesStoppedContainer(t *testing.T) {
	g := newRig(t)
	p := newPod("a77a0004-attach", shell("quick", `echo done`))
	sb := g.sandbox(p)
	ctr := g.start(p, sb, &p.Spec.Containers[0])
	g.waitLog(ctr, "done")
	deadline := time.Now().Add(waitLimit)
	for {
		cs, err := g.r.ListContainers(context.Background(), string(p.UID))
		if err == nil && len(cs) == 1 && cs[0].State == ctrd.StateExited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("container did not exit: %+v %v", cs, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, err := g.r.AttachStream(context.Background(), ctr.ID, ctrd.ExecStreams{})
	if err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("attach to an exited container: %v, want 'not running'", err)
	}
}

// gate is a writer whose writes wait until it opens: a client that does not keep up.
type gate struct {
	open chan struct{}
	n    int
}

func (g *gate) Write(p []byte) (int, error) {
	<-g.open
	g.n += len(p)
	return len(p), nil
}

// An attach whose client does not keep up is cut off; the container and its log never wait for it.
func TestAttachSlowClientIsCutOffNotTheContainer(t *testing.T) {
	g := newRig(t)
	_, ctr := g.startWith("a77a0005-attach", "flood", `echo ready; read l; head -c 3000000 /dev/zero | tr '\0' a; echo; echo all-written; sleep 3600`, ttyIO{stdin: true})
	g.waitLog(ctr, "ready")

	slow := &gate{open: make(chan struct{})}
	in, stdin := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := g.r.AttachStream(context.Background(), ctr.ID, ctrd.ExecStreams{Stdin: in, Stdout: slow})
		in.Close()
		done <- err
	}()
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	// The container writes its 3 MB and goes on although the attach took none of it.
	g.waitLog(ctr, "all-written")
	close(slow.open)
	select {
	case err := <-done:
		if !errors.Is(err, ctrd.ErrAttachLagged) {
			t.Errorf("slow attach ended with %v, want ErrAttachLagged", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("the slow attach did not end")
	}
	if slow.n >= 3000000 {
		t.Errorf("the slow client got all %d bytes: it was not cut off", slow.n)
	}
}

// stdinOnce with a terminal (kubectl run -it): an attach that ends leaves the stdin open, as
// containerd's CRI does, so the next attach reaches the same shell (kubectl's "resume using
// kubectl attach").
func TestAttachTerminalStdinOnceStaysOpen(t *testing.T) {
	g := newRig(t)
	_, ctr := g.startWith("a77a0007-attach", "tty", `exec sh`, ttyIO{stdin: true, once: true, tty: true})

	a := g.attach(ctr.ID, ctrd.ExecStreams{TTY: true})
	a.send(t, "echo first-$((1+1))\n")
	a.waitOut(t, "first-2")
	a.cancel() // the session is cut
	a.wait(t)

	b := g.attach(ctr.ID, ctrd.ExecStreams{TTY: true})
	b.send(t, "echo second-$((2+2))\n")
	b.waitOut(t, "second-4")
	b.send(t, "exit 6\n")
	b.wait(t)
	if b.err != nil || b.code != 6 {
		t.Errorf("second attach ended with code %d err %v, want the shell's exit code 6", b.code, b.err)
	}
}
