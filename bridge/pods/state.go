package pods

import (
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"sort"

	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
	v1 "k8s.io/api/core/v1"
)

// entry is one retained desired object of a node as this bridge knows it: from the snapshot read
// at start, then from its own writes. Only live objects have one: a deleted object's topic is
// cleared (an empty retained payload), which leaves nothing to know.
type entry struct {
	Gen  int64  // 0: the payload is unreadable
	Hash string // of the encoded object; "" for a payload this bridge cannot read or did not write for this node
	// Digest is protocol.Digest of the exact retained payload: what an index lists for the object,
	// and what the node checks the payload it receives against.
	Digest string
}

// listable says whether an index may list the object as it is retained: only a payload this
// bridge can read, written for this node, has a generation the node will find in it.
func (e entry) listable() bool { return e.Gen > 0 && e.Hash != "" }

// nodeState is the bridge's picture of one node's retained desired state. It is owned by the
// node's worker (the work queue never hands one key to two workers), so it has no lock.
type nodeState struct {
	// counter is the node's generation counter: the highest revision or generation seen in the
	// retained index, the retained objects and the node's acks, or written since (see raise).
	counter int64
	// anchor is, for a bridge that signs, the highest revision it knows to be genuine: a
	// retained index signed with its key, or one it wrote. Unsigned figures (acks, objects)
	// raise the counter to at most anchor+maxCounterStep. clamp says whether anchor applies.
	anchor      int64
	clamp       bool
	entries     map[string]entry
	index       map[string]protocol.IndexEntry // the retained index's objects
	indexRev    int64                          // 0: no retained index
	indexDigest string                         // protocol.Digest of the retained index payload
	// dropped holds, for each key an index of this bridge stopped listing, the revision of that
	// index: the node no longer holds the object once its acks are at that revision or above and
	// name the key in none of their outcomes. Keys listed again leave it; syncNode keeps only
	// those of pods still waiting for their node's confirmation.
	dropped map[string]int64
	// warnedRefusedRev is the revision of the last refused index a warning was logged for.
	warnedRefusedRev int64
	// stuckLogged holds, for each object that cannot be sent, the reason last logged: a node
	// synced again and again (a Secret waiting for its sealing key) logs it once, not per sync.
	stuckLogged map[string]string
}

func newEmptyState() *nodeState {
	return &nodeState{entries: map[string]entry{}, index: map[string]protocol.IndexEntry{}, dropped: map[string]int64{}, stuckLogged: map[string]string{}}
}

// object is one wanted desired object, encoded.
type object struct {
	Kind      protocol.ObjectKind
	Namespace string
	Name      string
	Raw       []byte // the object's JSON, as it goes into Desired.Object
	Hash      string
	// Stuck objects cannot be sent (too large, not encodable, a Secret for a node whose sealing
	// key is unknown): the retained version, if any, stays listed.
	Stuck bool
	// SealTo is the node key a Secret's data is sealed to when it is written.
	SealTo *ecdh.PublicKey
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
		// deleting an object the API wants because this copy cannot be encoded.
		return &object{Kind: kind, Namespace: namespace, Name: name, Stuck: true}, fmt.Errorf("encode %s %s/%s: %w", kind, namespace, name, err)
	}
	return &object{Kind: kind, Namespace: namespace, Name: name, Raw: raw, Hash: hashRaw(raw)}, nil
}

