package ctlclient

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"
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
func (c *Client) Nodes(ctx context.Context) (*NodeList, error) {
	got, err := c.Snapshot(ctx, c.topics.AllNodes(protocol.ClassLiveness), c.topics.AllNodes(protocol.ClassNodeStatus),
		c.topics.AllNodes(protocol.ClassAcks))
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
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
}

// Pods reads the retained pod statuses of node ("" for every node), leaving out pods reported as
// deleted. They come sorted by node, namespace and name.
func (c *Client) Pods(ctx context.Context, node string) (*PodList, error) {
	filter := c.topics.AllNodes(protocol.ClassPodStatus)
	if node != "" {
		if err := protocol.ValidateNodeName(node); err != nil {
			return nil, err
		}
		filter = c.topics.PodStatusFilter(node)
	}
	got, err := c.Snapshot(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	out := &PodList{}
	for _, topic := range slices.Sorted(maps.Keys(got)) {
		bad := func(err error) { out.Skipped = append(out.Skipped, fmt.Errorf("%s: %w", topic, err)) }
		t, err := c.topics.Parse(topic)
		if err != nil {
			out.Skipped = append(out.Skipped, err)
			continue
		}
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
		out.Items = append(out.Items, *s)
	}
	slices.SortFunc(out.Items, func(a, b protocol.PodStatus) int {
		return strings.Compare(a.Node+"\x00"+a.Namespace+"\x00"+a.Name, b.Node+"\x00"+b.Namespace+"\x00"+b.Name)
	})
	return out, nil
}

// Indexes reads the retained indexes of every node, by node name, with the ones that could not be
// read.
func (c *Client) Indexes(ctx context.Context) (map[string]*protocol.Index, []error, error) {
	got, err := c.Snapshot(ctx, c.topics.AllNodes(protocol.ClassIndex))
	if err != nil {
		return nil, nil, fmt.Errorf("read indexes: %w", err)
	}
	out := map[string]*protocol.Index{}
	var skipped []error
	for _, topic := range slices.Sorted(maps.Keys(got)) {
		t, err := c.topics.Parse(topic)
		if err != nil {
			skipped = append(skipped, err)
			continue
		}
		idx, err := c.decodeIndex(t.Node, got[topic])
		if err != nil {
			skipped = append(skipped, err)
			continue
		}
		out[t.Node] = idx
	}
	return out, skipped, nil
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
	a, err := protocol.DecodeAcks(got[topic], protocol.DefaultMaxPayload)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", topic, err)
	}
	if a.Node != node {
		return nil, fmt.Errorf("%s: payload is for node %q", topic, a.Node)
	}
	return a, nil
}
