package store

import (
	"encoding/json"
	"fmt"
	"strconv"

	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
)

// bucketPodsV0 is the only bucket of a schema 0 file: "namespace/name" -> v1.Pod JSON.
var bucketPodsV0 = []byte("pods")

// migration moves a file from schema version `from` to from+1. It runs inside the single Update
// transaction of Open, so a failure leaves the file as it was.
type migration struct {
	from  int
	apply func(tx *bolt.Tx) error
}

// migrations returns the steps in order; step i goes from version i to i+1, and there is one
// step per version below SchemaVersion. note records what an operator should see in the log.
func migrations(note func(format string, args ...any)) []migration {
	return []migration{
		{from: 0, apply: func(tx *bolt.Tx) error { return migrate0to1(tx, note) }},
	}
}

// upgrade brings a file at version (or versionEmpty) to SchemaVersion in one transaction.
// A file already at SchemaVersion is not written at all.
func (d *DB) upgrade(version int) error {
	if version == SchemaVersion {
		return nil
	}
	var notes []string
	note := func(format string, args ...any) { notes = append(notes, fmt.Sprintf(format, args...)) }
	err := d.bolt.Update(func(tx *bolt.Tx) error {
		if version == versionEmpty {
			for _, b := range currentBuckets() {
				if _, err := tx.CreateBucketIfNotExists(b); err != nil {
					return fmt.Errorf("create bucket %q: %w", b, err)
				}
			}
		} else {
			steps := migrations(note)
			for v := version; v < SchemaVersion; v++ {
				if v >= len(steps) || steps[v].from != v {
					return fmt.Errorf("no migration from schema version %d", v)
				}
				if err := steps[v].apply(tx); err != nil {
					return fmt.Errorf("migrate schema %d -> %d: %w", v, v+1, err)
				}
				note("state db %s: migrated schema version %d -> %d", d.path, v, v+1)
			}
		}
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return fmt.Errorf("create bucket %q: %w", bucketMeta, err)
		}
		return meta.Put(keySchemaVersion, []byte(strconv.Itoa(SchemaVersion)))
	})
	if err != nil {
		if version == versionEmpty {
			return fmt.Errorf("initialise state db %s: %w", d.path, err)
		}
		return fmt.Errorf("upgrade state db %s from schema version %d (the file is unchanged): %w", d.path, version, err)
	}
	d.notices = append(d.notices, notes...)
	return nil
}

// migrate0to1 moves the v0 "pods" bucket (keyed by namespace/name) into desired_pods keyed by
// UID. All v0 pods came from the manifest dir, so their source is "file:"; a pod that cannot be
// keyed (no uid, unparsable) is dropped with a note, since the manifest dir re-adds it on start.
func migrate0to1(tx *bolt.Tx, note func(string, ...any)) error {
	desired, err := tx.CreateBucketIfNotExists(bucketDesired)
	if err != nil {
		return fmt.Errorf("create bucket %q: %w", bucketDesired, err)
	}
	if _, err := tx.CreateBucketIfNotExists(bucketStatus); err != nil {
		return fmt.Errorf("create bucket %q: %w", bucketStatus, err)
	}
	old := tx.Bucket(bucketPodsV0)
	if old == nil {
		return nil
	}
	moved := 0
	err = old.ForEach(func(k, v []byte) error {
		if v == nil {
			note("schema 0 -> 1: dropped nested bucket pods/%s: schema 0 had none", k)
			return nil
		}
		var pod v1.Pod
		if err := json.Unmarshal(v, &pod); err != nil {
			note("schema 0 -> 1: dropped pods/%s: not a v1.Pod: %v", k, err)
			return nil
		}
		if pod.UID == "" {
			note("schema 0 -> 1: dropped pods/%s: no metadata.uid", k)
			return nil
		}
		key := []byte(pod.UID)
		if desired.Get(key) != nil {
			note("schema 0 -> 1: pods/%s has the same uid %s as an earlier pod; keeping pods/%s", k, pod.UID, k)
		}
		val, err := encodeDesired(DesiredPod{Pod: &pod, Source: "file:"})
		if err != nil {
			return fmt.Errorf("pods/%s: %w", k, err)
		}
		if err := desired.Put(key, val); err != nil {
			return fmt.Errorf("pods/%s: put desired_pods/%s: %w", k, pod.UID, err)
		}
		moved++
		return nil
	})
	if err != nil {
		return err
	}
	if err := tx.DeleteBucket(bucketPodsV0); err != nil {
		return fmt.Errorf("delete bucket %q: %w", bucketPodsV0, err)
	}
	note("schema 0 -> 1: moved %d pods from %q to %q", moved, bucketPodsV0, bucketDesired)
	return nil
}
