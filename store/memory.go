package store

import (
	"errors"
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Memory is the in-memory twin of DB for unit tests. It keeps records encoded exactly as DB stores
// them, so it has the same semantics down to the details: callers never share objects with it,
// times come back with whole seconds, input DB refuses is refused, and a record that cannot be
// decoded degrades the same way (see SetRaw). It writes nothing to disk.
type Memory struct {
	mu      sync.Mutex
	closed  bool
	buckets map[string]map[string][]byte
	notices []string
}

var _ State = (*Memory)(nil)

// errClosed is what Memory returns after Close, as DB does once its file is closed.
var errClosed = errors.New("state is closed")

// NewMemory returns an empty in-memory state.
func NewMemory() *Memory {
	return &Memory{buckets: map[string]map[string][]byte{
		string(bucketDesired): {},
		string(bucketStatus):  {},
	}}
}

// SetRaw stores val under bucket/key as it is, bypassing the encoders, so that a test can plant a
// record that does not decode ("desired_pods" or "pod_status"; see the package comment).
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
