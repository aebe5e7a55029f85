// Package store keeps the agent's persistent state in one bbolt file (FileName under the state dir).
//
// On-disk layout, schema version 5 (every key and value is a byte string):
//
//	meta/
//	    schema_version   -> decimal ASCII text, e.g. "5"
//	    session          -> decimal ASCII text: the last number NextSession returned (absent before the first)
//	    outbox_counters  -> JSON {"eventBytes": 0, "latestBytes": 0, "events": 0, "latest": 0,
//	                              "droppedEvents": 0, "refusedLatest": 0} (absent until the first outbox write)
//	desired_pods/
//	    <pod UID>       -> JSON {"source": {"kind": "file", "origin": "/etc/mqlet/pods/web.yaml", "doc": 0},
//	                             "generation": 0, "pod": <v1.Pod>}
//	pod_status/
//	    <pod UID>       -> JSON <v1.PodStatus>
//	objects/
//	    ConfigMap/<namespace>/<name> -> JSON {"source": {...}, "generation": 3, "configMap": <v1.ConfigMap>}
//	    Secret/<namespace>/<name>    -> seal(JSON {"source": {...}, "generation": 3, "secret": <v1.Secret>})
//	sync_marks/
//	    <key, e.g. "pods/default/web"> -> JSON {"generation": 4, "deleted": false}
//	outbox/              (its bbolt bucket sequence is the last Seq given)
//	    <seq, uint64 big-endian> -> format byte (1), flags byte (1 retained, 2 latest), uvarint len(topic),
//	                                topic, payload
//	outbox_latest/
//	    <topic>         -> seq (uint64 big-endian) of the topic's Latest entry in outbox
//	node_status/
//	    node            -> JSON <v1.Node>: the node's last status that changed for real (absent
//	                       until the first)
//	events/
//	    <pod UID>       -> JSON {"namespace": "default", "name": "web", "events": [{"type": "Warning",
//	                             "reason": "BackOff", "message": "...", "source": "...", "fieldPath":
//	                             "spec.containers{web}", "count": 3, "firstTime": <RFC 3339 nano>,
//	                             "lastTime": <RFC 3339 nano>}, ...]}: the pod's deduplicated events,
//	                       oldest first (source and fieldPath left out when empty)
//
// Values are encoding/json of the k8s.io/api types, so metav1.Time fields keep whole seconds only.
// The source is a source.Ref (kind "file": origin is the manifest's path, doc the 0-based document
// index; kind "mqtt": origin is the topic); every field is written, zeros included.
//
// A Secret is never written in clear: its whole value is sealed with AES-256-GCM under the node key
// (package seal; see OpenWith), with "objects/<key>" as additional data, so a sealed value copied
// under another key does not open. The key (kind, namespace and name) is in clear. A DB opened
// without a key refuses to store Secrets and reports stored ones as RecordErrors.
//
// The outbox keeps running totals in meta/outbox_counters so that a put does not walk the bucket
// unless it has to drop events; a missing or undecodable counters record is rebuilt from the
// buckets (the two persistent counts then restart at 0).
//
// Older layouts, migrated by Open (see migrations in migrate.go):
//   - schema 4: as schema 5 without the events bucket.
//   - schema 3: as schema 4 without the node_status bucket.
//   - schema 2: as schema 3 without the session and outbox_counters keys and without the objects,
//     sync_marks, outbox and outbox_latest buckets.
//   - schema 1: desired_pods values were {"source": "<string>", "pod": <v1.Pod>}, the source being
//     "file:<path>#<doc>" for the manifest dir ("file:" for pods migrated from schema 0).
//   - schema 0: a file written before the meta bucket existed: a single bucket "pods" keyed by
//     "namespace/name" holding v1.Pod JSON.
//
// A record whose value cannot be decoded does not stop Open or a List: it is reported as a
// RecordError and skipped, and the others load.
//
// Open never rewrites an existing file it cannot read: a damaged file is refused with ErrCorrupt
// and a recovery hint (everything in it can be rebuilt from the pod sources and containerd), or,
// with Options.SetAsideDamaged (the agent's choice), renamed to state.db.corrupt-<UTC time> and
// replaced by an empty file. Damage is looked for at open, before anything is written: the meta
// and freelist pages and the file length (precheck.go), the bounds of every element of every
// branch and leaf page, and bbolt's own consistency check (tx.Check: the freelist against the
// pages in use, key order), because bbolt trusts the file and panics, in a goroutine no caller
// can recover, when it writes over a page that is both free and in use.
//
// Rollback safety (rollback.go): before Open migrates a file from schema N it copies it to
// state.db.schema-N (fsynced, renamed into place), keeping the keepBackups highest schemas. Each
// file records meta/min_reader_schema (decimal ASCII; absent in files written before it, meaning
// the file's own schema): the oldest schema whose binaries can use it, lowered past each
// additive migration (one that only adds buckets that older binaries can leave alone; see
// migration.additive: 3 -> 4 and 4 -> 5 are, so a schema 5 file says 3). An older binary opens
// a newer file as it is when it knows that schema, and otherwise, with Options.RollBackNewer
// (the agent's choice), keeps the newer file as state.db.schema-<its schema> and restores the
// newest backup it knows, or starts empty; without the option it refuses with ErrNewerSchema and
// says what to do.
//
// Rules for changing the layout: add buckets or
// change encodings only together with a new SchemaVersion and a migration step from the previous
// version (marked additive only if it is; see migration.additive), list the new layout in
// bucketsAt, and commit a fixture file written by the previous release under testdata/ with a
// test that opens a copy of it.
package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/mqlet/mqlet/store/seal"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// SchemaVersion is the layout version this binary writes; see the package comment.
const SchemaVersion = 5

