// Package nodesync is the node's end of the MQTT channel: one link to the broker, the downlink
// source that feeds the agent, the uplink that reports through the outbox, and the logs server.
// cmd/mqlet wires it to the agent; nothing here knows containerd.
package nodesync

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/downlink"
	"github.com/mqlet/mqlet/sync/link"
	"github.com/mqlet/mqlet/sync/logserve"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
	"github.com/mqlet/mqlet/sync/stream"
	"github.com/mqlet/mqlet/sync/uplink"
	v1 "k8s.io/api/core/v1"
)

// Store is what the channel keeps in the state store.
type Store interface {
	downlink.Store
	uplink.Store
	NextSession() (int64, error)
}

// Options configure the channel.
type Options struct {
	Node   string
	Topics protocol.Topics
	// Link carries the broker URL, TLS, credentials, keepalive and back-off; the client id,
	// subscriptions and liveness are filled in here.
	Link       link.Options
	Store      Store
	MaxPayload int
	Outbox     store.OutboxLimits
	// Trusted are the public keys desired state must be signed by; empty takes any index.
	Trusted []ed25519.PublicKey
	// Sealing, when set, opens the Secrets sealed to this node; without it sealed Secrets are
	// refused.
	Sealing *sealing.Key
	// Logs, when set, finds container logs for `mqlet ctl logs` (served over MQTT).
	Logs logserve.LogFinder
	// Exec, when set with Sealing, runs commands in containers for `mqlet ctl exec` (sessions
	// over MQTT, sealed with keys agreed with the sealing key).
	Exec stream.Execer
	// Usage, when set, answers usage requests (the bridge's kubelet stats) on the logs channel.
	Usage   func(ctx context.Context) (*protocol.Usage, error)
	Version string
	Log     *slog.Logger
}

// Sync is the running channel.
type Sync struct {
	o    Options
	link *link.Link
	down *downlink.Downlink
	up   *uplink.Uplink
	logs *logserve.Server
	exec *stream.Server

	// ops are the downlink's fetch requests and resync requests, carried out in order by fetcher
	// so that neither the downlink's loop nor the link's overflow handler waits on the broker.
	opsMu  sync.Mutex
	ops    []fetchOp
	opsDue chan struct{}

	desiredIn atomic.Int64 // desired object messages received (the cost of a reconnect)
}

// fetchOp is one request of the downlink: subscribe (again) or unsubscribe desired topics, or
// publish a resync request.
type fetchOp struct {
	subscribe, unsubscribe []string // keys
	resync                 *protocol.ResyncRequest
	replayIndex            bool // resubscribe the index (after an inbox overflow)
	// dropSummary ends the summary subscription of this session once the uplink read it back:
	// every summary the node publishes would otherwise come back to it.
	dropSummary int64
}

// sender adapts the link to the uplink's Link interface.
type sender struct{ *link.Link }

func (s sender) Send(topic string, payload []byte, retained bool) uplink.Receipt {
	return s.Publish(topic, payload, retained)
}

// logPublisher adapts the link to the logs server: log chunks go straight to the broker (not
// through the outbox: a stream is ephemeral), one acknowledged chunk at a time.
type logPublisher struct{ *link.Link }

func (p logPublisher) Publish(ctx context.Context, topic string, payload []byte) error {
	return p.Link.Publish(topic, payload, false).Wait(ctx)
}

