package ctlclient

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
	v1 "k8s.io/api/core/v1"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// ErrNotFound is wrapped when the object to delete or read is not there.
var ErrNotFound = errors.New("not found")

// ErrLostRace is wrapped when a write kept losing to other writers of the same node.
var ErrLostRace = errors.New("lost to a concurrent writer")

// maxCounter bounds the generation counter a writer goes on from: far above any real node's (a
// write a second for 10^9 years), far below where adding to it could overflow.
const maxCounter = 1 << 62

// writeAttempts bounds how often a write is redone after another writer's index crossed it.
const writeAttempts = 6

// Index reads a node's retained index. A node without one has revision 0 and no objects.
func (c *Client) Index(ctx context.Context, node string) (*protocol.Index, error) {
	if err := protocol.ValidateNodeName(node); err != nil {
		return nil, err
	}
	topic := c.topics.Index(node)
	got, err := c.Snapshot(ctx, topic)
	if err != nil {
		return nil, err
	}
	return c.decodeIndex(node, got[topic])
}

// decodeIndex decodes the retained index payload of node (nil: no index yet).
func (c *Client) decodeIndex(node string, payload []byte) (*protocol.Index, error) {
	if payload == nil {
		return &protocol.Index{APIVersion: protocol.APIVersion, Node: node, Objects: map[string]protocol.IndexEntry{}}, nil
	}
	idx, err := protocol.DecodeIndex(protocol.Topic{Class: protocol.ClassIndex, Node: node}, payload, protocol.DefaultMaxPayload)
	if err != nil {
		// Writing over an index this client cannot read could lose other writers' objects:
		// refuse, and say which topic to look at.
		return nil, fmt.Errorf("retained index of node %s (%s): %w", node, c.topics.Index(node), err)
	}
	return idx, nil
}

// Applied is one object of an apply.
type Applied struct {
	Kind      protocol.ObjectKind
	Namespace string
	Name      string
	// Created is true when the node's index did not list the object before.
	Created bool
	// Unchanged is true when the node's index already lists this very object: nothing was written
	// for it, and its generation stays.
	Unchanged bool
	// Generation is the object's generation after the apply.
	Generation int64
}

// Key is the object's protocol.ObjectKey.
func (a Applied) Key() string { return protocol.ObjectKey(a.Kind, a.Namespace, a.Name) }

// ApplyResult says what an apply wrote.
type ApplyResult struct {
	// Generation is the index's revision after the apply (unchanged when nothing was written).
	Generation int64
	Objects    []Applied
	// Warnings are things the user should know (a node never seen, an index rebuilt from what
	// the node reports).
	Warnings []string
}

