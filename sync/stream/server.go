package stream

import (
	"context"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/mqlet/mqlet/core/execio"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
)

// Execer runs commands in containers; the agent implements it (as for its local API).
type Execer interface {
	ExecTarget(namespace, name, container string) (string, error)
	ExecStream(ctx context.Context, id string, cmd []string, s execio.Streams) (int, error)
}

// Attacher is implemented by Execers that can join a container's own process (attach sessions);
// the agent does.
type Attacher interface {
	AttachStream(ctx context.Context, id string, s execio.Streams) (int, error)
}

// PodDialer is implemented by Execers that can connect into a pod's network (port-forward
// sessions); the agent does.
type PodDialer interface {
	DialPod(ctx context.Context, namespace, name string, port int) (net.Conn, error)
}

// Publisher publishes one message at QoS 1, not retained, and returns once the broker has
// acknowledged it. Session frames bypass the outbox: they are only of use now.
type Publisher interface {
	Publish(ctx context.Context, topic string, payload []byte) error
}

// Defaults of ServerOptions.
const (
	DefaultMaxSessions = 4
	DefaultLease       = 30 * time.Second
	DefaultIdle        = 30 * time.Minute
	DefaultMaxLife     = 4 * time.Hour
	DefaultWindow      = 256 << 10
)

const (
	queueLen     = 64              // messages waiting in a session's inbox; more ends it
	finalTimeout = 5 * time.Second // bounds the publish of a session's last frame and of a refusal
)

// ServerOptions configure a Server.
type ServerOptions struct {
	Node   string
	Topics protocol.Topics
	Exec   Execer
	Pub    Publisher
	// Key is the node's sealing key: sessions agree their keys with it. Without one the node
	// cannot serve exec over MQTT (every open is refused saying so).
	Key *sealing.Key
	// Trusted, when set, are the keys an open must be signed by (protocol.SignExecRequest), each
	// id served once; empty serves every open (a node without trust anchors, as for logs).
	Trusted     []ed25519.PublicKey
	MaxSessions int           // at once (DefaultMaxSessions); more are refused
	Lease       time.Duration // a session whose client sent nothing for this long ends (DefaultLease)
	Idle        time.Duration // a session with no data either way for this long ends (DefaultIdle)
	MaxLife     time.Duration // no session lasts longer (DefaultMaxLife)
	Window      int64         // stdin bytes a client may send before the node grants more (DefaultWindow)
	Now         func() time.Time
	Log         *slog.Logger
}

// Server serves exec sessions: Handle takes the node's exec/req messages in, Run runs sessions.
type Server struct {
	o ServerOptions

	mu       sync.Mutex
	ctx      context.Context // Run's; nil before Run
	wg       *sync.WaitGroup
	sessions map[string]*session
	opened   map[string]time.Time // signed opens served, by id, until they expire
	refusals chan refusal
	started  time.Time // a signed open issued before it may be a replay of one served before
}

type refusal struct{ id, why string }

// NewServer returns a Server; Run checks the options.
func NewServer(o ServerOptions) *Server {
	if o.MaxSessions <= 0 {
		o.MaxSessions = DefaultMaxSessions
	}
	if o.Lease <= 0 {
		o.Lease = DefaultLease
	}
	if o.Idle <= 0 {
		o.Idle = DefaultIdle
	}
	if o.MaxLife <= 0 {
		o.MaxLife = DefaultMaxLife
	}
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Server{o: o, sessions: map[string]*session{}, opened: map[string]time.Time{}, refusals: make(chan refusal, queueLen),
		started: o.Now().Truncate(time.Second)}
}

// Run serves until ctx ends, then ends every session (their commands are killed) and returns once
// they are gone.
func (s *Server) Run(ctx context.Context) error {
	switch {
	case s.o.Topics.Prefix() == "":
		return errors.New("stream: no topics (use protocol.NewTopics)")
	case s.o.Exec == nil || s.o.Pub == nil:
		return errors.New("stream: Exec and Pub are required")
	}
	if err := protocol.ValidateNodeName(s.o.Node); err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	var wg sync.WaitGroup
	s.mu.Lock()
	s.ctx, s.wg = ctx, &wg
	s.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			s.mu.Lock()
			s.ctx = nil // no new sessions; running ones end with ctx
			s.mu.Unlock()
			wg.Wait()
			return nil
		case r := <-s.refusals:
			s.refuse(ctx, r.id, r.why)
		}
	}
}