// New validates the options and builds the parts; nothing connects before Run.
func New(o Options) (*Sync, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if err := protocol.ValidateNodeName(o.Node); err != nil {
		return nil, err
	}
	s := &Sync{o: o, opsDue: make(chan struct{}, 1)}
	t := o.Topics
	lo := o.Link
	lo.ClientID = o.Node
	// Desired objects are not subscribed wholesale: the downlink fetches each one it lacks.
	// The node's own summary and marker: the uplink reads back, on every connection, whether the
	// broker still holds what the node reported.
	lo.Subscriptions = []string{t.Index(o.Node), t.LogsRequest(o.Node), t.Summary(o.Node), t.NodeMarker(o.Node)}
	if o.Exec != nil && o.Sealing != nil {
		lo.Subscriptions = append(lo.Subscriptions, t.ExecRequest(o.Node))
	}
	lo.LivenessTopic = t.Liveness(o.Node)
	lo.Online = func(session int64) []byte { return s.liveness(true, session) }
	lo.Offline = func(session int64) []byte { return s.liveness(false, session) }
	lo.IsStaleOffline = protocol.IsStaleOffline
	lo.NextSession = o.Store.NextSession
	// A dropped message may have been an object or the index: replaying the index makes the
	// downlink fetch whatever it still lacks.
	lo.OnOverflow = func() { s.queueOp(fetchOp{replayIndex: true}) }
	if lo.Log == nil {
		lo.Log = o.Log
	}
	l, err := link.New(lo)
	if err != nil {
		return nil, err
	}
	s.link = l
	s.up = uplink.New(uplink.Options{Node: o.Node, Topics: t, Store: o.Store, Link: sender{l}, Limits: o.Outbox, Log: o.Log,
		Settled: func(session int64) { s.queueOp(fetchOp{dropSummary: session}) }})
	s.down = downlink.New(downlink.Options{
		Node: o.Node, Topics: t, Store: o.Store, MaxPayload: o.MaxPayload, Events: s.up,
		Acks: s.up.Acks, Trusted: o.Trusted, Unseal: unsealer(o),
		Fetch:   func(keys []string) { s.queueOp(fetchOp{subscribe: keys}) },
		Unfetch: func(keys []string) { s.queueOp(fetchOp{unsubscribe: keys}) },
		Resync: func(reason string, missing []string) {
			s.queueOp(fetchOp{resync: &protocol.ResyncRequest{Reason: reason, Missing: missing}})
		},
		Log: o.Log,
	})
	if o.Logs != nil {
		// With trust anchors, only requests signed by one of them are served.
		s.logs = logserve.New(logserve.Options{Node: o.Node, Topics: t, Finder: o.Logs, Pub: logPublisher{l}, Log: o.Log, Trusted: o.Trusted, Usage: o.Usage})
	}
	if o.Exec != nil && o.Sealing != nil {
		// The same anchors as logs: with them, only signed opens are served.
		s.exec = stream.NewServer(stream.ServerOptions{Node: o.Node, Topics: t, Exec: o.Exec, Pub: logPublisher{l}, Key: o.Sealing, Trusted: o.Trusted, Log: o.Log})
	}
	return s, nil
}

// unsealer opens Secrets sealed to this node, or nil without a sealing key.
func unsealer(o Options) func(*v1.Secret, *protocol.Sealed) error {
	if o.Sealing == nil {
		return nil
	}
	return func(s *v1.Secret, sd *protocol.Sealed) error { return o.Sealing.Open(o.Node, s, sd) }
}

func (s *Sync) liveness(online bool, session int64) []byte {
	b, err := protocol.Encode(&protocol.Liveness{Node: s.o.Node, Online: online, Session: session, Time: time.Now().UTC(), Version: s.o.Version})
	if err != nil {
		panic(err) // a fixed struct of plain fields always encodes
	}
	return b
}

// Source is the MQTT source for the agent.
func (s *Sync) Source() source.Source { return s.down }

// NodeStatus hands the node's status to the uplink, which publishes it (retained, through the
// outbox) and again on a connection to a broker that lost it. The caller decides what is a real change
// (nodestatus.Manager hands on only those); it never blocks.
func (s *Sync) NodeStatus(n *v1.Node) { s.up.NodeStatus(n) }

// Reporter is what the agent reports through (pod status, pod gone, events).
func (s *Sync) Reporter() *uplink.Uplink { return s.up }

// DesiredReceived is the number of desired object messages received since Run began: a node
// fetches only the objects it lacks, so an ordinary reconnect adds nothing.
func (s *Sync) DesiredReceived() int64 { return s.desiredIn.Load() }

// Connected reports whether the link to the broker is up now (for metrics).
func (s *Sync) Connected() bool {
	_, _, ok := s.link.Connected()
	return ok
}

// queueOp queues a request for fetcher without waiting.
func (s *Sync) queueOp(op fetchOp) {
	s.opsMu.Lock()
	if len(s.ops) >= maxQueuedOps {
		// Disconnected for long, with the settle timer asking again and again: the oldest
		// requests are repeated by newer ones anyway.
		s.ops = s.ops[1:]
	}
	s.ops = append(s.ops, op)
	s.opsMu.Unlock()
	select {
	case s.opsDue <- struct{}{}:
	default:
	}
}

// maxQueuedOps bounds the requests waiting for a connection.
const maxQueuedOps = 256

// fetchBatch bounds the filters of one SUBSCRIBE or UNSUBSCRIBE packet.
const fetchBatch = 64

