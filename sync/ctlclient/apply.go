package ctlclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	"github.com/mqlet/mqlet/sync/protocol"
)

// ErrNotFound is wrapped when the object to delete or read is not there.
var ErrNotFound = errors.New("not found")

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
		return &protocol.Index{APIVersion: protocol.APIVersion, Node: node, Objects: map[string]int64{}}, nil
	}
	idx, err := protocol.DecodeIndex(protocol.Topic{Class: protocol.ClassIndex, Node: node}, payload, protocol.DefaultMaxPayload)
	if err != nil {
		// Writing over an index this client cannot read could lose the generations of other
		// writers' objects: refuse, and say which topic to look at.
		return nil, fmt.Errorf("retained index of node %s (%s): %w", node, c.topics.Index(node), err)
	}
	if idx.Objects == nil {
		idx.Objects = map[string]int64{}
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
}

// Key is the object's protocol.ObjectKey.
func (a Applied) Key() string { return protocol.ObjectKey(a.Kind, a.Namespace, a.Name) }

// ApplyResult says what an apply wrote.
type ApplyResult struct {
	// Generation is the generation every object of the apply got, and the index's new revision.
	Generation int64
	Objects    []Applied
}

// Apply publishes objects (*v1.Pod, *v1.ConfigMap, *v1.Secret) as node's desired state.
//
// Generations come from the node's counter, whose current value is the retained index's revision
// R (raised to the highest generation in the node's acks, see counter): every object gets R+1,
// each is published retained, and only then the index with revision R+1 listing them, so a node that sees the new index never lacks an object it lists. The index is then
// read back: a PUBACK only says the broker received the message, and a broker whose ACL denies the
// publish acknowledges it all the same.
//
// Two control planes applying to one node at the same moment can both draw R+1; the later index
// wins, and the objects only the other index listed drop out of the desired set. One client
// serializes its own writes; across processes, use one writer per node.
func (c *Client) Apply(ctx context.Context, node string, objects []any) (*ApplyResult, error) {
	what := "apply to node " + node
	if err := protocol.ValidateNodeName(node); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if len(objects) == 0 {
		return nil, fmt.Errorf("%s: no objects", what)
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	idx, gen, _, err := c.counter(ctx, node)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	res := &ApplyResult{Generation: gen}
	var msgs []*protocol.Desired
	seen := map[string]bool{}
	for _, obj := range objects {
		d, err := protocol.NewDesired(node, gen, obj)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if seen[d.Key()] {
			return nil, fmt.Errorf("%s: %s is given twice", what, d.Key())
		}
		seen[d.Key()] = true
		_, listed := idx.Objects[d.Key()]
		res.Objects = append(res.Objects, Applied{Kind: d.Kind, Namespace: d.Namespace, Name: d.Name, Created: !listed})
		msgs = append(msgs, d)
	}
	if err := c.commit(ctx, idx, gen, msgs); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return res, nil
}

// Delete deletes one desired object of node: a tombstone at the next generation, then the index
// without the object. It returns the tombstone's generation, or an error wrapping ErrNotFound when
// neither the index nor the object's retained topic holds the object.
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
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	objTopic := c.topics.Desired(node, kind, namespace, name)
	idx, gen, got, err := c.counter(ctx, node, objTopic)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	key := protocol.ObjectKey(kind, namespace, name)
	if _, listed := idx.Objects[key]; !listed && !liveDesired(got[objTopic]) {
		return 0, fmt.Errorf("%s: %w", what, ErrNotFound)
	}
	tomb := protocol.NewTombstone(node, kind, namespace, name, gen)
	if err := c.commit(ctx, idx, gen, []*protocol.Desired{tomb}); err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return gen, nil
}

// liveDesired says whether a retained desired payload holds an object rather than a tombstone. An
// undecodable payload counts as live: deleting it is how a user gets rid of it.
func liveDesired(payload []byte) bool {
	if payload == nil {
		return false
	}
	var d struct {
		Deleted bool `json:"deleted"`
	}
	return json.Unmarshal(payload, &d) != nil || !d.Deleted
}

