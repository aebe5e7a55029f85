package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/mqlet/mqlet/core/source"
	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// DesiredPod is a pod the agent should run, keyed by Pod.UID, with where it came from.
type DesiredPod struct {
	Pod    *v1.Pod
	Source source.Ref
	// Generation is the source's generation of this pod (0 when the source has none); the store
	// keeps it and does not compare it.
	Generation int64
}

// sourceRecord is source.Ref as stored. It has its own tags so that a change to source.Ref's
// JSON (which is not the store's) cannot silently change the file layout; every field is written,
// so a record says "doc 0" instead of leaving it to a default.
type sourceRecord struct {
	Kind   string `json:"kind"`
	Origin string `json:"origin"`
	Doc    int    `json:"doc"`
}

// desiredRecord is the JSON stored in desired_pods at schema version 2.
type desiredRecord struct {
	Source     sourceRecord `json:"source"`
	Generation int64        `json:"generation"`
	Pod        *v1.Pod      `json:"pod"`
}

// checkDesired is what every implementation of State refuses to store.
func checkDesired(p DesiredPod) error {
	if p.Pod == nil {
		return errors.New("desired pod has no Pod")
	}
	if p.Pod.UID == "" {
		return fmt.Errorf("desired pod %s/%s has no metadata.uid", p.Pod.Namespace, p.Pod.Name)
	}
	if p.Source.Kind == "" {
		return fmt.Errorf("desired pod %s/%s (uid %s) has no source kind", p.Pod.Namespace, p.Pod.Name, p.Pod.UID)
	}
	return nil
}

func encodeDesired(p DesiredPod) ([]byte, error) {
	if err := checkDesired(p); err != nil {
		return nil, err
	}
	r := desiredRecord{
		Source:     sourceRecord{Kind: string(p.Source.Kind), Origin: p.Source.Origin, Doc: p.Source.Doc},
		Generation: p.Generation,
		Pod:        p.Pod,
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode desired pod %s: %w", p.Pod.UID, err)
	}
	return b, nil
}

// decodeDesired decodes the record stored under key; the error is a RecordError.
func decodeDesired(key, val []byte) (DesiredPod, error) {
	bad := func(err error) (DesiredPod, error) {
		return DesiredPod{}, RecordError{Bucket: string(bucketDesired), Key: string(key), Err: err}
	}
	if val == nil {
		return bad(errors.New("a nested bucket, not a record"))
	}
	var r desiredRecord
	if err := json.Unmarshal(val, &r); err != nil {
		return bad(err)
	}
	if r.Pod == nil {
		return bad(errors.New("record has no pod"))
	}
	// A pod stored under another pod's key would be run, stopped and reported under the wrong UID.
	if string(r.Pod.UID) != string(key) {
		return bad(fmt.Errorf("record holds pod %s/%s with uid %q", r.Pod.Namespace, r.Pod.Name, r.Pod.UID))
	}
	return DesiredPod{
		Pod:        r.Pod,
		Source:     source.Ref{Kind: source.Kind(r.Source.Kind), Origin: r.Source.Origin, Doc: r.Source.Doc},
		Generation: r.Generation,
	}, nil
}

func checkStatus(uid types.UID, s *v1.PodStatus) error {
	if uid == "" {
		return errors.New("empty pod uid")
	}
	if s == nil {
		return fmt.Errorf("pod %s: nil status", uid)
	}
	return nil
}

func encodeStatus(uid types.UID, s *v1.PodStatus) ([]byte, error) {
	if err := checkStatus(uid, s); err != nil {
		return nil, err
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encode status for pod %s: %w", uid, err)
	}
	return b, nil
}

// decodeStatus decodes the status stored under key; the error is a RecordError.
func decodeStatus(key, val []byte) (*v1.PodStatus, error) {
	if val == nil {
		return nil, RecordError{Bucket: string(bucketStatus), Key: string(key), Err: errors.New("a nested bucket, not a record")}
	}
	s := new(v1.PodStatus)
	if err := json.Unmarshal(val, s); err != nil {
		return nil, RecordError{Bucket: string(bucketStatus), Key: string(key), Err: err}
	}
	return s, nil
}