// Handle takes one message of the node's exec/req topic. It never blocks: an open is checked and
// its session started, a frame is queued for its session.
func (s *Server) Handle(payload []byte) {
	op, id := protocol.ExecOp(payload)
	switch op {
	case protocol.ExecFrame:
		f, err := protocol.DecodeExecSealed(payload, protocol.DefaultMaxPayload)
		if err != nil {
			s.o.Log.Debug("exec frame dropped", "err", err)
			return
		}
		s.mu.Lock()
		se := s.sessions[f.ID]
		s.mu.Unlock()
		if se == nil {
			return // a session that ended, or never was
		}
		select {
		case se.in <- f:
		default:
			se.cancel(fmt.Errorf("the client sent more than %d frames the node had not taken yet", queueLen))
		}
	case protocol.ExecOpen:
		req, err := protocol.DecodeExecRequest(payload, protocol.DefaultMaxPayload)
		if err != nil {
			s.refuseLater(id, err.Error())
			return
		}
		if why := s.authorise(req); why != "" {
			s.refuseLater(req.ID, why)
			return
		}
		s.start(req)
	default:
		s.o.Log.Debug("exec message dropped: unknown op", "op", op)
	}
}

func (s *Server) refuseLater(id, why string) {
	s.o.Log.Warn("exec request refused", "id", id, "reason", why)
	if protocol.ValidateRequestID(id) != nil {
		return // no reply topic: nobody can be told
	}
	select {
	case s.refusals <- refusal{id, why}:
	default:
		s.o.Log.Warn("exec refusal dropped: too many queued", "id", id)
	}
}

// refuse answers an open with an error in clear (no session key exists yet).
func (s *Server) refuse(ctx context.Context, id, why string) {
	ctx, cancel := context.WithTimeout(ctx, finalTimeout)
	defer cancel()
	b, err := protocol.Encode(&protocol.ExecSealed{ID: id, Op: protocol.ExecFrame, Error: why})
	if err == nil {
		err = s.o.Pub.Publish(ctx, s.o.Topics.ExecReply(s.o.Node, id), b)
	}
	if err != nil {
		s.o.Log.Warn("exec refusal not sent", "id", id, "err", err)
	}
}

// authorise says why req may not be served ("" when it may), as logserve does for logs requests.
func (s *Server) authorise(req *protocol.ExecRequest) string {
	if s.o.Key == nil {
		return fmt.Sprintf("node %s has no sealing key, so it cannot serve exec over MQTT", s.o.Node)
	}
	if req.NodeKeyID != s.o.Key.ID() {
		return fmt.Sprintf("exec request %s: made for node key %s, this node's is %s", req.ID, req.NodeKeyID, s.o.Key.ID())
	}
	if len(s.o.Trusted) == 0 {
		return ""
	}
	now := s.o.Now()
	if err := protocol.VerifyExecRequest(s.o.Node, req, s.o.Trusted, now); err != nil {
		return err.Error()
	}
	// The ids served are known since this server started only: an open from before then could
	// be one served already, replayed (after an agent restart) while it has not expired.
	if req.Issued.IsZero() || req.Issued.Before(s.started) {
		return fmt.Sprintf("exec request %s: issued %s, before this node's agent started (%s): it may be a replay; open a new session",
			req.ID, req.Issued.Format(time.RFC3339), s.started.Format(time.RFC3339))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, exp := range s.opened {
		if !now.Before(exp) {
			delete(s.opened, id)
		}
	}
	if _, seen := s.opened[req.ID]; seen {
		return fmt.Sprintf("exec request %s: already served (a replay)", req.ID)
	}
	s.opened[req.ID] = req.Expires
	return ""
}

// start registers the session and runs it, or refuses it.
func (s *Server) start(req *protocol.ExecRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.ctx == nil:
		s.o.Log.Warn("exec request dropped: the server is not running", "id", req.ID)
		return
	case s.sessions[req.ID] != nil:
		return // a QoS 1 duplicate of an open being served
	case len(s.sessions) >= s.o.MaxSessions:
		go s.refuseLater(req.ID, fmt.Sprintf("too many exec sessions on node %s (%d at once); try again later", s.o.Node, s.o.MaxSessions))
		return
	}
	ctx, cancel := context.WithCancelCause(s.ctx)
	se := &session{s: s, req: req, in: make(chan *protocol.ExecSealed, queueLen), cancel: cancel}
	s.sessions[req.ID] = se
	s.wg.Go(func() {
		se.run(ctx)
		cancel(nil)
		s.mu.Lock()
		delete(s.sessions, req.ID)
		s.mu.Unlock()
	})
}