// newNodeState reads a node's retained index, acks and desired objects (a Snapshot of
// Topics.Index, Topics.Acks and Topics.DesiredFilter). What cannot be read is reported and still
// raises the counter where a generation can be found, so the next generation is above every one
// the node may hold (docs/protocol.md section 16).
//
// trust, when not nil, are the keys of the bridge's own signatures: the counter then goes past
// what a verified index shows by at most maxCounterStep (see raise).
func newNodeState(node string, topics protocol.Topics, snap map[string][]byte, maxPayload int, trust []ed25519.PublicKey) (*nodeState, []error) {
	s := newEmptyState()
	s.clamp = trust != nil
	var problems []error
	var seen []int64 // figures that raise the counter, once the anchor is known
	for topic, payload := range snap {
		if len(payload) == 0 {
			continue // a cleared topic
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
			s.indexDigest = protocol.Digest(payload)
			seen = append(seen, idx.Revision)
			if trust != nil && protocol.VerifyIndex(idx, trust) == nil {
				s.anchor = idx.Revision
			}
			s.index = idx.Objects
		case protocol.ClassAcks:
			a, err := protocol.DecodeAcks(payload, maxPayload)
			if err == nil && a.Node != node {
				err = fmt.Errorf("payload is for node %q", a.Node)
			}
			if err != nil {
				problems = append(problems, fmt.Errorf("retained %s: unreadable acks: %w", topic, err))
				continue
			}
			seen = append(seen, a.Top())
		case protocol.ClassDesired:
			// The envelope alone: what matters is the generation, whether the object is the one
			// this bridge would write, and the digest of the exact bytes; a payload it cannot
			// read is simply replaced (or cleared).
			key := protocol.ObjectKey(t.Kind, t.Namespace, t.Name)
			e := entry{Digest: protocol.Digest(payload)}
			var d protocol.Desired
			if err := json.Unmarshal(payload, &d); err != nil {
				problems = append(problems, fmt.Errorf("retained %s: %w", topic, err))
				s.entries[key] = e
				continue
			}
			seen = append(seen, d.Generation)
			if d.Generation > 0 {
				e.Gen = d.Generation
			}
			if d.APIVersion == protocol.APIVersion && d.Node == node && d.Kind == t.Kind && d.Namespace == t.Namespace &&
				d.Name == t.Name && len(d.Object) > 0 && string(d.Object) != "null" {
				e.Hash = hashRaw(d.Object)
			}
			s.entries[key] = e
		}
	}
	for _, e := range s.index {
		seen = append(seen, e.Generation)
	}
	for _, v := range seen {
		s.raise(v)
	}
	return s, problems
}

// maxCounterStep is how far figures the bridge cannot verify (acks, retained objects, another
// writer's index) may carry a signing bridge's counter past the newest revision it knows to be
// genuine. The acks are relayed unsigned: without a bound, one forged figure would have the bridge
// sign an index at the counter's ceiling, where the node's revision would stay, and no writer
// could follow (a freeze outlasting the broker's misbehaviour). A real node's revisions grow by
// one per write, far below the step.
const maxCounterStep = 1 << 20

// maxCounter is the ceiling of the counter: a write that would go past it is refused (the
// counter reached it through unsigned figures, or the node is frozen there).
const maxCounter = 1 << 62

// raise raises the counter to v, a revision or generation read from the broker; for a bridge that
// signs, to at most anchor+maxCounterStep.
func (s *nodeState) raise(v int64) {
	if s.clamp {
		v = min(v, s.anchor+maxCounterStep)
	}
	s.counter = max(s.counter, v)
}

// write is one retained desired message to publish: Payload is exactly what goes out, and
// Digest (protocol.Digest of it) is what the index lists.
type write struct {
	Key     string
	Msg     *protocol.Desired
	Hash    string
	Payload []byte
	Digest  string
}

// plan is what one sync of a node publishes, in this order: objects, then the index, then the
// clearing of the retained topics the index no longer lists (docs/protocol.md section 4.4). The
// index goes after the objects it lists so that a crash between the steps never leaves an index
// naming a payload the broker does not have; topics are cleared after the index so that no node
// ever finds an object its index still lists gone from the broker.
type plan struct {
	Gen    int64 // the generation new writes got; the counter after the plan
	Writes []write
	Index  *protocol.Index // nil: the index stays as it is
	// IndexPayload is Index encoded, and IndexDigest its digest.
	IndexPayload []byte
	IndexDigest  string
	// Clears are the keys whose retained topics are cleared (an empty retained payload) once the
	// index is out: objects no longer wanted, so the broker stops keeping them (secrets included).
	Clears []string
}

func (p *plan) empty() bool { return len(p.Writes) == 0 && p.Index == nil && len(p.Clears) == 0 }

