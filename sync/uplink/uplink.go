// Package uplink sends what the node reports (pod status, node status, events, acks, resync
// requests) to the broker through the bbolt outbox.
//
// Producers (the agent's workers, the downlink) never wait: their reports land in an in-memory
// batch that one writer goroutine folds into one outbox transaction, coalescing per topic. A
// drainer goroutine publishes the outbox oldest first while connected and removes an entry only
// when the broker's PUBACK for that very publish was seen, so the final state of every object
// reaches the broker across kill -9, power loss and broker outages. Nothing is sent while nothing
// changes: idle traffic is the MQTT keepalive alone.
package uplink

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/mqlet/mqlet/agent/event"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
)

// Store is the outbox part of the state store.
type Store interface {
	OutboxPut(entries []store.OutboxEntry, lim store.OutboxLimits) ([]uint64, error)
	OutboxList(limit int) ([]store.OutboxEntry, error)
	OutboxAck(topic string, seq uint64) error
	OutboxStats() (store.OutboxStats, error)
}

// Receipt completes when the broker acknowledged a publish (Err nil) or it can no longer be.
type Receipt interface {
	Done() <-chan struct{}
	Err() error
}

// Link is the MQTT connection.
type Link interface {
	WaitConnected(ctx context.Context) (session int64, lost <-chan struct{}, err error)
	Send(topic string, payload []byte, retained bool) Receipt
}

const (
	// maxPendingEvents bounds events waiting in memory for the writer; beyond it the oldest go,
	// counted like the outbox's own drops.
	maxPendingEvents = 256
	// drainBatch is how many outbox entries one read fetches; inflight is how many publishes may
	// wait for their PUBACK at once.
	drainBatch = 64
	inflight   = 16
)

// Options configure an Uplink.
type Options struct {
	Node   string
	Topics protocol.Topics
	Store  Store
	Link   Link
	Limits store.OutboxLimits
	Log    *slog.Logger
	Now    func() time.Time
}

// Uplink implements the agent's Reporter (PodStatus, PodGone, Emit) and takes node status, acks
// and resync requests.
type Uplink struct {
	o Options

	mu      sync.Mutex
	latest  map[string]store.OutboxEntry // topic -> newest payload not yet in the outbox
	order   []string                     // topics of latest in arrival order
	events  []store.OutboxEntry
	dropped uint64              // events dropped in memory, not yet reported
	sent    map[string][32]byte // digest of the last payload queued per live topic: unchanged reports cost nothing
	// again holds the last acks and node status: they are queued again on every new connection,
	// so a broker that lost its retained messages learns what the node runs (a writer needs the
	// acks to pick generations above the node's) at the cost of two small messages per reconnect.
	again map[string]store.OutboxEntry

	wake  chan struct{} // writer
	drain chan struct{} // drainer
}