// session is one running exec on the node.
type session struct {
	s      *Server
	req    *protocol.ExecRequest
	in     chan *protocol.ExecSealed
	cancel context.CancelCauseFunc

	pubMu sync.Mutex // serialises seal+publish, so frames leave in Seq order
	seal  *sealer
}

// send seals and publishes one frame to the client.
func (se *session) send(ctx context.Context, kind byte, payload []byte) error {
	se.pubMu.Lock()
	defer se.pubMu.Unlock()
	b, err := se.seal.seal(kind, payload)
	if err != nil {
		return err
	}
	return se.s.o.Pub.Publish(ctx, se.s.o.Topics.ExecReply(se.s.o.Node, se.req.ID), b)
}

// aliveTimeout bounds the publish of a lease's answer: the frames of the client wait meanwhile.
const aliveTimeout = 5 * time.Second

// output is stdout or stderr of the command: each write waits for the client's credit.
type output struct {
	ctx  context.Context
	se   *session
	kind byte
	cr   *credit
	act  func()
}

func (w *output) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k, err := w.cr.take(min(len(p), maxData), w.ctx.Done())
		if err != nil {
			return n, err
		}
		if err := w.se.send(w.ctx, w.kind, p[:k]); err != nil {
			return n, err
		}
		w.act()
		n += k
		p = p[k:]
	}
	return n, nil
}

