package ctlclient

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Liveness states of a node.
const (
	StateOnline  = "online"
	StateOffline = "offline"
	StateUnknown = "unknown" // no liveness message: the node never connected, or it was cleared
)

// Node is what the broker holds about one node.
type Node struct {
	Name string
	// State is StateOnline, StateOffline or StateUnknown, after the stale-offline rule: an offline
	// message (a Will delivered late) from a session older than one known to have been online is
	// ignored.
	State string
	// Session is the node's session the state comes from; 0 when unknown.
	Session int64
	// Since is when the state began by the node's clock (the liveness message's time); zero when
	// unknown, as for an online state inferred past a stale offline.
	Since time.Time
	// StaleOffline is true when the retained liveness was such a stale offline.
	StaleOffline bool
	Version      string

	Liveness *protocol.Liveness   // the retained liveness message; nil when none
	Status   *protocol.NodeStatus // the retained node status; nil when none
	Acks     *protocol.Acks       // the retained acks; nil when none
}

// NodeList is every node that has any retained uplink state.
type NodeList struct {
	Items []Node
	// Skipped are the retained messages that could not be read; the rest of the list stands.
	Skipped []error
}

// Nodes reads the liveness, node status and acks of every node.
//
// A fleet-wide read larger than the broker's queue for this client loses messages without a word
// (section 10 of docs/protocol.md), so it is checked as Pods is: the status summaries are read
// first (one small message per node), and a node with a summary publishes its liveness, node
// status and acks too. A node lacking any of them is read again alone, a read that fits.
func (c *Client) Nodes(ctx context.Context) (*NodeList, error) {
	got, err := c.snapshot(ctx, []string{c.topics.AllNodes(protocol.ClassSummary)},
		[]string{c.topics.AllNodes(protocol.ClassLiveness), c.topics.AllNodes(protocol.ClassNodeStatus), c.topics.AllNodes(protocol.ClassAcks)})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	var short []string
	for topic := range got {
		t, err := c.topics.Parse(topic)
		if err != nil || t.Class != protocol.ClassSummary {
			continue
		}
		delete(got, topic) // the summary only tells which nodes must be there
		for _, want := range []string{c.topics.Liveness(t.Node), c.topics.NodeStatus(t.Node), c.topics.Acks(t.Node)} {
			if _, ok := got[want]; !ok {
				short = append(short, t.Node)
				break
			}
		}
	}
	for _, node := range slices.Sorted(slices.Values(short)) {
		alone, err := c.Snapshot(ctx, c.topics.Liveness(node), c.topics.NodeStatus(node), c.topics.Acks(node))
		if err != nil {
			return nil, fmt.Errorf("list nodes: read node %s again: %w", node, err)
		}
		maps.Copy(got, alone)
	}
	return c.nodes(got), nil
}

// Node reads one node; the error wraps ErrNotFound when the broker holds nothing of it.
func (c *Client) Node(ctx context.Context, name string) (*Node, []error, error) {
	if err := protocol.ValidateNodeName(name); err != nil {
		return nil, nil, err
	}
	got, err := c.Snapshot(ctx, c.topics.Liveness(name), c.topics.NodeStatus(name), c.topics.Acks(name))
	if err != nil {
		return nil, nil, fmt.Errorf("read node %s: %w", name, err)
	}
	l := c.nodes(got)
	if len(l.Items) == 0 {
		if len(l.Skipped) > 0 {
			return nil, nil, fmt.Errorf("read node %s: %w", name, l.Skipped[0])
		}
		return nil, nil, fmt.Errorf("node %s: %w (no liveness, status or acks on the broker)", name, ErrNotFound)
	}
	return &l.Items[0], l.Skipped, nil
}