// New makes an uplink; Run starts it.
func New(o Options) *Uplink {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Uplink{o: o, latest: map[string]store.OutboxEntry{}, sent: map[string][32]byte{}, again: map[string]store.OutboxEntry{},
		wake: make(chan struct{}, 1), drain: make(chan struct{}, 1)}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// queueLatest queues a retained, latest-only payload for topic unless it equals the last one.
func (u *Uplink) queueLatest(topic string, v any) { u.queue(topic, v, true, false) }

// queue queues a latest-only payload; keep marks it for republishing on every new connection.
func (u *Uplink) queue(topic string, v any, retained, keep bool) {
	payload, err := protocol.Encode(v)
	if err != nil {
		u.o.Log.Error("uplink: encode", "topic", topic, "err", err)
		return
	}
	sum := sha256.Sum256(payload)
	u.mu.Lock()
	if u.sent[topic] == sum {
		u.mu.Unlock()
		return
	}
	u.sent[topic] = sum
	if _, ok := u.latest[topic]; !ok {
		u.order = append(u.order, topic)
	}
	e := store.OutboxEntry{Topic: topic, Payload: payload, Retained: retained, Latest: true}
	u.latest[topic] = e
	if keep {
		u.again[topic] = e
	}
	u.mu.Unlock()
	signal(u.wake)
}

func (u *Uplink) queueEvent(topic string, v any) {
	payload, err := protocol.Encode(v)
	if err != nil {
		u.o.Log.Error("uplink: encode", "topic", topic, "err", err)
		return
	}
	u.mu.Lock()
	if len(u.events) >= maxPendingEvents {
		u.events = u.events[1:]
		u.dropped++
	}
	u.events = append(u.events, store.OutboxEntry{Topic: topic, Payload: payload})
	u.mu.Unlock()
	signal(u.wake)
}

// PodStatus reports a pod's latest status.
func (u *Uplink) PodStatus(d store.DesiredPod, st v1.PodStatus) {
	p := *d.Pod // a shallow copy is enough: the pod is only read, by the encoder
	p.Status = st
	u.queueLatest(u.o.Topics.PodStatus(u.o.Node, p.Namespace, p.Name), &protocol.PodStatus{
		Node: u.o.Node, Namespace: p.Namespace, Name: p.Name, UID: p.UID,
		Source: string(d.Source.Kind), Generation: d.Generation, Object: &p,
	})
}

// PodGone reports that a pod left the node. The retained status says so (rather than being
// cleared) so a reader that was away learns the pod went, and with which generation.
func (u *Uplink) PodGone(d store.DesiredPod) {
	p := d.Pod
	topic := u.o.Topics.PodStatus(u.o.Node, p.Namespace, p.Name)
	u.queueLatest(topic, &protocol.PodStatus{
		Node: u.o.Node, Namespace: p.Namespace, Name: p.Name, UID: p.UID,
		Source: string(d.Source.Kind), Generation: d.Generation, Deleted: true,
	})
	// The gone pod's digest would stay for the agent's lifetime, one per pod name ever run (jobs
	// with generated names make that unbounded). Forgetting it costs at most a repeated "deleted"
	// status if PodGone is called twice.
	u.mu.Lock()
	delete(u.sent, topic)
	u.mu.Unlock()
}

// Emit sends an event.
func (u *Uplink) Emit(e event.Event) {
	u.queueEvent(u.o.Topics.Events(u.o.Node), &protocol.Event{
		Node: u.o.Node, Time: e.Time, Type: string(e.Type), Reason: e.Reason, Message: e.Message,
		Object: protocol.ObjectRef{Kind: e.Object.Kind, Namespace: e.Object.Namespace, Name: e.Object.Name, UID: e.Object.UID},
		Source: e.Source,
	})
}

// NodeStatus reports the node's status; the caller decides what is a real change.
func (u *Uplink) NodeStatus(n *v1.Node) {
	u.queue(u.o.Topics.NodeStatus(u.o.Node), &protocol.NodeStatus{Node: u.o.Node, Object: n}, true, true)
}

// Acks reports what the node has taken in.
func (u *Uplink) Acks(a protocol.Acks) {
	a.Node = u.o.Node
	u.queue(u.o.Topics.Acks(u.o.Node), &a, true, true)
}

// Resync asks the control plane for a full resend. Requests coalesce: only the latest is sent.
func (u *Uplink) Resync(r protocol.ResyncRequest) {
	r.Node = u.o.Node
	u.queue(u.o.Topics.Resync(u.o.Node), &r, false, false)
}

// reconnected queues the acks and node status again for a new connection.
func (u *Uplink) reconnected() {
	u.mu.Lock()
	for topic, e := range u.again {
		if _, ok := u.latest[topic]; !ok {
			u.order = append(u.order, topic)
			u.latest[topic] = e
		}
	}
	u.mu.Unlock()
	signal(u.wake)
}

// Run writes and drains the outbox until ctx ends; both goroutines end before it returns.
func (u *Uplink) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); u.writer(ctx) }()
	go func() { defer wg.Done(); u.drainer(ctx) }()
	wg.Wait()
	return nil
}

func (u *Uplink) take() ([]store.OutboxEntry, uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]store.OutboxEntry, 0, len(u.order)+len(u.events))
	for _, t := range u.order {
		out = append(out, u.latest[t])
	}
	out = append(out, u.events...)
	dropped := u.dropped
	u.latest, u.order, u.events, u.dropped = map[string]store.OutboxEntry{}, nil, nil, 0
	return out, dropped
}

// writer folds whatever accumulated since the last write into one outbox transaction.
func (u *Uplink) writer(ctx context.Context) {
	var reported uint64 // outbox drops already reported
	if st, err := u.o.Store.OutboxStats(); err == nil {
		reported = st.DroppedEvents
	}
	for {
		select {
		case <-ctx.Done():
			u.flush(&reported) // what was reported before the stop survives it
			return
		case <-u.wake:
			u.flush(&reported)
		}
	}
}