func (se *session) run(ctx context.Context) {
	o := se.s.o
	req := se.req
	log := o.Log.With("session", req.ID, "pod", req.Namespace+"/"+req.Pod)
	clientPub, err := ecdh.X25519().NewPublicKey(mustB64(req.ClientKey))
	if err != nil {
		se.s.refuseLater(req.ID, fmt.Sprintf("exec request %s: clientKey: %v", req.ID, err))
		return
	}
	shared, err := o.Key.Agree(clientPub)
	if err != nil {
		se.s.refuseLater(req.ID, err.Error())
		return
	}
	nodeNonce := make([]byte, protocol.ExecNonceSize)
	if _, err := rand.Read(nodeNonce); err != nil {
		se.s.refuseLater(req.ID, err.Error())
		return
	}
	aeadIn, aeadOut, err := sessionKeys(shared, req.ID, clientPub, o.Key.PublicKey(), nodeNonce)
	if err != nil {
		se.s.refuseLater(req.ID, err.Error())
		return
	}
	se.seal = &sealer{aead: aeadOut, id: req.ID, dir: dirToClient, first: nodeNonce}
	open := &opener{aead: aeadIn, id: req.ID, dir: dirToNode}

	// run is what the session carries: a command, or a connection into the pod (port-forward).
	var run func(ctx context.Context, s execio.Streams) (int, error)
	if req.Port != 0 {
		d, ok := o.Exec.(PodDialer)
		if !ok {
			se.final(ctx, kindError, []byte("this node cannot port-forward"), log)
			return
		}
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := d.DialPod(dctx, req.Namespace, req.Pod, int(req.Port))
		cancel()
		if err != nil {
			se.final(ctx, kindError, []byte(err.Error()), log)
			return
		}
		defer conn.Close()
		run = func(ctx context.Context, s execio.Streams) (int, error) { return forward(ctx, conn, s) }
	} else {
		id, err := o.Exec.ExecTarget(req.Namespace, req.Pod, req.Container)
		if err != nil {
			// Sealed: the client learns it from the node itself, not from whoever can publish.
			se.final(ctx, kindError, []byte(err.Error()), log)
			return
		}
		run = func(ctx context.Context, s execio.Streams) (int, error) {
			return o.Exec.ExecStream(ctx, id, req.Command, s)
		}
		if req.Attach {
			a, ok := o.Exec.(Attacher)
			if !ok {
				se.final(ctx, kindError, []byte("this node cannot attach"), log)
				return
			}
			run = func(ctx context.Context, s execio.Streams) (int, error) {
				return a.AttachStream(ctx, id, s)
			}
		}
	}
	if err := se.send(ctx, kindAccepted, u32(int(o.Window))); err != nil {
		log.Warn("exec session: accept not sent", "err", err)
		return
	}
	log.Info("exec session started", "container", req.Container, "command", req.Command, "port", req.Port, "attach", req.Attach)

	var (
		actMu    sync.Mutex
		lastData = o.Now()
		lastPeer = o.Now()
	)
	touch := func(p *time.Time) func() {
		return func() { actMu.Lock(); *p = o.Now(); actMu.Unlock() }
	}
	// ectx ends with the session (lease, cancel, a bad frame, the timeouts): the output writers
	// wait for credit on it, so a client that stopped granting and went away frees the command's
	// output (and the session's slot) instead of holding it for ever.
	ectx, endExec := context.WithCancelCause(ctx)
	defer endExec(nil)
	outCredit := newCredit(req.Window)
	streams := execio.Streams{
		Stdout: &output{ctx: ectx, se: se, kind: kindStdout, cr: outCredit, act: touch(&lastData)},
		Stderr: &output{ctx: ectx, se: se, kind: kindStderr, cr: outCredit, act: touch(&lastData)},
		TTY:    req.TTY,
	}
	if req.Size != nil {
		streams.Size = execio.TermSize{Width: req.Size.Width, Height: req.Size.Height}
	}
	resize := make(chan execio.TermSize, 1)
	streams.Resize = resize
	var stdin *window
	if req.Stdin || req.Port != 0 {
		stdin = newWindow(int(o.Window))
		streams.Stdin = stdin
	}

	// The client's frames: applied in order by one goroutine that never blocks on the command
	// (stdin goes to a buffer the window bounds), so credit and lease frames always get through.
	go func() {
		for {
			select {
			case <-ectx.Done():
				return
			case f := <-se.in:
				kind, p, err := open.open(f)
				if errors.Is(err, errDuplicate) {
					continue
				}
				if err != nil {
					endExec(err)
					return
				}
				touch(&lastPeer)()
				switch kind {
				case kindStdin:
					if stdin == nil || stdin.put(p) != nil {
						endExec(fmt.Errorf("the client sent stdin beyond its window, or to a session without stdin"))
						return
					}
					touch(&lastData)()
				case kindStdinEOF:
					if stdin != nil {
						stdin.close()
					}
				case kindResize:
					if len(p) == 4 {
						select {
						case <-resize:
						default:
						}
						resize <- execio.TermSize{Width: binary.BigEndian.Uint16(p), Height: binary.BigEndian.Uint16(p[2:])}
					}
				case kindCredit:
					if len(p) != 4 || outCredit.grant(int64(binary.BigEndian.Uint32(p)), req.Window) != nil {
						endExec(errors.New("the client granted more credit than its window"))
						return
					}
				case kindLease:
					// Answered, so the client can tell a node that lost the session (an agent
					// killed and restarted, frames lost with a broker) from a quiet command.
					actx, cancel := context.WithTimeout(ectx, aliveTimeout)
					err := se.send(actx, kindAlive, nil)
					cancel()
					if err != nil && ectx.Err() == nil {
						log.Warn("exec session: lease not answered", "err", err)
					}
				case kindCancel:
					endExec(errors.New("cancelled by the client"))
					return
				default:
					endExec(fmt.Errorf("unknown frame kind %q", kind))
					return
				}
			}
		}
	}()
	// Stdin credit: what the command took is granted back, in batches.
	if stdin != nil {
		go func() {
			for {
				n, err := stdin.consumed(ectx.Done(), int(o.Window)/4)
				if err != nil {
					return
				}
				if se.send(ectx, kindCredit, u32(n)) != nil {
					return
				}
			}
		}()
	}
	// Lease, idle and life: the watchdog ends the command when one runs out.
	go func() {
		tick := time.NewTicker(min(o.Lease/4, time.Second))
		defer tick.Stop()
		born := o.Now()
		for {
			select {
			case <-ectx.Done():
				return
			case <-tick.C:
			}
			now := o.Now()
			actMu.Lock()
			peer, data := lastPeer, lastData
			actMu.Unlock()
			switch {
			case now.Sub(peer) > o.Lease:
				endExec(fmt.Errorf("the client sent nothing for %s (its lease ran out)", o.Lease))
			case now.Sub(data) > o.Idle:
				endExec(fmt.Errorf("no data either way for %s", o.Idle))
			case now.Sub(born) > o.MaxLife:
				endExec(fmt.Errorf("the session reached its longest life, %s", o.MaxLife))
			}
		}
	}()

	code, err := run(ectx, streams)
	if stdin != nil {
		stdin.close()
	}
	if cause := context.Cause(ectx); ectx.Err() != nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	} else if ctx.Err() != nil {
		err = errors.New("the node's exec server is stopping")
	}
	if err != nil {
		log.Info("exec session ended", "err", err)
		se.final(context.WithoutCancel(ctx), kindError, []byte(err.Error()), log)
		return
	}
	log.Info("exec session ended", "exitCode", code)
	b := make([]byte, 4)
	binary.BigEndian.PutUint32(b, uint32(int32(code)))
	se.final(ctx, kindExit, b, log)
}

