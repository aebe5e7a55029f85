package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/mqlet/mqlet/core/source"
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
	// additive: the step only adds buckets, and the binaries of schema `from` keep working on
	// the result: they use the buckets they know, leave the new ones alone, and the newer binary
	// copes with what they did to the old ones meanwhile (see minReader). A step that changes an
	// encoding, moves or drops a bucket, or puts values in an old bucket that `from` binaries
	// would misread is not additive.
	additive bool
}

// migrations returns the steps in order; step i goes from version i to i+1, and there is one
// step per version below SchemaVersion. note records what an operator should see in the log.
func migrations(note func(format string, args ...any)) []migration {
	return []migration{
		// Moves the pods bucket and re-keys it.
		{from: 0, apply: func(tx *bolt.Tx) error { return migrate0to1(tx, note) }},
		// Changes the desired_pods encoding.
		{from: 1, apply: func(tx *bolt.Tx) error { return migrate1to2(tx, note) }},
		// Adds buckets, but schema 3 binaries also put pods of source kind "mqtt" in desired_pods
		// and tie them to sync_marks and the outbox, which a schema 2 binary would neither
		// understand nor keep in step.
		{from: 2, apply: func(tx *bolt.Tx) error { return migrate2to3(tx, note) }},
		// Adds node_status, rewritten on the first status computation.
		{from: 3, additive: true, apply: func(tx *bolt.Tx) error { return migrate3to4(tx, note) }},
		// Adds events, per pod UID: a newer binary back on the file may find the events of a pod
		// an older one deleted meanwhile; they are read only by pod UID, so they show nowhere.
		{from: 4, additive: true, apply: func(tx *bolt.Tx) error { return migrate4to5(tx, note) }},
	}
}