// plan compares the wanted objects with the retained state. A wanted object whose hash differs
// from the retained one (or that is not retained, or not readably) is written at the next
// generation; a retained object that is not wanted is left out of the index and its topic
// cleared. Keys in resend (a node's resync request) are published again at their current
// generation if unchanged (and their payload encodes to the digest listed; else at the next
// generation). Keys in terminating (pods being deleted) need an index that leaves them out: when
// there is no index at all, one is written. The index is written when its content changes, and
// also as iw says.
//
// With key set, every index is signed with it (nodes with trust anchors take only signed ones);
// Ed25519 signatures are deterministic, so the same index again is the same bytes.
func (s *nodeState) plan(node string, want map[string]*object, terminating, resend map[string]bool, iw indexWrite, key ed25519.PrivateKey) (plan, error) {
	if s.counter >= maxCounter {
		return plan{}, fmt.Errorf("node %s: the generation counter is at %d, past what a writer goes on from (forged acks or index on the broker?)", node, s.counter)
	}
	gen := s.counter + 1
	usedGen := false
	p := plan{Gen: s.counter}
	next := make(map[string]protocol.IndexEntry, len(want))
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	add := func(k string, o *object, g int64) error {
		w, err := newWrite(node, k, o, g)
		if err != nil {
			return err
		}
		p.Writes = append(p.Writes, w)
		next[k] = protocol.IndexEntry{Generation: g, Digest: w.Digest}
		return nil
	}
	for _, k := range keys {
		o := want[k]
		e, ok := s.entries[k]
		live := ok && e.listable()
		switch {
		case o.Stuck:
			// Wanted, but this version cannot go out: the node keeps the version it has. The
			// retained object stays listed as it is; one the broker no longer holds keeps the
			// entry the index has, since leaving it out would delete it from the node.
			if live {
				next[k] = protocol.IndexEntry{Generation: e.Gen, Digest: e.Digest}
			} else if ie, listed := s.index[k]; listed {
				next[k] = ie
			}
		case live && e.Hash == o.Hash && !resend[k]:
			next[k] = protocol.IndexEntry{Generation: e.Gen, Digest: e.Digest}
		case live && e.Hash == o.Hash:
			// Asked for again: the same bytes at the same generation, if this bridge's encoding
			// gives them; a payload another writer encoded differently goes out as a new
			// generation, so the index never lists a digest the broker does not hold.
			w, err := newWrite(node, k, o, e.Gen)
			if err != nil {
				return plan{}, err
			}
			if w.Digest == e.Digest {
				p.Writes = append(p.Writes, w)
				next[k] = protocol.IndexEntry{Generation: e.Gen, Digest: e.Digest}
				continue
			}
			if err := add(k, o, gen); err != nil {
				return plan{}, err
			}
			usedGen = true
		default:
			if err := add(k, o, gen); err != nil {
				return plan{}, err
			}
			usedGen = true
		}
	}
	for k := range s.entries {
		if _, wanted := want[k]; !wanted {
			p.Clears = append(p.Clears, k)
		}
	}
	sort.Strings(p.Clears)
	// A pod being deleted that no index ever listed still needs a revision its node can confirm:
	// without any index there is none.
	needRev := false
	for k := range terminating {
		if _, wanted := want[k]; !wanted && s.indexRev == 0 {
			needRev = true
		}
	}
	changed := !maps.Equal(next, s.index)
	switch {
	case usedGen || needRev || iw == indexNewRevision || changed && (len(next) > 0 || s.indexRev > 0):
		p.Gen = gen
		p.Index = &protocol.Index{APIVersion: protocol.APIVersion, Node: node, Revision: gen, Objects: next}
	case iw == indexRepublish && s.indexRev > 0:
		// The same index again: it must be the same bytes, or the node refuses it as a conflict
		// (one revision, two payloads). An index encoded by another writer goes out as a new
		// revision instead.
		p.Index = &protocol.Index{APIVersion: protocol.APIVersion, Node: node, Revision: s.indexRev, Objects: next}
	case iw == indexRepublish && len(next) > 0:
		p.Gen = gen
		p.Index = &protocol.Index{APIVersion: protocol.APIVersion, Node: node, Revision: gen, Objects: next}
	}
	if p.Index == nil {
		return p, nil
	}
	encode := func() ([]byte, error) {
		if key != nil {
			protocol.SignIndex(p.Index, key)
		}
		return protocol.Encode(p.Index)
	}
	payload, err := encode()
	if err != nil {
		return plan{}, fmt.Errorf("encode the index of node %s at revision %d: %w", node, p.Index.Revision, err)
	}
	if p.Index.Revision == s.indexRev && protocol.Digest(payload) != s.indexDigest {
		p.Gen = gen
		p.Index.Revision = gen
		if payload, err = encode(); err != nil {
			return plan{}, fmt.Errorf("encode the index of node %s at revision %d: %w", node, gen, err)
		}
	}
	p.IndexPayload, p.IndexDigest = payload, protocol.Digest(payload)
	return p, nil
}

// indexWrite says when a plan writes the index beyond a change of its content.
type indexWrite int

const (
	indexIfChanged   indexWrite = iota
	indexRepublish              // the same index again, if any (a resync request: the broker may have lost it)
	indexNewRevision            // a new revision even unchanged (the node runs an index this bridge did not write)
)