// nodes decodes a snapshot of liveness, node status and acks topics.
func (c *Client) nodes(got map[string][]byte) *NodeList {
	byName := map[string]*Node{}
	out := &NodeList{}
	get := func(name string) *Node {
		n := byName[name]
		if n == nil {
			n = &Node{Name: name}
			byName[name] = n
		}
		return n
	}
	for _, topic := range slices.Sorted(maps.Keys(got)) {
		payload := got[topic]
		t, err := c.topics.Parse(topic)
		if err != nil {
			out.Skipped = append(out.Skipped, err)
			continue
		}
		bad := func(err error) { out.Skipped = append(out.Skipped, fmt.Errorf("%s: %w", topic, err)) }
		switch t.Class {
		case protocol.ClassLiveness:
			l, err := protocol.DecodeLiveness(payload, protocol.DefaultMaxPayload)
			if err != nil {
				bad(err)
				continue
			}
			if l.Node != t.Node {
				bad(fmt.Errorf("payload is for node %q", l.Node))
				continue
			}
			get(t.Node).Liveness = l
		case protocol.ClassNodeStatus:
			s, err := protocol.DecodeNodeStatus(payload, protocol.DefaultMaxPayload)
			if err != nil {
				bad(err)
				continue
			}
			if s.Node != t.Node {
				bad(fmt.Errorf("payload is for node %q", s.Node))
				continue
			}
			if s.Object.Name != t.Node {
				// The sealing key's attestation names the object's node: another node's genuine
				// status under this topic would have this node's Secrets sealed to that node.
				bad(fmt.Errorf("its object is node %q", s.Object.Name))
				continue
			}
			get(t.Node).Status = s
		case protocol.ClassAcks:
			a, err := protocol.DecodeAcks(payload, protocol.DefaultMaxPayload)
			if err != nil {
				bad(err)
				continue
			}
			if a.Node != t.Node {
				bad(fmt.Errorf("payload is for node %q", a.Node))
				continue
			}
			get(t.Node).Acks = a
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		n := byName[name]
		if l := n.Liveness; l != nil && l.Online && l.Session >= c.sessions[name].Session {
			c.sessions[name] = *l
		}
		var seen *protocol.Liveness
		if l, ok := c.sessions[name]; ok {
			seen = &l
		}
		n.settle(seen)
		out.Items = append(out.Items, *n)
	}
	return out
}

// settle applies the stale-offline rule. The evidence that a newer session was online is the
// highest online message this client has seen (seen, may be nil) and the session of the node's
// acks: the node writes them only while connected.
func (n *Node) settle(seen *protocol.Liveness) {
	l := n.Liveness
	if l == nil {
		n.State = StateUnknown
		if n.Status != nil && n.Status.Object != nil {
			n.Version = n.Status.Object.Status.NodeInfo.KubeletVersion
		}
		return
	}
	n.State, n.Session, n.Since, n.Version = StateOffline, l.Session, l.Time, l.Version
	if l.Online {
		n.State = StateOnline
		return
	}
	newest := int64(0)
	if seen != nil {
		newest = seen.Session
	}
	if n.Acks != nil && n.Acks.Session > newest {
		newest = n.Acks.Session
	}
	if l.Session < newest {
		n.State, n.StaleOffline, n.Session, n.Since = StateOnline, true, newest, time.Time{}
		if seen != nil && seen.Session == newest {
			n.Since, n.Version = seen.Time, seen.Version
		}
	}
}

// PodList is the pods the nodes report.
type PodList struct {
	Items   []protocol.PodStatus
	Skipped []error
	// Summaries are the status summaries of the nodes read, by node: how many live pod statuses
	// each node keeps on the broker.
	Summaries map[string]*protocol.StatusSummary
	// Unchecked are the nodes whose pod statuses were read but which publish no status summary
	// (an agent from before summaries): whether all of their statuses arrived cannot be told.
	Unchecked []string
	// Short are the nodes of which fewer live pod statuses arrived than their summary counts,
	// even when read alone: Items lacks some of their pods.
	Short []Shortfall
}

// Shortfall is a node whose pod statuses did not all arrive.
type Shortfall struct {
	Node string
	// Expected is the node's summary's count of live pod statuses, Received how many were read.
	Expected, Received int
}

func (s Shortfall) String() string {
	return fmt.Sprintf("node %s: %d pod statuses expected (its status summary), %d received", s.Node, s.Expected, s.Received)
}

// IncompleteError says that a read of pod statuses lacks some: the broker dropped retained
// messages (its queue for this client was too small for the read) or some could not be decoded.
type IncompleteError struct {
	Short []Shortfall
}

func (e *IncompleteError) Error() string {
	parts := make([]string, len(e.Short))
	for i, s := range e.Short {
		parts[i] = s.String()
	}
	return "incomplete read of pod statuses (" + strings.Join(parts, "; ") +
		"): the broker dropped retained messages, or some could not be read; raise the broker's max_queued_messages (docs/protocol.md, broker settings) or read one node at a time"
}

// Incomplete returns an *IncompleteError when some node's statuses did not all arrive, else nil.
func (l *PodList) Incomplete() error {
	if len(l.Short) == 0 {
		return nil
	}
	return &IncompleteError{Short: slices.Clone(l.Short)}
}

// nodePods is what one read returned for one node.
type nodePods struct {
	items   []protocol.PodStatus
	summary *protocol.StatusSummary
	skipped []error
}

// received is the number of live pod statuses read for the node.
func (n *nodePods) received() int { return len(n.items) }

// short says whether fewer live statuses arrived than the node's summary counts. More is fine: a
// pod may have started between the node's summary and the read.
func (n *nodePods) short() bool { return n.summary != nil && n.received() < n.summary.Pods }

// Pods reads the retained pod statuses of node ("" for every node), leaving out pods reported as
// deleted. They come sorted by node, namespace and name.
//
// A read never passes off part of the statuses as all of them: each node's count of live statuses
// is checked against its retained status summary (published by the node after the statuses it
// counts). A node that falls short is read again alone, a smaller read that fits the broker's
// queue for this client; a node still short is in Short (see Incomplete), its statuses that did
// arrive in Items.
func (c *Client) Pods(ctx context.Context, node string) (*PodList, error) {
	byNode := map[string]*nodePods{}
	var skipped []error
	if node != "" {
		if err := protocol.ValidateNodeName(node); err != nil {
			return nil, err
		}
		n, err := c.nodePods(ctx, node)
		if err != nil {
			return nil, fmt.Errorf("list pods: %w", err)
		}
		byNode[node] = n
	} else {
		// The summaries first (one per node), so that a status read too large for the broker's
		// queue loses statuses, which the summaries reveal, rather than summaries.
		got, err := c.snapshot(ctx, []string{c.topics.AllNodes(protocol.ClassSummary)}, []string{c.topics.AllNodes(protocol.ClassPodStatus)})
		if err != nil {
			return nil, fmt.Errorf("list pods: %w", err)
		}
		byNode, skipped = c.decodePods(got)
	}
	// Read short nodes again, one at a time. For one node's read this is a second try: a pod
	// deleted between reading the summary and the statuses makes a read look short.
	for _, name := range slices.Sorted(maps.Keys(byNode)) {
		if !byNode[name].short() {
			continue
		}
		n, err := c.nodePods(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("list pods: read node %s again: %w", name, err)
		}
		byNode[name] = n
	}

	out := &PodList{Skipped: skipped, Summaries: map[string]*protocol.StatusSummary{}}
	for _, name := range slices.Sorted(maps.Keys(byNode)) {
		n := byNode[name]
		out.Items = append(out.Items, n.items...)
		out.Skipped = append(out.Skipped, n.skipped...)
		switch {
		case n.summary == nil:
			if n.received() > 0 {
				out.Unchecked = append(out.Unchecked, name)
			}
		case n.short():
			out.Summaries[name] = n.summary
			out.Short = append(out.Short, Shortfall{Node: name, Expected: n.summary.Pods, Received: n.received()})
		default:
			out.Summaries[name] = n.summary
		}
	}
	slices.SortFunc(out.Items, func(a, b protocol.PodStatus) int {
		return strings.Compare(a.Node+"\x00"+a.Namespace+"\x00"+a.Name, b.Node+"\x00"+b.Namespace+"\x00"+b.Name)
	})
	return out, nil
}

// nodePods reads one node's summary and pod statuses (the summary first, see Pods).
func (c *Client) nodePods(ctx context.Context, node string) (*nodePods, error) {
	got, err := c.snapshot(ctx, []string{c.topics.Summary(node)}, []string{c.topics.PodStatusFilter(node)})
	if err != nil {
		return nil, err
	}
	byNode, skipped := c.decodePods(got)
	n := byNode[node]
	if n == nil {
		n = &nodePods{}
	}
	n.skipped = append(n.skipped, skipped...) // topics that name no node: none under one node's filters
	return n, nil
}

// decodePods decodes a snapshot of status summaries and pod statuses, by node. What cannot be
// read is kept with its node (so a node read again replaces it), or returned apart when the topic
// names no node; a node's status that cannot be read is not counted as received, so it shows as a
// shortfall against the node's summary.
func (c *Client) decodePods(got map[string][]byte) (map[string]*nodePods, []error) {
	byNode := map[string]*nodePods{}
	var skipped []error
	get := func(name string) *nodePods {
		n := byNode[name]
		if n == nil {
			n = &nodePods{}
			byNode[name] = n
		}
		return n
	}
	for _, topic := range slices.Sorted(maps.Keys(got)) {
		t, err := c.topics.Parse(topic)
		if err != nil {
			skipped = append(skipped, err)
			continue
		}
		bad := func(err error) {
			n := get(t.Node)
			n.skipped = append(n.skipped, fmt.Errorf("%s: %w", topic, err))
		}
		switch t.Class {
		case protocol.ClassSummary:
			s, err := protocol.DecodeStatusSummary(got[topic], protocol.DefaultMaxPayload)
			if err != nil {
				bad(err)
				continue
			}
			if s.Node != t.Node {
				bad(fmt.Errorf("payload is for node %q", s.Node))
				continue
			}
			get(t.Node).summary = s
		case protocol.ClassPodStatus:
			n := get(t.Node)
			s, err := protocol.DecodePodStatus(got[topic], protocol.DefaultMaxPayload)
			if err != nil {
				bad(err)
				continue
			}
			// The topic is what the broker's ACL vouches for; a payload naming another pod is not
			// believed.
			if s.Node != t.Node || s.Namespace != t.Namespace || s.Name != t.Name {
				bad(fmt.Errorf("payload is about %s/%s on node %q", s.Namespace, s.Name, s.Node))
				continue
			}
			if s.Deleted {
				continue
			}
			n.items = append(n.items, *s)
		}
	}
	return byNode, skipped
}

// perNode reads the retained messages of class c of every node and decodes each, by node name,
// with the ones that could not be read.
func perNode[T any](ctx context.Context, c *Client, class protocol.Class, what string, decode func(node, topic string, payload []byte) (*T, error)) (map[string]*T, []error, error) {
	got, err := c.Snapshot(ctx, c.topics.AllNodes(class))
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", what, err)
	}
	out := map[string]*T{}
	var skipped []error
	for _, topic := range slices.Sorted(maps.Keys(got)) {
		t, err := c.topics.Parse(topic)
		if err != nil {
			skipped = append(skipped, err)
			continue
		}
		v, err := decode(t.Node, topic, got[topic])
		if err != nil {
			skipped = append(skipped, err)
			continue
		}
		out[t.Node] = v
	}
	return out, skipped, nil
}

