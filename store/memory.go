package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Memory is the in-memory twin of DB for unit tests. It keeps records encoded exactly as DB stores
// them, so it has the same semantics down to the details: callers never share objects with it,
// times come back with whole seconds, input DB refuses is refused, and a record that cannot be
// decoded degrades the same way (see SetRaw). It writes nothing to disk.
//
// Secrets are kept in clear: nothing reaches a disk, and a test needs no node key.
type Memory struct {
	mu      sync.Mutex
	closed  bool
	buckets map[string]map[string][]byte
	notices []string
	// outboxSeq is the last Seq given, what DB keeps as the outbox bucket's sequence.
	outboxSeq uint64
}

var _ State = (*Memory)(nil)

// errClosed is what Memory returns after Close, as DB does once its file is closed.
var errClosed = errors.New("state is closed")

// NewMemory returns an empty in-memory state.
func NewMemory() *Memory {
	buckets := map[string]map[string][]byte{}
	for _, b := range currentBuckets() {
		buckets[string(b)] = map[string][]byte{}
	}
	return &Memory{buckets: buckets}
}

// SetRaw stores val under bucket/key as it is, bypassing the encoders, so that a test can plant a
// record that does not decode (any bucket of the package comment's layout; objects values are
// the clear JSON, as Memory does not seal).
func (m *Memory) SetRaw(bucket, key string, val []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.buckets[bucket]
	if !ok {
		return fmt.Errorf("memory state: set raw %s/%s: no bucket %q", bucket, key, bucket)
	}
	b[key] = append([]byte(nil), val...)
	return nil
}

// bucket returns the named bucket, or errClosed; m.mu must be held.
func (m *Memory) bucket(name []byte) (map[string][]byte, error) {
	if m.closed {
		return nil, errClosed
	}
	return m.buckets[string(name)], nil
}

func (m *Memory) PutDesired(p DesiredPod) error {
	val, err := encodeDesired(p)
	if err != nil {
		return fmt.Errorf("memory state: put desired: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketDesired)
	if err != nil {
		return fmt.Errorf("memory state: put desired pod %s: %w", p.Pod.UID, err)
	}
	b[string(p.Pod.UID)] = val
	return nil
}

func (m *Memory) UpdateDesired(put []DesiredPod, del []types.UID) error {
	vals, err := encodeUpdate(put, del)
	if err != nil {
		return fmt.Errorf("memory state: update desired pods: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketDesired)
	if err != nil {
		return fmt.Errorf("memory state: update desired pods: %w", err)
	}
	for _, uid := range del {
		delete(b, string(uid))
	}
	for uid, val := range vals {
		b[string(uid)] = val
	}
	return nil
}

func (m *Memory) GetDesired(uid types.UID) (DesiredPod, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketDesired)
	if err != nil {
		return DesiredPod{}, false, fmt.Errorf("memory state: get desired pod %s: %w", uid, err)
	}
	val, ok := b[string(uid)]
	if !ok {
		return DesiredPod{}, false, nil
	}
	p, err := decodeDesired([]byte(uid), val)
	if err != nil {
		return DesiredPod{}, false, fmt.Errorf("memory state: get desired pod %s: %w", uid, err)
	}
	return p, true, nil
}

func (m *Memory) ListDesired() ([]DesiredPod, []RecordError, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketDesired)
	if err != nil {
		return nil, nil, fmt.Errorf("memory state: list desired pods: %w", err)
	}
	pods, bad := collectDesired(walkMap(b))
	return pods, bad, nil
}

// walkMap walks a bucket the way bbolt's ForEach does, for the collectors shared with DB.
func walkMap(b map[string][]byte) func(func(k, v []byte) error) error {
	return func(fn func(k, v []byte) error) error {
		for k, v := range b {
			if err := fn([]byte(k), v); err != nil {
				return err
			}
		}
		return nil
	}
}

func (m *Memory) DeleteDesired(uid types.UID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketDesired)
	if err != nil {
		return fmt.Errorf("memory state: delete desired pod %s: %w", uid, err)
	}
	delete(b, string(uid))
	return nil
}

func (m *Memory) PutStatus(uid types.UID, s *v1.PodStatus) error {
	val, err := encodeStatus(uid, s)
	if err != nil {
		return fmt.Errorf("memory state: put status: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketStatus)
	if err != nil {
		return fmt.Errorf("memory state: put status for pod %s: %w", uid, err)
	}
	b[string(uid)] = val
	return nil
}

func (m *Memory) GetStatus(uid types.UID) (*v1.PodStatus, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketStatus)
	if err != nil {
		return nil, false, fmt.Errorf("memory state: get status for pod %s: %w", uid, err)
	}
	val, ok := b[string(uid)]
	if !ok {
		return nil, false, nil
	}
	s, err := decodeStatus([]byte(uid), val)
	if err != nil {
		return nil, false, fmt.Errorf("memory state: get status for pod %s: %w", uid, err)
	}
	return s, true, nil
}

func (m *Memory) ListStatus() (map[types.UID]*v1.PodStatus, []RecordError, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketStatus)
	if err != nil {
		return nil, nil, fmt.Errorf("memory state: list status: %w", err)
	}
	out, bad := collectStatus(walkMap(b))
	return out, bad, nil
}

func (m *Memory) DeleteStatus(uid types.UID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketStatus)
	if err != nil {
		return fmt.Errorf("memory state: delete status for pod %s: %w", uid, err)
	}
	delete(b, string(uid))
	return nil
}