// final sends the session's last frame, bounded.
func (se *session) final(ctx context.Context, kind byte, payload []byte, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalTimeout)
	defer cancel()
	if err := se.send(ctx, kind, payload); err != nil {
		log.Warn("exec session: last frame not sent", "err", err)
	}
}

func mustB64(s string) []byte {
	b, _ := base64.StdEncoding.DecodeString(s) // DecodeExecRequest checked it
	return b
}

// window is the command's stdin on the node: a buffer the client's window bounds, so putting into
// it never blocks; the command reads from it.
type window struct {
	mu       sync.Mutex
	buf      []byte
	max      int
	eof      bool
	taken    int           // bytes read and not yet granted back
	readable chan struct{} // signalled on put or close
	took     chan struct{} // signalled on read
}

func newWindow(max int) *window {
	return &window{max: max, readable: make(chan struct{}, 1), took: make(chan struct{}, 1)}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (w *window) put(p []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.eof {
		return nil // the command's stdin is closed: input has nowhere to go
	}
	if len(w.buf)+len(p) > w.max {
		return errors.New("stdin beyond the window")
	}
	w.buf = append(w.buf, p...)
	signal(w.readable)
	return nil
}

func (w *window) close() {
	w.mu.Lock()
	w.eof = true
	w.mu.Unlock()
	signal(w.readable)
}

func (w *window) Read(p []byte) (int, error) {
	for {
		w.mu.Lock()
		if len(w.buf) > 0 {
			n := copy(p, w.buf)
			w.buf = w.buf[n:]
			w.taken += n
			w.mu.Unlock()
			signal(w.took)
			return n, nil
		}
		if w.eof {
			w.mu.Unlock()
			return 0, io.EOF
		}
		w.mu.Unlock()
		<-w.readable
	}
}

// consumed waits until at least batch bytes were read (or all that was put was read) and returns
// how many, to be granted back.
func (w *window) consumed(done <-chan struct{}, batch int) (int, error) {
	for {
		w.mu.Lock()
		if w.taken >= batch || (w.taken > 0 && len(w.buf) == 0) {
			n := w.taken
			w.taken = 0
			w.mu.Unlock()
			return n, nil
		}
		w.mu.Unlock()
		select {
		case <-w.took:
		case <-done:
			return 0, errSessionEnded
		}
	}
}

// forward copies the session's stdin into conn and conn into its stdout until conn's end (both
// ways), or ctx's. The client's stdin EOF half-closes conn, as a TCP client's would.
func forward(ctx context.Context, conn net.Conn, s execio.Streams) (int, error) {
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	up := make(chan error, 1)
	go func() {
		_, err := io.Copy(conn, s.Stdin)
		if cw, ok := conn.(interface{ CloseWrite() error }); ok && err == nil {
			cw.CloseWrite()
		}
		up <- err
	}()
	_, err := io.Copy(s.Stdout, conn)
	if ctx.Err() != nil {
		return -1, ctx.Err()
	}
	if err != nil {
		return -1, fmt.Errorf("port-forward: %w", err)
	}
	// The pod closed its side: the session is over whatever the client still sends.
	conn.Close()
	return 0, nil
}
