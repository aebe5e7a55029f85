// Package logserve is the node's side of `logs` over MQTT: it answers the logs requests that reach
// the node's logs/req topic with chunks of the container's log file on logs/resp/<id>.
//
// A stream is ephemeral: its chunks go straight to the link, not through the outbox, since a
// requester that is gone when the link comes back wants none of them. Each chunk waits for the
// broker's acknowledgement of the one before, which bounds both the memory a stream holds and the
// rate it sends at to what the link carries.
//
// What a stream sends, in order:
//
//   - on open, the last Tail lines of the log (the whole log when Tail <= 0), in chunks of at most
//     protocol.MaxLogChunk bytes. A followed stream always sends a first chunk at once, empty when
//     there is nothing yet: it tells the requester that the node is there.
//   - with Follow, what the log grows by, polled every Options.Poll; renew (within
//     Options.RenewTimeout) keeps the stream going.
//   - a last chunk with EOF set: at the end of the log without Follow; on cancel (no error); when no
//     renew came in time, when the container's log ended for good (the container was restarted and
//     logs to a new file, or the pod is gone), or when the server stops (with an error saying so).
//
// A request that cannot be served (undecodable, unknown pod, too many streams) is answered with a
// single EOF chunk whose Error says why, when its ID is readable; otherwise it is only logged.
package logserve

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"
)

// LogFinder finds a container's log file; *agent.Agent implements it.
type LogFinder interface {
	LogPath(namespace, name, container string, previous bool) (string, error)
}

// Publisher publishes one message at QoS 1, not retained, and returns once the broker has
// acknowledged it (or with why not). The node's wiring adapts its link to it.
type Publisher interface {
	Publish(ctx context.Context, topic string, payload []byte) error
}

// Defaults of Options.
const (
	DefaultMaxStreams   = 4
	DefaultRenewTimeout = 60 * time.Second
	DefaultPoll         = 250 * time.Millisecond
)

const (
	// queueLen bounds the requests waiting for Run; more are dropped (and logged), so Handle
	// never blocks the link's message handler.
	queueLen = 64
	// finalTimeout bounds the publish of a stream's last chunk once the stream was told to stop,
	// and of a refusal.
	finalTimeout = 5 * time.Second
	// recheckEvery is how many polls of a followed log go by between two lookups of its path: a
	// container restart moves its log to a new file, which ends the stream of the old one.
	recheckEvery = 8
)

// Options configure a Server.
type Options struct {
	Node   string
	Topics protocol.Topics
	Finder LogFinder
	Pub    Publisher
	// MaxStreams is how many streams may run at once (default DefaultMaxStreams); more are
	// refused with an error chunk.
	MaxStreams int
	// RenewTimeout ends a followed stream that got no renew for that long (default
	// DefaultRenewTimeout).
	RenewTimeout time.Duration
	// Poll is how often a followed log is checked for new output (default DefaultPoll).
	Poll time.Duration
	// Trusted, when set, are the keys a request must be signed by (protocol.SignLogsRequest):
	// the node then serves only its control planes, not whoever can publish on its topics, and
	// opens a request ID once. Empty serves every request (the node has no trust anchors).
	Trusted []ed25519.PublicKey
	// Usage, when set, answers op usage (the bridge's /stats/summary and /metrics/resource);
	// without it such a request is refused.
	Usage func(ctx context.Context) (*protocol.Usage, error)
	Now   func() time.Time
	Log   *slog.Logger
}

// Server serves logs requests. Handle takes them in; Run serves them.
type Server struct {
	o  Options
	in chan job

	mu     sync.Mutex
	opened map[string]time.Time // signed open requests served, by ID, until they expire
}

// job is a request for Run: a decoded request, or a refusal to send.
type job struct {
	req    *protocol.LogsRequest
	refuse string // with id: answer with this error and nothing else
	id     string
}