// counter reads node's index (with the extra topics, returned by topic) and picks the next
// generation: above the index's revision, and above every generation the node's acks show. The
// acks matter when the broker lost the retained index (no persistence, a power cut between saves):
// counting again from a lower revision would produce generations the node refuses as stale. An
// unreadable acks message is the node's problem and does not stop the write.
func (c *Client) counter(ctx context.Context, node string, extra ...string) (*protocol.Index, int64, map[string][]byte, error) {
	indexTopic, acksTopic := c.topics.Index(node), c.topics.Acks(node)
	got, err := c.Snapshot(ctx, append([]string{indexTopic, acksTopic}, extra...)...)
	if err != nil {
		return nil, 0, nil, err
	}
	idx, err := c.decodeIndex(node, got[indexTopic])
	if err != nil {
		return nil, 0, nil, err
	}
	top := idx.Revision
	if payload := got[acksTopic]; payload != nil {
		if a, err := protocol.DecodeAcks(payload, protocol.DefaultMaxPayload); err == nil && a.Node == node {
			top = max(top, a.IndexRevision)
			for _, g := range a.Applied {
				top = max(top, g)
			}
			for _, g := range a.Deleted {
				top = max(top, g)
			}
			for _, r := range a.Refused {
				top = max(top, r.Generation)
			}
		}
	}
	return idx, top + 1, got, nil
}

// commit publishes msgs (all of generation gen, above idx.Revision) and then the index updated
// with them at revision gen, and reads the index back as the receipt.
func (c *Client) commit(ctx context.Context, idx *protocol.Index, gen int64, msgs []*protocol.Desired) error {
	next := &protocol.Index{APIVersion: protocol.APIVersion, Node: idx.Node, Revision: gen, Objects: maps.Clone(idx.Objects)}
	type pending struct {
		topic   string
		payload []byte
	}
	var out []pending
	for _, d := range msgs {
		if d.Generation != gen {
			return fmt.Errorf("internal: %s has generation %d, the apply %d", d.Key(), d.Generation, gen)
		}
		payload, err := protocol.Encode(d)
		if err != nil {
			return err
		}
		// The node refuses what is over its payload limit; better to say so here than to leave
		// a retained message every node ignores.
		if len(payload) > protocol.DefaultMaxPayload {
			return fmt.Errorf("%s: the desired message is %d bytes, more than the %d a node accepts", d.Key(), len(payload), protocol.DefaultMaxPayload)
		}
		out = append(out, pending{c.topics.Desired(d.Node, d.Kind, d.Namespace, d.Name), payload})
		if d.Deleted {
			delete(next.Objects, d.Key())
		} else {
			next.Objects[d.Key()] = gen
		}
	}
	payload, err := protocol.Encode(next)
	if err != nil {
		return err
	}
	if len(payload) > protocol.DefaultMaxPayload {
		return fmt.Errorf("the index would be %d bytes, more than the %d a node accepts", len(payload), protocol.DefaultMaxPayload)
	}
	// Every object is sent before any PUBACK is awaited (the broker keeps the order of one
	// connection), and the index only once all of them are acknowledged.
	toks := make([]func() error, len(out))
	for i, p := range out {
		tok := c.mc.Publish(p.topic, qos, true, p.payload)
		toks[i] = func() error { return c.wait(ctx, tok, "publish "+p.topic) }
	}
	for _, wait := range toks {
		if err := wait(); err != nil {
			return err
		}
	}
	indexTopic := c.topics.Index(idx.Node)
	if err := c.publish(ctx, indexTopic, payload, true); err != nil {
		return err
	}
	back, err := c.Index(ctx, idx.Node)
	if err != nil {
		return fmt.Errorf("read the index back: %w", err)
	}
	if back.Revision != gen {
		return fmt.Errorf("the broker's index of node %s has revision %d after this client wrote %d: "+
			"another control plane wrote it meanwhile, or the broker did not take the message (may this client write %s?)",
			idx.Node, back.Revision, gen, indexTopic)
	}
	return nil
}