// nodeRunsAnotherIndex says whether a node's acks show it running an index other than the one
// this bridge holds for it: a newer revision (written by a writer whose index the broker then
// lost, or by another writer), the same revision with other bytes (two writers crossed), or, with
// no index on either side, objects the node applied from an earlier writer. The node keeps acting
// on that index until a newer one reaches it, whatever the broker holds, so the bridge writes its
// own at a new revision. Not when the node refused the index this bridge holds: writing again
// would only be refused again, each acks answering the last write.
func nodeRunsAnotherIndex(acks *protocol.Acks, s *nodeState) bool {
	if acks == nil {
		return false
	}
	if r := acks.IndexRefused; r != nil && s.indexRev > 0 && r.Generation == s.indexRev && (r.Digest == "" || r.Digest == s.indexDigest) {
		return false
	}
	switch {
	case acks.IndexRevision == 0:
		return s.indexRev == 0 && len(acks.Applied) > 0
	case acks.IndexRevision > s.indexRev:
		return true
	case acks.IndexRevision == s.indexRev:
		return acks.IndexDigest != "" && acks.IndexDigest != s.indexDigest
	}
	return false // the node is behind: it catches up with the retained index
}

// newWrite encodes o for node at generation gen.
func newWrite(node, key string, o *object, gen int64) (write, error) {
	msg := &protocol.Desired{APIVersion: protocol.APIVersion, Kind: o.Kind, Node: node, Namespace: o.Namespace,
		Name: o.Name, Generation: gen, Object: o.Raw}
	if o.SealTo != nil {
		// The broker and the site gateway see the Secret's data only sealed to this node.
		var s v1.Secret
		if err := json.Unmarshal(o.Raw, &s); err != nil {
			return write{}, fmt.Errorf("seal desired %s of node %s: %w", key, node, err)
		}
		bare, sealed, err := sealing.Seal(o.SealTo, node, &s)
		if err != nil {
			return write{}, err
		}
		if msg.Object, err = json.Marshal(bare); err != nil {
			return write{}, fmt.Errorf("seal desired %s of node %s: %w", key, node, err)
		}
		msg.Sealed = sealed
	}
	payload, err := protocol.Encode(msg)
	if err != nil {
		return write{}, fmt.Errorf("encode desired %s of node %s at generation %d: %w", key, node, gen, err)
	}
	return write{Key: key, Msg: msg, Hash: o.Hash, Payload: payload, Digest: protocol.Digest(payload)}, nil
}

// commit records a plan that was published completely.
func (s *nodeState) commit(p plan) {
	for _, w := range p.Writes {
		s.entries[w.Key] = entry{Gen: w.Msg.Generation, Hash: w.Hash, Digest: w.Digest}
	}
	for _, k := range p.Clears {
		delete(s.entries, k)
	}
	if p.Index != nil {
		for k := range s.index {
			if _, listed := p.Index.Objects[k]; !listed {
				if _, known := s.dropped[k]; !known {
					s.dropped[k] = p.Index.Revision
				}
			}
		}
		for k := range p.Index.Objects {
			delete(s.dropped, k)
		}
		s.index = p.Index.Objects
		s.indexRev = p.Index.Revision
		s.indexDigest = p.IndexDigest
	}
	s.counter = max(s.counter, p.Gen)
	s.anchor = max(s.anchor, p.Gen) // written by this bridge
}

// dropRevision is the revision of an index that leaves key out and is no older than any index
// that listed it: 0 while the current index lists key or there is no index. Without a record of
// the index that dropped the key (a bridge that started after it was written), the current index
// serves: it leaves the key out and is at least as new.
func (s *nodeState) dropRevision(key string) int64 {
	if _, listed := s.index[key]; listed {
		return 0
	}
	if r, ok := s.dropped[key]; ok {
		return r
	}
	return s.indexRev
}

// goneFromNode says whether a node's acks show that it no longer holds key, which an index at
// revision dropRev left out: the node has compared against that index or a newer one (a node
// deletes an object when a newer index leaves it out) and reports no outcome for the key (every
// entry of its current index has one: applied, refused or missing). Compact acks tell the applied
// entries only against the index they name: current (the bridge's own) when it is that one;
// otherwise nothing is confirmed until the node runs the bridge's index or lists its entries.
func goneFromNode(acks *protocol.Acks, key string, dropRev int64, current *protocol.Index) bool {
	if acks == nil || dropRev <= 0 || acks.IndexRevision < dropRev {
		return false
	}
	applied, known := acks.AppliedIn(current)
	if !known {
		return false
	}
	_, isApplied := applied[key]
	_, refused := acks.Refused[key]
	_, missing := acks.Missing[key]
	return !isApplied && !refused && !missing
}

// current is the index this bridge last wrote for the node, as acks name it; nil before any.
func (s *nodeState) current() *protocol.Index {
	if s.indexRev == 0 {
		return nil
	}
	return &protocol.Index{Revision: s.indexRev, Objects: s.index, PayloadDigest: s.indexDigest}
}
