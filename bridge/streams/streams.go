// Package streams serves the interactive endpoints of the kubelet API for edge nodes (exec, attach
// and portForward): the API server's request, in the protocols it
// speaks to a kubelet (SPDY and websocket, k8s.io/cri-streaming), becomes sealed sessions to the
// node over MQTT (sync/stream), the same sessions `mqlet ctl exec` and `ctl port-forward` open
// (one per forwarded connection).
//
// Each request is one session: its bytes are bounded and flow-controlled on the MQTT side, it is
// renewed while the API server's connection lasts and cancelled when that connection goes (the
// node then kills the command), and a node that does not answer fails the request within
// stream.AnswerTimeout.
package streams

import (
	"context"
	"crypto/ecdh"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/stream"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

// Timeouts of a stream between the API server and the bridge, kubelet's defaults: a stream with
// no traffic for IdleTimeout is closed (streamingConnectionIdleTimeout), and the client must open
// its streams within CreationTimeout of the upgrade.
const (
	IdleTimeout     = 4 * time.Hour
	CreationTimeout = remotecommand.DefaultStreamCreationTimeout
)

// Options configure New.
type Options struct {
	// Transport reaches the broker (the bridge's MQTT connection); Topics names the tree.
	Transport stream.Transport
	Topics    protocol.Topics
	// SigningKey signs every open (nodes with trust anchors serve only signed ones).
	SigningKey ed25519.PrivateKey
	// NodeKey returns node's sealing public key, which the session's keys are agreed with
	// (attested by the node's certificate where the fleet CA is known).
	NodeKey func(node string) (*ecdh.PublicKey, error)
	// IdleTimeout and CreationTimeout default to the constants above.
	IdleTimeout, CreationTimeout time.Duration
	Log                          *slog.Logger
}

// Server implements kubeletapi.Streamer.
type Server struct{ o Options }

// New returns a Server.
func New(o Options) *Server {
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = IdleTimeout
	}
	if o.CreationTimeout <= 0 {
		o.CreationTimeout = CreationTimeout
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Server{o: o}
}

// target is what a kubelet streaming path names: /{verb}/{namespace}/{pod}[/{uid}]/{container}
// (exec, attach) or /{verb}/{namespace}/{pod}[/{uid}] (portForward).
type target struct {
	verb, namespace, pod, uid, container string
}

func parsePath(path string) (target, error) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	t := target{verb: parts[0]}
	switch {
	case t.verb == "portForward" && (len(parts) == 3 || len(parts) == 4):
		t.namespace, t.pod = parts[1], parts[2]
		if len(parts) == 4 {
			t.uid = parts[3]
		}
	case (t.verb == "exec" || t.verb == "attach" || t.verb == "run") && len(parts) == 4:
		t.namespace, t.pod, t.container = parts[1], parts[2], parts[3]
	case (t.verb == "exec" || t.verb == "attach" || t.verb == "run") && len(parts) == 5:
		t.namespace, t.pod, t.uid, t.container = parts[1], parts[2], parts[3], parts[4]
	default:
		return t, fmt.Errorf("%s: not a kubelet streaming path", path)
	}
	for _, p := range []string{t.namespace, t.pod, t.container} {
		if strings.ContainsAny(p, "\x00") {
			return t, fmt.Errorf("%s: bad path element", path)
		}
	}
	return t, nil
}

