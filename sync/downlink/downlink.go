// Package downlink is the MQTT source of desired state: it turns the retained desired messages and
// the index of this node (docs/protocol.md) into source.Changes for the agent, and configMaps and
// secrets into store records.
//
// Correctness rests on generations, not on the broker or the client library: a message is applied
// only when its generation is above the one recorded for its key (a SyncMark, kept in the store with
// tombstones), so duplicates, replays and reordering change nothing. A mark is written only after
// the change was handed to the agent (which stores it before acting), so a crash in between makes
// the retained message apply again after restart instead of being skipped.
package downlink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/mqlet/mqlet/agent/event"
	"github.com/mqlet/mqlet/agent/source"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/protocol"
)

// Store is what the downlink needs of the state store.
type Store interface {
	ListDesired() ([]store.DesiredPod, []store.RecordError, error)
	ListMarks() (map[string]store.SyncMark, []store.RecordError, error)
	PutMarks(marks []store.SyncMark) error
	PutObject(r store.ObjectRecord) error
	DeleteObject(kind store.ObjectKind, namespace, name string) error
}

// Message is one message from the node's subscriptions.
type Message struct {
	Topic    string
	Payload  []byte
	Retained bool
}

// indexMark is the mark key holding the revision of the last index compared against. Object keys
// always have three segments, so it cannot collide with one.
const indexMark = "index"

// Defaults.
const (
	DefaultSettle    = 3 * time.Second
	maxResendBackoff = 5 * time.Minute
	inboxSize        = 1024
)

// Options configure a Downlink.
type Options struct {
	Node       string
	Topics     protocol.Topics
	Store      Store
	MaxPayload int
	// Events receives refusals (bad payloads, stale generations); it must not block.
	Events event.Sink
	// Acks receives the node's acknowledgements after every change; it must not block (the
	// uplink coalesces them).
	Acks func(protocol.Acks)
	// Resend asks for a full resend of the desired set: resubscribe and publish a resync request.
	Resend func(reason string, missing []string)
	// Settle is how long an index entry may stay missing before a resend is asked: retained
	// messages of different topics arrive in no set order after a (re)subscribe.
	Settle time.Duration
	Log    *slog.Logger
	Now    func() time.Time
}

// Downlink is a source.Source of kind MQTT.
type Downlink struct {
	o  Options
	in chan Message

	// Owned by Run's goroutine.
	marks    map[string]store.SyncMark
	refused  map[string]protocol.Refusal
	index    *protocol.Index // the last index compared against
	lacking  int             // entries of index whose generation is not taken in yet (missing() lists them)
	deliver  func(source.Change)
	attempts int // resends asked in a row without the set converging
}