// New returns a Server; Run checks the options.
func New(o Options) *Server {
	if o.MaxStreams <= 0 {
		o.MaxStreams = DefaultMaxStreams
	}
	if o.RenewTimeout <= 0 {
		o.RenewTimeout = DefaultRenewTimeout
	}
	if o.Poll <= 0 {
		o.Poll = DefaultPoll
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Server{o: o, in: make(chan job, queueLen), opened: map[string]time.Time{}}
}

// Handle takes one message of the node's logs/req topic. It never blocks: the request is decoded
// and queued for Run, or dropped (and logged) when the queue is full.
func (s *Server) Handle(payload []byte) {
	req, err := protocol.DecodeLogsRequest(payload, protocol.DefaultMaxPayload)
	var j job
	if err != nil {
		// The reply topic needs a valid ID; without one nobody can be told.
		var peek struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(payload, &peek) != nil || protocol.ValidateRequestID(peek.ID) != nil {
			s.o.Log.Warn("logs request refused", "err", err)
			return
		}
		j = job{id: peek.ID, refuse: err.Error()}
	} else if why := s.authorise(req); why != "" {
		s.o.Log.Warn("logs request refused", "id", req.ID, "op", req.Op, "reason", why)
		j = job{id: req.ID, refuse: why}
	} else {
		j = job{req: req, id: req.ID}
	}
	select {
	case s.in <- j:
	default:
		s.o.Log.Warn("logs request dropped: too many requests queued", "id", j.id, "queued", queueLen)
	}
}

// authorise says why req may not be served ("" when it may): with trust anchors it must be signed
// by one of them for this node, unexpired, and an open must not have been seen before (a captured
// request replayed).
func (s *Server) authorise(req *protocol.LogsRequest) string {
	if len(s.o.Trusted) == 0 {
		return ""
	}
	now := s.o.Now()
	if err := protocol.VerifyLogsRequest(s.o.Node, req, s.o.Trusted, now); err != nil {
		return err.Error()
	}
	if req.Op != protocol.LogsOpen {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, exp := range s.opened {
		if !now.Before(exp) {
			delete(s.opened, id) // expired: it would be refused as such anyway
		}
	}
	if _, seen := s.opened[req.ID]; seen {
		return fmt.Sprintf("logs request %s: already served (a replay)", req.ID)
	}
	s.opened[req.ID] = req.Expires
	return ""
}

// stream is one running stream as Run sees it.
type stream struct {
	req      *protocol.LogsRequest
	cancel   context.CancelCauseFunc
	deadline atomic.Int64 // unix nanoseconds; a followed stream ends past it
}

func (st *stream) renew(d time.Duration) { st.deadline.Store(time.Now().Add(d).UnixNano()) }

// Reasons a stream was stopped, as its context's cause.
var (
	errCancelled = errors.New("cancelled by the requester")
	errStopping  = errors.New("the node's log server is stopping")
)

// Run serves requests until ctx ends, then ends every stream (each gets its last chunk, bounded)
// and returns once all its goroutines have.
func (s *Server) Run(ctx context.Context) error {
	switch {
	case s.o.Topics.Prefix() == "":
		return errors.New("logserve: no topics (use protocol.NewTopics)")
	case s.o.Finder == nil || s.o.Pub == nil:
		return errors.New("logserve: Finder and Pub are required")
	}
	if err := protocol.ValidateNodeName(s.o.Node); err != nil {
		return fmt.Errorf("logserve: %w", err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	// Refusals go out one at a time from one goroutine: a flood of bad requests costs a bounded
	// queue, not a goroutine each.
	refusals := make(chan job, queueLen)
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case j := <-refusals:
				s.refuse(ctx, j.id, j.refuse)
			}
		}
	})
	refuse := func(id, why string) {
		s.o.Log.Warn("logs request refused", "id", id, "err", why)
		select {
		case refusals <- job{id: id, refuse: why}:
		default:
			s.o.Log.Warn("logs refusal dropped: too many queued", "id", id)
		}
	}

	streams := map[string]*stream{}
	ended := make(chan string)
	for {
		select {
		case <-ctx.Done():
			for _, st := range streams {
				st.cancel(errStopping)
			}
			return nil
		case id := <-ended:
			delete(streams, id)
		case j := <-s.in:
			if j.req == nil {
				refuse(j.id, j.refuse)
				continue
			}
			st := streams[j.id]
			switch j.req.Op {
			case protocol.LogsOpen:
				switch {
				case st != nil:
					// QoS 1 may deliver a request twice; the stream is already there.
					s.o.Log.Debug("logs request: duplicate open ignored", "id", j.id)
				case len(streams) >= s.o.MaxStreams:
					refuse(j.id, fmt.Sprintf("too many log streams on node %s (%d at once); try again later", s.o.Node, s.o.MaxStreams))
				default:
					sctx, cancel := context.WithCancelCause(ctx)
					st = &stream{req: j.req, cancel: cancel}
					st.renew(s.o.RenewTimeout)
					streams[j.id] = st
					wg.Go(func() {
						s.serve(sctx, st)
						cancel(nil)
						select {
						case ended <- st.req.ID:
						case <-ctx.Done():
						}
					})
				}
			case protocol.LogsRenew:
				if st != nil {
					st.renew(s.o.RenewTimeout)
				}
			case protocol.LogsCancel:
				if st != nil {
					st.cancel(errCancelled)
				}
			case protocol.LogsUsage:
				if s.o.Usage == nil {
					refuse(j.id, fmt.Sprintf("node %s does not report its usage over MQTT", s.o.Node))
					continue
				}
				wg.Go(func() { s.serveUsage(ctx, j.id) })
			}
		}
	}
}

// serveUsage answers a usage request: the node's Usage in JSON, in chunks of at most
// protocol.MaxLogChunk bytes, the last one with EOF.
func (s *Server) serveUsage(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(ctx, finalTimeout)
	defer cancel()
	u, err := s.o.Usage(ctx)
	var data []byte
	if err == nil {
		data, err = json.Marshal(u)
	}
	if err != nil {
		s.refuse(ctx, id, fmt.Sprintf("usage of node %s: %v", s.o.Node, err))
		return
	}
	for seq := int64(0); ; seq++ {
		n := min(len(data), protocol.MaxLogChunk)
		ch := protocol.LogsChunk{ID: id, Seq: seq, Data: data[:n], EOF: n == len(data)}
		data = data[n:]
		if err := s.publish(ctx, &ch); err != nil {
			s.o.Log.Warn("usage reply not sent", "id", id, "err", err)
			return
		}
		if ch.EOF {
			return
		}
	}
}

// refuse answers request id with a single EOF chunk carrying why.
func (s *Server) refuse(ctx context.Context, id, why string) {
	ctx, cancel := context.WithTimeout(ctx, finalTimeout)
	defer cancel()
	ch := protocol.LogsChunk{ID: id, Seq: 0, EOF: true, Error: why}
	if err := s.publish(ctx, &ch); err != nil {
		s.o.Log.Warn("logs refusal not sent", "id", id, "err", err)
	}
}

func (s *Server) publish(ctx context.Context, ch *protocol.LogsChunk) error {
	payload, err := protocol.Encode(ch)
	if err != nil {
		return err
	}
	return s.o.Pub.Publish(ctx, s.o.Topics.LogsReply(s.o.Node, ch.ID), payload)
}