// Indexes reads the retained indexes of every node, by node name, with the ones that could not be
// read.
func (c *Client) Indexes(ctx context.Context) (map[string]*protocol.Index, []error, error) {
	return perNode(ctx, c, protocol.ClassIndex, "indexes", func(node, _ string, p []byte) (*protocol.Index, error) {
		return c.decodeIndex(node, p)
	})
}

// Acks reads a node's retained acks; nil (and no error) when it has none.
func (c *Client) Acks(ctx context.Context, node string) (*protocol.Acks, error) {
	if err := protocol.ValidateNodeName(node); err != nil {
		return nil, err
	}
	topic := c.topics.Acks(node)
	got, err := c.Snapshot(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("read acks of node %s: %w", node, err)
	}
	if got[topic] == nil {
		return nil, nil
	}
	return c.decodeAcks(node, topic, got[topic])
}

// AllAcks reads the retained acks of every node, by node name, with the ones that could not be
// read. The acks carry the node's refusals, so a reader shows them without having watched the
// node's events.
func (c *Client) AllAcks(ctx context.Context) (map[string]*protocol.Acks, []error, error) {
	return perNode(ctx, c, protocol.ClassAcks, "acks", c.decodeAcks)
}

func (c *Client) decodeAcks(node, topic string, payload []byte) (*protocol.Acks, error) {
	a, err := protocol.DecodeAcks(payload, protocol.DefaultMaxPayload)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", topic, err)
	}
	if a.Node != node {
		return nil, fmt.Errorf("%s: payload is for node %q", topic, a.Node)
	}
	return a, nil
}

