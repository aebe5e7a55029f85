// Package uplink sends what the node reports (pod status, node status, events, acks, resync
// requests) to the broker through the bbolt outbox.
//
// Producers (the agent's workers, the downlink) never wait: their reports land in an in-memory
// batch that one writer goroutine folds into one outbox transaction, coalescing per topic. A
// drainer goroutine publishes the outbox oldest first while connected and removes an entry only
// when the broker's PUBACK for that very publish was seen (a send window's entries with one
// transaction), so the final state of every object reaches the broker across kill -9, power loss
// and broker outages. Nothing is sent while nothing changes: idle traffic is the MQTT keepalive
// alone.
//
// The retained topics the uplink keeps on the broker (each live pod's status, the node status,
// the acks) are summed up by a retained protocol.StatusSummary, queued after them whenever one
// changes. On every new connection the node reads its own summary back, using its private marker
// topic to know when the broker's retained answer is complete (docs/protocol.md, section 10): a
// broker that still holds the last summary the node saw acknowledged holds everything it sums up,
// and nothing is sent again; a broker that lost it (restarted without its persistence file, or
// from an older one) gets every kept topic and the summary again.
package uplink

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
)

// Store is the outbox part of the state store.
type Store interface {
	OutboxPut(entries []store.OutboxEntry, lim store.OutboxLimits) ([]uint64, error)
	OutboxList(limit int) ([]store.OutboxEntry, error)
	OutboxAckMany(acks []store.OutboxRef) error
	OutboxStats() (store.OutboxStats, error)
}

// Receipt completes when the broker acknowledged a publish (Err nil) or it can no longer be.
type Receipt interface {
	Done() <-chan struct{}
	Err() error
}

// Link is the MQTT connection. It must be subscribed to the node's own Topics.Summary and
// Topics.NodeMarker before WaitConnected offers a connection, and what arrives on them must be
// handed to Receive.
type Link interface {
	WaitConnected(ctx context.Context) (session int64, lost <-chan struct{}, err error)
	Send(topic string, payload []byte, retained bool) Receipt
}

const (
	// maxPendingEvents bounds events waiting in memory for the writer; beyond it the oldest go,
	// counted like the outbox's own drops.
	maxPendingEvents = 256
	// drainBatch is how many outbox entries one read fetches (and one transaction removes once
	// they are acknowledged); inflight is how many publishes may wait for their PUBACK at once.
	drainBatch = 64
	inflight   = 16
	// A marker that does not come back (the broker may drop a QoS 1 message, e.g. when a queue is
	// full) is sent again after markerRetryMin, doubling up to markerRetryMax, while connected.
	markerRetryMin = 2 * time.Second
	markerRetryMax = time.Minute
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
	// MarkerRetry, when set, replaces markerRetryMin (tests).
	MarkerRetry time.Duration
	// Settled, when set, is called (without blocking) once a connection's check is done: the
	// summary topic has served its purpose on that connection, and the node's own summaries
	// need not come back to it.
	Settled func(session int64)
}

// kept is a retained, latest-only topic the uplink keeps on the broker, and what is known of
// where its last payload is.
type kept struct {
	// payload is the last one queued. It is kept (not only its digest) so that it can be queued
	// again for a broker that lost it without asking the agent: that costs about what the outbox
	// bound allows anyway, one status per live pod.
	payload []byte
	sum     string // protocol.Digest(payload), a line of the summary's digest
	pod     bool   // a pod status: counted in the summary's Pods
	queued  bool   // handed to the writer and no PUBACK of it seen since
	ackConn int64  // the session whose PUBACK of payload was seen; 0 when none
	ackAt   uint64 // Uplink.acks at that PUBACK: orders it against the summary's
}

// lost: neither on its way (the outbox refused it) nor acknowledged.
func (k *kept) lost() bool { return !k.queued && k.ackConn == 0 }

// check is what one connection learns of the broker's retained state.
type check struct {
	session int64
	lost    <-chan struct{}
	// expect is the last summary PUBACKed before this connection (nil: none since the start) and
	// expectAt the number of that PUBACK.
	expect   []byte
	expectAt uint64
	marker   string        // the latest marker value sent; "" before the first
	settled  bool          // the marker came back and the check is done
	done     chan struct{} // closed when settled
}