// Apply publishes objects (*v1.Pod, *v1.ConfigMap, *v1.Secret) as part of node's desired state;
// objects of the node not named keep what they are. See write for how it cannot lose other objects.
func (c *Client) Apply(ctx context.Context, node string, objects []any) (*ApplyResult, error) {
	what := "apply to node " + node
	if err := protocol.ValidateNodeName(node); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if len(objects) == 0 {
		return nil, fmt.Errorf("%s: no objects", what)
	}
	var puts []*protocol.Desired
	seen := map[string]bool{}
	var sealTo *ecdh.PublicKey
	for _, obj := range objects {
		var sealed *protocol.Sealed
		if s, ok := obj.(*v1.Secret); ok {
			// A Secret's data goes sealed to the node's key: the broker never holds it in clear.
			if sealTo == nil {
				var err error
				if sealTo, err = c.sealingKey(ctx, node); err != nil {
					return nil, fmt.Errorf("%s: secret %s/%s: %w", what, s.Namespace, s.Name, err)
				}
			}
			bare, sd, err := sealing.Seal(sealTo, node, s)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
			obj, sealed = bare, sd
		}
		d, err := protocol.NewDesired(node, 0, obj)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		d.Sealed = sealed
		if seen[d.Key()] {
			return nil, fmt.Errorf("%s: %s is given twice", what, d.Key())
		}
		seen[d.Key()] = true
		puts = append(puts, d)
	}
	res, err := c.write(ctx, node, puts, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if sealTo != nil && c.o.NodeTrust == nil {
		res.Warnings = append(res.Warnings, fmt.Sprintf("node %s's sealing key %s was taken as the broker handed it over: without the fleet's CA (node CA) nothing shows it is the node's own", node, sealing.KeyID(sealTo)))
	}
	return res, nil
}

// sealingKey reads the key a node publishes in its status for Secrets to be sealed to. With
// NodeTrust it must be vouched for by the node's certificate; without, it is taken as the broker
// hands it over, and a broker operator who replaced it before a Secret was sealed could read that
// Secret (docs/security.md); the signed index still keeps them from changing what the node runs.
func (c *Client) sealingKey(ctx context.Context, node string) (*ecdh.PublicKey, error) {
	return c.nodeKey(ctx, node, "secrets are only sent sealed")
}

// nodeKey is sealingKey with why it is needed (said in its errors).
func (c *Client) nodeKey(ctx context.Context, node, why string) (*ecdh.PublicKey, error) {
	n, skipped, err := c.Node(ctx, node)
	switch {
	case err != nil && !errors.Is(err, ErrNotFound):
		return nil, fmt.Errorf("read the node's sealing key: %w", err)
	case err != nil || n.Status == nil:
		skippedWhy := ""
		if len(skipped) > 0 {
			skippedWhy = fmt.Sprintf(" (its status cannot be read: %v)", skipped[0])
		}
		return nil, fmt.Errorf("node %s has not reported its status to this broker%s, so its sealing key is unknown: %s (start the node first)", node, skippedWhy, why)
	}
	var pub *ecdh.PublicKey
	if c.o.NodeTrust != nil {
		pub, err = c.o.NodeTrust.Attested(n.Status.Object, time.Now())
	} else {
		pub, err = sealing.NodePublic(n.Status.Object)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, why)
	}
	return pub, nil
}

// Delete deletes one desired object of node: the index without it (a new revision), then the
// object's retained topic cleared. It returns the revision that deleted it, or an error wrapping
// ErrNotFound when the node's index does not list the object.
func (c *Client) Delete(ctx context.Context, node string, kind protocol.ObjectKind, namespace, name string) (int64, error) {
	what := fmt.Sprintf("delete %s %s/%s on node %s", kind, namespace, name, node)
	if err := protocol.ValidateNodeName(node); err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if _, err := protocol.KindFromPlural(kind.Plural()); err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if err := protocol.ValidateObjectName(kind, namespace, name); err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	res, err := c.write(ctx, node, nil, []string{protocol.ObjectKey(kind, namespace, name)})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return res.Generation, nil
}

// indexWatch follows a node's retained index (and acks, and the desired topics a write touches)
// for the duration of one write: every index publish the broker routes, in its order, so a writer
// sees whether another writer's index came before or after its own.
type indexWatch struct {
	c     *Client
	node  string
	index string // the index topic

	mu      sync.Mutex
	indexes [][]byte          // index payloads in arrival order, the retained one first
	latest  map[string][]byte // latest payload of every other watched topic
	nonce   string
	arrived chan struct{}
}

