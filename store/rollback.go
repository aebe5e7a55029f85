package store

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Rollback safety: an A/B OTA update can boot the previous release on the state file the newer one
// migrated. Three things make that work:
//
//   - Before Open migrates a file from schema N, it copies the file to <state file>.schema-N
//     (written to a temporary name, fsynced, renamed, directory fsynced), so the last state each
//     older release could read is kept beside the file.
//   - Each file records, beside its schema version, the oldest schema whose binaries can still
//     read and write it (meta/min_reader_schema; see minReader). A binary that knows schema K opens
//     a file of schema F > K as it is when that minimum is <= K.
//   - Otherwise, with Options.RollBackNewer (the agent's choice), Open moves the newer file to
//     <state file>.schema-F and puts in its place a copy of the newest backup of a schema <= K, or,
//     with none, starts from an empty file; DB.RolledBack reports what it did.

// backupSuffix precedes the schema number in a backup's name: state.db.schema-4.
const backupSuffix = ".schema-"

// keepBackups is how many backups (the highest schema numbers) a migration leaves beside the
// file: enough for a rollback across two releases that each changed the schema, small on flash.
const keepBackups = 3

// keyMinReader is meta/min_reader_schema: decimal ASCII, the oldest schema version a binary must
// know to use the file. Absent in files written before it existed: then it is the file's own
// schema version (only a binary that knows that schema reads it).
var keyMinReader = []byte("min_reader_schema")

// bucketsAt lists the buckets of a file at schema version v (v >= 1); see the package comment.
// Names are spelled out per version, like the migrations', so that the list for an old version
// never changes.
func bucketsAt(v int) [][]byte {
	names := []string{"meta", "desired_pods", "pod_status"} // schemas 1 and 2
	if v >= 3 {
		names = append(names, "objects", "sync_marks", "outbox", "outbox_latest")
	}
	if v >= 4 {
		names = append(names, "node_status")
	}
	if v >= 5 {
		names = append(names, "events")
	}
	out := make([][]byte, len(names))
	for i, n := range names {
		out[i] = []byte(n)
	}
	return out
}

// minReader is the oldest schema version whose binaries can use a file of schema v: v itself,
// lowered past every step below v that is additive (see migration.additive). A binary of that
// older schema reads and writes the buckets it knows and leaves the newer ones alone; the newer
// binary, when it runs again, finds them as it left them.
func minReader(v int) int {
	steps := migrations(func(string, ...any) {})
	r := v
	for r > 0 && r-1 < len(steps) && steps[r-1].additive {
		r--
	}
	return r
}

// newerSchemaError is Open's refusal of a file from a newer mqlet that this binary cannot use.
type newerSchemaError struct {
	path                  string
	schema, reader, known int
	backup                string // newest usable backup, "" when none
}

func (e *newerSchemaError) Error() string {
	what := fmt.Sprintf("open state db %s: %s: schema version %d, readable by binaries of schema %d and later; this binary knows up to %d",
		e.path, ErrNewerSchema, e.schema, e.reader, e.known)
	if e.backup != "" {
		return what + fmt.Sprintf("; run the newer mqlet, or restore the backup of the older state (mv %s %s%s%d && cp %s %s)",
			e.path, e.path, backupSuffix, e.schema, e.backup, e.path)
	}
	return what + fmt.Sprintf("; there is no backup of a schema this binary knows (%s%sN, N <= %d): run the newer mqlet, "+
		"or move the file aside (mv %s %s%s%d) to start from empty state (desired pods are re-read from the manifest dir "+
		"and the MQTT downlink; running pods are adopted from containerd)",
		e.path, backupSuffix, e.known, e.path, e.path, backupSuffix, e.schema)
}

func (e *newerSchemaError) Is(target error) bool { return target == ErrNewerSchema }

// RolledBack is what Open did with a file from a newer mqlet that this binary cannot use
// (Options.RollBackNewer).
type RolledBack struct {
	// SetAside is where the newer file now is: the state file's path with ".schema-" and its
	// schema version appended.
	SetAside string
	// Schema is the newer file's schema version.
	Schema int
	// Backup is the backup now in the state file's place, e.g. /var/lib/mqlet/state.db.schema-4,
	// or "" when there was none and Open started from an empty file.
	Backup string
	// BackupSchema is Backup's schema version (before Open migrated it to this binary's).
	BackupSchema int
}

// RolledBack reports the newer file Open replaced, or nil.
func (d *DB) RolledBack() *RolledBack {
	if d.rolledBack == nil {
		return nil
	}
	r := *d.rolledBack
	return &r
}

// backups lists the backups beside path, highest schema first.
func backups(path string) ([]int, error) {
	matches, err := filepath.Glob(globEscape(path) + backupSuffix + "*")
	if err != nil {
		return nil, fmt.Errorf("list backups of %s: %w", path, err)
	}
	var schemas []int
	for _, m := range matches {
		s := strings.TrimPrefix(m, path+backupSuffix)
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || strconv.Itoa(n) != s {
			continue // a temporary file, or someone else's
		}
		schemas = append(schemas, n)
	}
	slices.Sort(schemas)
	slices.Reverse(schemas)
	return schemas, nil
}