// Uplink implements the agent's Reporter (PodStatus, PodGone, Emit) and takes node status, acks
// and resync requests.
type Uplink struct {
	o Options

	mu      sync.Mutex
	latest  map[string]store.OutboxEntry // topic -> newest payload not yet in the outbox
	order   []string                     // topics of latest in arrival order
	events  []store.OutboxEntry
	dropped uint64 // events dropped in memory, not yet reported
	// kept holds the live retained topics (pod statuses, node status, acks): unchanged reports
	// cost nothing, and the summary sums them up. A gone pod's topic leaves it.
	kept       map[string]*kept
	summary    kept // the summary's own topic (payload nil before the first)
	summaryDue bool // a kept topic changed since the last summary was queued
	// gone are the pod status topics last published as deleted, oldest first: past
	// maxGoneStatuses the oldest is cleared on the broker, so one-off pods (Jobs with generated
	// names) do not pile up there and crowd a reader's queue.
	gone []string
	// summaryForce queues the summary even when unchanged: after a repair it must follow the
	// statuses queued again.
	summaryForce bool
	resync       [32]byte // digest of the last resync request queued: repeats cost nothing
	acks         uint64   // PUBACKs seen so far, numbering them
	// ackedSummary is the last summary payload whose PUBACK was seen, ackedSummaryAt its number.
	ackedSummary   []byte
	ackedSummaryAt uint64
	check          *check // the current connection's
	// rxSummary is the last retained summary received, on the connection rxSession.
	rxSession int64
	rxSummary []byte
	// echoSession is the newest connection whose own online message came back.
	echoSession int64

	wake   chan struct{} // writer
	drain  chan struct{} // drainer
	verify chan struct{} // verifier: a new check
}

// New makes an uplink; Run starts it.
func New(o Options) *Uplink {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MarkerRetry <= 0 {
		o.MarkerRetry = markerRetryMin
	}
	return &Uplink{o: o, latest: map[string]store.OutboxEntry{}, kept: map[string]*kept{},
		wake: make(chan struct{}, 1), drain: make(chan struct{}, 1), verify: make(chan struct{}, 1)}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// putLatest queues e, replacing what is queued in memory for its topic. u.mu must be held.
func (u *Uplink) putLatest(e store.OutboxEntry) {
	if _, ok := u.latest[e.Topic]; !ok {
		u.order = append(u.order, e.Topic)
	}
	u.latest[e.Topic] = e
}

func keptEntry(topic string, payload []byte) store.OutboxEntry {
	return store.OutboxEntry{Topic: topic, Payload: payload, Retained: true, Latest: true}
}

// queueKept queues a payload of a kept topic unless it equals the last one queued (and that one
// was not lost on its way to the outbox).
func (u *Uplink) queueKept(topic string, v any, pod bool) {
	payload, err := protocol.Encode(v)
	if err != nil {
		u.o.Log.Error("uplink: encode", "topic", topic, "err", err)
		return
	}
	sum := protocol.Digest(payload)
	u.mu.Lock()
	k := u.kept[topic]
	if k != nil && k.sum == sum && !k.lost() {
		u.mu.Unlock()
		return
	}
	if k == nil {
		k = &kept{pod: pod}
		u.kept[topic] = k
	}
	k.payload, k.sum, k.queued, k.ackConn = payload, sum, true, 0
	u.summaryDue = true
	u.putLatest(keptEntry(topic, payload))
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
	u.queueKept(u.o.Topics.PodStatus(u.o.Node, p.Namespace, p.Name), &protocol.PodStatus{
		Node: u.o.Node, Namespace: p.Namespace, Name: p.Name, UID: p.UID,
		Source: string(d.Source.Kind), Generation: d.Generation, Object: &p,
	}, true)
}

// PodGone reports that a pod left the node. The retained status says so (rather than being
// cleared) so a reader that was away learns the pod went, and with which generation. The topic
// stops being kept: the summary no longer counts it, and the pod's payload is forgotten (a node
// running pods with ever new names must not keep one per name). Calling it twice sends the
// deleted status twice.
func (u *Uplink) PodGone(d store.DesiredPod) {
	p := d.Pod
	topic := u.o.Topics.PodStatus(u.o.Node, p.Namespace, p.Name)
	payload, err := protocol.Encode(&protocol.PodStatus{
		Node: u.o.Node, Namespace: p.Namespace, Name: p.Name, UID: p.UID,
		Source: string(d.Source.Kind), Generation: d.Generation, Deleted: true,
	})
	if err != nil {
		u.o.Log.Error("uplink: encode", "topic", topic, "err", err)
		return
	}
	u.mu.Lock()
	if _, ok := u.kept[topic]; ok {
		delete(u.kept, topic)
		u.summaryDue = true
	}
	u.putLatest(keptEntry(topic, payload))
	u.gone = append(slices.DeleteFunc(u.gone, func(t string) bool { return t == topic }), topic)
	if len(u.gone) > maxGoneStatuses {
		oldest := u.gone[0]
		u.gone = u.gone[1:]
		if _, live := u.kept[oldest]; !live {
			// An empty retained payload clears the topic; a reader sees no pod there.
			u.putLatest(keptEntry(oldest, nil))
		}
	}
	u.mu.Unlock()
	signal(u.wake)
}

// maxGoneStatuses bounds the deleted pod statuses a node leaves retained on the broker.
const maxGoneStatuses = 64

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
	u.queueKept(u.o.Topics.NodeStatus(u.o.Node), &protocol.NodeStatus{Node: u.o.Node, Object: n}, false)
}