// watch subscribes to node's index, acks and the desired topics of keys, and waits until the
// retained messages are in (the marker technique of Snapshot). The caller must hold snapMu and
// call the returned stop.
func (c *Client) watch(ctx context.Context, node string, keys []string) (*indexWatch, func(), error) {
	w := &indexWatch{c: c, node: node, index: c.topics.Index(node), latest: map[string][]byte{}}
	handle := func(_ mqtt.Client, m mqtt.Message) {
		w.mu.Lock()
		defer w.mu.Unlock()
		switch {
		case m.Topic() == c.marker:
			if w.arrived != nil && string(m.Payload()) == w.nonce {
				close(w.arrived)
				w.arrived = nil
			}
		case m.Topic() == w.index:
			w.indexes = append(w.indexes, m.Payload())
		default:
			w.latest[m.Topic()] = m.Payload()
		}
	}
	filters := map[string]byte{w.index: qos, c.topics.Acks(node): qos}
	for _, k := range keys {
		kind, ns, name, err := protocol.ParseObjectKey(k)
		if err != nil {
			return nil, nil, err
		}
		filters[c.topics.Desired(node, kind, ns, name)] = qos
	}
	stop := func() {
		all := append(slices.Collect(maps.Keys(filters)), c.marker)
		c.wait(context.WithoutCancel(ctx), c.mc.Unsubscribe(all...), "unsubscribe")
	}
	if err := c.wait(ctx, c.mc.SubscribeMultiple(filters, handle), "watch node "+node+": subscribe"); err != nil {
		stop()
		return nil, nil, err
	}
	if err := c.wait(ctx, c.mc.Subscribe(c.marker, qos, handle), "watch node "+node+": subscribe to the marker topic"); err != nil {
		stop()
		return nil, nil, err
	}
	if err := w.sync(ctx); err != nil {
		stop()
		return nil, nil, err
	}
	return w, stop, nil
}

// sync returns once everything the broker routed to this client before now has arrived.
func (w *indexWatch) sync(ctx context.Context) error {
	c := w.c
	c.mu.Lock()
	c.markerN++
	nonce := fmt.Sprintf("%d-%s", c.markerN, randomHex(4))
	c.mu.Unlock()
	arrived := make(chan struct{})
	w.mu.Lock()
	w.nonce, w.arrived = nonce, arrived
	w.mu.Unlock()
	if err := c.publish(ctx, c.marker, []byte(nonce), false); err != nil {
		return err
	}
	tctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	defer cancel()
	select {
	case <-arrived:
		return nil
	case <-c.lost:
		return c.lostErr
	case <-tctx.Done():
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("the marker message on %s did not come back within %s (may this client read and write %s?)", c.marker, c.o.Timeout, c.marker)
	}
}

// awaitChange waits until topic's latest payload is no longer old, for at most d; false when it
// did not change.
func (w *indexWatch) awaitChange(ctx context.Context, topic string, old []byte, d time.Duration) bool {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		if _, now := w.seen(topic); !bytes.Equal(now, old) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			return false
		case <-tick.C:
		}
	}
}

// seen returns the index payloads received so far and the latest payload of topic.
func (w *indexWatch) seen(topic string) ([][]byte, []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.indexes), w.latest[topic]
}