func (m *Memory) PutObject(r ObjectRecord) error {
	key, val, err := encodeObject(r)
	if err != nil {
		return fmt.Errorf("memory state: put object: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketObjects)
	if err != nil {
		return fmt.Errorf("memory state: put object %s: %w", key, err)
	}
	b[key] = val
	return nil
}

func (m *Memory) GetObject(kind ObjectKind, namespace, name string) (ObjectRecord, bool, error) {
	key, err := objectKey(kind, namespace, name)
	if err != nil {
		return ObjectRecord{}, false, fmt.Errorf("memory state: get object: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketObjects)
	if err != nil {
		return ObjectRecord{}, false, fmt.Errorf("memory state: get object %s: %w", key, err)
	}
	val, ok := b[key]
	if !ok {
		return ObjectRecord{}, false, nil
	}
	r, err := openAndDecodeObject([]byte(key), val, inClear)
	if err != nil {
		return ObjectRecord{}, false, fmt.Errorf("memory state: get object %s: %w", key, err)
	}
	return r, true, nil
}

// inClear is Memory's way of opening a stored object value: it never seals.
func inClear(_, v []byte) ([]byte, error) { return v, nil }

func (m *Memory) ListObjects() ([]ObjectRecord, []RecordError, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketObjects)
	if err != nil {
		return nil, nil, fmt.Errorf("memory state: list objects: %w", err)
	}
	out, bad := collectObjects(walkMap(b), inClear)
	return out, bad, nil
}

func (m *Memory) DeleteObject(kind ObjectKind, namespace, name string) error {
	key, err := objectKey(kind, namespace, name)
	if err != nil {
		return fmt.Errorf("memory state: delete object: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketObjects)
	if err != nil {
		return fmt.Errorf("memory state: delete object %s: %w", key, err)
	}
	delete(b, key)
	return nil
}

func (m *Memory) PutMarks(marks []SyncMark) error {
	kvs, err := encodeMarks(marks)
	if err != nil {
		return fmt.Errorf("memory state: put sync marks: %w", err)
	}
	if len(kvs) == 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketMarks)
	if err != nil {
		return fmt.Errorf("memory state: put sync marks: %w", err)
	}
	for _, kv := range kvs {
		b[string(kv[0])] = kv[1]
	}
	return nil
}

func (m *Memory) UpdateMarks(put []SyncMark, del []string) error {
	kvs, err := encodeMarks(put)
	if err != nil {
		return fmt.Errorf("memory state: update sync marks: %w", err)
	}
	for i, k := range del {
		if err := checkMarkKey(k); err != nil {
			return fmt.Errorf("memory state: update sync marks: del[%d]: %w", i, err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketMarks)
	if err != nil {
		return fmt.Errorf("memory state: update sync marks: %w", err)
	}
	for _, k := range del {
		delete(b, k)
	}
	for _, kv := range kvs {
		b[string(kv[0])] = kv[1]
	}
	return nil
}

func (m *Memory) ListMarks() (map[string]SyncMark, []RecordError, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketMarks)
	if err != nil {
		return nil, nil, fmt.Errorf("memory state: list sync marks: %w", err)
	}
	out, bad := collectMarks(walkMap(b))
	return out, bad, nil
}

func (m *Memory) DeleteMarks(keys []string) error {
	for i, k := range keys {
		if err := checkMarkKey(k); err != nil {
			return fmt.Errorf("memory state: delete sync marks: keys[%d]: %w", i, err)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketMarks)
	if err != nil {
		return fmt.Errorf("memory state: delete sync marks: %w", err)
	}
	for _, k := range keys {
		delete(b, k)
	}
	return nil
}

func (m *Memory) NextSession() (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	meta, err := m.bucket(bucketMeta)
	if err != nil {
		return 0, fmt.Errorf("memory state: next session: %w", err)
	}
	n, val, err := nextSession(meta[string(keySession)])
	if err != nil {
		return 0, fmt.Errorf("memory state: next session: %w", err)
	}
	meta[string(keySession)] = val
	return n, nil
}

// memOutbox is outboxTx over Memory's maps; m.mu must be held. Memory has no rollback, so the
// shared code must not fail halfway, and over maps nothing can.
type memOutbox struct{ m *Memory }

// outbox returns the outbox of an open Memory; m.mu must be held.
func (m *Memory) outbox() (memOutbox, error) {
	if m.closed {
		return memOutbox{}, errClosed
	}
	return memOutbox{m}, nil
}

func (o memOutbox) entries() map[string][]byte { return o.m.buckets[string(bucketOutbox)] }
func (o memOutbox) index() map[string][]byte   { return o.m.buckets[string(bucketOutboxLatest)] }
func (o memOutbox) meta() map[string][]byte    { return o.m.buckets[string(bucketMeta)] }

func (o memOutbox) walk(from uint64, fn func(uint64, []byte) bool) error {
	// Sorted on every walk: fine for tests, and it keeps Memory a plain map like the others.
	start := string(seqKey(from))
	var keys []string
	for k := range o.entries() {
		if len(k) == 8 && k >= start {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !fn(binary.BigEndian.Uint64([]byte(k)), o.entries()[k]) {
			return nil
		}
	}
	return nil
}

func (o memOutbox) get(seq uint64) []byte { return o.entries()[string(seqKey(seq))] }

func (o memOutbox) put(seq uint64, val []byte) error {
	o.entries()[string(seqKey(seq))] = val
	return nil
}

func (o memOutbox) del(seq uint64) error {
	delete(o.entries(), string(seqKey(seq)))
	return nil
}

func (o memOutbox) latest(topic string) (uint64, bool) {
	v, ok := o.index()[topic]
	if !ok || len(v) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(v), true
}

func (o memOutbox) setLatest(topic string, seq uint64) error {
	o.index()[topic] = seqKey(seq)
	return nil
}

func (o memOutbox) delLatest(topic string) error {
	delete(o.index(), topic)
	return nil
}

func (o memOutbox) nextSeq() (uint64, error) {
	o.m.outboxSeq++
	return o.m.outboxSeq, nil
}

func (o memOutbox) counters() []byte { return o.meta()[string(keyOutboxCounters)] }

func (o memOutbox) setCounters(val []byte) error {
	o.meta()[string(keyOutboxCounters)] = val
	return nil
}

func (m *Memory) OutboxPut(entries []OutboxEntry, lim OutboxLimits) ([]uint64, error) {
	if err := checkOutbox(entries); err != nil {
		return nil, fmt.Errorf("memory state: outbox put: %w", err)
	}
	if len(entries) == 0 {
		return []uint64{}, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	o, err := m.outbox()
	if err != nil {
		return nil, fmt.Errorf("memory state: outbox put: %w", err)
	}
	seqs, refused, err := outboxPut(o, entries, lim)
	if err != nil {
		return nil, fmt.Errorf("memory state: outbox put of %d entries (first for topic %s): %w", len(entries), entries[0].Topic, err)
	}
	return seqs, refusedError("memory state", refused)
}

func (m *Memory) OutboxList(limit int) ([]OutboxEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, err := m.outbox()
	if err != nil {
		return nil, fmt.Errorf("memory state: outbox list: %w", err)
	}
	out, err := outboxList(o, limit)
	if err != nil {
		return nil, fmt.Errorf("memory state: outbox list: %w", err)
	}
	return out, nil
}

func (m *Memory) OutboxAck(topic string, seq uint64) error {
	return m.OutboxAckMany([]OutboxRef{{Topic: topic, Seq: seq}})
}

func (m *Memory) OutboxAckMany(acks []OutboxRef) error {
	if len(acks) == 0 {
		return nil // as on DB: no transaction at all
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	o, err := m.outbox()
	if err == nil {
		err = outboxAckMany(o, acks)
	}
	if err != nil {
		return fmt.Errorf("memory state: outbox ack of %s: %w", ackDescription(acks), err)
	}
	return nil
}

func (m *Memory) OutboxStats() (OutboxStats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, err := m.outbox()
	if err != nil {
		return OutboxStats{}, fmt.Errorf("memory state: outbox stats: %w", err)
	}
	st, err := outboxStats(o)
	if err != nil {
		return OutboxStats{}, fmt.Errorf("memory state: outbox stats: %w", err)
	}
	return st, nil
}

func (m *Memory) Notices() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.notices...)
}

// Close makes every later call fail, as it does on DB.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}
