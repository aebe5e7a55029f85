// Package downlink is the MQTT source of desired state: it turns this node's retained index and the
// desired objects it lists (docs/protocol.md, sections 4 and 5) into source.Changes for the agent,
// and configMaps and secrets into store records.
//
// The index decides everything. An object is applied only when the digest of its payload is the one
// the current index lists for it; an object is deleted only when a newer index leaves it out; an
// object the index lists that has not arrived is missing (fetched and asked for again, never
// deleted). The verified index is stored whole (not just its revision) before it is acted on, and
// what the node took in for each entry (applied or refused, at a generation and digest) is stored
// as a sync mark, so a node restarted between an index and its objects knows exactly what it still
// lacks. Every entry of the current index has exactly one outcome (applied, refused, missing),
// reported in the retained acks; nothing else is kept, so the state stays O(desired set).
//
// The node does not subscribe to every desired topic: it subscribes to the index, and to the topic
// of each object it lacks only while it lacks it (Options.Fetch), so a reconnect moves the index
// and what changed, not the whole desired set.
package downlink

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
)

// Store is what the downlink needs of the state store.
type Store interface {
	ListDesired() ([]store.DesiredPod, []store.RecordError, error)
	ListObjects() ([]store.ObjectRecord, []store.RecordError, error)
	ListMarks() (map[string]store.SyncMark, []store.RecordError, error)
	UpdateMarks(put []store.SyncMark, del []string) error
	PutObject(r store.ObjectRecord) error
	DeleteObject(kind store.ObjectKind, namespace, name string) error
}

// Message is one message from the node's subscriptions.
type Message struct {
	Topic    string
	Payload  []byte
	Retained bool
	// Session is the connection it arrived on (0: unknown). The node's own marker and its own
	// online message (Topics.NodeMarker, Topics.Liveness) must be handed over too, in the order
	// they arrived: on a connection they come after the retained index, so they tell the
	// downlink whether the broker holds the index the node runs.
	Session int64
}

// indexMark is the mark key holding the last verified index (its payload in Data). Object keys
// always have three segments, so it cannot collide with one.
const indexMark = "index"

// Defaults.
const (
	DefaultSettle    = 3 * time.Second
	DefaultAckHold   = 500 * time.Millisecond
	maxResendBackoff = 5 * time.Minute
	inboxSize        = 1024
	// maxPending bounds the objects kept in memory that are newer than the index (a writer
	// publishes objects before the index that lists them).
	maxPending = 1024
)

// Options configure a Downlink.
type Options struct {
	Node       string
	Topics     protocol.Topics
	Store      Store
	MaxPayload int
	// Events receives refusals (bad payloads, stale or conflicting indexes); it must not block.
	Events event.Sink
	// Acks receives the node's acknowledgements after every change; it must not block (the
	// uplink coalesces them).
	Acks func(protocol.Acks)
	// Fetch subscribes (again) to the desired topics of keys, so the broker sends their retained
	// messages; Unfetch ends those subscriptions. Both must not block: the link does the I/O. A
	// new connection drops them all; the index it replays makes the downlink fetch again.
	Fetch, Unfetch func(keys []string)
	// Resync publishes a resync request naming the missing keys, for a control plane that lost
	// them; it must not block.
	Resync func(reason string, missing []string)
	// Unseal opens a Secret's sealed data into it (nil: this node has no sealing key, and sealed
	// Secrets are refused).
	Unseal func(*v1.Secret, *protocol.Sealed) error
	// Trusted are the public keys a signed index must verify with. Empty: any index is taken
	// (the broker and every writer on it are trusted), which New's caller says once at start.
	Trusted []ed25519.PublicKey
	// Settle is how long an index entry may stay missing before it is fetched again and asked for:
	// retained messages of different topics arrive in no set order after a (re)subscribe.
	Settle time.Duration
	// AckHold is how long acks that name missing objects are held back while those are fetched
	// (0: DefaultAckHold; negative: not at all): a change then costs one acks, naming it applied,
	// instead of one naming it missing and another naming it applied.
	AckHold time.Duration
	Log     *slog.Logger
	Now     func() time.Time
}

// held is what the node took in for one key: applied (refused empty) or refused, at a generation
// and payload digest. A pod stored by an older version of the node, or stored just before a crash
// that lost its mark, has an empty digest: it runs, but matches no index entry until fetched again.
type held struct {
	gen     int64
	digest  string
	refused string
}

// pending is an object that arrived ahead of the index that will list it.
type pending struct {
	gen     int64
	payload []byte
	seq     uint64
}