// ServeStream serves one exec, attach or portForward request for node. Refusals answer 400 with
// the reason: the API server hands a kubelet's 400 on to kubectl with its text.
func (s *Server) ServeStream(w http.ResponseWriter, r *http.Request, node string) {
	t, err := parsePath(r.URL.Path)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	key, err := s.o.NodeKey(node)
	if err != nil {
		http.Error(w, fmt.Sprintf("%s on node %s: %v", t.verb, node, err), http.StatusBadRequest)
		return
	}
	ex := &executor{s: s, node: node, key: key, namespace: t.namespace}
	if t.verb == "run" {
		s.run(w, r, ex, t)
		return
	}
	if t.verb == "portForward" {
		opts, err := portforward.NewV4Options(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		portforward.ServePortForward(w, r, ex, t.pod, t.uid, opts, s.o.IdleTimeout, s.o.CreationTimeout, portforward.SupportedProtocols)
		return
	}
	opts, err := remotecommand.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if t.verb == "attach" {
		remotecommand.ServeAttach(w, r, ex, t.pod, t.uid, t.container, opts, s.o.IdleTimeout, s.o.CreationTimeout,
			remotecommand.SupportedStreamingProtocols)
		return
	}
	cmd := r.URL.Query()["command"] // kubelet's name (api.ExecCommandParam)
	if len(cmd) == 0 {
		http.Error(w, "exec: no command", http.StatusBadRequest)
		return
	}
	remotecommand.ServeExec(w, r, ex, t.pod, t.uid, t.container, cmd, opts, s.o.IdleTimeout, s.o.CreationTimeout,
		remotecommand.SupportedStreamingProtocols)
}

// run serves kubelet's /run: the command (the cmd parameter, split at spaces, as kubelet splits
// it) without stdin, its stdout and stderr together as the answer once it ended.
func (s *Server) run(w http.ResponseWriter, r *http.Request, ex *executor, t target) {
	cmd := strings.Fields(r.URL.Query().Get("cmd"))
	if len(cmd) == 0 {
		http.Error(w, "run: no cmd", http.StatusBadRequest)
		return
	}
	var out syncWriter
	err := ex.ExecInContainer(r.Context(), t.pod, t.uid, t.container, cmd, nil, &out, &out, false, nil, 0)
	var code utilexec.CodeExitError
	if err != nil && !errors.As(err, &code) {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write(out.bytes())
}

// runOutputLimit bounds what /run keeps of a command's output: the whole answer is held in the
// bridge's memory until the command ends.
const runOutputLimit = 4 << 20

// syncWriter collects stdout and stderr, which the session writes from one goroutine each, up to
// runOutputLimit (the rest is dropped, the command is not held up).
type syncWriter struct {
	mu sync.Mutex
	b  []byte
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if room := runOutputLimit - len(s.b); room > 0 {
		s.b = append(s.b, p[:min(len(p), room)]...)
	}
	return len(p), nil
}

func (s *syncWriter) Close() error { return nil }

func (s *syncWriter) bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b
}

// executor runs one exec request as a session to the node.
type executor struct {
	s         *Server
	node      string
	key       *ecdh.PublicKey
	namespace string
}

func (e *executor) ExecInContainer(ctx context.Context, pod, _, container string, cmd []string, in io.Reader, out, errw io.WriteCloser,
	tty bool, resize <-chan remotecommand.TerminalSize, _ time.Duration) error {
	req := protocol.ExecRequest{Namespace: e.namespace, Pod: pod, Container: container, Command: cmd, TTY: tty}
	code, err := e.session(ctx, req, in, out, errw, resize)
	if err != nil {
		return err
	}
	if code != 0 {
		return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", code), Code: code}
	}
	return nil
}

// AttachContainer joins the container's own process (kubectl attach, run -it, debug -it). It ends
// when the process does, and succeeds then whatever its exit code, as kubelet's attach: the code
// is the pod status's.
func (e *executor) AttachContainer(ctx context.Context, pod, _, container string, in io.Reader, out, errw io.WriteCloser,
	tty bool, resize <-chan remotecommand.TerminalSize) error {
	req := protocol.ExecRequest{Namespace: e.namespace, Pod: pod, Container: container, Attach: true, TTY: tty}
	_, err := e.session(ctx, req, in, out, errw, resize)
	return err
}

// session runs one exec or attach session to the node and returns the exit code.
func (e *executor) session(ctx context.Context, req protocol.ExecRequest, in io.Reader, out, errw io.WriteCloser,
	resize <-chan remotecommand.TerminalSize) (int, error) {
	var sizes chan protocol.TermSize
	if resize != nil {
		sizes = make(chan protocol.TermSize)
		go func() {
			defer close(sizes)
			for {
				select {
				case <-ctx.Done():
					return
				case sz, ok := <-resize:
					if !ok {
						return
					}
					select {
					case sizes <- protocol.TermSize{Width: sz.Width, Height: sz.Height}:
					case <-ctx.Done():
						return
					}
				}
			}
		}()
	}
	var stdout, stderr io.Writer = discardNil(out), discardNil(errw)
	start := time.Now()
	code, err := stream.Exec(ctx, e.s.o.Transport, e.s.o.Topics, e.s.o.SigningKey, e.node, e.key, req, in, stdout, stderr, sizes)
	verb := "exec"
	if req.Attach {
		verb = "attach"
	}
	e.s.o.Log.Info(verb, "node", e.node, "pod", e.namespace+"/"+req.Pod, "container", req.Container, "exit", code,
		"took", time.Since(start).Round(time.Millisecond), "err", err)
	return code, err
}

// PortForward copies one port-forward stream of the API server to port in the pod: a session whose
// stdin and stdout are the stream's bytes; the node connects to the port on the pod's 127.0.0.1.
func (e *executor) PortForward(ctx context.Context, pod, _ string, port int32, conn io.ReadWriteCloser) error {
	defer conn.Close()
	req := protocol.ExecRequest{Namespace: e.namespace, Pod: pod, Port: port}
	_, err := stream.Exec(ctx, e.s.o.Transport, e.s.o.Topics, e.s.o.SigningKey, e.node, e.key, req, conn, conn, nil, nil)
	if err != nil {
		e.s.o.Log.Info("port-forward ended", "node", e.node, "pod", e.namespace+"/"+pod, "port", port, "err", err)
	}
	return err
}

// discardNil: an output the client did not ask for (no stdout, or no stderr with a tty).
func discardNil(w io.WriteCloser) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
