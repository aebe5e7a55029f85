package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	bolt "go.etcd.io/bbolt"
)

// SyncMark is what the MQTT source has taken in for one object: the generation and payload digest
// of the outcome it reached (applied, or refused with a reason). One mark, under a key that is not
// an object key, holds the last verified index itself (Data), so a restarted node knows every entry
// of it, not just its revision.
type SyncMark struct {
	Key        string // e.g. "pods/default/web", "configmaps/ns/x", "secrets/ns/y"
	Generation int64
	Digest     string // of the desired payload taken in (or, for the index mark, of the index)
	// Refused is why the node refused this generation; empty when it was applied.
	Refused string
	// Data is the index payload, for the index mark only.
	Data []byte
	// Deleted is only ever read: it marks tombstones written by protocol v1 nodes, which a v2
	// node drops.
	Deleted bool
}

// markRecord is the JSON of a sync_marks value; the key is the mark's.
type markRecord struct {
	Generation int64  `json:"generation"`
	Deleted    bool   `json:"deleted,omitempty"`
	Digest     string `json:"digest,omitempty"`
	Refused    string `json:"refused,omitempty"`
	Data       []byte `json:"data,omitempty"`
}

// encodeMarks checks and encodes marks before anything is written, so that bad input changes
// nothing. The order is kept: when a key appears twice the later mark is the one stored, as if
// the marks had been put one by one.
func encodeMarks(marks []SyncMark) ([][2][]byte, error) {
	out := make([][2][]byte, 0, len(marks))
	for i, m := range marks {
		if err := checkMarkKey(m.Key); err != nil {
			return nil, fmt.Errorf("marks[%d]: %w", i, err)
		}
		val, err := json.Marshal(markRecord{Generation: m.Generation, Deleted: m.Deleted, Digest: m.Digest, Refused: m.Refused, Data: m.Data})
		if err != nil {
			return nil, fmt.Errorf("marks[%d] %s: %w", i, m.Key, err)
		}
		out = append(out, [2][]byte{[]byte(m.Key), val})
	}
	return out, nil
}

func checkMarkKey(key string) error {
	if key == "" {
		return errors.New("empty key")
	}
	// bbolt's limit; a key this long is a bug upstream, better refused here than by bbolt
	// in the middle of a transaction.
	if len(key) > bolt.MaxKeySize {
		return fmt.Errorf("key of %d bytes, longer than %d", len(key), bolt.MaxKeySize)
	}
	return nil
}

func decodeMark(key, val []byte) (SyncMark, error) {
	if val == nil {
		return SyncMark{}, RecordError{Bucket: string(bucketMarks), Key: string(key), Err: errors.New("a nested bucket, not a record")}
	}
	var r markRecord
	if err := json.Unmarshal(val, &r); err != nil {
		return SyncMark{}, RecordError{Bucket: string(bucketMarks), Key: string(key), Err: err}
	}
	return SyncMark{Key: string(key), Generation: r.Generation, Deleted: r.Deleted, Digest: r.Digest, Refused: r.Refused, Data: r.Data}, nil
}

// collectMarks decodes every record a walk of sync_marks yields, for DB and Memory alike.
func collectMarks(walk func(func(k, v []byte) error) error) (map[string]SyncMark, []RecordError) {
	out := map[string]SyncMark{}
	var bad []RecordError
	walk(func(k, v []byte) error {
		if m, err := decodeMark(k, v); err != nil {
			bad = append(bad, asRecordError(err))
		} else {
			out[m.Key] = m
		}
		return nil
	})
	sortRecordErrors(bad)
	return out, bad
}

// nextSession returns the number after the one stored (nil: none yet, so 1) and its encoding.
// A stored value that is not a positive number is an error, not a restart at 1: sessions must
// never repeat, since the control plane tells an old session's Last Will from a new one by it.
func nextSession(stored []byte) (int64, []byte, error) {
	var last int64
	if stored != nil {
		n, err := strconv.ParseInt(string(stored), 10, 64)
		if err != nil || n < 1 {
			return 0, nil, fmt.Errorf("%s/%s is %q, want a positive decimal number; set it to a number above any session "+
				"this node has announced (or move the state file aside)", bucketMeta, keySession, stored)
		}
		last = n
	}
	next := last + 1
	return next, []byte(strconv.FormatInt(next, 10)), nil
}