// FileName is the name of the state file under the agent's state dir.
const FileName = "state.db"

const (
	// lockTimeout bounds how long Open waits for another process's lock on the file: long enough
	// to ride out a previous agent that is still shutting down, short enough to fail visibly.
	lockTimeout = 2 * time.Second
	// batchDelay is short because pod workers wait on these writes on the pod start path; a few
	// milliseconds is still enough to fold a burst of status updates into one fsync.
	batchDelay = 2 * time.Millisecond
)

var (
	bucketMeta         = []byte("meta")
	bucketDesired      = []byte("desired_pods")
	bucketStatus       = []byte("pod_status")
	bucketObjects      = []byte("objects")
	bucketMarks        = []byte("sync_marks")
	bucketOutbox       = []byte("outbox")
	bucketOutboxLatest = []byte("outbox_latest")
	bucketNodeStatus   = []byte("node_status")
	bucketEvents       = []byte("events")

	keySchemaVersion  = []byte("schema_version")
	keySession        = []byte("session")
	keyOutboxCounters = []byte("outbox_counters")
)

// currentBuckets are the buckets a file at SchemaVersion must have.
func currentBuckets() [][]byte { return bucketsAt(SchemaVersion) }

// Errors that Open wraps, for callers that want to react (e.g. exit codes); the error text
// already says what to do.
var (
	ErrCorrupt     = errors.New("state file is corrupt or unreadable")
	ErrLocked      = errors.New("state file is locked by another process")
	ErrNewerSchema = errors.New("state file was written by a newer mqlet")

	// errDamaged marks the ErrCorrupt errors that mean the file was damaged (bad pages, a bad
	// length, a broken tree), as opposed to a file that is intact but not mqlet's: only a damaged
	// file is set aside (Options.SetAsideDamaged).
	errDamaged = errors.New("damaged")
)

// DB is the agent's persistent state in one bbolt file.
type DB struct {
	path    string
	bolt    *bolt.DB
	notices []string
	// box seals Secret records; nil when the DB was opened without a node key.
	box *seal.Box
	// openTxID is bbolt's transaction id when Open returned; see Commits.
	openTxID int
	// setAside is the damaged file Open renamed before starting afresh; nil when none.
	setAside *SetAside
	// rolledBack is the newer file Open replaced (Options.RollBackNewer); nil when none.
	rolledBack *RolledBack
}