// New makes a downlink; Run starts it.
func New(o Options) *Downlink {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Settle <= 0 {
		o.Settle = DefaultSettle
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
	if o.Resend == nil {
		o.Resend = func(string, []string) {}
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

// Run restates the stored MQTT pods as this source's full set (so a node booting without a broker
// runs what it ran and the agent knows this source has spoken), then applies messages until ctx ends.
func (d *Downlink) Run(ctx context.Context, deliver func(source.Change)) error {
	d.deliver = deliver
	marks, bad, err := d.o.Store.ListMarks()
	if err != nil {
		return fmt.Errorf("mqtt downlink: read sync marks: %w", err)
	}
	for _, e := range bad {
		d.o.Log.Warn("mqtt downlink: skipping an unreadable sync mark; the control plane's next message repairs it", "err", e)
	}
	d.marks = marks
	d.refused = map[string]protocol.Refusal{}
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
		// A pod stored without its mark (a crash between the two writes) still counts as taken in,
		// so the index can delete it and a replay of its generation changes nothing.
		key := protocol.ObjectKey(protocol.KindPod, p.Pod.Namespace, p.Pod.Name)
		if m := d.marks[key]; m.Generation < p.Generation {
			d.marks[key] = store.SyncMark{Key: key, Generation: p.Generation}
		}
	}
	if m, ok := d.marks[indexMark]; ok {
		d.index = &protocol.Index{Revision: m.Generation}
	}
	deliver(source.Change{Op: source.Resync, Items: items})

	var settle *time.Timer
	var settleC <-chan time.Time
	defer func() {
		if settle != nil {
			settle.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-d.in:
			if d.handle(m) && settle == nil {
				settle = time.NewTimer(d.settleDelay())
				settleC = settle.C
			}
		case <-settleC:
			settle, settleC = nil, nil
			if missing := d.missing(); len(missing) > 0 {
				d.attempts++
				d.o.Log.Warn("mqtt downlink: objects named by the index have not arrived; asking for a resend",
					"missing", missing, "attempt", d.attempts)
				d.o.Resend("index lists objects this node does not have", missing)
				settle = time.NewTimer(d.settleDelay())
				settleC = settle.C
			} else {
				d.attempts = 0
			}
		}
	}
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

// handle applies one message; it reports whether the index now names objects the node lacks.
func (d *Downlink) handle(m Message) bool {
	t, err := d.o.Topics.Parse(m.Topic)
	if err != nil {
		d.refuse(m.Topic, protocol.Topic{}, 0, err)
		return false
	}
	if t.Node != d.o.Node {
		d.refuse(m.Topic, t, 0, fmt.Errorf("the topic is for node %q, this node is %q", t.Node, d.o.Node))
		return false
	}
	if len(m.Payload) == 0 {
		// An empty retained payload clears a topic (a control plane removing an acknowledged
		// tombstone). It is never a deletion: nothing is deleted because a message is missing.
		d.o.Log.Debug("mqtt downlink: cleared topic ignored", "topic", m.Topic)
		return false
	}
	switch t.Class {
	case protocol.ClassDesired:
		d.desired(t, m)
		return d.lacking > 0
	case protocol.ClassIndex:
		d.applyIndex(t, m)
		return d.lacking > 0
	}
	d.refuse(m.Topic, t, 0, fmt.Errorf("topic class %q carries no desired state", t.Class))
	return false
}

func (d *Downlink) desired(t protocol.Topic, m Message) {
	obj, err := protocol.DecodeDesired(t, m.Payload, d.o.MaxPayload)
	if err != nil {
		d.refuse(m.Topic, t, 0, err)
		return
	}
	key := obj.Key()
	mark := d.marks[key]
	switch {
	case obj.Generation < mark.Generation:
		d.refuse(m.Topic, t, obj.Generation, fmt.Errorf("stale generation %d: generation %d is already applied", obj.Generation, mark.Generation))
		return
	case obj.Generation == mark.Generation:
		if m.Retained {
			// Every (re)subscribe replays the retained set: expected, and silent.
			return
		}
		d.refuse(m.Topic, t, obj.Generation, fmt.Errorf("duplicate generation %d: already applied", obj.Generation))
		return
	}
	if d.index != nil && obj.Generation <= d.index.Revision {
		if _, listed := d.index.Objects[key]; !listed {
			// The index at this revision covers every generation up to it and does not list the
			// object: it was deleted since. Starting it only to delete it at the next compare
			// would flap a pod, so it is recorded as deleted right away.
			d.o.Log.Info("mqtt downlink: object older than the index and not listed in it; treated as deleted",
				"key", key, "generation", obj.Generation, "revision", d.index.Revision)
			d.deleteByIndex(key)
			d.ack()
			return
		}
	}
	if err := d.apply(obj, m.Topic); err != nil {
		var verdict interface{ Refusal() }
		if errors.As(err, &verdict) {
			// The store refused the object itself (another source defines its name): report it
			// like a bad payload rather than retrying what will be refused again.
			d.refuse(m.Topic, t, obj.Generation, err)
			return
		}
		// Not marked: the next delivery of this retained message tries again.
		d.o.Log.Error("mqtt downlink: apply failed; will retry on the next delivery", "topic", m.Topic, "err", err)
		return
	}
	d.mark(store.SyncMark{Key: key, Generation: obj.Generation, Deleted: obj.Deleted})
	delete(d.refused, key)
	d.ack()
}

// apply hands a pod change to the agent or writes a configMap/secret.
func (d *Downlink) apply(obj *protocol.DesiredObject, topic string) error {
	ref := source.Ref{Kind: source.MQTT, Origin: topic}
	switch obj.Kind {
	case protocol.KindPod:
		if obj.Deleted {
			d.deliver(source.Change{Op: source.Delete, Keys: []string{obj.Namespace + "/" + obj.Name}})
			return nil
		}
		p := obj.Pod
		p.Namespace = obj.Namespace
		d.deliver(source.Change{Op: source.Upsert, Items: []source.Item{{Pod: p, Ref: ref, Generation: obj.Generation}}})
		return nil
	case protocol.KindConfigMap, protocol.KindSecret:
		kind := store.KindConfigMap
		if obj.Kind == protocol.KindSecret {
			kind = store.KindSecret
		}
		if obj.Deleted {
			return d.o.Store.DeleteObject(kind, obj.Namespace, obj.Name)
		}
		r := store.ObjectRecord{Kind: kind, Namespace: obj.Namespace, Name: obj.Name, Generation: obj.Generation, Source: ref}
		if obj.ConfigMap != nil {
			obj.ConfigMap.Namespace = obj.Namespace
			r.ConfigMap = obj.ConfigMap
		} else {
			obj.Secret.Namespace = obj.Namespace
			r.Secret = obj.Secret
		}
		return d.o.Store.PutObject(r)
	}
	return fmt.Errorf("unknown kind %q", obj.Kind)
}

// applyIndex deletes what the index says is gone and remembers what it says is missing.
func (d *Downlink) applyIndex(t protocol.Topic, m Message) {
	x, err := protocol.DecodeIndex(t, m.Payload, d.o.MaxPayload)
	if err != nil {
		d.refuse(m.Topic, t, 0, err)
		return
	}
	if d.index != nil && x.Revision < d.index.Revision {
		d.refuse(m.Topic, t, x.Revision, fmt.Errorf("stale index revision %d: revision %d was already compared", x.Revision, d.index.Revision))
		return
	}
	d.index = x
	d.lacking = len(d.missing())
	var gone []string
	for _, key := range slices.Sorted(maps.Keys(d.marks)) {
		mk := d.marks[key]
		if key == indexMark || mk.Deleted || mk.Generation > x.Revision {
			continue // a tombstone already, or newer than this index
		}
		if _, listed := x.Objects[key]; !listed {
			d.o.Log.Info("mqtt downlink: the index no longer lists an object; deleting it", "key", key, "revision", x.Revision)
			gone = append(gone, key)
		}
	}
	d.deleteByIndex(gone...)
	d.mark(store.SyncMark{Key: indexMark, Generation: x.Revision})
	d.ack()
}

// deleteByIndex deletes objects the current index does not list and records tombstones at the
// index's revision (pods in one change, so the agent writes the store once).
func (d *Downlink) deleteByIndex(keys ...string) {
	var podKeys []string
	var gone []store.SyncMark
	for _, key := range keys {
		kind, ns, name, err := protocol.ParseObjectKey(key)
		if err != nil {
			continue
		}
		switch kind {
		case protocol.KindPod:
			podKeys = append(podKeys, ns+"/"+name)
		case protocol.KindConfigMap, protocol.KindSecret:
			sk := store.KindConfigMap
			if kind == protocol.KindSecret {
				sk = store.KindSecret
			}
			if err := d.o.Store.DeleteObject(sk, ns, name); err != nil {
				d.o.Log.Error("mqtt downlink: delete an object the index no longer lists", "key", key, "err", err)
				continue
			}
		}
		gone = append(gone, store.SyncMark{Key: key, Generation: d.index.Revision, Deleted: true})
	}
	if len(podKeys) > 0 {
		d.deliver(source.Change{Op: source.Delete, Keys: podKeys})
	}
	if len(gone) > 0 {
		d.mark(gone...)
	}
}

// missing lists the index entries the node has not taken in yet.
func (d *Downlink) missing() []string {
	if d.index == nil {
		return nil
	}
	var out []string
	for key, g := range d.index.Objects {
		if d.marks[key].Generation < g {
			out = append(out, key)
		}
	}
	slices.Sort(out)
	return out
}

func (d *Downlink) mark(ms ...store.SyncMark) {
	for _, mk := range ms {
		if d.index != nil {
			// Keep lacking current, so a message costs O(1) and not a walk over the index.
			if g, listed := d.index.Objects[mk.Key]; listed {
				was, now := d.marks[mk.Key].Generation < g, mk.Generation < g
				switch {
				case was && !now:
					d.lacking--
				case !was && now:
					d.lacking++
				}
			}
		}
		d.marks[mk.Key] = mk
	}
	if err := d.o.Store.PutMarks(ms); err != nil {
		// In memory the marks hold; after a restart the retained messages apply again, which
		// the agent's own generation check makes harmless.
		d.o.Log.Error("mqtt downlink: store sync marks", "err", err)
	}
}

// ack hands the current acknowledgements to the uplink.
func (d *Downlink) ack() {
	a := protocol.Acks{Node: d.o.Node, Applied: map[string]int64{}, Deleted: map[string]int64{}}
	if d.index != nil {
		a.IndexRevision = d.index.Revision
	}
	for key, mk := range d.marks {
		switch {
		case key == indexMark:
		case mk.Deleted:
			a.Deleted[key] = mk.Generation
		default:
			a.Applied[key] = mk.Generation
		}
	}
	if len(d.refused) > 0 {
		a.Refused = maps.Clone(d.refused)
	}
	d.o.Acks(a)
}

// refuse reports a message the node did not apply. The reason never quotes the payload: it may
// hold a secret.
func (d *Downlink) refuse(topic string, t protocol.Topic, gen int64, err error) {
	reason := "Refused"
	if errors.Is(err, protocol.ErrTooLarge) {
		reason = "PayloadTooLarge"
	}
	d.o.Log.Warn("mqtt downlink: message refused", "topic", topic, "err", err)
	obj := event.Object{Kind: "Node", Name: d.o.Node}
	if t.Kind != "" {
		obj = event.Object{Kind: string(t.Kind), Namespace: t.Namespace, Name: t.Name}
		if gen > 0 {
			key := protocol.ObjectKey(t.Kind, t.Namespace, t.Name)
			d.refused[key] = protocol.Refusal{Generation: gen, Reason: err.Error()}
			defer d.ack()
		}
	}
	d.o.Events.Emit(event.Event{
		Time: d.o.Now(), Type: event.Warning, Reason: reason, Object: obj,
		Message: fmt.Sprintf("%s: %v", topic, err), Source: "mqtt " + topic,
	})
}