// WatchAcks follows node's retained acks: done is called with the retained acks and then with each
// one the node publishes, until it returns true. It returns the last acks that could be read (nil
// when none), and, when ctx ends or the connection is lost first, that error too. Acks that cannot
// be read are passed over: the node's next acks replace them.
func (c *Client) WatchAcks(ctx context.Context, node string, done func(*protocol.Acks) bool) (*protocol.Acks, error) {
	if err := protocol.ValidateNodeName(node); err != nil {
		return nil, err
	}
	// Snapshots unsubscribe their filters when they end, which would end this subscription too.
	c.snapMu.Lock()
	defer c.snapMu.Unlock()
	topic := c.topics.Acks(node)
	var (
		mu     sync.Mutex
		latest []byte
		notify = make(chan struct{}, 1)
	)
	// Called by paho, which must not be blocked: keep only the latest payload.
	handle := func(_ mqtt.Client, m mqtt.Message) {
		if len(m.Payload()) == 0 {
			return
		}
		mu.Lock()
		latest = m.Payload()
		mu.Unlock()
		select {
		case notify <- struct{}{}:
		default:
		}
	}
	defer c.wait(context.WithoutCancel(ctx), c.mc.Unsubscribe(topic), "unsubscribe")
	if err := c.wait(ctx, c.mc.Subscribe(topic, qos, handle), "watch "+topic); err != nil {
		return nil, err
	}
	var last *protocol.Acks
	for {
		select {
		case <-notify:
		case <-c.lost:
			return last, fmt.Errorf("watch %s: %w", topic, c.lostErr)
		case <-ctx.Done():
			return last, ctx.Err()
		}
		mu.Lock()
		payload := latest
		mu.Unlock()
		a, err := c.decodeAcks(node, topic, payload)
		if err != nil {
			continue
		}
		last = a
		if done(a) {
			return a, nil
		}
	}
}