// SetAside is a damaged state file that Open renamed (Options.SetAsideDamaged) before it
// created a new, empty one in its place.
type SetAside struct {
	// Path is where the damaged file now is: the state file's path with ".corrupt-" and the UTC
	// time appended, e.g. /var/lib/mqlet/state.db.corrupt-20261127T102500Z.
	Path string
	// Cause is why it was refused: the error Open would have returned without the option.
	Cause error
}

// Options are what OpenWith takes beyond the path.
type Options struct {
	// SecretKey is the node key that Secret records are sealed under (seal.KeySize bytes, from
	// seal.LoadOrCreateKey). Without one, everything but Secrets works: PutObject refuses a Secret
	// and stored ones are reported as RecordErrors.
	SecretKey []byte
	// SetAsideDamaged makes Open rename a damaged file (one Open would refuse with ErrCorrupt
	// because its pages, length or tree are broken) instead of refusing it, and start from a new
	// empty file; DB.SetAside reports it. Everything in the file can be rebuilt (desired pods
	// from their sources, pod status from containerd), and an unattended node must not stay
	// down after a power cut. An intact file that is not mqlet's, a newer schema and a locked
	// file are still refused.
	SetAsideDamaged bool
	// RollBackNewer makes Open, on a file from a newer mqlet that this binary cannot use (its
	// meta/min_reader_schema is above the schema this binary knows), keep that file as
	// <path>.schema-<its schema> and put in its place a copy of the newest backup of a schema this
	// binary knows (<path>.schema-N, made before each migration), or, with none, an empty file;
	// DB.RolledBack reports it. Without it such a file is refused with ErrNewerSchema. This is
	// what lets an A/B OTA rollback boot the previous release on the migrated file.
	RollBackNewer bool
	// Now names the set-aside file; time.Now when nil.
	Now func() time.Time
	// KnownSchema plays an older release in tests: Open then behaves as a binary that knows
	// schema versions up to KnownSchema (layout checks, migrations, backups, roll-back) while the
	// record methods stay this release's. 0 means SchemaVersion; above it is refused.
	KnownSchema int
}

// known is the schema version Open acts as knowing.
func (o Options) known() int {
	if o.KnownSchema == 0 {
		return SchemaVersion
	}
	return o.KnownSchema
}

// Open opens (creating if absent) the bbolt state file at path, without a node key (see
// OpenWith). The parent directory must exist. An existing file that is not a readable bbolt file
// is refused with ErrCorrupt and left untouched; a file with a newer schema is opened as it is
// when its minimum reader schema is this binary's or older, and otherwise refused with
// ErrNewerSchema (see Options.RollBackNewer); an older schema is copied aside and migrated in one
// transaction. A second agent on the same file
// gets ErrLocked after about two seconds.
func Open(path string) (*DB, error) {
	return open(path, lockTimeout, Options{})
}

// OpenWith is Open with options: o.SecretKey, when set, must be a valid node key, and lets the
// DB store and read Secret records.
func OpenWith(path string, o Options) (*DB, error) {
	return openRollingBack(path, lockTimeout, o)
}