// Acks reports what the node has taken in.
func (u *Uplink) Acks(a protocol.Acks) {
	a.Node = u.o.Node
	u.queueKept(u.o.Topics.Acks(u.o.Node), &a, false)
}

// Resync asks the control plane for a full resend. Requests coalesce: only the latest is sent,
// and one equal to the last is not sent again.
func (u *Uplink) Resync(r protocol.ResyncRequest) {
	r.Node = u.o.Node
	topic := u.o.Topics.Resync(u.o.Node)
	payload, err := protocol.Encode(&r)
	if err != nil {
		u.o.Log.Error("uplink: encode", "topic", topic, "err", err)
		return
	}
	sum := sha256.Sum256(payload)
	u.mu.Lock()
	if u.resync == sum {
		u.mu.Unlock()
		return
	}
	u.resync = sum
	u.putLatest(store.OutboxEntry{Topic: topic, Payload: payload, Latest: true})
	u.mu.Unlock()
	signal(u.wake)
}

// summaryPayload sums up the kept topics: Pods counts the pod statuses, Digest is the SHA-256
// (lowercase hex) of the lines "<topic> <protocol.Digest(payload)>\n" in topic order. u.mu must
// be held; it is CPU only, one line per kept topic.
func (u *Uplink) summaryPayload() ([]byte, error) {
	h := sha256.New()
	pods := 0
	for _, topic := range slices.Sorted(maps.Keys(u.kept)) {
		k := u.kept[topic]
		if k.pod {
			pods++
		}
		io.WriteString(h, topic+" "+k.sum+"\n")
	}
	return protocol.Encode(&protocol.StatusSummary{Node: u.o.Node, Pods: pods, Digest: hex.EncodeToString(h.Sum(nil))})
}

// queueSummary queues the summary, after everything queued so far, when it changed or a repair
// needs it again. u.mu must be held.
func (u *Uplink) queueSummary() {
	force := u.summaryForce
	u.summaryDue, u.summaryForce = false, false
	payload, err := u.summaryPayload()
	if err != nil {
		u.o.Log.Error("uplink: encode the status summary", "err", err)
		return
	}
	s := &u.summary
	if !force && bytes.Equal(payload, s.payload) && !s.lost() {
		return // e.g. a status that changed and changed back before the writer ran
	}
	s.payload, s.queued, s.ackConn = payload, true, 0
	u.putLatest(keptEntry(u.o.Topics.Summary(u.o.Node), payload))
}

// Receive takes a message that arrived on the node's own summary or marker topic (class
// protocol.ClassSummary or protocol.ClassNodeMarker) on the connection session. It never blocks.
func (u *Uplink) Receive(class protocol.Class, payload []byte, retained bool, session int64) {
	switch class {
	case protocol.ClassSummary:
		// Only a retained delivery (the broker's answer to the subscription) tells what the broker
		// kept; a live copy of the node's own publish says nothing of that.
		if !retained {
			return
		}
		u.mu.Lock()
		if session >= u.rxSession {
			u.rxSession, u.rxSummary = session, bytes.Clone(payload)
		}
		u.mu.Unlock()
	case protocol.ClassNodeMarker:
		u.markerBack(string(payload), session)
	case protocol.ClassLiveness:
		u.onlineBack(session)
	}
}

// onlineBack takes the echo of the connection's own online message: the node subscribed before
// publishing it, so every retained message of its subscriptions arrived before it, as before a
// marker (which is then not needed). It may come before connected made the check.
func (u *Uplink) onlineBack(session int64) {
	u.mu.Lock()
	u.echoSession = max(u.echoSession, session)
	c := u.check
	if c == nil || c.session != session || c.settled {
		u.mu.Unlock()
		return
	}
	u.settle(c, session) // unlocks
}