// PutMarks stores marks, each replacing the previous mark for its key, in one transaction (one
// fsync; concurrent calls are folded together). Invalid input (an empty key) is refused before
// anything is written.
func (d *DB) PutMarks(marks []SyncMark) error {
	kvs, err := encodeMarks(marks)
	if err != nil {
		return fmt.Errorf("state db %s: put sync marks: %w", d.path, err)
	}
	if len(kvs) == 0 {
		return nil
	}
	err = d.bolt.Batch(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketMarks)
		if err != nil {
			return err
		}
		for _, kv := range kvs {
			if err := b.Put(kv[0], kv[1]); err != nil {
				return fmt.Errorf("put %s: %w", kv[0], err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("state db %s: put %d sync marks (first %s): %w", d.path, len(kvs), kvs[0][0], err)
	}
	return nil
}

// UpdateMarks stores put and removes the marks with keys in del, in one transaction (one fsync;
// concurrent calls are folded together): the MQTT source's view of an index and the outcomes it
// implies change together or not at all. Invalid input is refused before anything is written.
func (d *DB) UpdateMarks(put []SyncMark, del []string) error {
	kvs, err := encodeMarks(put)
	if err != nil {
		return fmt.Errorf("state db %s: update sync marks: %w", d.path, err)
	}
	for i, k := range del {
		if err := checkMarkKey(k); err != nil {
			return fmt.Errorf("state db %s: update sync marks: del[%d]: %w", d.path, i, err)
		}
	}
	if len(kvs) == 0 && len(del) == 0 {
		return nil
	}
	err = d.bolt.Batch(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketMarks)
		if err != nil {
			return err
		}
		for _, k := range del {
			if err := b.Delete([]byte(k)); err != nil {
				return fmt.Errorf("delete %s: %w", k, err)
			}
		}
		for _, kv := range kvs {
			if err := b.Put(kv[0], kv[1]); err != nil {
				return fmt.Errorf("put %s: %w", kv[0], err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("state db %s: update sync marks (%d put, %d deleted): %w", d.path, len(kvs), len(del), err)
	}
	return nil
}

// ListMarks returns every stored mark by key, and a RecordError for each record that could not
// be decoded and was skipped.
func (d *DB) ListMarks() (out map[string]SyncMark, bad []RecordError, err error) {
	err = d.bolt.View(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketMarks)
		if err != nil {
			return err
		}
		out, bad = collectMarks(b.ForEach)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("state db %s: list sync marks: %w", d.path, err)
	}
	return out, bad, nil
}

// DeleteMarks removes the marks with keys in one transaction; a missing key is not an error.
func (d *DB) DeleteMarks(keys []string) error {
	for i, k := range keys {
		if err := checkMarkKey(k); err != nil {
			return fmt.Errorf("state db %s: delete sync marks: keys[%d]: %w", d.path, i, err)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	err := d.bolt.Batch(func(tx *bolt.Tx) error {
		b, err := bucket(tx, bucketMarks)
		if err != nil {
			return err
		}
		for _, k := range keys {
			if err := b.Delete([]byte(k)); err != nil {
				return fmt.Errorf("delete %s: %w", k, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("state db %s: delete %d sync marks (first %s): %w", d.path, len(keys), keys[0], err)
	}
	return nil
}

// NextSession returns the next session number, 1 for a new file, and stores it in the same
// transaction: numbers grow across restarts and never repeat.
func (d *DB) NextSession() (int64, error) {
	var n int64
	// Update, not Batch: it is called once per start, and it returns a number that must be the
	// committed one.
	err := d.bolt.Update(func(tx *bolt.Tx) error {
		meta, err := bucket(tx, bucketMeta)
		if err != nil {
			return err
		}
		next, val, err := nextSession(meta.Get(keySession))
		if err != nil {
			return err
		}
		n = next
		return meta.Put(keySession, val)
	})
	if err != nil {
		return 0, fmt.Errorf("state db %s: next session: %w", d.path, err)
	}
	return n, nil
}