// openSettingAside is open, and with o.SetAsideDamaged, a damaged file renamed and a new one
// opened in its place.
func openSettingAside(path string, timeout time.Duration, o Options) (*DB, error) {
	d, err := open(path, timeout, o)
	if err == nil || !o.SetAsideDamaged || !errors.Is(err, errDamaged) {
		return d, err
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	aside, rerr := setAside(path, now())
	if rerr != nil {
		return nil, fmt.Errorf("%w; setting it aside failed too: %w", err, rerr)
	}
	d, err2 := open(path, timeout, o)
	if err2 != nil {
		return nil, fmt.Errorf("open state db %s after moving the damaged one to %s: %w", path, aside, err2)
	}
	d.setAside = &SetAside{Path: aside, Cause: err}
	d.notices = append(d.notices, fmt.Sprintf("state db %s was damaged and is set aside as %s; starting from an empty state "+
		"(desired pods are read again from their sources, running pods are adopted): %v", path, aside, err))
	return d, nil
}

// setAside renames the file at path to path.corrupt-<UTC time>, with a counter if that name is
// taken (two damaged files in one second), and syncs the directory so the rename survives a
// power cut: otherwise the damaged file could be back under its own name at the next boot.
func setAside(path string, now time.Time) (string, error) {
	base := path + ".corrupt-" + now.UTC().Format("20060102T150405Z")
	aside := base
	for i := 2; ; i++ {
		if _, err := os.Lstat(aside); errors.Is(err, fs.ErrNotExist) {
			break
		} else if err != nil {
			return "", fmt.Errorf("set aside %s: %w", path, err)
		}
		aside = fmt.Sprintf("%s.%d", base, i)
	}
	if err := os.Rename(path, aside); err != nil {
		return "", fmt.Errorf("set aside %s: %w", path, err)
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return aside, nil // renamed; only the durability of the rename is in doubt
	}
	defer dir.Close()
	_ = dir.Sync()
	return aside, nil
}

// SetAside reports the damaged file Open renamed before starting afresh, or nil.
func (d *DB) SetAside() *SetAside {
	if d.setAside == nil {
		return nil
	}
	s := *d.setAside
	return &s
}

func open(path string, timeout time.Duration, o Options) (d *DB, err error) {
	if o.KnownSchema < 0 || o.KnownSchema > SchemaVersion {
		return nil, fmt.Errorf("open state db %s: KnownSchema %d outside [0, %d] (0: this release's)", path, o.KnownSchema, SchemaVersion)
	}
	known := o.known()
	var box *seal.Box
	if o.SecretKey != nil {
		if box, err = seal.New(o.SecretKey); err != nil {
			return nil, fmt.Errorf("open state db %s: node key: %w", path, err)
		}
	}

	// bbolt trusts the file: a bad page can make it panic, or fault on the mmap, and a panic inside
	// bolt.Open leaks its file and lock. So the parts bolt.Open reads (meta pages, freelist page,
	// file length) are checked first with plain reads, and the rest is walked once below, where
	// panics and faults become this error instead of a crash later in a pod worker.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	var bdb *bolt.DB
	defer func() {
		if r := recover(); r != nil {
			if bdb != nil {
				closeQuietly(bdb)
			}
			d, err = nil, corruptError(path, fmt.Errorf("bbolt panicked reading it: %v", r))
		}
	}()

	notice, err := precheck(path, timeout)
	if err != nil {
		return nil, err
	}

	// A zero-length file carries no data: bbolt initialises it like a new one.
	bdb, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout})
	if err != nil {
		bdb = nil
		switch {
		case errors.Is(err, berrors.ErrTimeout):
			return nil, lockedError(path, timeout, err)
		case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum),
			errors.Is(err, berrors.ErrVersionMismatch):
			return nil, corruptError(path, err)
		case errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("open state db %s: %w (the state directory must exist)", path, err)
		default:
			return nil, fmt.Errorf("open state db %s: %w", path, err)
		}
	}
	bdb.MaxBatchDelay = batchDelay

	d = &DB{path: path, bolt: bdb, box: box}
	if notice != "" {
		d.notices = append(d.notices, notice)
	}
	version, reader, err := d.inspect(known)
	if err != nil {
		closeQuietly(bdb)
		return nil, err
	}
	if version > known {
		if reader > known {
			closeQuietly(bdb)
			backup, _, berr := newestBackup(path, known)
			if berr != nil {
				return nil, fmt.Errorf("open state db %s: %w: schema version %d; %w", path, ErrNewerSchema, version, berr)
			}
			return nil, &newerSchemaError{path: path, schema: version, reader: reader, known: known, backup: backup}
		}
		// Every step above known only added buckets: this binary uses the ones it knows and
		// leaves the rest, and the file keeps its schema version for the newer binary.
		d.notices = append(d.notices, fmt.Sprintf("state db %s was written by a newer mqlet (schema %d); this binary knows "+
			"schema %d and the file is readable from schema %d, so it is used as it is (the newer buckets are left alone)",
			path, version, known, reader))
	} else if err := d.upgrade(version, known); err != nil {
		closeQuietly(bdb)
		return nil, err
	}
	if d.openTxID, err = d.txID(); err != nil {
		closeQuietly(bdb)
		return nil, err
	}
	return d, nil
}

