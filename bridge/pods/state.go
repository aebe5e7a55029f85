package pods

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"sort"

	"github.com/mqlet/mqlet/sync/protocol"
)

// entry is one retained desired object of a node as this bridge knows it: from the snapshot read
// at start, then from its own writes.
type entry struct {
	Gen     int64
	Hash    string // of the encoded object; "" for a tombstone or a payload this bridge cannot read
	Deleted bool
}

// nodeState is the bridge's picture of one node's retained desired state. It is owned by the
// node's worker (the work queue never hands one key to two workers), so it has no lock.
type nodeState struct {
	// counter is the node's generation counter: the highest revision or generation seen in the
	// retained index, the retained objects and the node's acks, or written since.
	counter  int64
	entries  map[string]entry
	index    map[string]int64 // the retained index's objects
	indexRev int64            // 0: no retained index
}

// object is one wanted desired object, encoded.
type object struct {
	Kind      protocol.ObjectKind
	Namespace string
	Name      string
	Raw       []byte // the object's JSON, as it goes into Desired.Object
	Hash      string
	// Stuck objects cannot be sent (too large, or not encodable): the retained version, if any, stays listed.
	Stuck bool
}

func (o *object) key() string { return protocol.ObjectKey(o.Kind, o.Namespace, o.Name) }

func hashRaw(raw []byte) string {
	h := sha256.Sum256(raw)
	return hex.EncodeToString(h[:16])
}

// encodeObject encodes a sanitized *v1.Pod, *v1.ConfigMap or *v1.Secret.
func encodeObject(kind protocol.ObjectKind, namespace, name string, obj any) (*object, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		// Still wanted: Stuck keeps whatever version the broker holds listed, rather than
		// tombstoning an object the API wants because this copy cannot be encoded.
		return &object{Kind: kind, Namespace: namespace, Name: name, Stuck: true}, fmt.Errorf("encode %s %s/%s: %w", kind, namespace, name, err)
	}
	return &object{Kind: kind, Namespace: namespace, Name: name, Raw: raw, Hash: hashRaw(raw)}, nil
}

// newNodeState reads a node's retained index, acks and desired objects (a Snapshot of
// Topics.Index, Topics.Acks and Topics.DesiredFilter). What cannot be read is reported and still
// raises the counter where a generation can be found, so the next generation is above every one
// the node may hold (docs/protocol.md section 16).
func newNodeState(node string, topics protocol.Topics, snap map[string][]byte, maxPayload int) (*nodeState, []error) {
	s := &nodeState{entries: map[string]entry{}, index: map[string]int64{}}
	var problems []error
	for topic, payload := range snap {
		if len(payload) == 0 {
			continue
		}
		t, err := topics.Parse(topic)
		if err != nil || t.Node != node {
			continue
		}
		switch t.Class {
		case protocol.ClassIndex:
			idx, err := protocol.DecodeIndex(t, payload, maxPayload)
			if err != nil {
				problems = append(problems, fmt.Errorf("retained %s: %w", topic, err))
				continue
			}
			s.indexRev = idx.Revision
			s.counter = max(s.counter, idx.Revision)
			if idx.Objects != nil {
				s.index = idx.Objects
			}
		case protocol.ClassAcks:
			a, err := protocol.DecodeAcks(payload, maxPayload)
			if err != nil || a.Node != node {
				problems = append(problems, fmt.Errorf("retained %s: unreadable acks: %v", topic, err))
				continue
			}
			s.counter = max(s.counter, acksTop(a))
		case protocol.ClassDesired:
			// The envelope alone: what matters is the generation and whether the object is the
			// one this bridge would write; a payload it cannot read is simply replaced.
			var d protocol.Desired
			if err := json.Unmarshal(payload, &d); err != nil {
				problems = append(problems, fmt.Errorf("retained %s: %w", topic, err))
				s.entries[protocol.ObjectKey(t.Kind, t.Namespace, t.Name)] = entry{}
				continue
			}
			s.counter = max(s.counter, d.Generation)
			e := entry{Gen: d.Generation, Deleted: d.Deleted}
			if !d.Deleted && d.Node == node && d.Kind == t.Kind && d.Namespace == t.Namespace && d.Name == t.Name {
				e.Hash = hashRaw(d.Object)
			}
			s.entries[protocol.ObjectKey(t.Kind, t.Namespace, t.Name)] = e
		}
	}
	for _, g := range s.index {
		s.counter = max(s.counter, g)
	}
	return s, problems
}

