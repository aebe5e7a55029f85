package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"
	"k8s.io/apimachinery/pkg/types"
)

// MaxEventsPerRecord is the most events one pod's record may hold. The agent's recorder keeps far
// fewer; the store's own bound only makes sure that a caller's bug cannot grow one value without
// limit.
const MaxEventsPerRecord = 1000

// EventRecord is one deduplicated event about a pod: the same event seen again raises Count and
// moves LastTime, as kubelet's event correlator does.
type EventRecord struct {
	Type    string // Normal or Warning
	Reason  string // CamelCase: Pulling, Started, BackOff, ...
	Message string
	// Source is where the event's cause came from (event.Event.Source: a manifest file, a topic);
	// empty for what the node did on its own.
	Source string
	// FieldPath names the container the event is about ("spec.containers{web}"); empty for the pod.
	FieldPath string
	Count     int32
	FirstTime time.Time
	LastTime  time.Time
}

// PodEvents is the list of events kept for one pod, keyed by its UID, in the order the caller
// gives (the recorder keeps them oldest first).
type PodEvents struct {
	UID       types.UID
	Namespace string
	Name      string
	Events    []EventRecord
}

// podEventsRecord is the JSON of an events value; the UID is the key's.
type podEventsRecord struct {
	Namespace string        `json:"namespace"`
	Name      string        `json:"name"`
	Events    []eventRecord `json:"events"`
}

// eventRecord is EventRecord as stored, with tags of its own so that the layout is the store's.
// Times keep nanoseconds (RFC 3339): they order events, and two in one second are common.
type eventRecord struct {
	Type      string    `json:"type"`
	Reason    string    `json:"reason"`
	Message   string    `json:"message"`
	Source    string    `json:"source,omitempty"`
	FieldPath string    `json:"fieldPath,omitempty"`
	Count     int32     `json:"count"`
	FirstTime time.Time `json:"firstTime"`
	LastTime  time.Time `json:"lastTime"`
}

// checkEvents is what every implementation of State refuses to store.
func checkEvents(p PodEvents) error {
	if p.UID == "" {
		return fmt.Errorf("events of pod %s/%s: empty pod uid", p.Namespace, p.Name)
	}
	if p.Namespace == "" || p.Name == "" {
		return fmt.Errorf("events of pod uid %s: namespace %q or name %q is empty", p.UID, p.Namespace, p.Name)
	}
	if len(p.Events) == 0 {
		return fmt.Errorf("events of pod %s/%s (uid %s): no events (delete the record instead)", p.Namespace, p.Name, p.UID)
	}
	if len(p.Events) > MaxEventsPerRecord {
		return fmt.Errorf("events of pod %s/%s (uid %s): %d events, the most one record holds is %d",
			p.Namespace, p.Name, p.UID, len(p.Events), MaxEventsPerRecord)
	}
	for i, e := range p.Events {
		if err := checkEvent(e); err != nil {
			return fmt.Errorf("events of pod %s/%s (uid %s): events[%d]: %w", p.Namespace, p.Name, p.UID, i, err)
		}
	}
	return nil
}

func checkEvent(e EventRecord) error {
	switch {
	case e.Type == "" || e.Reason == "":
		return fmt.Errorf("type %q or reason %q is empty", e.Type, e.Reason)
	case e.Count < 1:
		return fmt.Errorf("%s: count %d, want at least 1", e.Reason, e.Count)
	case e.FirstTime.IsZero() || e.LastTime.IsZero():
		return fmt.Errorf("%s: firstTime or lastTime is zero", e.Reason)
	case e.LastTime.Before(e.FirstTime):
		return fmt.Errorf("%s: lastTime %s is before firstTime %s", e.Reason, e.LastTime.Format(time.RFC3339Nano), e.FirstTime.Format(time.RFC3339Nano))
	}
	return nil
}

func encodeEvents(p PodEvents) ([]byte, error) {
	if err := checkEvents(p); err != nil {
		return nil, err
	}
	r := podEventsRecord{Namespace: p.Namespace, Name: p.Name, Events: make([]eventRecord, len(p.Events))}
	for i, e := range p.Events {
		r.Events[i] = eventRecord(e)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode events of pod %s: %w", p.UID, err)
	}
	return b, nil
}

// decodeEvents decodes the record stored under key (a pod UID); the error is a RecordError.
func decodeEvents(key, val []byte) (PodEvents, error) {
	bad := func(err error) (PodEvents, error) {
		return PodEvents{}, RecordError{Bucket: string(bucketEvents), Key: string(key), Err: err}
	}
	if val == nil {
		return bad(errors.New("a nested bucket, not a record"))
	}
	var r podEventsRecord
	if err := json.Unmarshal(val, &r); err != nil {
		return bad(err)
	}
	p := PodEvents{UID: types.UID(key), Namespace: r.Namespace, Name: r.Name, Events: make([]EventRecord, len(r.Events))}
	for i, e := range r.Events {
		p.Events[i] = EventRecord(e)
	}
	if err := checkEvents(p); err != nil {
		return bad(err)
	}
	return p, nil
}

// encodeEventsUpdate checks and encodes an UpdateEvents request before anything is written, so
// that bad input changes nothing. A UID may appear once.
func encodeEventsUpdate(put []PodEvents, del []types.UID) (map[types.UID][]byte, error) {
	vals := make(map[types.UID][]byte, len(put))
	for i, p := range put {
		val, err := encodeEvents(p)
		if err != nil {
			return nil, fmt.Errorf("put[%d]: %w", i, err)
		}
		if _, dup := vals[p.UID]; dup {
			return nil, fmt.Errorf("put[%d]: uid %s appears twice", i, p.UID)
		}
		vals[p.UID] = val
	}
	for i, uid := range del {
		if uid == "" {
			return nil, fmt.Errorf("del[%d]: empty uid", i)
		}
		if _, both := vals[uid]; both {
			return nil, fmt.Errorf("del[%d]: uid %s is also in put", i, uid)
		}
	}
	return vals, nil
}