// connected starts the check of a new connection. It runs on the drainer before anything is sent
// on the connection, so expect is what the broker held before it.
func (u *Uplink) connected(session int64, lost <-chan struct{}) {
	u.mu.Lock()
	c := &check{session: session, lost: lost, expect: u.ackedSummary, expectAt: u.ackedSummaryAt, done: make(chan struct{})}
	u.check = c
	if u.echoSession == session {
		u.settle(c, session) // the online came back already; unlocks
		return
	}
	u.mu.Unlock()
	signal(u.verify)
}

// verifier publishes the marker of each new connection, again on a bounded back-off while it does
// not come back. It never holds up the drainer or a producer.
func (u *Uplink) verifier(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-u.verify:
		}
		u.mu.Lock()
		c := u.check
		u.mu.Unlock()
		if c != nil {
			u.verifyConnection(ctx, c)
		}
	}
}

func (u *Uplink) verifyConnection(ctx context.Context, c *check) {
	topic := u.o.Topics.NodeMarker(u.o.Node)
	delay := u.o.MarkerRetry
	// The echo of the connection's online message settles the check without a marker; the
	// marker is for when that echo does not come (a link without liveness, a dropped message).
	first := time.NewTimer(delay)
	select {
	case <-ctx.Done():
		first.Stop()
		return
	case <-c.lost:
		first.Stop()
		return
	case <-c.done:
		first.Stop()
		return
	case <-first.C:
	}
	for {
		var b [16]byte
		_, _ = rand.Read(b[:]) // never fails (crypto/rand panics rather than return an error)
		value := hex.EncodeToString(b[:])
		u.mu.Lock()
		if u.check != c || c.settled {
			u.mu.Unlock()
			return
		}
		c.marker = value // a marker sent before this one is ignored when it comes back
		u.mu.Unlock()
		// The receipt is not awaited: the marker's return is the answer, and a publish that fails
		// is covered by the retry below.
		u.o.Link.Send(topic, []byte(value), false)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
		case <-c.lost:
		case <-c.done:
		case <-t.C:
			u.o.Log.Debug("uplink: the marker did not come back; sending another", "topic", topic, "session", c.session, "waited", delay)
			delay = min(2*delay, markerRetryMax)
			continue
		}
		t.Stop()
		return
	}
}

// markerBack settles the connection's check when the latest marker it sent comes back: every
// retained message the subscription brought arrived before it.
func (u *Uplink) markerBack(value string, session int64) {
	u.mu.Lock()
	c := u.check
	if c == nil || c.session != session || c.settled || c.marker == "" || value != c.marker {
		u.mu.Unlock()
		return // an older marker, another connection's, or a check already settled
	}
	u.settle(c, session)
}

// settle finishes the check of connection session: every retained message of the node's
// subscriptions has arrived. u.mu must be held; settle unlocks it.
func (u *Uplink) settle(c *check, session int64) {
	c.settled = true
	var seen []byte
	if u.rxSession == session {
		seen = u.rxSummary
	}
	held := c.expect != nil && bytes.Equal(seen, c.expect)
	again := u.repair(c, held)
	close(c.done)
	summary := u.summaryForce
	u.mu.Unlock()
	if u.o.Settled != nil {
		u.o.Settled(session)
	}
	switch {
	case again > 0 || summary:
		u.o.Log.Info("uplink: the broker does not hold what the node reported; queueing it again",
			"session", session, "topics", again, "broker_kept_last_summary", held)
		signal(u.wake)
	default:
		u.o.Log.Debug("uplink: the broker holds what the node reported", "session", session)
	}
}

// repair queues again every kept topic the broker may lack, and the summary after them. u.mu must
// be held. held says the broker still holds the summary PUBACKed last before this connection,
// hence everything PUBACKed before it. Not queued again: a payload on its way (it drains anyway),
// one PUBACKed on this connection (the broker has it: a broker that restarts drops the
// connection), and with held one PUBACKed before that summary.
func (u *Uplink) repair(c *check, held bool) int {
	again := 0
	for _, topic := range slices.Sorted(maps.Keys(u.kept)) {
		k := u.kept[topic]
		if k.queued || k.ackConn == c.session || held && k.ackConn != 0 && k.ackAt <= c.expectAt {
			continue
		}
		k.queued, k.ackConn = true, 0
		u.putLatest(keptEntry(topic, k.payload))
		again++
	}
	s := &u.summary
	switch {
	case again > 0:
		u.summaryForce = true // after the statuses queued again, even if unchanged
	case held || s.payload == nil || s.queued || s.ackConn == c.session:
	default:
		u.summaryForce = true // the broker lost or holds another summary than the node's
	}
	return again
}

