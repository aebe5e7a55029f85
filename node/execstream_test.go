package node_test

// The exec-over-MQTT server and client (sync/stream) against a real mosquitto and a real
// containerd: here, not in sync/, whose code and tests link no agent/ (internal/layering).

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"github.com/mqlet/mqlet/internal/testbuf"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/core/execio"
	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/internal/testenv"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
	"github.com/mqlet/mqlet/sync/stream"
)

const (
	node        = "n1"
	testTimeout = 20 * time.Second
)

var tp = protocol.MustTopics(protocol.DefaultPrefix)

// pahoTransport is stream.Transport on a paho client, as the ctl's and the bridge's are.
type pahoTransport struct{ c mqtt.Client }

func (p pahoTransport) Publish(ctx context.Context, topic string, payload []byte) error {
	tok := p.c.Publish(topic, 1, false, payload)
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p pahoTransport) Subscribe(ctx context.Context, topic string, h func([]byte)) (func(), error) {
	tok := p.c.Subscribe(topic, 1, func(_ mqtt.Client, m mqtt.Message) { h(m.Payload()) })
	select {
	case <-tok.Done():
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	return func() { p.c.Unsubscribe(topic).WaitTimeout(testTimeout) }, nil
}

// tap wraps a stream.Transport: it records what is published and may alter or drop it.
type tap struct {
	stream.Transport
	mu     sync.Mutex
	sent   [][]byte
	alter  func(n int, payload []byte) []byte // n counts publishes from 0; nil return drops
	cutOff atomic.Bool                        // drop everything from now on
}

func (t *tap) Publish(ctx context.Context, topic string, payload []byte) error {
	t.mu.Lock()
	n := len(t.sent)
	t.sent = append(t.sent, payload)
	t.mu.Unlock()
	if t.cutOff.Load() {
		return nil
	}
	if t.alter != nil {
		if payload = t.alter(n, payload); payload == nil {
			return nil
		}
	}
	return t.Transport.Publish(ctx, topic, payload)
}

func dial(t *testing.T, b *mqtttest.Broker, id string) mqtt.Client {
	t.Helper()
	cl := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(b.Plain).SetClientID(id).SetAutoReconnect(false).SetConnectTimeout(testTimeout))
	if tok := cl.Connect(); !tok.WaitTimeout(testTimeout) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", id, tok.Error())
	}
	t.Cleanup(func() { cl.Disconnect(100) })
	return cl
}

// execer is the node's stream.Execer on the real runtime: pod default/web is the test's container.
type execer struct {
	rt       *ctrd.Runtime
	id       string
	accepted atomic.Int64 // output bytes the node's writers took
	echo     string       // the address DialPod connects to
}

func (e *execer) ExecTarget(ns, name, container string) (string, error) {
	if ns != "default" || name != "web" {
		return "", errors.New("pod " + ns + "/" + name + " not found")
	}
	return e.id, nil
}

type counting struct {
	w io.Writer
	n *atomic.Int64
}

func (c counting) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

func (e *execer) ExecStream(ctx context.Context, id string, cmd []string, s execio.Streams) (int, error) {
	s.Stdout = counting{s.Stdout, &e.accepted}
	return e.rt.ExecStream(ctx, id, cmd, s)
}

// rig is a broker, a node (Server on its own connection, fed like the node's link) with a busybox
// container running in the real containerd, and a client connection.
type rig struct {
	env    testenv.Env
	ns     string
	ex     *execer
	srv    *stream.Server
	key    *sealing.Key
	anchor ed25519.PrivateKey
	client stream.Transport
	b      *mqtttest.Broker
	pub    *countingPub
}

// countingPub counts the data bytes in the node's sealed frames: a frame's box is its kind byte,
// its data and the AEAD's 16-byte tag; control frames carry at most 4 bytes.
type countingPub struct {
	stream.Publisher
	data atomic.Int64
	mute atomic.Bool // the node's frames are lost on the way (taken, never delivered)
}

