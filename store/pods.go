package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// DesiredPod is a pod the agent should run, keyed by Pod.UID, and where it came from.
type DesiredPod struct {
	Pod    *v1.Pod
	Source string // e.g. "file:/etc/mqlet/pods/web.yaml#0"; opaque to the store except for ReplaceDesired's prefix
}

// desiredRecord is the JSON stored in desired_pods.
type desiredRecord struct {
	Source string  `json:"source"`
	Pod    *v1.Pod `json:"pod"`
}

func encodeDesired(p DesiredPod) ([]byte, error) {
	if p.Pod == nil {
		return nil, errors.New("desired pod has no Pod")
	}
	if p.Pod.UID == "" {
		return nil, fmt.Errorf("desired pod %s/%s has no metadata.uid", p.Pod.Namespace, p.Pod.Name)
	}
	b, err := json.Marshal(desiredRecord{Source: p.Source, Pod: p.Pod})
	if err != nil {
		return nil, fmt.Errorf("encode desired pod %s: %w", p.Pod.UID, err)
	}
	return b, nil
}

func decodeDesired(key, val []byte) (DesiredPod, error) {
	var r desiredRecord
	if err := json.Unmarshal(val, &r); err != nil {
		return DesiredPod{}, fmt.Errorf("decode %s/%s: %w", bucketDesired, key, err)
	}
	if r.Pod == nil {
		return DesiredPod{}, fmt.Errorf("decode %s/%s: record has no pod", bucketDesired, key)
	}
	return DesiredPod{Pod: r.Pod, Source: r.Source}, nil
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

// GetDesired returns the desired pod with uid, and false if there is none.
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

// ListDesired returns all desired pods sorted by namespace/name (then UID, so the order is total).
func (d *DB) ListDesired() ([]DesiredPod, error) {
	var pods []DesiredPod
	err := d.bolt.View(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketDesired)
		if err != nil {
			return err
		}
		return b.ForEach(func(k, v []byte) error {
			p, err := decodeDesired(k, v)
			if err != nil {
				return err
			}
			pods = append(pods, p)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("state db %s: list desired pods: %w", d.path, err)
	}
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
	return pods, nil
}

// ReplaceDesired makes the desired pods whose Source starts with sourcePrefix exactly pods, in one
// transaction: it puts every pod and deletes the pods of that prefix whose UID is not in the list.
// Every pod's Source must start with sourcePrefix. A pod whose UID is stored under another source
// is overwritten, i.e. it moves to this source. Returns the deleted UIDs, sorted.
func (d *DB) ReplaceDesired(sourcePrefix string, pods []DesiredPod) (deleted []types.UID, err error) {
	vals := make(map[types.UID][]byte, len(pods))
	for i, p := range pods {
		val, err := encodeDesired(p)
		if err != nil {
			return nil, fmt.Errorf("state db %s: replace desired %q: pod %d: %w", d.path, sourcePrefix, i, err)
		}
		uid := p.Pod.UID
		if !strings.HasPrefix(p.Source, sourcePrefix) {
			return nil, fmt.Errorf("state db %s: replace desired %q: pod %s has source %q outside that prefix",
				d.path, sourcePrefix, uid, p.Source)
		}
		if _, dup := vals[uid]; dup {
			return nil, fmt.Errorf("state db %s: replace desired %q: uid %s appears twice", d.path, sourcePrefix, uid)
		}
		vals[uid] = val
	}
	err = d.bolt.Update(func(tx *bolt.Tx) error {
		deleted = deleted[:0]
		b, err := bucket(tx, bucketDesired)
		if err != nil {
			return err
		}
		var stale [][]byte
		err = b.ForEach(func(k, v []byte) error {
			if _, keep := vals[types.UID(k)]; keep {
				return nil
			}
			var r desiredRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("decode %s/%s: %w", bucketDesired, k, err)
			}
			if strings.HasPrefix(r.Source, sourcePrefix) {
				// Keys are only valid during the transaction and must not be deleted mid-iteration.
				stale = append(stale, append([]byte(nil), k...))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range stale {
			if err := b.Delete(k); err != nil {
				return fmt.Errorf("delete %s: %w", k, err)
			}
			deleted = append(deleted, types.UID(k))
		}
		for uid, val := range vals {
			if err := b.Put([]byte(uid), val); err != nil {
				return fmt.Errorf("put %s: %w", uid, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("state db %s: replace desired %q: %w", d.path, sourcePrefix, err)
	}
	return deleted, nil
}

// PutStatus stores the last observed status of pod uid.
func (d *DB) PutStatus(uid types.UID, s *v1.PodStatus) error {
	if uid == "" {
		return fmt.Errorf("state db %s: put status: empty pod uid", d.path)
	}
	if s == nil {
		return fmt.Errorf("state db %s: put status for pod %s: nil status", d.path, uid)
	}
	// Encoded outside the batch: Batch may run the function more than once.
	val, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("state db %s: encode status for pod %s: %w", d.path, uid, err)
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

// GetStatus returns the stored status of pod uid, and false if there is none.
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
		s = new(v1.PodStatus)
		if err := json.Unmarshal(val, s); err != nil {
			return fmt.Errorf("decode %s/%s: %w", bucketStatus, uid, err)
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("state db %s: get status for pod %s: %w", d.path, uid, err)
	}
	return s, s != nil, nil
}

// ListStatus returns every stored pod status by pod UID.
func (d *DB) ListStatus() (map[types.UID]*v1.PodStatus, error) {
	out := make(map[types.UID]*v1.PodStatus)
	err := d.bolt.View(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketStatus)
		if err != nil {
			return err
		}
		return b.ForEach(func(k, v []byte) error {
			s := new(v1.PodStatus)
			if err := json.Unmarshal(v, s); err != nil {
				return fmt.Errorf("decode %s/%s: %w", bucketStatus, k, err)
			}
			out[types.UID(k)] = s
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("state db %s: list status: %w", d.path, err)
	}
	return out, nil
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