// Run writes and drains the outbox, and checks each new connection, until ctx ends; its
// goroutines end before it returns.
func (u *Uplink) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { u.writer(ctx) })
	wg.Go(func() { u.drainer(ctx) })
	wg.Go(func() { u.verifier(ctx) })
	wg.Wait()
	return nil
}

func (u *Uplink) take() ([]store.OutboxEntry, uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.summaryDue || u.summaryForce {
		u.queueSummary() // last of the latest entries: it drains after what it sums up
	}
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
	seqs, err := u.o.Store.OutboxPut(entries, u.o.Limits)
	if err == nil {
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
		// What was not queued is lost: the next report of these objects is written even if
		// equal, and the next connection's check queues them again.
		u.mu.Lock()
		for i, e := range entries {
			if seqs == nil || seqs[i] == 0 {
				u.notQueued(e)
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

// notQueued records that e did not reach the outbox. u.mu must be held.
func (u *Uplink) notQueued(e store.OutboxEntry) {
	k := u.kept[e.Topic]
	if e.Topic == u.o.Topics.Summary(u.o.Node) {
		k = &u.summary
	}
	if k != nil && bytes.Equal(k.payload, e.Payload) {
		k.queued = false
	}
	if e.Topic == u.o.Topics.Resync(u.o.Node) {
		u.resync = [32]byte{}
	}
}

// acknowledged records the PUBACKs of entries, in the order they were sent, on session. u.mu
// must be held.
func (u *Uplink) acknowledged(entries []store.OutboxEntry, session int64) {
	summary := u.o.Topics.Summary(u.o.Node)
	for _, e := range entries {
		u.acks++
		k := u.kept[e.Topic]
		if e.Topic == summary {
			u.ackedSummary, u.ackedSummaryAt = e.Payload, u.acks
			k = &u.summary
		}
		// A PUBACK of an older payload than the last queued says nothing of the newer one.
		if k != nil && bytes.Equal(k.payload, e.Payload) {
			k.queued, k.ackConn, k.ackAt = false, session, u.acks
		}
	}
}

// drainer publishes the outbox oldest first whenever connected.
func (u *Uplink) drainer(ctx context.Context) {
	var last int64
	for {
		session, lost, err := u.o.Link.WaitConnected(ctx)
		if err != nil {
			return // ctx ended
		}
		if session != last {
			// Before the first publish on the connection: see connected.
			u.connected(session, lost)
		}
		last = session
		u.drainConnection(ctx, session, lost)
		if ctx.Err() != nil {
			return
		}
	}
}

// drainConnection sends until the connection is lost or ctx ends.
func (u *Uplink) drainConnection(ctx context.Context, session int64, lost <-chan struct{}) {
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
		if !u.send(ctx, session, lost, entries) {
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

// send publishes entries with at most inflight unacknowledged and then removes, with one outbox
// transaction, those whose PUBACK was seen: the whole batch, or when a publish failed (the
// connection went, ctx ended, the broker refused) the ones before it, so what the broker has is
// not sent again after a reconnect. Entries after a failed one stay even if acknowledged: the
// outbox is drained as a queue, and sending them again keeps each summary behind the statuses
// it sums up. It returns false when a publish failed.
func (u *Uplink) send(ctx context.Context, session int64, lost <-chan struct{}, entries []store.OutboxEntry) bool {
	var (
		window []pending
		acked  []store.OutboxEntry
	)
	defer func() { u.remove(acked, session) }()
	wait := func(p pending) bool {
		select {
		case <-p.r.Done():
		default:
			select {
			case <-p.r.Done():
			case <-ctx.Done():
				return false
			case <-lost:
				return false
			}
		}
		if err := p.r.Err(); err != nil {
			if !errors.Is(err, context.Canceled) {
				u.o.Log.Debug("uplink: publish not acknowledged; it stays in the outbox", "topic", p.e.Topic, "err", err)
			}
			return false
		}
		acked = append(acked, p.e)
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

// remove takes acknowledged entries out of the outbox in one transaction. If that fails they
// stay and are sent again: a duplicate is harmless, a lost status is not.
func (u *Uplink) remove(acked []store.OutboxEntry, session int64) {
	if len(acked) == 0 {
		return
	}
	refs := make([]store.OutboxRef, len(acked))
	for i, e := range acked {
		refs[i] = store.OutboxRef{Topic: e.Topic, Seq: e.Seq}
	}
	if err := u.o.Store.OutboxAckMany(refs); err != nil {
		u.o.Log.Error("uplink: remove acknowledged entries from the outbox", "entries", len(refs), "err", err)
	}
	// The broker has them whatever the store said.
	u.mu.Lock()
	u.acknowledged(acked, session)
	u.mu.Unlock()
}