func (u *Uplink) flush(reported *uint64) {
	entries, memDropped := u.take()
	if len(entries) == 0 {
		return
	}
	if _, err := u.o.Store.OutboxPut(entries, u.o.Limits); err == nil {
		// Logged after the commit, so a reader of the log (and the kill -9 tests) knows the
		// entries are on disk, not merely on their way.
		if u.o.Log.Enabled(context.Background(), slog.LevelDebug) {
			topics := make([]string, len(entries))
			for i, e := range entries {
				topics[i] = e.Topic
			}
			u.o.Log.Debug("uplink: wrote to the outbox", "topics", topics)
		}
	} else {
		u.o.Log.Error("uplink: outbox put", "entries", len(entries), "err", err)
		// Forget what was queued, so the next report of these objects is written even if equal.
		u.mu.Lock()
		for _, e := range entries {
			if e.Latest {
				delete(u.sent, e.Topic)
			}
		}
		u.mu.Unlock()
	}
	st, err := u.o.Store.OutboxStats()
	if err != nil {
		u.o.Log.Error("uplink: outbox stats", "err", err)
	}
	if lost := memDropped + st.DroppedEvents - *reported; err == nil && lost > 0 {
		*reported = st.DroppedEvents
		u.o.Log.Warn("uplink: events dropped because the outbox was full", "dropped", lost)
		payload, _ := protocol.Encode(&protocol.Event{
			Node: u.o.Node, Time: u.o.Now(), Type: string(event.Warning), Reason: "EventsDropped",
			Message: fmt.Sprintf("%d events were dropped because the outbox was full", lost),
			Object:  protocol.ObjectRef{Kind: "Node", Name: u.o.Node}, Dropped: lost,
		})
		if _, err := u.o.Store.OutboxPut([]store.OutboxEntry{{Topic: u.o.Topics.Events(u.o.Node), Payload: payload}}, u.o.Limits); err != nil {
			u.o.Log.Error("uplink: outbox put", "err", err)
		}
	}
	signal(u.drain)
}

// drainer publishes the outbox oldest first whenever connected.
func (u *Uplink) drainer(ctx context.Context) {
	var last int64
	for {
		session, lost, err := u.o.Link.WaitConnected(ctx)
		if err != nil {
			return // ctx ended
		}
		if last != 0 && session != last {
			u.reconnected()
		}
		last = session
		u.drainConnection(ctx, lost)
		if ctx.Err() != nil {
			return
		}
	}
}

// drainConnection sends until the connection is lost or ctx ends.
func (u *Uplink) drainConnection(ctx context.Context, lost <-chan struct{}) {
	for {
		entries, err := u.o.Store.OutboxList(drainBatch)
		if err != nil {
			u.o.Log.Error("uplink: read outbox", "err", err)
		}
		if len(entries) == 0 || err != nil {
			select {
			case <-ctx.Done():
				return
			case <-lost:
				return
			case <-u.drain:
				continue
			}
		}
		if !u.send(ctx, lost, entries) {
			// Not acknowledged with the connection still up (it is going, or the broker refused):
			// pause instead of spinning on the same entries.
			select {
			case <-ctx.Done():
			case <-lost:
			case <-time.After(time.Second):
			}
			return
		}
	}
}

type pending struct {
	e store.OutboxEntry
	r Receipt
}

// send publishes entries with at most inflight unacknowledged, removing each from the outbox on its
// PUBACK. It returns false when the connection went or ctx ended.
func (u *Uplink) send(ctx context.Context, lost <-chan struct{}, entries []store.OutboxEntry) bool {
	var window []pending
	wait := func(p pending) bool {
		select {
		case <-p.r.Done():
		case <-ctx.Done():
			return false
		case <-lost:
			return false
		}
		if err := p.r.Err(); err != nil {
			if !errors.Is(err, context.Canceled) {
				u.o.Log.Debug("uplink: publish not acknowledged; it stays in the outbox", "topic", p.e.Topic, "err", err)
			}
			return false
		}
		if err := u.o.Store.OutboxAck(p.e.Topic, p.e.Seq); err != nil {
			u.o.Log.Error("uplink: outbox ack", "topic", p.e.Topic, "err", err)
		}
		return true
	}
	for _, e := range entries {
		if len(window) == inflight {
			if !wait(window[0]) {
				return false
			}
			window = window[1:]
		}
		window = append(window, pending{e: e, r: u.o.Link.Send(e.Topic, e.Payload, e.Retained)})
	}
	for _, p := range window {
		if !wait(p) {
			return false
		}
	}
	return true
}