// Downlink is a source.Source of kind MQTT.
type Downlink struct {
	o  Options
	in chan Message

	// Owned by Run's goroutine.
	index        *protocol.Index // the last verified index; nil before the first
	indexDigest  string
	indexPayload []byte
	indexRefused *protocol.Refusal
	held         map[string]held
	pending      map[string]pending
	pendingSeq   uint64
	fetching     map[string]bool // keys whose desired topic is subscribed
	undeleted    map[string]bool // keys whose deletion failed (store error): retried on the timer
	deliver      func(source.Change) source.Result
	attempts     int // fetches in a row without the set converging

	// Whether the broker holds the index in force, which decides compact or complete acks.
	session  int64 // the newest connection a message arrived on
	sawIndex bool  // the index in force arrived on that connection
	settled  bool  // the node's marker came back on that connection: sawIndex is final
	complete bool  // the broker lacks the index in force: acks list every applied entry

	running  bool        // Run's loop has started: acks may be held back
	ackDue   bool        // acks changed and were held back
	ackTimer *time.Timer // nil unless acks are held back
}

// New makes a downlink; Run starts it.
func New(o Options) *Downlink {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Settle <= 0 {
		o.Settle = DefaultSettle
	}
	if o.AckHold == 0 {
		o.AckHold = DefaultAckHold
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxPayload <= 0 {
		o.MaxPayload = protocol.DefaultMaxPayload
	}
	if o.Events == nil {
		o.Events = event.SinkFunc(func(event.Event) {})
	}
	if o.Acks == nil {
		o.Acks = func(protocol.Acks) {}
	}
	if o.Fetch == nil {
		o.Fetch = func([]string) {}
	}
	if o.Unfetch == nil {
		o.Unfetch = func([]string) {}
	}
	if o.Resync == nil {
		o.Resync = func(string, []string) {}
	}
	return &Downlink{o: o, in: make(chan Message, inboxSize)}
}

// Kind implements source.Source.
func (d *Downlink) Kind() source.Kind { return source.MQTT }

// Offer hands a message to the downlink without blocking; false when its queue is full.
func (d *Downlink) Offer(m Message) bool {
	select {
	case d.in <- m:
		return true
	default:
		return false
	}
}

// Deliver hands a message to the downlink, waiting for room in its queue until ctx ends.
func (d *Downlink) Deliver(ctx context.Context, m Message) error {
	select {
	case d.in <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run restores the stored index and outcomes, restates the stored MQTT pods as this source's full
// set (so a node booting without a broker runs what it ran and the agent knows this source has
// spoken), finishes what the stored index decided (deletions a crash interrupted), then applies
// messages until ctx ends.
func (d *Downlink) Run(ctx context.Context, deliver func(source.Change) source.Result) error {
	d.deliver = deliver
	d.held, d.pending, d.fetching, d.undeleted = map[string]held{}, map[string]pending{}, map[string]bool{}, map[string]bool{}
	marks, bad, err := d.o.Store.ListMarks()
	if err != nil {
		return fmt.Errorf("mqtt downlink: read sync marks: %w", err)
	}
	for _, e := range bad {
		d.o.Log.Warn("mqtt downlink: skipping an unreadable sync mark; the object is fetched again", "err", e)
	}
	var drop []string
	for key, m := range marks {
		switch {
		case key == indexMark:
			d.restoreIndex(m)
			if d.index == nil {
				drop = append(drop, key)
			}
		case m.Deleted:
			drop = append(drop, key) // a protocol v1 tombstone: v2 deletes by index only
		default:
			d.held[key] = held{gen: m.Generation, digest: m.Digest, refused: m.Refused}
		}
	}
	pods, _, err := d.o.Store.ListDesired()
	if err != nil {
		return fmt.Errorf("mqtt downlink: read desired pods: %w", err)
	}
	var items []source.Item
	for _, p := range pods {
		if p.Source.Kind != source.MQTT {
			continue
		}
		items = append(items, source.Item{Pod: p.Pod, Ref: p.Source, Generation: p.Generation})
		// A pod stored without its mark (a crash between the two writes, or a node upgraded from
		// protocol v1) runs: it counts as held, with an unknown digest.
		key := protocol.ObjectKey(protocol.KindPod, p.Pod.Namespace, p.Pod.Name)
		if _, ok := d.held[key]; !ok {
			d.held[key] = held{gen: p.Generation}
		}
	}
	// ConfigMaps and Secrets stored without their mark (a crash between the two writes) are held
	// too, so an index that leaves them out deletes them.
	objs, _, err := d.o.Store.ListObjects()
	if err != nil {
		return fmt.Errorf("mqtt downlink: read configmaps and secrets: %w", err)
	}
	for _, r := range objs {
		if r.Source.Kind != source.MQTT {
			continue
		}
		kind := protocol.KindConfigMap
		if r.Kind == store.KindSecret {
			kind = protocol.KindSecret
		}
		key := protocol.ObjectKey(kind, r.Namespace, r.Name)
		if _, ok := d.held[key]; !ok {
			d.held[key] = held{gen: r.Generation}
		}
	}
	if len(drop) > 0 {
		if err := d.o.Store.UpdateMarks(nil, drop); err != nil {
			d.o.Log.Warn("mqtt downlink: remove obsolete sync marks", "keys", drop, "err", err)
		}
	}
	deliver(source.Change{Op: source.Resync, Items: items})
	if d.index != nil {
		// The stored index is a decision already taken: what it leaves out goes, even if the
		// agent stopped between storing it and acting on it.
		d.deleteUnlisted()
	}
	// Until a connection shows that the broker holds the restored index, the acks are complete:
	// the broker may have lost it while the node was down, and compact acks would then leave a
	// writer nothing to rebuild from.
	d.complete = d.index != nil
	d.ack()
	d.running = true
	defer func() {
		if d.ackTimer != nil {
			d.ackTimer.Stop()
		}
	}()

	var settle *time.Timer
	var settleC <-chan time.Time
	// What was missing when the timer was armed: only those have waited a whole settle period
	// when it fires. An object that went missing just before (a new index a moment ago) is
	// given its own period instead of being asked for at once.
	var armedFor map[string]int64 // key -> the generation missing
	defer func() {
		if settle != nil {
			settle.Stop()
		}
	}()
	arm := func() {
		if settle == nil {
			settle = time.NewTimer(d.settleDelay())
			settleC = settle.C
			armedFor = map[string]int64{}
			for _, k := range d.missing() {
				armedFor[k] = d.index.Objects[k].Generation
			}
		}
	}
	if len(d.missing()) > 0 || len(d.undeleted) > 0 {
		// The stored index lists what has not arrived: ask for it even if the broker sends
		// nothing at all (it lost its state).
		arm()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-d.in:
			d.handle(m)
			if len(d.missing()) > 0 || len(d.undeleted) > 0 {
				arm()
			}
		case <-d.ackHeld():
			d.ackTimer = nil
			if d.ackDue {
				d.flushAcks()
			}
		case <-settleC:
			settle, settleC = nil, nil
			if len(d.undeleted) > 0 {
				d.deleteKeys(slices.Sorted(maps.Keys(d.undeleted)))
			}
			var missing []string
			for _, k := range d.missing() {
				if g, ok := armedFor[k]; ok && g == d.index.Objects[k].Generation {
					missing = append(missing, k)
				}
			}
			if len(missing) > 0 {
				d.attempts++
				d.o.Log.Warn("mqtt downlink: objects listed by the index have not arrived; fetching them again and asking the control plane",
					"missing", missing, "revision", d.index.Revision, "attempt", d.attempts)
				d.fetch(missing, true)
				// The attempt makes each request differ, so the uplink does not take a repeat
				// for a duplicate of the last one.
				d.o.Resync(fmt.Sprintf("index revision %d lists %d objects this node does not have (attempt %d)", d.index.Revision, len(missing), d.attempts), missing)
			} else if len(d.missing()) == 0 {
				d.attempts = 0
			}
			if len(d.missing()) > 0 || len(d.undeleted) > 0 {
				arm()
			}
		}
	}
}

// restoreIndex takes the stored index back if it still verifies.
func (d *Downlink) restoreIndex(m store.SyncMark) {
	if len(m.Data) == 0 {
		return // a protocol v1 mark: a revision without entries means nothing to v2
	}
	if protocol.Digest(m.Data) != m.Digest {
		d.o.Log.Warn("mqtt downlink: the stored index does not match its digest; waiting for the broker's", "revision", m.Generation)
		return
	}
	x, err := protocol.DecodeIndex(protocol.Topic{Class: protocol.ClassIndex, Node: d.o.Node}, m.Data, d.o.MaxPayload)
	if err != nil {
		d.o.Log.Warn("mqtt downlink: the stored index cannot be read; waiting for the broker's", "err", err)
		return
	}
	if len(d.o.Trusted) > 0 {
		if err := protocol.VerifyIndex(x, d.o.Trusted); err != nil {
			// The trust anchors changed (a key removed), or the file was altered: the broker's
			// index is verified again when it arrives.
			d.o.Log.Warn("mqtt downlink: the stored index is not signed by a trusted key; waiting for the broker's", "err", err)
			return
		}
	}
	d.index, d.indexDigest, d.indexPayload = x, m.Digest, m.Data
}

// settleDelay backs off while the set does not converge, so a control plane that lost an object
// is asked again and again, but not in a storm.
func (d *Downlink) settleDelay() time.Duration {
	delay := d.o.Settle
	for i := 0; i < d.attempts && delay < maxResendBackoff; i++ {
		delay *= 2
	}
	return min(delay, maxResendBackoff)
}

// handle applies one message.
func (d *Downlink) handle(m Message) {
	if m.Session > d.session {
		d.session, d.sawIndex, d.settled = m.Session, false, false
	}
	t, err := d.o.Topics.Parse(m.Topic)
	if err != nil {
		d.refuseMessage(m.Topic, protocol.Topic{}, err)
		return
	}
	if t.Node != d.o.Node {
		d.refuseMessage(m.Topic, t, fmt.Errorf("the topic is for node %q, this node is %q", t.Node, d.o.Node))
		return
	}
	if len(m.Payload) == 0 {
		// An empty retained payload clears a topic (a writer removing a deleted object). It is
		// never a deletion: nothing is deleted because a message is missing.
		d.o.Log.Debug("mqtt downlink: cleared topic ignored", "topic", m.Topic)
		if t.Class == protocol.ClassIndex {
			d.brokerLacksIndex() // someone cleared the index the node runs
		}
		return
	}
	switch t.Class {
	case protocol.ClassDesired:
		d.object(t, m)
	case protocol.ClassIndex:
		d.onIndex(t, m)
	case protocol.ClassNodeMarker, protocol.ClassLiveness:
		// The node's marker, or the echo of its own online message on this connection.
		d.onMarker(m.Session)
	default:
		d.refuseMessage(m.Topic, t, fmt.Errorf("topic class %q carries no desired state", t.Class))
	}
}

// onIndex takes a newer index: stores it, deletes what it leaves out, applies what arrived ahead
// of it, and fetches what it lists that the node lacks.
func (d *Downlink) onIndex(t protocol.Topic, m Message) {
	digest := protocol.Digest(m.Payload)
	x, err := protocol.DecodeIndex(t, m.Payload, d.o.MaxPayload)
	if err == nil && len(d.o.Trusted) > 0 {
		// Before anything else: an index no trusted key signed says nothing, not even that it
		// is stale or conflicting.
		err = protocol.VerifyIndex(x, d.o.Trusted)
	}
	// Whatever is refused below, the broker holds it on the index topic instead of the index in
	// force: the acks must then list every applied entry, for a writer to rebuild from.
	if err != nil {
		if d.index != nil {
			d.complete = true
		}
		d.refuseIndex(m.Topic, peekRevision(m.Payload), digest, err)
		return
	}
	if d.index != nil {
		switch {
		case x.Revision < d.index.Revision:
			d.complete = true
			d.refuseIndex(m.Topic, x.Revision, digest, fmt.Errorf("stale index revision %d: revision %d is already in force", x.Revision, d.index.Revision))
			return
		case x.Revision == d.index.Revision && digest == d.indexDigest:
			// The retained index replayed by a new connection (or a resubscribe): fetch what is
			// still missing on this connection, silently.
			d.fetch(d.missing(), true)
			d.brokerHoldsIndex(m.Session)
			return
		case x.Revision == d.index.Revision:
			d.complete = true
			d.refuseIndex(m.Topic, x.Revision, digest, fmt.Errorf("conflicting index: revision %d is already in force with other content (two writers used one revision)", x.Revision))
			return
		}
	}
	// The decision is stored before it is acted on: a crash in between is finished at the next start.
	if err := d.o.Store.UpdateMarks([]store.SyncMark{{Key: indexMark, Generation: x.Revision, Digest: digest, Data: m.Payload}}, nil); err != nil {
		// Not taken: the next delivery of the retained index tries again.
		d.o.Log.Error("mqtt downlink: store the index; not acting on it", "revision", x.Revision, "err", err)
		return
	}
	d.index, d.indexDigest, d.indexPayload, d.indexRefused = x, digest, m.Payload, nil
	d.complete = false
	if m.Session == d.session {
		d.sawIndex = true
	}
	d.deleteUnlisted()
	for _, key := range slices.Sorted(maps.Keys(d.pending)) {
		p := d.pending[key]
		e, listed := x.Objects[key]
		switch {
		case listed && e.Digest == protocol.Digest(p.payload):
			delete(d.pending, key)
			d.take(key, e, p.payload)
		case !listed && p.gen > x.Revision, listed && p.gen > e.Generation:
			// Still ahead of this index.
		default:
			delete(d.pending, key)
		}
	}
	var done []string
	for key := range d.fetching {
		if _, listed := x.Objects[key]; !listed || !d.lacks(key) {
			done = append(done, key)
		}
	}
	d.unfetch(done)
	// Again, even for keys subscribed before: that may have been on an earlier connection.
	d.fetch(d.missing(), true)
	d.ack()
}

// brokerHoldsIndex notes that the index in force arrived on connection session: compact acks
// are enough again.
func (d *Downlink) brokerHoldsIndex(session int64) {
	if session == d.session {
		d.sawIndex = true
	}
	if d.complete {
		d.complete = false
		d.ack()
	}
}

// brokerLacksIndex switches to complete acks: the broker does not hold the index in force, and a
// writer must be able to rebuild it from what the node reports.
func (d *Downlink) brokerLacksIndex() {
	if d.index != nil && !d.complete {
		d.complete = true
		d.flushAcks() // not held back: they are what a writer needs now
	}
}

// onMarker takes the node's own marker coming back on connection session: every retained message
// of the node's subscriptions on that connection arrived before it. If the index in force was not
// among them, the broker lost it (restarted without its state, or someone cleared the topic).
func (d *Downlink) onMarker(session int64) {
	if session != d.session || d.settled {
		return
	}
	d.settled = true
	if !d.sawIndex {
		d.brokerLacksIndex()
	}
}

// deleteUnlisted deletes every held object the current index does not list.
func (d *Downlink) deleteUnlisted() {
	var gone []string
	for _, key := range slices.Sorted(maps.Keys(d.held)) {
		if _, listed := d.index.Objects[key]; !listed {
			d.o.Log.Info("mqtt downlink: the index no longer lists an object; deleting it", "key", key, "revision", d.index.Revision)
			gone = append(gone, key)
		}
	}
	d.deleteKeys(gone)
}

// deleteKeys deletes objects (pods in one change, so the agent writes the store once) and their
// marks. A deletion the store refused is retried on the settle timer.
func (d *Downlink) deleteKeys(keys []string) {
	var podKeys, marks []string
	for _, key := range keys {
		kind, ns, name, err := protocol.ParseObjectKey(key)
		if err != nil {
			delete(d.held, key)
			marks = append(marks, key)
			continue
		}
		switch kind {
		case protocol.KindPod:
			podKeys = append(podKeys, key)
		case protocol.KindConfigMap, protocol.KindSecret:
			if err := d.o.Store.DeleteObject(storeKind(kind), ns, name); err != nil {
				d.o.Log.Error("mqtt downlink: delete an object the index no longer lists; will retry", "key", key, "err", err)
				d.undeleted[key] = true
				continue
			}
			delete(d.undeleted, key)
			delete(d.held, key)
			marks = append(marks, key)
		}
	}
	if len(podKeys) > 0 {
		nsNames := make([]string, len(podKeys))
		for i, key := range podKeys {
			_, ns, name, _ := protocol.ParseObjectKey(key)
			nsNames[i] = ns + "/" + name
		}
		if res := d.deliver(source.Change{Op: source.Delete, Keys: nsNames}); res.Err != nil {
			d.o.Log.Error("mqtt downlink: delete pods the index no longer lists; will retry", "keys", podKeys, "err", res.Err)
			for _, key := range podKeys {
				d.undeleted[key] = true
			}
		} else {
			for _, key := range podKeys {
				delete(d.undeleted, key)
				delete(d.held, key)
				marks = append(marks, key)
			}
		}
	}
	if len(marks) > 0 {
		if err := d.o.Store.UpdateMarks(nil, marks); err != nil {
			// The objects are gone; a stale mark only makes the next start delete them again.
			d.o.Log.Error("mqtt downlink: remove the marks of deleted objects", "keys", marks, "err", err)
		}
	}
}

// object handles a desired object's message.
func (d *Downlink) object(t protocol.Topic, m Message) {
	key := protocol.ObjectKey(t.Kind, t.Namespace, t.Name)
	digest := protocol.Digest(m.Payload)
	var e protocol.IndexEntry
	listed := false
	if d.index != nil {
		e, listed = d.index.Objects[key]
	}
	if listed && e.Digest == digest {
		if h := d.held[key]; h.gen == e.Generation && h.digest == digest {
			d.unfetch([]string{key}) // a replay of what the node has: silent
			return
		}
		d.take(key, e, m.Payload)
		if !d.lacks(key) {
			d.unfetch([]string{key})
		}
		d.ack()
		return
	}
	gen := peekGeneration(m.Payload)
	switch {
	case listed && gen > e.Generation, !listed && (d.index == nil || gen > d.index.Revision):
		// Ahead of the index (objects are published before the index that lists them): kept
		// until that index arrives, never applied without it.
		d.keepPending(key, gen, m.Payload)
	case listed && gen == e.Generation:
		d.o.Log.Warn("mqtt downlink: object does not match the index's digest; still missing", "key", key, "generation", gen, "revision", d.index.Revision)
		d.o.Events.Emit(event.Event{
			Time: d.o.Now(), Type: event.Warning, Reason: "DigestMismatch", Object: objectRef(t),
			Message: fmt.Sprintf("%s: generation %d does not have the digest index revision %d lists for it (two writers, or a forged message); still waiting for the listed one", m.Topic, gen, d.index.Revision),
			Source:  "mqtt " + m.Topic,
		})
	default:
		// An older copy, or an object deleted since: the index decides, so this changes nothing.
		d.o.Log.Debug("mqtt downlink: object not in force under the current index; ignored", "key", key, "generation", gen)
	}
}

// keepPending remembers an object ahead of the index, dropping the oldest past maxPending.
func (d *Downlink) keepPending(key string, gen int64, payload []byte) {
	if p, ok := d.pending[key]; ok && p.gen > gen {
		return
	}
	if _, ok := d.pending[key]; !ok && len(d.pending) >= maxPending {
		oldest, seq := "", uint64(0)
		for k, p := range d.pending {
			if oldest == "" || p.seq < seq {
				oldest, seq = k, p.seq
			}
		}
		delete(d.pending, oldest)
	}
	d.pendingSeq++
	d.pending[key] = pending{gen: gen, payload: payload, seq: d.pendingSeq}
}

// take applies (or refuses) a payload whose digest the index lists for key, and stores the
// outcome. A store failure leaves the key missing, so it is fetched and tried again.
func (d *Downlink) take(key string, e protocol.IndexEntry, payload []byte) {
	kind, ns, name, _ := protocol.ParseObjectKey(key)
	t := protocol.Topic{Class: protocol.ClassDesired, Node: d.o.Node, Kind: kind, Namespace: ns, Name: name}
	topic := d.o.Topics.Desired(d.o.Node, kind, ns, name)
	obj, err := protocol.DecodeDesired(t, payload, d.o.MaxPayload)
	if err == nil && obj.Generation != e.Generation {
		err = fmt.Errorf("payload generation %d, the index lists %d", obj.Generation, e.Generation)
	}
	if err != nil {
		d.refuse(key, e, topic, "undecodable: "+err.Error(), err)
		return
	}
	reason, err := d.apply(obj, topic)
	switch {
	case err != nil:
		d.o.Log.Error("mqtt downlink: apply failed; the object stays missing and is fetched again", "topic", topic, "err", err)
		return
	case reason != "":
		d.refuse(key, e, topic, reason, errors.New(reason))
		return
	}
	d.setHeld(key, held{gen: e.Generation, digest: e.Digest})
}

// apply hands a pod to the agent or writes a configMap/secret. It returns the refusal reason when
// the agent or the store refused the object itself, and an error when it could not be stored.
func (d *Downlink) apply(obj *protocol.DesiredObject, topic string) (string, error) {
	ref := source.Ref{Kind: source.MQTT, Origin: topic}
	switch obj.Kind {
	case protocol.KindPod:
		p := obj.Pod
		p.Namespace = obj.Namespace
		res := d.deliver(source.Change{Op: source.Upsert, Items: []source.Item{{Pod: p, Ref: ref, Generation: obj.Generation}}})
		if res.Err != nil {
			return "", res.Err
		}
		if why, refused := res.Rejected[obj.Namespace+"/"+obj.Name]; refused {
			return why, nil
		}
		return "", nil
	case protocol.KindConfigMap, protocol.KindSecret:
		switch {
		case obj.Sealed != nil && d.o.Unseal == nil:
			return "the secret is sealed and this node has no sealing key (no node key)", nil
		case obj.Sealed != nil:
			if err := d.o.Unseal(obj.Secret, obj.Sealed); err != nil {
				// The same payload never opens later: a verdict, until a writer seals it again.
				return err.Error(), nil
			}
		case obj.Secret != nil && (len(obj.Secret.Data) > 0 || len(obj.Secret.StringData) > 0):
			d.o.Log.Warn("mqtt downlink: a secret arrived in clear; the broker and everyone who can read its topic saw it (writers seal secrets to the node's key)", "topic", topic)
			d.o.Events.Emit(event.Event{
				Time: d.o.Now(), Type: event.Warning, Reason: "SecretNotSealed",
				Object:  event.Object{Kind: "Secret", Namespace: obj.Namespace, Name: obj.Name},
				Message: fmt.Sprintf("%s arrived in clear: the broker and whoever can read the topic saw its data; a current mqlet ctl or mqlet-bridge seals secrets to this node's key", topic),
				Source:  "mqtt " + topic,
			})
		}
		r := store.ObjectRecord{Kind: storeKind(obj.Kind), Namespace: obj.Namespace, Name: obj.Name, Generation: obj.Generation, Source: ref}
		if obj.ConfigMap != nil {
			obj.ConfigMap.Namespace = obj.Namespace
			r.ConfigMap = obj.ConfigMap
		} else {
			obj.Secret.Namespace = obj.Namespace
			r.Secret = obj.Secret
		}
		err := d.o.Store.PutObject(r)
		var verdict interface{ Refusal() }
		if errors.As(err, &verdict) {
			// The store refused the object itself (another source defines its name): a
			// verdict, not a failure to retry.
			return err.Error(), nil
		}
		return "", err
	}
	return fmt.Sprintf("unknown kind %q", obj.Kind), nil
}

func storeKind(k protocol.ObjectKind) store.ObjectKind {
	if k == protocol.KindSecret {
		return store.KindSecret
	}
	return store.KindConfigMap
}

// setHeld records an outcome in memory and in the store.
func (d *Downlink) setHeld(key string, h held) {
	d.held[key] = h
	if err := d.o.Store.UpdateMarks([]store.SyncMark{{Key: key, Generation: h.gen, Digest: h.digest, Refused: h.refused}}, nil); err != nil {
		// In memory the outcome holds; after a restart the object is fetched and judged again,
		// which the agent's own generation check makes harmless.
		d.o.Log.Error("mqtt downlink: store a sync mark", "key", key, "err", err)
	}
}

// lacks says whether the current index lists key with an entry the node has no outcome for.
func (d *Downlink) lacks(key string) bool {
	if d.index == nil {
		return false
	}
	e, listed := d.index.Objects[key]
	h := d.held[key]
	return listed && (h.gen != e.Generation || h.digest != e.Digest)
}

// missing lists the index entries the node has no outcome for.
func (d *Downlink) missing() []string {
	if d.index == nil {
		return nil
	}
	var out []string
	for key := range d.index.Objects {
		if d.lacks(key) {
			out = append(out, key)
		}
	}
	slices.Sort(out)
	return out
}

// fetch subscribes to the topics of keys not subscribed yet, or to all of them again when again
// is set (the broker then resends their retained messages).
func (d *Downlink) fetch(keys []string, again bool) {
	var want []string
	for _, k := range keys {
		if again || !d.fetching[k] {
			want = append(want, k)
			d.fetching[k] = true
		}
	}
	if len(want) > 0 {
		d.o.Fetch(want)
	}
}

func (d *Downlink) unfetch(keys []string) {
	var drop []string
	for _, k := range keys {
		if d.fetching[k] {
			drop = append(drop, k)
			delete(d.fetching, k)
		}
	}
	if len(drop) > 0 {
		d.o.Unfetch(drop)
	}
}

// ack states that the acks changed. While the index in force lists objects not taken in yet (just
// fetched: their payloads are on their way), the acks are held back for AckHold, and sent at once
// when nothing is missing any more. Complete acks are never held back: a writer may be waiting
// for them.
func (d *Downlink) ack() {
	if d.running && d.o.AckHold > 0 && !d.complete && len(d.missing()) > 0 {
		d.ackDue = true
		if d.ackTimer == nil {
			d.ackTimer = time.NewTimer(d.o.AckHold)
		}
		return
	}
	d.flushAcks()
}

// ackHeld is the hold timer's channel; nil (never ready) when acks are not held back.
func (d *Downlink) ackHeld() <-chan time.Time {
	if d.ackTimer == nil {
		return nil
	}
	return d.ackTimer.C
}

// flushAcks hands the current acknowledgements to the uplink: the index in force and its entries
// not applied (compact), or, while the broker lacks that index, every entry's outcome (complete).
// Before any index, what the node holds is listed as applied, so a control plane that starts from
// nothing can learn what the node runs.
func (d *Downlink) flushAcks() {
	d.ackDue = false
	if d.ackTimer != nil {
		d.ackTimer.Stop()
		d.ackTimer = nil
	}
	a := protocol.Acks{Node: d.o.Node, IndexRefused: d.indexRefused, Compact: d.index != nil && !d.complete}
	if !a.Compact {
		a.Applied = map[string]protocol.IndexEntry{}
	}
	if d.index == nil {
		for key, h := range d.held {
			if h.refused == "" {
				a.Applied[key] = protocol.IndexEntry{Generation: h.gen, Digest: h.digest}
			}
		}
		d.o.Acks(a)
		return
	}
	a.IndexRevision, a.IndexDigest = d.index.Revision, d.indexDigest
	if d.complete && d.index.Signature != nil {
		// A writer rebuilding from these acks verifies the signed index rather than trusting
		// entries the broker relayed.
		a.Index = d.indexPayload
	}
	for key, e := range d.index.Objects {
		switch h := d.held[key]; {
		case h.gen != e.Generation || h.digest != e.Digest:
			if a.Missing == nil {
				a.Missing = map[string]protocol.IndexEntry{}
			}
			a.Missing[key] = e
		case h.refused != "":
			if a.Refused == nil {
				a.Refused = map[string]protocol.Refusal{}
			}
			a.Refused[key] = protocol.Refusal{Generation: h.gen, Digest: h.digest, Reason: h.refused}
		case !a.Compact:
			a.Applied[key] = e
		}
	}
	d.o.Acks(a)
}

// refuse records a durable refusal of an index entry and reports it. The reason never quotes the
// payload: it may hold a secret.
func (d *Downlink) refuse(key string, e protocol.IndexEntry, topic, reason string, err error) {
	d.setHeld(key, held{gen: e.Generation, digest: e.Digest, refused: reason})
	kind, ns, name, _ := protocol.ParseObjectKey(key)
	d.report(topic, protocol.Topic{Kind: kind, Namespace: ns, Name: name}, err)
}

// refuseIndex reports an index the node did not take and records it for the acks.
func (d *Downlink) refuseIndex(topic string, revision int64, digest string, err error) {
	d.indexRefused = &protocol.Refusal{Generation: revision, Digest: digest, Reason: err.Error()}
	d.report(topic, protocol.Topic{}, err)
	d.ack()
}

// refuseMessage reports a message that is about nothing the node can take (bad topic).
func (d *Downlink) refuseMessage(topic string, t protocol.Topic, err error) { d.report(topic, t, err) }

func (d *Downlink) report(topic string, t protocol.Topic, err error) {
	reason := "Refused"
	if errors.Is(err, protocol.ErrTooLarge) {
		reason = "PayloadTooLarge"
	}
	d.o.Log.Warn("mqtt downlink: message refused", "topic", topic, "err", err)
	obj := event.Object{Kind: "Node", Name: d.o.Node}
	if t.Kind != "" {
		obj = objectRef(t)
	}
	d.o.Events.Emit(event.Event{
		Time: d.o.Now(), Type: event.Warning, Reason: reason, Object: obj,
		Message: fmt.Sprintf("%s: %v", topic, err), Source: "mqtt " + topic,
	})
}

func objectRef(t protocol.Topic) event.Object {
	return event.Object{Kind: string(t.Kind), Namespace: t.Namespace, Name: t.Name}
}

// peekGeneration reads a payload's generation without judging the rest (0 when unreadable): enough
// to tell an object ahead of the index from an old one.
func peekGeneration(payload []byte) int64 {
	var g struct {
		Generation int64 `json:"generation"`
	}
	if len(payload) > protocol.DefaultMaxPayload || json.Unmarshal(payload, &g) != nil {
		return 0
	}
	return g.Generation
}

// peekRevision reads an index payload's revision without judging the rest (0 when unreadable).
func peekRevision(payload []byte) int64 {
	var r struct {
		Revision int64 `json:"revision"`
	}
	if len(payload) > protocol.DefaultMaxPayload || json.Unmarshal(payload, &r) != nil {
		return 0
	}
	return r.Revision
}