// sortDesired orders pods by namespace/name, then UID, so that the order is total.
func sortDesired(pods []DesiredPod) {
	sort.Slice(pods, func(i, j int) bool {
		a, b := pods[i].Pod, pods[j].Pod
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.UID < b.UID
	})
}

// encodeUpdate checks and encodes an UpdateDesired request before anything is written, so that
// bad input changes nothing. A UID may appear once: twice in put, or in both put and del, has no
// single meaning.
func encodeUpdate(put []DesiredPod, del []types.UID) (map[types.UID][]byte, error) {
	vals := make(map[types.UID][]byte, len(put))
	for i, p := range put {
		val, err := encodeDesired(p)
		if err != nil {
			return nil, fmt.Errorf("put[%d]: %w", i, err)
		}
		if _, dup := vals[p.Pod.UID]; dup {
			return nil, fmt.Errorf("put[%d]: uid %s appears twice", i, p.Pod.UID)
		}
		vals[p.Pod.UID] = val
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

// bucket returns a bucket that Open guaranteed exists; a nil here means the file was changed
// under us, which is reported rather than dereferenced.
func bucket(tx *bolt.Tx, name []byte) (*bolt.Bucket, error) {
	b := tx.Bucket(name)
	if b == nil {
		return nil, fmt.Errorf("bucket %q is missing", name)
	}
	return b, nil
}

var _ State = (*DB)(nil)

// PutDesired stores p under p.Pod.UID, replacing any previous record for that UID.
func (d *DB) PutDesired(p DesiredPod) error {
	val, err := encodeDesired(p)
	if err != nil {
		return fmt.Errorf("state db %s: put desired: %w", d.path, err)
	}
	uid := p.Pod.UID
	err = d.bolt.Batch(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketDesired)
		if err != nil {
			return err
		}
		return b.Put([]byte(uid), val)
	})
	if err != nil {
		return fmt.Errorf("state db %s: put desired pod %s: %w", d.path, uid, err)
	}
	return nil
}

// UpdateDesired puts every pod in put and deletes every UID in del (a missing one is not an
// error) in one transaction. Invalid input (a pod without UID or source kind, a UID twice) is
// refused before anything is written.
func (d *DB) UpdateDesired(put []DesiredPod, del []types.UID) error {
	vals, err := encodeUpdate(put, del)
	if err != nil {
		return fmt.Errorf("state db %s: update desired pods: %w", d.path, err)
	}
	if len(vals) == 0 && len(del) == 0 {
		return nil
	}
	// Update, not Batch: the request is already one transaction, and Batch could rerun it alone
	// after another caller's failure.
	err = d.bolt.Update(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketDesired)
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
		return fmt.Errorf("state db %s: update desired pods (%d put, %d deleted): %w", d.path, len(vals), len(del), err)
	}
	return nil
}

// DeleteDesired removes the desired pod with uid; a missing uid is not an error.
func (d *DB) DeleteDesired(uid types.UID) error {
	err := d.bolt.Batch(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketDesired)
		if err != nil {
			return err
		}
		return b.Delete([]byte(uid))
	})
	if err != nil {
		return fmt.Errorf("state db %s: delete desired pod %s: %w", d.path, uid, err)
	}
	return nil
}

// GetDesired returns the desired pod with uid, and false if there is none. A record that cannot be
// decoded is an error (a RecordError naming bucket and key, wrapped).
func (d *DB) GetDesired(uid types.UID) (DesiredPod, bool, error) {
	var (
		p     DesiredPod
		found bool
	)
	err := d.bolt.View(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketDesired)
		if err != nil {
			return err
		}
		val := b.Get([]byte(uid))
		if val == nil {
			return nil
		}
		found = true
		p, err = decodeDesired([]byte(uid), val)
		return err
	})
	if err != nil {
		return DesiredPod{}, false, fmt.Errorf("state db %s: get desired pod %s: %w", d.path, uid, err)
	}
	return p, found, nil
}