// write changes node's desired set: puts (generation filled in here) and drops (keys to delete).
//
// Generations come from the node's counter: above the revision of the broker's index and every
// generation or revision the node's acks mention. The base the change is made on is the broker's
// index, unless the node's acks show the node in force under a newer or different index (the
// broker lost its retained state, or two writers crossed): then the base is rebuilt from what the
// node reports (its acks list every entry of its index with generation and digest), so a writer
// never publishes an index built from less than the whole desired set. Objects go first, then the
// index. The writer follows the index topic throughout: if another writer's index came before its
// own (it may have been overwritten with one that lacks this writer's objects, or vice versa), or
// the index in force at the end does not list this writer's objects as written, the write is done
// again on top of what the other wrote, at most writeAttempts times; otherwise it failed loudly.
func (c *Client) write(ctx context.Context, node string, puts []*protocol.Desired, drops []string) (*ApplyResult, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.snapMu.Lock() // the watch uses the marker topic, as snapshots do
	defer c.snapMu.Unlock()

	keys := slices.Clone(drops)
	for _, d := range puts {
		keys = append(keys, d.Key())
	}
	w, stop, err := c.watch(ctx, node, keys)
	if err != nil {
		return nil, err
	}
	defer stop()

	from := 0               // index payloads before this position are judged already
	var floor int64         // every generation this write draws is above it
	var baseOverride []byte // another writer's index to build on, after a crossing
	// fixed keeps each object's payload from the first attempt that wrote it: another writer's
	// index may already list that payload's digest (it built on this write's index), so a redo
	// must not replace it with one at a new generation; only the index's revision moves on.
	fixed := map[string]pendingPublish{}
	// A connected node publishes complete acks right after it finds the broker without its
	// index: a write that needs them waits for them up to the client's timeout.
	var completeBy time.Time
	for attempt := 1; ; attempt++ {
		indexes, acksPayload := w.seen(c.topics.Acks(node))
		basePayload := baseOverride
		if basePayload == nil && len(indexes) > 0 {
			basePayload = indexes[len(indexes)-1]
		}
		base, warnings, err := c.base(node, basePayload, acksPayload, baseOverride != nil, indexes, puts, drops)
		if errors.Is(err, errAcksIncomplete) {
			if completeBy.IsZero() {
				completeBy = time.Now().Add(c.o.Timeout)
			}
			if w.awaitChange(ctx, c.topics.Acks(node), acksPayload, time.Until(completeBy)) {
				attempt--
				continue
			}
		}
		if err != nil {
			return nil, err
		}
		top := max(base.counter, floor)
		for _, p := range indexes {
			top = max(top, c.countedRevision(node, p))
		}
		if top >= maxCounter {
			return nil, fmt.Errorf("node %s: the generation counter is at %d, past what a writer goes on from (forged acks or index on the broker?); check %s and %s",
				node, top, c.topics.Index(node), c.topics.Acks(node))
		}
		gen := top + 1
		plan, err := c.planWrite(node, base, gen, puts, drops, w, fixed)
		if err != nil {
			return nil, err
		}
		plan.result.Warnings = warnings
		if plan.index == nil {
			return plan.result, nil // nothing changes
		}
		from = len(indexes)
		if err := c.publishPlan(ctx, node, plan); err != nil {
			return nil, err
		}
		if err := w.sync(ctx); err != nil {
			return nil, fmt.Errorf("read the index back: %w", err)
		}
		after, _ := w.seen("")
		verdict, other := judge(after[from:], plan.payload, plan.index, puts, drops)
		if verdict == "" {
			if err := c.verifyObjects(ctx, w, node, plan); err == nil {
				final := after[len(after)-1]
				for _, key := range drops {
					// Another writer may have applied the key again since: its payload stays.
					var x protocol.Index
					if json.Unmarshal(final, &x) == nil {
						if _, again := x.Objects[key]; again {
							continue
						}
					}
					c.clearTopic(ctx, node, key)
				}
				return plan.result, nil
			} else {
				verdict = err.Error()
			}
		}
		if attempt == writeAttempts {
			return nil, fmt.Errorf("%w: %s after %d attempts; nothing is lost on the node (a node deletes only what an index it accepts leaves out), but check `mqlet ctl get` and apply again", ErrLostRace, verdict, attempt)
		}
		floor = gen
		if other != nil {
			baseOverride = other
		}
		// Two writers redoing their writes in lockstep would cross again: a short random pause.
		select {
		case <-time.After(time.Duration(20+rand.IntN(80)) * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// writeBase is what a write builds on.
type writeBase struct {
	entries  map[string]protocol.IndexEntry
	counter  int64 // the highest revision or generation known for the node
	existing bool  // the node or the broker knows a desired set
}

// base picks the entries a write builds on; see write.
//
// crossing is set when indexPayload is another writer's index seen during this write (a redo):
// that writer is redoing too, and its index, not the node's, is what both writes build on. seen
// are the index payloads the write watched go by: compact acks name the node's index by digest,
// and one of them may be it.
func (c *Client) base(node string, indexPayload, acksPayload []byte, crossing bool, seen [][]byte, puts []*protocol.Desired, drops []string) (*writeBase, []string, error) {
	var warnings []string
	b := &writeBase{entries: map[string]protocol.IndexEntry{}}
	var idx *protocol.Index
	if indexPayload != nil {
		var err error
		if idx, err = c.decodeIndex(node, indexPayload); err != nil {
			return nil, nil, err
		}
		if c.o.SigningKey != nil {
			if err := protocol.VerifyIndex(idx, c.trust()); err != nil {
				// Signing vouches for every entry: an index the broker (or anyone who can
				// publish there) made up must not be carried into a signed one, nor its
				// revision (see countedRevision).
				warnings = append(warnings, fmt.Sprintf("the broker's index of node %s is not built on: %v", node, err))
				idx = nil
			}
		}
		if idx != nil {
			b.counter = idx.Revision
			b.entries, b.existing = maps.Clone(idx.Objects), true
		}
	}
	var acks *protocol.Acks
	if acksPayload != nil {
		a, err := protocol.DecodeAcks(acksPayload, protocol.DefaultMaxPayload)
		switch {
		case err != nil:
			warnings = append(warnings, fmt.Sprintf("the node's acks (%s) cannot be read: %v", c.topics.Acks(node), err))
		case a.Node != node:
			warnings = append(warnings, fmt.Sprintf("the acks on %s are for node %q", c.topics.Acks(node), a.Node))
		default:
			acks = a
		}
	}
	if acks == nil {
		if idx == nil {
			warnings = append(warnings, fmt.Sprintf("node %s has never reported to this broker (no acks, no index): its desired set starts here", node))
		}
		return b, warnings, nil
	}
	if c.o.SigningKey == nil {
		// A signing writer goes on only from revisions signed by a key it trusts (the index it
		// rebuilds from, below): the acks are relayed unsigned, and a counter forged in them
		// would carry an old signed set past the node's revision (a rollback the node takes,
		// since it is newly signed) or push the node to the counter's ceiling, where no writer
		// can follow (a freeze). A node refuses a revision at or below its own, so a writer
		// that went on from too low a counter is refused and reported, never obeyed.
		b.counter = max(b.counter, acks.Top())
	}
	rebuild := false
	switch {
	case idx == nil && (len(acks.Applied)+len(acks.Refused)+len(acks.Missing) > 0 || acks.IndexRevision > 0):
		rebuild = true
		warnings = append(warnings, fmt.Sprintf("the broker holds no index for node %s, but the node reports %d objects under revision %d: the broker lost its retained state; the index is rebuilt from what the node reports",
			node, reported(acks), acks.IndexRevision))
	case idx != nil && acks.IndexRevision > idx.Revision:
		rebuild = true
		warnings = append(warnings, fmt.Sprintf("the broker's index of node %s (revision %d) is older than the one the node runs (revision %d): the index is rebuilt from what the node reports",
			node, idx.Revision, acks.IndexRevision))
	case idx != nil && !crossing && acks.IndexRevision == idx.Revision && acks.IndexDigest != "" && acks.IndexDigest != protocol.Digest(indexPayload):
		// The node runs another index of this revision than the broker holds: the broker's was
		// refused (two writers crossed and one did not finish its redo, or the broker came back
		// from an older save). What the node runs is what is in force; building on the broker's
		// could bring back what the node's index deleted.
		rebuild = true
		warnings = append(warnings, fmt.Sprintf("node %s runs another index of revision %d than the broker holds (two writers crossed, or the broker was restored from an older save): the index is rebuilt from what the node reports",
			node, idx.Revision))
	}
	if !rebuild {
		return b, warnings, nil
	}
	b.entries = map[string]protocol.IndexEntry{}
	b.existing = true
	if acks.Compact {
		// Compact acks name the node's index by digest, and every outcome they stand for is an
		// entry of it: that index, if this write saw it go by, is the node's whole set.
		x, err := c.namedIndex(node, acks, seen)
		if err != nil {
			return nil, nil, err
		}
		maps.Copy(b.entries, x.Objects)
		b.counter = max(b.counter, x.Revision)
		return b, warnings, nil
	}
	if c.o.SigningKey != nil {
		// Signing vouches for every entry. Entries relayed by the broker could be forged, so
		// only the index the node reports, signed by this writer's key, is built on.
		x, err := c.verifiedAcksIndex(node, acks)
		if err != nil {
			return nil, nil, err
		}
		b.counter = max(b.counter, x.Revision)
		for k, e := range x.Objects {
			if old, ok := b.entries[k]; !ok || e.Generation > old.Generation {
				b.entries[k] = e
			}
		}
		return b, warnings, nil
	}
	take := func(k string, e protocol.IndexEntry) {
		if old, ok := b.entries[k]; !ok || e.Generation > old.Generation {
			b.entries[k] = e
		}
	}
	for k, e := range acks.Applied {
		take(k, e)
	}
	for k, r := range acks.Refused {
		take(k, protocol.IndexEntry{Generation: r.Generation, Digest: r.Digest})
	}
	for k, e := range acks.Missing {
		take(k, e)
	}
	covered := map[string]bool{}
	for _, d := range puts {
		covered[d.Key()] = true
	}
	for _, k := range drops {
		covered[k] = true
	}
	var unknown []string
	for k, e := range b.entries {
		if e.Digest == "" && !covered[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return nil, nil, fmt.Errorf("node %s runs %s without a digest this client could list (written by a protocol v1 control plane, or stored before its outcome): "+
			"the index cannot be rebuilt without them; apply (or delete) them in this same command", node, strings.Join(unknown, ", "))
	}
	return b, warnings, nil
}

// errAcksIncomplete: a write must rebuild the node's index from its acks, and they are compact.
var errAcksIncomplete = errors.New("the broker does not hold the index the node runs, and the node's acks do not list its entries yet")

// reported is how many entries acks give an outcome for (complete acks: all of them).
func reported(a *protocol.Acks) int {
	return len(a.Applied) + len(a.Refused) + len(a.Missing)
}

// namedIndex finds, among index payloads seen, the one compact acks name, checked as the node
// checked it (signed by a trusted key when this client signs). errAcksIncomplete when none is.
func (c *Client) namedIndex(node string, acks *protocol.Acks, seen [][]byte) (*protocol.Index, error) {
	for _, p := range slices.Backward(seen) {
		if protocol.Digest(p) != acks.IndexDigest {
			continue
		}
		x, err := protocol.DecodeIndex(protocol.Topic{Class: protocol.ClassIndex, Node: node}, p, protocol.DefaultMaxPayload)
		if err == nil && x.Revision != acks.IndexRevision {
			err = fmt.Errorf("it is revision %d, the acks say %d", x.Revision, acks.IndexRevision)
		}
		if err == nil && c.o.SigningKey != nil {
			err = protocol.VerifyIndex(x, c.trust())
		}
		if err != nil {
			return nil, fmt.Errorf("node %s: the index its acks name cannot be built on: %w", node, err)
		}
		return x, nil
	}
	return nil, fmt.Errorf("node %s: %w (revision %d): wait for the node to connect and report them, then apply again",
		node, errAcksIncomplete, acks.IndexRevision)
}

// trust are the keys whose signed indexes this client builds on: its own and Options.TrustedKeys
// (a previous signing key during a rotation).
func (c *Client) trust() []ed25519.PublicKey {
	return append([]ed25519.PublicKey{c.o.SigningKey.Public().(ed25519.PublicKey)}, c.o.TrustedKeys...)
}

// verifiedAcksIndex is the index a node reports in its acks, checked: signed by this client's key,
// for this node, and the one the acks' digest names.
func (c *Client) verifiedAcksIndex(node string, acks *protocol.Acks) (*protocol.Index, error) {
	what := fmt.Sprintf("node %s: the broker's index cannot be built on and the node's own", node)
	if len(acks.Index) == 0 {
		return nil, fmt.Errorf("%s is not in its acks (its index is unsigned, or it runs none): re-apply its whole desired set with the signing key, or fix the broker", what)
	}
	if protocol.Digest(acks.Index) != acks.IndexDigest {
		return nil, fmt.Errorf("%s does not match the digest the acks give", what)
	}
	x, err := protocol.DecodeIndex(protocol.Topic{Class: protocol.ClassIndex, Node: node}, acks.Index, protocol.DefaultMaxPayload)
	if err == nil {
		err = protocol.VerifyIndex(x, c.trust())
	}
	if err == nil && x.Revision != acks.IndexRevision {
		// An old signed index passed off as the node's current one would roll its desired set back.
		err = fmt.Errorf("it is revision %d, the acks say %d", x.Revision, acks.IndexRevision)
	}
	if err != nil {
		return nil, fmt.Errorf("%s cannot be verified with this client's key: %w", what, err)
	}
	return x, nil
}

// writePlan is one attempt of a write.
type writePlan struct {
	objects []pendingPublish // desired messages to publish, in order
	index   *protocol.Index  // nil: nothing changes
	payload []byte           // the index's
	result  *ApplyResult
}

type pendingPublish struct {
	key, topic string
	payload    []byte
	entry      protocol.IndexEntry
}

// planWrite makes the messages of one attempt. An object whose retained message is listed by the
// base with the same content is unchanged: not written again, its generation kept.
func (c *Client) planWrite(node string, b *writeBase, gen int64, puts []*protocol.Desired, drops []string, w *indexWatch, fixed map[string]pendingPublish) (*writePlan, error) {
	next := &protocol.Index{APIVersion: protocol.APIVersion, Node: node, Revision: gen, Objects: maps.Clone(b.entries)}
	p := &writePlan{result: &ApplyResult{Generation: gen}}
	changed := false
	for _, d := range puts {
		key := d.Key()
		topic := c.topics.Desired(node, d.Kind, d.Namespace, d.Name)
		old, listed := b.entries[key]
		a := Applied{Kind: d.Kind, Namespace: d.Namespace, Name: d.Name, Created: !listed}
		if f, ok := fixed[key]; ok {
			// A redo: the same payload as before.
			p.objects = append(p.objects, f)
			next.Objects[key] = f.entry
			a.Generation = f.entry.Generation
			p.result.Objects = append(p.result.Objects, a)
			changed = true
			continue
		}
		if _, retained := w.seen(topic); listed && sameObject(retained, old, d) {
			a.Unchanged, a.Generation = true, old.Generation
			p.result.Objects = append(p.result.Objects, a)
			continue
		}
		m := *d
		m.Generation = gen
		payload, err := protocol.Encode(&m)
		if err != nil {
			return nil, err
		}
		// The node refuses what is over its payload limit; better to say so here than to leave
		// a retained message every node ignores.
		if len(payload) > protocol.DefaultMaxPayload {
			return nil, fmt.Errorf("%s: the desired message is %d bytes, more than the %d a node accepts", key, len(payload), protocol.DefaultMaxPayload)
		}
		f := pendingPublish{key: key, topic: topic, payload: payload, entry: protocol.IndexEntry{Generation: gen, Digest: protocol.Digest(payload)}}
		fixed[key] = f
		p.objects = append(p.objects, f)
		next.Objects[key] = f.entry
		a.Generation = gen
		p.result.Objects = append(p.result.Objects, a)
		changed = true
	}
	for _, key := range drops {
		if _, listed := next.Objects[key]; !listed {
			return nil, ErrNotFound
		}
		delete(next.Objects, key)
		changed = true
	}
	if !changed {
		p.result.Generation = b.counter
		return p, nil
	}
	if c.o.SigningKey != nil {
		protocol.SignIndex(next, c.o.SigningKey)
	}
	payload, err := protocol.Encode(next)
	if err != nil {
		return nil, err
	}
	if len(payload) > protocol.DefaultMaxPayload {
		return nil, fmt.Errorf("the index would be %d bytes, more than the %d a node accepts", len(payload), protocol.DefaultMaxPayload)
	}
	p.index, p.payload = next, payload
	return p, nil
}

// sameObject says whether the retained payload is the listed entry and carries the same object.
func sameObject(retained []byte, e protocol.IndexEntry, d *protocol.Desired) bool {
	if retained == nil || protocol.Digest(retained) != e.Digest {
		return false
	}
	var r protocol.Desired
	if json.Unmarshal(retained, &r) != nil {
		return false
	}
	return r.Kind == d.Kind && r.Namespace == d.Namespace && r.Name == d.Name && bytes.Equal(r.Object, d.Object)
}

// publishPlan sends the objects (all before any PUBACK is awaited; the broker keeps one
// connection's order), and only when all are acknowledged, the index.
func (c *Client) publishPlan(ctx context.Context, node string, p *writePlan) error {
	toks := make([]func() error, len(p.objects))
	for i, o := range p.objects {
		tok := c.mc.Publish(o.topic, qos, true, o.payload)
		toks[i] = func() error { return c.wait(ctx, tok, "publish "+o.topic) }
	}
	for _, wait := range toks {
		if err := wait(); err != nil {
			return err
		}
	}
	return c.publish(ctx, c.topics.Index(node), p.payload, true)
}

// judge looks at the index payloads the broker routed since the write began (in its order). It
// returns "" when the write stands: its own index came with no other before it, and the index in
// force now lists the write's objects as written. Otherwise it says why, with the other writer's
// index to build on next.
func judge(seq [][]byte, own []byte, idx *protocol.Index, puts []*protocol.Desired, drops []string) (string, []byte) {
	ownAt := -1
	for i, p := range seq {
		if bytes.Equal(p, own) {
			ownAt = i
		}
	}
	if ownAt < 0 {
		return "this write's index did not come back (may this client write the node's index?)", lastOther(seq, own)
	}
	for _, p := range seq[:ownAt] {
		if !bytes.Equal(p, own) {
			return "another writer's index came just before this one's", p
		}
	}
	final := seq[len(seq)-1]
	if bytes.Equal(final, own) {
		return "", nil
	}
	var x protocol.Index
	if json.Unmarshal(final, &x) != nil {
		return "another writer published an unreadable index over this one's", final
	}
	for _, d := range puts {
		if e, ok := idx.Objects[d.Key()]; ok && x.Objects[d.Key()] != e {
			return "another writer's index replaced this one's without " + d.Key(), final
		}
	}
	for _, k := range drops {
		if _, ok := x.Objects[k]; ok {
			return "another writer's index replaced this one's and still lists " + k, final
		}
	}
	return "", nil
}

func lastOther(seq [][]byte, own []byte) []byte {
	for i := len(seq) - 1; i >= 0; i-- {
		if !bytes.Equal(seq[i], own) {
			return seq[i]
		}
	}
	return nil
}

// verifyObjects checks that the broker still holds this write's objects: another writer may have
// published the same key over them.
func (c *Client) verifyObjects(ctx context.Context, w *indexWatch, node string, p *writePlan) error {
	for _, o := range p.objects {
		if _, got := w.seen(o.topic); !bytes.Equal(got, o.payload) {
			return fmt.Errorf("another writer replaced %s", o.key)
		}
	}
	return nil
}

// clearTopic removes a deleted object's retained message, so the broker no longer keeps its
// content (a secret's included). The index already deleted it: a failure leaves only a stale
// retained message that no node applies.
func (c *Client) clearTopic(ctx context.Context, node, key string) {
	kind, ns, name, err := protocol.ParseObjectKey(key)
	if err != nil {
		return
	}
	c.publish(ctx, c.topics.Desired(node, kind, ns, name), nil, true)
}

// countedRevision is the revision an index payload seen on the node's index topic raises the
// counter to: any readable one for a writer that does not sign; for one that signs, only an index
// for this node signed by a key it trusts (see base).
func (c *Client) countedRevision(node string, payload []byte) int64 {
	if c.o.SigningKey == nil {
		return peekRevision(payload)
	}
	x, err := protocol.DecodeIndex(protocol.Topic{Class: protocol.ClassIndex, Node: node}, payload, protocol.DefaultMaxPayload)
	if err != nil || protocol.VerifyIndex(x, c.trust()) != nil {
		return 0
	}
	return x.Revision
}

// peekRevision reads an index payload's revision (0 when unreadable).
func peekRevision(payload []byte) int64 {
	var r struct {
		Revision int64 `json:"revision"`
	}
	if json.Unmarshal(payload, &r) != nil {
		return 0
	}
	return r.Revision
}