// fetcher carries out the downlink's requests in order on the current connection, waiting for
// one when there is none: the index a new connection replays arrives while the link is still
// announcing itself online, and the fetches it causes must not be lost. A request carried out on a
// later connection than the one it was made on is harmless (one more SUBSCRIBE), and one that fails
// with the connection is asked again by the downlink, which fetches again on every index replay and
// on its settle timer.
func (s *Sync) fetcher(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.opsDue:
		}
		s.opsMu.Lock()
		ops := s.ops
		s.ops = nil
		s.opsMu.Unlock()
		session, _, err := s.link.WaitConnected(ctx)
		if err != nil {
			return nil // ctx ended
		}
		for _, op := range ops {
			if err := s.do(op, session); err != nil {
				s.o.Log.Warn("mqtt: fetch desired objects", "err", err)
			}
		}
	}
}

func (s *Sync) do(op fetchOp, session int64) error {
	topics := func(keys []string) []string {
		out := make([]string, 0, len(keys))
		for _, k := range keys {
			kind, ns, name, err := protocol.ParseObjectKey(k)
			if err == nil {
				out = append(out, s.o.Topics.Desired(s.o.Node, kind, ns, name))
			}
		}
		return out
	}
	switch {
	case op.dropSummary != 0:
		// Not on a newer connection, which subscribed again for its own read-back.
		return s.link.UnsubscribeSession(op.dropSummary, []string{s.o.Topics.Summary(s.o.Node)})
	case op.replayIndex:
		return s.link.Resubscribe(s.o.Topics.Index(s.o.Node))
	case op.resync != nil:
		op.resync.Session = session
		s.up.Resync(*op.resync)
		return nil
	}
	for f := range slices.Chunk(topics(op.subscribe), fetchBatch) {
		if err := s.link.SubscribeInbox(f); err != nil {
			return err
		}
	}
	for f := range slices.Chunk(topics(op.unsubscribe), fetchBatch) {
		if err := s.link.UnsubscribeInbox(f); err != nil {
			return err
		}
	}
	return nil
}

// Run runs the link, the uplink, message routing, the resender and the logs server until
// ctx ends; every goroutine has ended when it returns.
func (s *Sync) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	run := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil && ctx.Err() == nil {
				select {
				case errc <- fmt.Errorf("mqtt %s: %w", name, err):
				default:
				}
				cancel()
			}
		}()
	}
	run("link", s.link.Run)
	run("uplink", s.up.Run)
	run("routing", s.route)
	run("fetch", s.fetcher)
	if s.logs != nil {
		run("logs", s.logs.Run)
	}
	if s.exec != nil {
		run("exec", s.exec.Run)
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// route hands each received message to its consumer without blocking the link.
func (s *Sync) route(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-s.link.Inbox():
			t, err := s.o.Topics.Parse(m.Topic)
			switch {
			case err == nil && t.Node == s.o.Node && t.Class == protocol.ClassLogsRequest:
				if s.logs != nil {
					s.logs.Handle(m.Payload)
				}
			case err == nil && t.Node == s.o.Node && t.Class == protocol.ClassExecRequest:
				if s.exec != nil {
					s.exec.Handle(m.Payload)
				}
			case err == nil && t.Node == s.o.Node && t.Class == protocol.ClassSummary:
				s.up.Receive(t.Class, m.Payload, m.Retained, m.Session)
			case err == nil && t.Node == s.o.Node && (t.Class == protocol.ClassNodeMarker || t.Class == protocol.ClassLiveness):
				// The marker, or the echo of the connection's own online (the link passes on
				// only that), which comes after every retained message of the connection.
				s.up.Receive(t.Class, m.Payload, m.Retained, m.Session)
				// The downlink too, behind the retained index of this connection: whether that
				// arrived decides what its acks must carry.
				if err := s.down.Deliver(ctx, downlink.Message{Topic: m.Topic, Payload: m.Payload, Retained: m.Retained, Session: m.Session}); err != nil {
					return nil
				}
			default:
				if err == nil && t.Class == protocol.ClassDesired {
					s.desiredIn.Add(1)
				}
				// Everything else, bad topics included (the downlink refuses those with an event
				// naming topic and reason). Waiting here is fine: this is not paho's goroutine, and the link's own bounded
				// inbox (with its coalesced overflow -> resend) absorbs a burst meanwhile.
				if err := s.down.Deliver(ctx, downlink.Message{Topic: m.Topic, Payload: m.Payload, Retained: m.Retained, Session: m.Session}); err != nil {
					return nil
				}
			}
		}
	}
}