// ListDesired returns the desired pods sorted by namespace/name (then UID), and a RecordError for
// each record that could not be decoded and was skipped.
func (d *DB) ListDesired() (pods []DesiredPod, bad []RecordError, err error) {
	err = d.bolt.View(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketDesired)
		if err != nil {
			return err
		}
		pods, bad = collectDesired(b.ForEach)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("state db %s: list desired pods: %w", d.path, err)
	}
	return pods, bad, nil
}

// collectDesired decodes every record a walk of desired_pods yields, for DB and Memory alike: the
// good ones sorted, the undecodable ones as RecordErrors.
func collectDesired(walk func(func(k, v []byte) error) error) ([]DesiredPod, []RecordError) {
	var pods []DesiredPod
	var bad []RecordError
	walk(func(k, v []byte) error {
		if p, err := decodeDesired(k, v); err != nil {
			bad = append(bad, asRecordError(err))
		} else {
			pods = append(pods, p)
		}
		return nil
	})
	sortDesired(pods)
	sortRecordErrors(bad)
	return pods, bad
}

// collectStatus is collectDesired for pod_status.
func collectStatus(walk func(func(k, v []byte) error) error) (map[types.UID]*v1.PodStatus, []RecordError) {
	out := map[types.UID]*v1.PodStatus{}
	var bad []RecordError
	walk(func(k, v []byte) error {
		if s, err := decodeStatus(k, v); err != nil {
			bad = append(bad, asRecordError(err))
		} else {
			out[types.UID(k)] = s
		}
		return nil
	})
	sortRecordErrors(bad)
	return out, bad
}

// PutStatus stores the last observed status of pod uid. Concurrent calls are folded into one
// transaction (one fsync): pod workers call it in bursts.
func (d *DB) PutStatus(uid types.UID, s *v1.PodStatus) error {
	// Encoded outside the batch: Batch may run the function more than once.
	val, err := encodeStatus(uid, s)
	if err != nil {
		return fmt.Errorf("state db %s: put status: %w", d.path, err)
	}
	err = d.bolt.Batch(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketStatus)
		if err != nil {
			return err
		}
		return b.Put([]byte(uid), val)
	})
	if err != nil {
		return fmt.Errorf("state db %s: put status for pod %s: %w", d.path, uid, err)
	}
	return nil
}

// GetStatus returns the stored status of pod uid, and false if there is none. A record that cannot
// be decoded is an error (a RecordError naming bucket and key, wrapped).
func (d *DB) GetStatus(uid types.UID) (*v1.PodStatus, bool, error) {
	var s *v1.PodStatus
	err := d.bolt.View(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketStatus)
		if err != nil {
			return err
		}
		val := b.Get([]byte(uid))
		if val == nil {
			return nil
		}
		s, err = decodeStatus([]byte(uid), val)
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("state db %s: get status for pod %s: %w", d.path, uid, err)
	}
	return s, s != nil, nil
}

// ListStatus returns every stored pod status by pod UID, and a RecordError for each record that
// could not be decoded and was skipped.
func (d *DB) ListStatus() (out map[types.UID]*v1.PodStatus, bad []RecordError, err error) {
	err = d.bolt.View(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketStatus)
		if err != nil {
			return err
		}
		out, bad = collectStatus(b.ForEach)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("state db %s: list status: %w", d.path, err)
	}
	return out, bad, nil
}

// DeleteStatus removes the stored status of pod uid; a missing uid is not an error.
func (d *DB) DeleteStatus(uid types.UID) error {
	err := d.bolt.Batch(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketStatus)
		if err != nil {
			return err
		}
		return b.Delete([]byte(uid))
	})
	if err != nil {
		return fmt.Errorf("state db %s: delete status for pod %s: %w", d.path, uid, err)
	}
	return nil
}

func asRecordError(err error) RecordError {
	var re RecordError
	if errors.As(err, &re) {
		return re
	}
	return RecordError{Err: err}
}

// sortRecordErrors orders by key, the order in which bbolt walks a bucket.
func sortRecordErrors(errs []RecordError) {
	sort.Slice(errs, func(i, j int) bool { return errs[i].Key < errs[j].Key })
}