// globEscape quotes the glob metacharacters in a literal path.
func globEscape(p string) string {
	var b strings.Builder
	for _, r := range p {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// newestBackup is the backup of the highest schema <= known, or "" and -1.
func newestBackup(path string, known int) (string, int, error) {
	schemas, err := backups(path)
	if err != nil {
		return "", -1, err
	}
	for _, n := range schemas {
		if n <= known {
			return backupName(path, n), n, nil
		}
	}
	return "", -1, nil
}

func backupName(path string, schema int) string {
	return path + backupSuffix + strconv.Itoa(schema)
}

// backup copies the open file, as of one read transaction, to path.schema-<schema>, replacing an
// older copy of that schema, and prunes all but the keepBackups highest schemas.
func (d *DB) backup(schema int) error {
	name := backupName(d.path, schema)
	err := writeAtomic(name, func(w io.Writer) error {
		return d.bolt.View(func(tx *bolt.Tx) error {
			_, err := tx.WriteTo(w)
			return err
		})
	})
	if err != nil {
		return fmt.Errorf("back up state db %s at schema %d before migrating it: %w", d.path, schema, err)
	}
	d.notices = append(d.notices, fmt.Sprintf("state db %s: copied to %s before migrating it from schema %d "+
		"(an older mqlet restores it if it cannot read the migrated file)", d.path, name, schema))
	schemas, err := backups(d.path)
	if err != nil {
		return nil // the backup is made; pruning waits for the next migration
	}
	for _, n := range schemas[min(len(schemas), keepBackups):] {
		if err := os.Remove(backupName(d.path, n)); err == nil {
			d.notices = append(d.notices, fmt.Sprintf("state db %s: removed the old backup %s (keeping the %d newest)",
				d.path, backupName(d.path, n), keepBackups))
		}
	}
	return nil
}

// writeAtomic writes name through a temporary file in the same directory: written, fsynced,
// renamed over name, and the directory fsynced, so a power cut leaves either the old file or the
// whole new one under name.
func writeAtomic(name string, write func(io.Writer) error) (err error) {
	f, err := os.CreateTemp(filepath.Dir(name), filepath.Base(name)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err = f.Chmod(0o600); err != nil {
		return err
	}
	if err = write(f); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(f.Name(), name); err != nil {
		return err
	}
	return syncDir(filepath.Dir(name))
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// rollBack replaces the file at path (schema newer, unusable by this binary) with a copy of the
// newest backup of a schema <= known, keeping the newer file as path.schema-<newer>; with no such
// backup it only moves the newer file, and the caller starts from an empty file. At every instant
// path holds either the newer file or the whole backup: the newer file is hard-linked to its new
// name before the backup's copy is renamed over path.
func rollBack(path string, newer, known int) (*RolledBack, error) {
	backup, schema, err := newestBackup(path, known)
	if err != nil {
		return nil, err
	}
	r := &RolledBack{SetAside: backupName(path, newer), Schema: newer, Backup: backup, BackupSchema: schema}
	if backup == "" {
		if err := os.Rename(path, r.SetAside); err != nil {
			return nil, fmt.Errorf("set aside %s as %s: %w", path, r.SetAside, err)
		}
		return r, syncDir(filepath.Dir(path))
	}
	// The copy first: if it fails, nothing has moved.
	src, err := os.Open(backup)
	if err != nil {
		return nil, fmt.Errorf("restore backup %s: %w", backup, err)
	}
	defer src.Close()
	restored, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".restore-*")
	if err != nil {
		return nil, fmt.Errorf("restore backup %s: %w", backup, err)
	}
	tmp := restored.Name()
	defer os.Remove(tmp) // gone after the rename; left only on failure
	_, err = io.Copy(restored, src)
	if err == nil {
		err = restored.Chmod(0o600)
	}
	if err == nil {
		err = restored.Sync()
	}
	if cerr := restored.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("restore backup %s: copy to %s: %w", backup, tmp, err)
	}
	// Keep the newer file under its schema's name: through a temporary link, so that an older
	// file of that name is replaced in one rename.
	link := r.SetAside + ".tmp-link"
	_ = os.Remove(link)
	if err := os.Link(path, link); err != nil {
		return nil, fmt.Errorf("keep %s as %s: %w", path, r.SetAside, err)
	}
	if err := os.Rename(link, r.SetAside); err != nil {
		os.Remove(link)
		return nil, fmt.Errorf("keep %s as %s: %w", path, r.SetAside, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("restore backup %s over %s: %w", backup, path, err)
	}
	return r, syncDir(filepath.Dir(path))
}

// openRollingBack is open, and with o.RollBackNewer, a newer file this binary cannot use replaced
// by its newest usable backup (or set aside) and the result opened.
func openRollingBack(path string, timeout time.Duration, o Options) (*DB, error) {
	d, err := openSettingAside(path, timeout, o)
	var newer *newerSchemaError
	if err == nil || !o.RollBackNewer || !errors.As(err, &newer) {
		return d, err
	}
	r, rerr := rollBack(path, newer.schema, newer.known)
	if rerr != nil {
		return nil, fmt.Errorf("%w; rolling back failed: %w", err, rerr)
	}
	d, err2 := openSettingAside(path, timeout, o)
	if err2 != nil {
		return nil, fmt.Errorf("open state db %s after rolling back from schema %d (kept as %s): %w", path, newer.schema, r.SetAside, err2)
	}
	d.rolledBack = r
	var what string
	if r.Backup != "" {
		what = fmt.Sprintf("restored the backup %s (schema %d) in its place", r.Backup, r.BackupSchema)
	} else {
		what = fmt.Sprintf("there was no backup of schema <= %d, so started from an empty state "+
			"(desired pods are read again from their sources, running pods are adopted)", newer.known)
	}
	// First: it explains the notices of the reopen (a migration of the backup, say).
	d.notices = append([]string{fmt.Sprintf("state db %s was written by a newer mqlet (schema %d, readable from schema %d); "+
		"this binary knows schema %d: kept the file as %s and %s", path, newer.schema, newer.reader, newer.known, r.SetAside, what)},
		d.notices...)
	return d, nil
}