// Retained is what the broker retains under one node's subtree.
type Retained struct {
	Messages, Bytes int
	// Expected is how many retained messages a well-behaved node and its control plane keep
	// there: the desired objects its index lists plus the index, its live pod statuses, up to
	// maxGoneStatuses deleted ones, and its node status, summary, acks and online message.
	Expected int
	// Warning says why the volume looks wrong ("" when it does not): a node (or anyone with its
	// credentials) filling the broker with retained messages under its own subtree, which the
	// broker's ACL allows and no per-client quota bounds (docs/security.md).
	Warning string
}

// RetainedBytesBound is the retained volume of one node past which Retained warns: far above what
// a desired set at the payload limit's typical use needs, far below what starves a broker.
const RetainedBytesBound = 64 << 20

// maxGoneStatuses mirrors the node's bound on retained statuses of deleted pods (sync/uplink).
const maxGoneStatuses = 64

// RetainedUsage reads everything the broker retains for node and says whether it looks like a node
// filling the broker. idx is the node's index and livePods its summary's pod count.
func (c *Client) RetainedUsage(ctx context.Context, node string, idx *protocol.Index, livePods int) (*Retained, error) {
	if err := protocol.ValidateNodeName(node); err != nil {
		return nil, err
	}
	got, err := c.Snapshot(ctx, c.topics.Node(node)+"/#")
	if err != nil {
		return nil, fmt.Errorf("read what the broker retains for node %s: %w", node, err)
	}
	r := &Retained{Messages: len(got)}
	for _, p := range got {
		r.Bytes += len(p)
	}
	listed := 0
	if idx != nil {
		listed = len(idx.Objects) + 1
	}
	r.Expected = listed + livePods + maxGoneStatuses + 4
	switch {
	case r.Messages > 2*r.Expected:
		r.Warning = fmt.Sprintf("node %s's subtree holds %d retained messages, more than twice the %d its desired set and pods account for: is something publishing retained messages there (the node's credentials)? List them with mosquitto_sub -t '%s/#' --retained-only -v", node, r.Messages, r.Expected, c.topics.Node(node))
	case r.Bytes > RetainedBytesBound:
		r.Warning = fmt.Sprintf("node %s's subtree holds %d bytes of retained messages, more than %d MiB", node, r.Bytes, RetainedBytesBound>>20)
	}
	return r, nil
}