// acksTop is the highest generation or revision a node's acks mention.
func acksTop(a *protocol.Acks) int64 {
	top := a.IndexRevision
	for _, g := range a.Applied {
		top = max(top, g)
	}
	for _, g := range a.Deleted {
		top = max(top, g)
	}
	for _, r := range a.Refused {
		top = max(top, r.Generation)
	}
	return top
}

// write is one retained desired message to publish.
type write struct {
	Key  string
	Msg  *protocol.Desired
	Hash string
}

// plan is what one sync of a node publishes: objects and tombstones first, then the index.
type plan struct {
	Gen    int64 // the generation new writes got; the counter after the plan
	Writes []write
	Index  *protocol.Index // nil: the index stays as it is
}

func (p *plan) empty() bool { return len(p.Writes) == 0 && p.Index == nil }

// plan compares the wanted objects with the retained state. A wanted object whose hash differs
// from the retained one (or that is not retained, or only as a tombstone) is written at the next
// generation; a retained live object that is not wanted gets a tombstone at that generation, and
// so does each key in tombstone (pods being deleted) that has no tombstone yet. Keys in resend
// (a node's resync request) are published again at their current generation if unchanged. The
// index is written when its content changes or forceIndex is set.
func (s *nodeState) plan(node string, want map[string]*object, tombstone map[string]bool, resend map[string]bool, forceIndex bool) plan {
	gen := s.counter + 1
	usedGen := false
	p := plan{Gen: s.counter}
	next := make(map[string]int64, len(want))
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		o := want[k]
		e, ok := s.entries[k]
		live := ok && !e.Deleted
		switch {
		case o.Stuck:
			if live {
				next[k] = e.Gen
			}
		case live && e.Hash == o.Hash:
			next[k] = e.Gen
			if resend[k] {
				p.Writes = append(p.Writes, write{Key: k, Hash: o.Hash, Msg: desiredMsg(node, o, e.Gen)})
			}
		default:
			next[k] = gen
			usedGen = true
			p.Writes = append(p.Writes, write{Key: k, Hash: o.Hash, Msg: desiredMsg(node, o, gen)})
		}
	}
	gone := map[string]bool{}
	for k, e := range s.entries {
		if _, wanted := want[k]; !wanted && !e.Deleted {
			gone[k] = true
		}
	}
	for k := range tombstone {
		if _, wanted := want[k]; wanted {
			continue
		}
		if _, ok := s.entries[k]; !ok {
			gone[k] = true
		}
	}
	goneKeys := make([]string, 0, len(gone))
	for k := range gone {
		goneKeys = append(goneKeys, k)
	}
	sort.Strings(goneKeys)
	for _, k := range goneKeys {
		kind, ns, name, err := protocol.ParseObjectKey(k)
		if err != nil {
			continue // the snapshot only holds keys of parsed topics
		}
		usedGen = true
		p.Writes = append(p.Writes, write{Key: k, Msg: protocol.NewTombstone(node, kind, ns, name, gen)})
	}
	if usedGen {
		p.Gen = gen
	}
	switch {
	case usedGen || !maps.Equal(next, s.index) && (len(next) > 0 || s.indexRev > 0):
		p.Gen = gen
		p.Index = &protocol.Index{APIVersion: protocol.APIVersion, Node: node, Revision: gen, Objects: next}
	case forceIndex && s.indexRev > 0:
		p.Index = &protocol.Index{APIVersion: protocol.APIVersion, Node: node, Revision: s.indexRev, Objects: next}
	case forceIndex && len(next) > 0:
		p.Gen = gen
		p.Index = &protocol.Index{APIVersion: protocol.APIVersion, Node: node, Revision: gen, Objects: next}
	}
	return p
}

func desiredMsg(node string, o *object, gen int64) *protocol.Desired {
	return &protocol.Desired{APIVersion: protocol.APIVersion, Kind: o.Kind, Node: node, Namespace: o.Namespace,
		Name: o.Name, Generation: gen, Object: o.Raw}
}

// commit records a plan that was published completely.
func (s *nodeState) commit(p plan) {
	for _, w := range p.Writes {
		if w.Msg.Deleted {
			s.entries[w.Key] = entry{Gen: w.Msg.Generation, Deleted: true}
		} else {
			s.entries[w.Key] = entry{Gen: w.Msg.Generation, Hash: w.Hash}
		}
	}
	if p.Index != nil {
		s.index = p.Index.Objects
		s.indexRev = p.Index.Revision
	}
	s.counter = max(s.counter, p.Gen)
}

// forget drops a tombstone the bridge cleared from the broker.
func (s *nodeState) forget(key string) { delete(s.entries, key) }