func lockedError(path string, timeout time.Duration, cause error) error {
	return fmt.Errorf("open state db %s: %w (waited %s; is another mqlet agent running with the same state dir?): %w",
		path, ErrLocked, timeout, cause)
}

func closeQuietly(bdb *bolt.DB) {
	defer func() { _ = recover() }()
	_ = bdb.Close()
}

// corruptError is the error for a damaged file: ErrCorrupt and errDamaged.
func corruptError(path string, cause error) error {
	return fmt.Errorf("open state db %s: %w (%w): move it aside (mv %s %s.corrupt) and restart: "+
		"desired pods are re-read from the manifest dir (and the MQTT downlink); pod status is rebuilt from containerd",
		path, damaged{}, cause, path, path)
}

// damaged is ErrCorrupt and errDamaged in one wrapped error, reading as ErrCorrupt.
type damaged struct{}

func (damaged) Error() string        { return ErrCorrupt.Error() }
func (damaged) Is(target error) bool { return target == ErrCorrupt || target == errDamaged }

// versionEmpty marks a file with no buckets at all: new, or created by a run that stopped
// before its first transaction.
const versionEmpty = -1

// inspect checks, without writing, that every page reachable from the chosen meta page lies in the
// file and parses, then reports the schema version.
// reader is the file's meta/min_reader_schema, or its version when absent.
func (d *DB) inspect(known int) (version, reader int, err error) {
	st, err := os.Stat(d.path)
	if err != nil {
		return 0, 0, fmt.Errorf("open state db %s: %w", d.path, err)
	}
	version = versionEmpty
	err = d.bolt.View(func(tx *bolt.Tx) error {
		// Pages past the end of the file are mapped but unbacked: touching them is SIGBUS. A file
		// shorter than its own high-water mark was truncated (or its meta page lies).
		if tx.Size() > st.Size() {
			return corruptError(d.path, fmt.Errorf("file is %d bytes but its meta page says %d: truncated", st.Size(), tx.Size()))
		}
		if err := walk(tx); err != nil {
			return corruptError(d.path, err)
		}
		// The walk reads what a lookup reads; bbolt's own check also compares the freelist with
		// the pages in use and the key order on every page. A file that fails it opens and reads
		// fine, then panics in bbolt's write path ("page 9 already freed") once a transaction
		// reuses a page that is both free and in use, which no recover in mqlet can catch.
		if err := check(tx); err != nil {
			return corruptError(d.path, err)
		}
		var names []string
		_ = tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			names = append(names, string(name))
			return nil
		})
		meta := tx.Bucket(bucketMeta)
		switch {
		case meta != nil:
			raw := meta.Get(keySchemaVersion)
			v, err := strconv.Atoi(string(raw))
			if err != nil || v < 0 {
				return corruptError(d.path, fmt.Errorf("meta/%s is %q, want a decimal number", keySchemaVersion, raw))
			}
			version, reader = v, v
			if raw := meta.Get(keyMinReader); raw != nil {
				r, err := strconv.Atoi(string(raw))
				if err != nil || r < 0 || r > v {
					return corruptError(d.path, fmt.Errorf("meta/%s is %q, want a decimal number no greater than the schema version %d",
						keyMinReader, raw, v))
				}
				reader = r
			}
		case len(names) == 0:
			version = versionEmpty
		case len(names) == 1 && names[0] == string(bucketPodsV0):
			version = 0
		default:
			return fmt.Errorf("open state db %s: %w: it is a bbolt file but not an mqlet state file (buckets %q, no %q bucket); "+
				"check the state dir, or move the file aside (mv %s %s.foreign)", d.path, ErrCorrupt, names, bucketMeta, d.path, d.path)
		}
		// A newer file this binary may use must hold every bucket it knows, too; one it may not
		// use can lack some (a later step may have dropped one) and is not damaged for that.
		if version == known || (version > known && reader <= known) {
			for _, b := range bucketsAt(known) {
				if tx.Bucket(b) == nil {
					return corruptError(d.path, fmt.Errorf("schema version %d but bucket %q is missing", version, b))
				}
			}
		}
		return nil
	})
	return version, reader, err
}