func (c *countingPub) Publish(ctx context.Context, topic string, payload []byte) error {
	if c.mute.Load() {
		return nil
	}
	if f, err := protocol.DecodeExecSealed(payload, 0); err == nil && len(f.Box) > 1+4+16 {
		c.data.Add(int64(len(f.Box) - 1 - 16))
	}
	return c.Publisher.Publish(ctx, topic, payload)
}

func newRig(t *testing.T, o stream.ServerOptions) *rig {
	t.Helper()
	env := testenv.Require(t)
	ns := testenv.Namespace(t, env.ContainerdAddress)
	ctx := context.Background()
	rt, err := ctrd.New(ctx, ctrd.Options{Address: env.ContainerdAddress, Namespace: ns, StateDir: t.TempDir(), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	rc, err := ctrd.OpenArchive(env.Image(testenv.Busybox))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.ImportArchive(ctx, rc); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	const id = "exec-over-mqtt"
	env.RunBusybox(t, ns, id, filepath.Join(t.TempDir(), "log"), "exec sleep 3600")

	nodeKey := make([]byte, 32)
	rand.Read(nodeKey)
	key, err := sealing.FromNodeKey(nodeKey)
	if err != nil {
		t.Fatal(err)
	}
	pub, anchor, _ := ed25519.GenerateKey(rand.Reader)
	r := &rig{env: env, ns: ns, ex: &execer{rt: rt, id: id}, key: key, anchor: anchor, b: mqtttest.Start(t, mqtttest.Options{})}
	nodeConn := dial(t, r.b, "node")
	r.pub = &countingPub{Publisher: pahoTransport{nodeConn}}
	o.Node, o.Topics, o.Exec, o.Pub, o.Key = node, tp, r.ex, r.pub, key
	if o.Trusted == nil {
		o.Trusted = []ed25519.PublicKey{pub}
	}
	if os.Getenv("STREAM_DEBUG") != "" {
		o.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	r.srv = stream.NewServer(o)
	if tok := nodeConn.Subscribe(tp.ExecRequest(node), 1, func(_ mqtt.Client, m mqtt.Message) { r.srv.Handle(m.Payload()) }); !tok.WaitTimeout(testTimeout) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.srv.Run(sctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	r.client = pahoTransport{dial(t, r.b, "client")}
	return r
}

// processes counts the container's processes, from containerd.
func (r *rig) processes(t *testing.T) int {
	t.Helper()
	return r.env.Processes(t, r.ns, r.ex.id)
}

// waitProcesses waits (bounded) until the container has n processes.
func (r *rig) waitProcesses(t *testing.T, n int, why string) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for r.processes(t) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: the container has %d processes, want %d", why, r.processes(t), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *rig) exec(ctx context.Context, t stream.Transport, signer ed25519.PrivateKey, req protocol.ExecRequest, stdin io.Reader, stdout, stderr io.Writer, resize <-chan protocol.TermSize) (int, error) {
	if req.Pod == "" {
		req.Pod = "web"
	}
	return stream.Exec(ctx, t, tp, signer, node, r.key.PublicKey(), req, stdin, stdout, stderr, resize)
}

func TestExecOverMQTT(t *testing.T) {
	r := newRig(t, stream.ServerOptions{})
	ctx := context.Background()

	t.Run("stdin, stdout, stderr, exit code", func(t *testing.T) {
		var out, errOut testbuf.Buffer
		// More than the node's stdin window and many frames: credit must flow back.
		in := strings.Repeat("0123456789abcdef", 40000)
		code, err := r.exec(ctx, r.client, r.anchor, protocol.ExecRequest{Command: []string{"sh", "-c", "cat; echo on-stderr >&2; exit 3"}},
			strings.NewReader(in), &out, &errOut, nil)
		if err != nil {
			t.Fatal(err)
		}
		if code != 3 || out.String() != in || errOut.String() != "on-stderr\n" {
			t.Errorf("exit %d, stdout %d bytes (want %d, equal), stderr %q", code, len(out.String()), len(in), errOut.String())
		}
	})

	t.Run("tty size and resize", func(t *testing.T) {
		var out testbuf.Buffer
		resize := make(chan protocol.TermSize, 1)
		type result struct {
			code int
			err  error
		}
		res := make(chan result, 1)
		go func() {
			code, err := r.exec(ctx, r.client, r.anchor, protocol.ExecRequest{TTY: true, Size: &protocol.TermSize{Width: 100, Height: 30},
				Command: []string{"sh", "-c", "tty; stty size; while [ \"$(stty size)\" = '30 100' ]; do sleep 0.05; done; stty size; exit 5"}},
				nil, &out, nil, resize)
			res <- result{code, err}
		}()
		// Resize only once the command has seen the first size.
		deadline := time.Now().Add(testTimeout)
		for !strings.Contains(out.String(), "30 100") {
			if time.Now().After(deadline) {
				t.Fatalf("the initial size never showed: %q", out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		resize <- protocol.TermSize{Width: 120, Height: 40}
		rs := <-res
		if rs.err != nil {
			t.Fatal(rs.err)
		}
		got := out.String()
		if rs.code != 5 || !strings.Contains(got, "/dev/pts/") || !strings.Contains(got, "40 120") {
			t.Errorf("exit %d, output %q: want 5, a pts, 30 100 then 40 120", rs.code, got)
		}
	})

	t.Run("unknown pod is told by the node", func(t *testing.T) {
		_, err := r.exec(ctx, r.client, r.anchor, protocol.ExecRequest{Pod: "nope", Command: []string{"true"}}, nil, nil, nil, nil)
		if err == nil || !strings.Contains(err.Error(), "pod default/nope not found") {
			t.Errorf("err %v, want the node's not found", err)
		}
	})

	t.Run("unsigned and forged opens are refused", func(t *testing.T) {
		_, err := r.exec(ctx, r.client, nil, protocol.ExecRequest{Command: []string{"true"}}, nil, nil, nil, nil)
		if err == nil || !strings.Contains(err.Error(), "not signed") {
			t.Errorf("unsigned: err %v, want a refusal saying so", err)
		}
		_, other, _ := ed25519.GenerateKey(rand.Reader)
		_, err = r.exec(ctx, r.client, other, protocol.ExecRequest{Command: []string{"true"}}, nil, nil, nil, nil)
		if err == nil || !strings.Contains(err.Error(), "not signed by a key this node trusts") {
			t.Errorf("forged: err %v, want a refusal saying so", err)
		}
	})

	t.Run("a replayed open is refused", func(t *testing.T) {
		tp1 := &tap{Transport: r.client}
		if _, err := r.exec(ctx, tp1, r.anchor, protocol.ExecRequest{ID: "replayed-1", Command: []string{"true"}}, nil, nil, nil, nil); err != nil {
			t.Fatal(err)
		}
		// The broker (or anyone who saw it) publishes the captured open again.
		replies := make(chan []byte, 8)
		unsub, err := r.client.Subscribe(ctx, tp.ExecReply(node, "replayed-1"), func(p []byte) { replies <- p })
		if err != nil {
			t.Fatal(err)
		}
		defer unsub()
		if err := r.client.Publish(ctx, tp.ExecRequest(node), tp1.sent[0]); err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-replies:
			f, err := protocol.DecodeExecSealed(p, 0)
			if err != nil || !strings.Contains(f.Error, "already served (a replay)") {
				t.Errorf("answer to the replay: %+v, %v; want a refusal naming the replay", f, err)
			}
		case <-time.After(testTimeout):
			t.Fatal("no answer to the replayed open")
		}
	})

	t.Run("a tampered frame ends the session and the command", func(t *testing.T) {
		// Publish 0 is the open; 1 is the first stdin frame: flip a bit of its sealed box.
		tp1 := &tap{Transport: r.client, alter: func(n int, p []byte) []byte {
			if n != 1 {
				return p
			}
			f, err := protocol.DecodeExecSealed(p, 0)
			if err != nil {
				t.Errorf("frame 1: %v", err)
				return p
			}
			f.Box[len(f.Box)/2] ^= 1
			b, _ := protocol.Encode(f)
			return b
		}}
		_, err := r.exec(ctx, tp1, r.anchor, protocol.ExecRequest{Command: []string{"cat"}},
			strings.NewReader("secret\n"), nil, nil, nil)
		if err == nil || !strings.Contains(err.Error(), "does not open") {
			t.Errorf("err %v, want the node's 'does not open'", err)
		}
		r.waitProcesses(t, 1, "after the tampered frame")
	})

}

func TestExecClientVanishes(t *testing.T) {
	r := newRig(t, stream.ServerOptions{Lease: 2 * time.Second})
	var out testbuf.Buffer
	tp1 := &tap{Transport: r.client}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	inR, inW := io.Pipe() // stdin that stays open: the session lives until the lease ends it
	defer inW.Close()
	go func() {
		_, err := r.exec(ctx, tp1, r.anchor, protocol.ExecRequest{Command: []string{"sh", "-c", "echo started; exec sleep 3600"}}, inR, &out, nil, nil)
		errc <- err
	}()
	deadline := time.Now().Add(testTimeout)
	for !strings.Contains(out.String(), "started") {
		if time.Now().After(deadline) {
			t.Fatal("the command never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := r.processes(t); n != 2 {
		t.Fatalf("%d processes while the exec runs, want 2", n)
	}
	// The client is cut off from the broker: nothing it sends arrives, not even its cancel.
	tp1.cutOff.Store(true)
	cancel()
	<-errc
	r.waitProcesses(t, 1, "after the client vanished (lease 2s)")
}

// A client that stops taking output holds the node to its window: the node's writers block, so
// the node holds at most the window, and all of it arrives once the client reads again.
func TestExecFlowControl(t *testing.T) {
	r := newRig(t, stream.ServerOptions{})
	const window = 64 << 10
	const total = 1 << 20
	release := make(chan struct{})
	var got atomic.Int64
	out := writerFunc(func(p []byte) (int, error) {
		<-release
		got.Add(int64(len(p)))
		return len(p), nil
	})
	errc := make(chan error, 1)
	codec := make(chan int, 1)
	// The command waits for stdin's end before it exits: containerd 1.6 can drop output still in
	// the pipes of an exec that has exited (containerd#5741), which is not what this tests.
	inR, inW := io.Pipe()
	defer inW.Close()
	go func() {
		code, err := r.exec(context.Background(), r.client, r.anchor, protocol.ExecRequest{Window: window,
			Command: []string{"sh", "-c", "head -c 1048576 /dev/zero; read x; exit 0"}}, inR, out, nil, nil)
		codec <- code
		errc <- err
	}()
	deadline := time.Now().Add(testTimeout)
	for r.pub.data.Load() < window {
		if time.Now().After(deadline) {
			t.Fatalf("the node sent %d bytes, never its whole window %d", r.pub.data.Load(), window)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Give a node without flow control time to run on; with it, it is blocked at the window.
	time.Sleep(time.Second)
	if n := r.pub.data.Load(); n > window {
		t.Errorf("the node sent %d bytes of output while the client read none; the window is %d", n, window)
	}
	close(release)
	for got.Load() < total {
		if time.Now().After(deadline.Add(testTimeout)) {
			t.Fatalf("%d bytes arrived, want %d", got.Load(), total)
		}
		time.Sleep(20 * time.Millisecond)
	}
	inW.Close()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if code := <-codec; code != 0 || got.Load() != total {
		t.Errorf("exit %d, %d bytes; want 0 and %d", code, got.Load(), total)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// An exec to a node that is not there fails after stream.AnswerTimeout with a message saying so.
func TestExecNodeOffline(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	c := pahoTransport{dial(t, b, "client")}
	k, _ := sealing.Generate()
	_, err := stream.Exec(context.Background(), c, tp, nil, "gone", k.PublicKey(), protocol.ExecRequest{Pod: "web", Command: []string{"true"}}, nil, nil, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "node gone did not answer") {
		t.Errorf("err %v, want 'node gone did not answer'", err)
	}
}

// A node serves at most MaxSessions at once; one more is refused with the reason, and the running
// one is undisturbed.
func TestExecMaxSessions(t *testing.T) {
	r := newRig(t, stream.ServerOptions{MaxSessions: 1})
	var out testbuf.Buffer
	inR, inW := io.Pipe()
	errc := make(chan error, 1)
	codec := make(chan int, 1)
	go func() {
		code, err := r.exec(context.Background(), r.client, r.anchor, protocol.ExecRequest{Command: []string{"sh", "-c", "echo started; read x; exit 4"}}, inR, &out, nil, nil)
		codec <- code
		errc <- err
	}()
	deadline := time.Now().Add(testTimeout)
	for !strings.Contains(out.String(), "started") {
		if time.Now().After(deadline) {
			t.Fatal("the first session never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, err := r.exec(context.Background(), r.client, r.anchor, protocol.ExecRequest{Command: []string{"true"}}, nil, nil, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "too many exec sessions on node n1 (1 at once)") {
		t.Errorf("second session: err %v, want too many sessions", err)
	}
	inW.Write([]byte("go\n"))
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if code := <-codec; code != 4 {
		t.Errorf("the first session's exit %d, want 4", code)
	}
}

// DialPod makes the test's execer a stream.PodDialer: "the pod's port" is a local echo server.
func (e *execer) DialPod(ctx context.Context, ns, name string, port int) (net.Conn, error) {
	if name != "web" || e.echo == "" {
		return nil, errors.New("pod " + ns + "/" + name + " not found")
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", e.echo)
}

// A port-forward session carries a TCP connection's bytes both ways; the client's EOF half-closes
// it, and the pod's close ends the session with 0.
func TestPortForwardSession(t *testing.T) {
	r := newRig(t, stream.ServerOptions{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // echo upper-cased until EOF, then close
				b, _ := io.ReadAll(c)
				c.Write(bytes.ToUpper(b))
				c.Close()
			}()
		}
	}()
	r.ex.echo = ln.Addr().String()
	in := strings.Repeat("through the broker ", 10000)
	var out testbuf.Buffer
	code, err := r.exec(context.Background(), r.client, r.anchor, protocol.ExecRequest{Port: 8080}, strings.NewReader(in), &out, nil, nil)
	if err != nil || code != 0 {
		t.Fatalf("exit %d, err %v", code, err)
	}
	if out.String() != strings.ToUpper(in) {
		t.Errorf("%d bytes back, want the %d sent, upper-cased", len(out.String()), len(in))
	}
	_, err = r.exec(context.Background(), r.client, r.anchor, protocol.ExecRequest{Pod: "nope", Port: 8080}, strings.NewReader(""), nil, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "pod default/nope not found") {
		t.Errorf("unknown pod: err %v", err)
	}
}

// A session with no data either way for Idle ends, and its command with it; the client is told why.
func TestExecIdleTimeout(t *testing.T) {
	r := newRig(t, stream.ServerOptions{Idle: time.Second})
	_, err := r.exec(context.Background(), r.client, r.anchor, protocol.ExecRequest{Command: []string{"sleep", "3600"}}, nil, nil, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "no data either way for 1s") {
		t.Errorf("err %v, want the idle timeout", err)
	}
	r.waitProcesses(t, 1, "after the idle timeout")
}