// collectEvents decodes every record a walk of the events bucket yields, for DB and Memory alike,
// sorted by namespace, name and UID.
func collectEvents(walk func(func(k, v []byte) error) error) ([]PodEvents, []RecordError) {
	var out []PodEvents
	var bad []RecordError
	walk(func(k, v []byte) error {
		p, err := decodeEvents(k, v)
		if err != nil {
			bad = append(bad, asRecordError(err))
		} else {
			out = append(out, p)
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.UID < b.UID
	})
	sortRecordErrors(bad)
	return out, bad
}

// UpdateEvents replaces the event lists of the pods in put and deletes those of the UIDs in del (a
// missing one is not an error), in one transaction: the recorder flushes a burst of events for
// many pods with one fsync. Invalid input is refused before anything is written.
func (d *DB) UpdateEvents(put []PodEvents, del []types.UID) error {
	vals, err := encodeEventsUpdate(put, del)
	if err != nil {
		return fmt.Errorf("state db %s: update events: %w", d.path, err)
	}
	if len(vals) == 0 && len(del) == 0 {
		return nil
	}
	// Update, not Batch: the request is already one transaction (see UpdateDesired).
	err = d.bolt.Update(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketEvents)
		if err != nil {
			return err
		}
		for _, uid := range del {
			if err := b.Delete([]byte(uid)); err != nil {
				return fmt.Errorf("delete %s: %w", uid, err)
			}
		}
		for uid, val := range vals {
			if err := b.Put([]byte(uid), val); err != nil {
				return fmt.Errorf("put %s: %w", uid, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("state db %s: update events (%d pods put, %d deleted): %w", d.path, len(vals), len(del), err)
	}
	return nil
}

// GetEvents returns the events of the pod with uid, and false if none are stored. A record that
// cannot be decoded is an error (a RecordError naming bucket and key, wrapped).
func (d *DB) GetEvents(uid types.UID) (PodEvents, bool, error) {
	var (
		p     PodEvents
		found bool
	)
	err := d.bolt.View(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketEvents)
		if err != nil {
			return err
		}
		val := b.Get([]byte(uid))
		if val == nil {
			return nil
		}
		found = true
		p, err = decodeEvents([]byte(uid), val)
		return err
	})
	if err != nil {
		return PodEvents{}, false, fmt.Errorf("state db %s: get events of pod %s: %w", d.path, uid, err)
	}
	return p, found, nil
}

// ListEvents returns every pod's events sorted by namespace, name and UID, and a RecordError for
// each record that could not be decoded and was skipped.
func (d *DB) ListEvents() (out []PodEvents, bad []RecordError, err error) {
	err = d.bolt.View(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketEvents)
		if err != nil {
			return err
		}
		out, bad = collectEvents(b.ForEach)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("state db %s: list events: %w", d.path, err)
	}
	return out, bad, nil
}

// DeleteEvents removes the events of the pod with uid; a missing record is not an error.
func (d *DB) DeleteEvents(uid types.UID) error {
	if uid == "" {
		return fmt.Errorf("state db %s: delete events: empty pod uid", d.path)
	}
	err := d.bolt.Batch(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketEvents)
		if err != nil {
			return err
		}
		return b.Delete([]byte(uid))
	})
	if err != nil {
		return fmt.Errorf("state db %s: delete events of pod %s: %w", d.path, uid, err)
	}
	return nil
}

// UpdateEvents is DB.UpdateEvents in memory.
func (m *Memory) UpdateEvents(put []PodEvents, del []types.UID) error {
	vals, err := encodeEventsUpdate(put, del)
	if err != nil {
		return fmt.Errorf("memory state: update events: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketEvents)
	if err != nil {
		return fmt.Errorf("memory state: update events: %w", err)
	}
	for _, uid := range del {
		delete(b, string(uid))
	}
	for uid, val := range vals {
		b[string(uid)] = val
	}
	return nil
}

// GetEvents is DB.GetEvents in memory.
func (m *Memory) GetEvents(uid types.UID) (PodEvents, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketEvents)
	if err != nil {
		return PodEvents{}, false, fmt.Errorf("memory state: get events of pod %s: %w", uid, err)
	}
	val, ok := b[string(uid)]
	if !ok {
		return PodEvents{}, false, nil
	}
	p, err := decodeEvents([]byte(uid), val)
	if err != nil {
		return PodEvents{}, false, fmt.Errorf("memory state: get events of pod %s: %w", uid, err)
	}
	return p, true, nil
}

// ListEvents is DB.ListEvents in memory.
func (m *Memory) ListEvents() ([]PodEvents, []RecordError, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketEvents)
	if err != nil {
		return nil, nil, fmt.Errorf("memory state: list events: %w", err)
	}
	out, bad := collectEvents(walkMap(b))
	return out, bad, nil
}

// DeleteEvents is DB.DeleteEvents in memory.
func (m *Memory) DeleteEvents(uid types.UID) error {
	if uid == "" {
		return errors.New("memory state: delete events: empty pod uid")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.bucket(bucketEvents)
	if err != nil {
		return fmt.Errorf("memory state: delete events of pod %s: %w", uid, err)
	}
	delete(b, string(uid))
	return nil
}