// walk visits every key in every bucket, nested ones included, so that each branch, leaf and
// overflow page is read once: ForEach hands out values, which lie on those pages, and the last
// byte of each is read, so an overflow page past the end of the file faults here, where open
// turns the fault into an error, and not in bbolt's check goroutine, where nothing could.
func walk(tx *bolt.Tx) error {
	var visit func(b *bolt.Bucket, path string) error
	var sink byte
	visit = func(b *bolt.Bucket, path string) error {
		if err := b.ForEach(func(k, v []byte) error {
			if len(v) > 0 {
				sink ^= v[len(v)-1]
			}
			return nil
		}); err != nil {
			return fmt.Errorf("bucket %s: %w", path, err)
		}
		return b.ForEachBucket(func(k []byte) error {
			return visit(b.Bucket(k), path+"/"+string(k))
		})
	}
	return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
		return visit(b, string(name))
	})
}

// maxCheckProblems bounds how many of bbolt's findings the error quotes; a damaged page can
// yield hundreds, and one is enough to refuse the file.
const maxCheckProblems = 3

// check runs bbolt's consistency check (tx.Check) and returns its first findings as one error.
// Every finding is read: the check's goroutine ends only when its channel is drained.
func check(tx *bolt.Tx) error {
	var found []string
	n := 0
	for err := range tx.Check() {
		if n < maxCheckProblems {
			found = append(found, err.Error())
		}
		n++
	}
	if n == 0 {
		return nil
	}
	if n > maxCheckProblems {
		found = append(found, fmt.Sprintf("and %d more", n-maxCheckProblems))
	}
	return fmt.Errorf("bbolt consistency check failed: %s", strings.Join(found, "; "))
}

// Close releases the file and its lock after pending batched writes have committed.
func (d *DB) Close() error {
	if err := d.bolt.Close(); err != nil {
		return fmt.Errorf("close state db %s: %w", d.path, err)
	}
	return nil
}

// Commits returns how many write transactions this DB committed since Open returned: each commit
// is one bbolt commit, and one or more durable writes to the disk (bbolt 1.5 calls fdatasync
// twice per commit, after the data pages and after the meta page). Calls that bbolt's Batch folded
// into one transaction count once. It is read from bbolt's transaction id, which every commit
// raises by one and which nothing else changes, so no write path can be left uncounted.
func (d *DB) Commits() (uint64, error) {
	id, err := d.txID()
	if err != nil {
		return 0, err
	}
	return uint64(id - d.openTxID), nil
}

// txID is the id of the last committed transaction (a read transaction carries it).
func (d *DB) txID() (id int, err error) {
	err = d.bolt.View(func(tx *bolt.Tx) error {
		id = tx.ID()
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("state db %s: read the transaction id: %w", d.path, err)
	}
	return id, nil
}

// Path is the file the DB was opened from.
func (d *DB) Path() string { return d.path }

// Notices lists things Open did or found that an operator should see in the log: migrations
// run, records dropped by them, a damaged meta page recovered from. Empty on a normal open.
func (d *DB) Notices() []string { return append([]string(nil), d.notices...) }