// upgrade brings a file at version (or versionEmpty) to known (SchemaVersion but in tests) in
// one transaction, after copying it aside as <path>.schema-<version> (see backup). A file already
// at known is not written at all.
func (d *DB) upgrade(version, known int) error {
	if version == known {
		return nil
	}
	if version != versionEmpty {
		// Without a copy (a full disk, say) the migration still runs: a node that stays down is
		// worse than a rollback that starts from an empty state, which the sources rebuild.
		if err := d.backup(version); err != nil {
			d.notices = append(d.notices, fmt.Sprintf("%v; migrating without it: a rollback to a release of a schema below %d "+
				"would start from an empty state", err, minReader(known)))
		}
	}
	var notes []string
	note := func(format string, args ...any) { notes = append(notes, fmt.Sprintf(format, args...)) }
	err := d.bolt.Update(func(tx *bolt.Tx) error {
		if version != versionEmpty {
			steps := migrations(note)
			for v := version; v < known; v++ {
				if v >= len(steps) || steps[v].from != v {
					return fmt.Errorf("no migration from schema version %d", v)
				}
				if err := steps[v].apply(tx); err != nil {
					return fmt.Errorf("migrate schema %d -> %d: %w", v, v+1, err)
				}
				note("state db %s: migrated schema version %d -> %d", d.path, v, v+1)
			}
		}
		// One rule for every path (a new file, any chain of steps): the current buckets exist.
		for _, b := range bucketsAt(known) {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return fmt.Errorf("create bucket %q: %w", b, err)
			}
		}
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return fmt.Errorf("create bucket %q: %w", bucketMeta, err)
		}
		if err := meta.Put(keySchemaVersion, []byte(strconv.Itoa(known))); err != nil {
			return err
		}
		return meta.Put(keyMinReader, []byte(strconv.Itoa(minReader(known))))
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

// Migrations write the layout of the version they produce with their own frozen types, never
// with the current encoders: a chain 0 -> 1 -> 2 -> 3 must hand each step exactly what a release
// of its starting schema wrote.

// desiredRecordV2 is a desired_pods value at schema version 2 (unchanged in schema 3, but frozen
// here so that a later change to desiredRecord cannot change what migrate1to2 writes).
type desiredRecordV2 struct {
	Source     sourceRecordV2 `json:"source"`
	Generation int64          `json:"generation"`
	Pod        *v1.Pod        `json:"pod"`
}

type sourceRecordV2 struct {
	Kind   string `json:"kind"`
	Origin string `json:"origin"`
	Doc    int    `json:"doc"`
}

// desiredRecordV1 is a desired_pods value at schema version 1: the source as an opaque string,
// "file:<path>#<doc>" for the manifest dir ("file:" for pods migrated from schema 0).
type desiredRecordV1 struct {
	Source string  `json:"source"`
	Pod    *v1.Pod `json:"pod"`
}

// migrate0to1 moves the v0 "pods" bucket (keyed by namespace/name) into desired_pods keyed by
// UID. All v0 pods came from the manifest dir, so their source is "file:"; a pod that cannot be
// keyed (no uid, unparsable) is dropped with a note, since the manifest dir re-adds it on start.
func migrate0to1(tx *bolt.Tx, note func(string, ...any)) error {
	desired, err := tx.CreateBucketIfNotExists(bucketDesired)
	if err != nil {
		return fmt.Errorf("create bucket %q: %w", bucketDesired, err)
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
		val, err := json.Marshal(desiredRecordV1{Source: "file:", Pod: &pod})
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

// migrate1to2 rewrites each desired_pods record with the source as a typed source.Ref and a
// generation of 0. The manifest dir's "file:<path>#<doc>" becomes {file, path, doc}; any other
// string keeps its record, with the kind taken from before the first ':' and the rest as origin,
// and a note. A record that is not schema 1 JSON is left as it is, with a note: loading reports
// and skips it, so no data is destroyed and the agent still starts. pod_status is unchanged.
func migrate1to2(tx *bolt.Tx, note func(string, ...any)) error {
	// Schema 1 always had the bucket; a file without it has nothing to rewrite (upgrade creates
	// the current buckets after the steps), so odd content never stops Open.
	desired := tx.Bucket(bucketDesired)
	if desired == nil {
		return nil
	}
	type rewrite struct{ key, val []byte }
	var rewrites []rewrite
	err := desired.ForEach(func(k, v []byte) error {
		if v == nil {
			note("schema 1 -> 2: left nested bucket %s/%s as it is: schema 1 had none", bucketDesired, k)
			return nil
		}
		var old desiredRecordV1
		if err := json.Unmarshal(v, &old); err != nil || old.Pod == nil {
			if err == nil {
				err = errors.New("no pod")
			}
			note("schema 1 -> 2: left %s/%s as it is (it will be reported and skipped on load): not a schema 1 record: %v",
				bucketDesired, k, err)
			return nil
		}
		ref, ok := parseSourceV1(old.Source)
		if !ok {
			note("schema 1 -> 2: %s/%s: source %q is not \"file:<path>#<doc>\"; kept as kind %q, origin %q",
				bucketDesired, k, old.Source, ref.Kind, ref.Origin)
		}
		val, err := json.Marshal(desiredRecordV2{
			Source: sourceRecordV2{Kind: string(ref.Kind), Origin: ref.Origin, Doc: ref.Doc},
			Pod:    old.Pod,
		})
		if err != nil {
			return fmt.Errorf("%s/%s: encode: %w", bucketDesired, k, err)
		}
		// Keys and values are only valid during the transaction, and a bucket must not be
		// written while ForEach walks it.
		rewrites = append(rewrites, rewrite{key: append([]byte(nil), k...), val: val})
		return nil
	})
	if err != nil {
		return err
	}
	for _, r := range rewrites {
		if err := desired.Put(r.key, r.val); err != nil {
			return fmt.Errorf("put %s/%s: %w", bucketDesired, r.key, err)
		}
	}
	note("schema 1 -> 2: rewrote %d desired pods with a typed source", len(rewrites))
	return nil
}

// parseSourceV1 turns a schema 1 source string into a Ref. ok is false for anything but the
// manifest dir's "file:<path>#<doc>"; the Ref is then the best reading of it (kind before the
// first ':', origin after).
func parseSourceV1(s string) (ref source.Ref, ok bool) {
	kind, rest, _ := strings.Cut(s, ":")
	if source.Kind(kind) == source.File {
		// A path may hold '#'; the manifest dir appended the last one.
		if i := strings.LastIndexByte(rest, '#'); i > 0 {
			doc, err := strconv.Atoi(rest[i+1:])
			if err == nil && doc >= 0 && rest[i+1:] == strconv.Itoa(doc) {
				return source.Ref{Kind: source.File, Origin: rest[:i], Doc: doc}, true
			}
		}
	}
	return source.Ref{Kind: source.Kind(kind), Origin: rest}, false
}

// migrate2to3 adds what the MQTT sync needs: the objects (configMaps and sealed secrets),
// sync_marks, outbox and outbox_latest buckets, empty. Nothing of schema 2 changes; the meta keys
// session and outbox_counters appear with their first use. The names are spelled out here, not
// taken from the current layout, so that this step keeps producing schema 3 whatever comes later.
func migrate2to3(tx *bolt.Tx, note func(string, ...any)) error {
	added := []string{"objects", "sync_marks", "outbox", "outbox_latest"}
	for _, name := range added {
		if _, err := tx.CreateBucketIfNotExists([]byte(name)); err != nil {
			return fmt.Errorf("create bucket %q: %w", name, err)
		}
	}
	note("schema 2 -> 3: added buckets %s", strings.Join(added, ", "))
	return nil
}

// migrate3to4 adds the node_status bucket, empty: the node's status is written again on the
// agent's first status computation. Nothing of schema 3 changes.
func migrate3to4(tx *bolt.Tx, note func(string, ...any)) error {
	if _, err := tx.CreateBucketIfNotExists([]byte("node_status")); err != nil {
		return fmt.Errorf("create bucket %q: %w", "node_status", err)
	}
	note("schema 3 -> 4: added bucket node_status")
	return nil
}

// migrate4to5 adds the events bucket, empty: events from before the upgrade were never kept.
// Nothing of schema 4 changes.
func migrate4to5(tx *bolt.Tx, note func(string, ...any)) error {
	if _, err := tx.CreateBucketIfNotExists([]byte("events")); err != nil {
		return fmt.Errorf("create bucket %q: %w", "events", err)
	}
	note("schema 4 -> 5: added bucket events")
	return nil
}
