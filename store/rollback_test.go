package store

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/source"
	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
)

// The v2 fixture's pods, as every test below expects to read them from it or its backup.
var v2FixturePods = map[string]fixturePod{
	"default/job":   {"c36a6a22-e267-5555-bf99-ae98bb0ecc64", source.Ref{Kind: source.File, Origin: "/tmp/v2fix/pods/b.yaml", Doc: 0}, 0, v1.PodSucceeded},
	"default/web":   {"3169c6b8-9aab-548b-a454-4c4e3fb93d3f", source.Ref{Kind: source.File, Origin: "/tmp/v2fix/pods/a.yaml", Doc: 0}, 0, v1.PodRunning},
	"tools/sidecar": {"486d9658-8e9c-5626-9d7a-1b10b5351e11", source.Ref{Kind: source.File, Origin: "/tmp/v2fix/pods/b.yaml", Doc: 1}, 0, v1.PodRunning},
}

// metaOf reads the file's schema_version and min_reader_schema ("" when absent), read-only.
func metaOf(t *testing.T, path string) (schema, reader string) {
	t.Helper()
	bdb, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	_ = bdb.View(func(tx *bolt.Tx) error {
		schema = string(tx.Bucket(bucketMeta).Get(keySchemaVersion))
		reader = string(tx.Bucket(bucketMeta).Get(keyMinReader))
		return nil
	})
	return schema, reader
}

// TestMinReader pins which migrations are additive: a later change to that list changes which
// releases can read a file, and must be deliberate.
func TestMinReader(t *testing.T) {
	for v, want := range map[int]int{0: 0, 1: 1, 2: 2, 3: 3, 4: 3, 5: 3} {
		if got := minReader(v); got != want {
			t.Errorf("minReader(%d) = %d, want %d", v, got, want)
		}
	}
}

// TestBackupBeforeMigration: migrating the released schema 2 file leaves a copy of it, at
// schema 2 with its records, as state.db.schema-2, and the migrated file records its minimum
// reader.
func TestBackupBeforeMigration(t *testing.T) {
	path := copyFixture(t, "v2.db")
	before := dumpBuckets(t, path, bucketDesired, bucketStatus)
	d, err := OpenWith(path, Options{SecretKey: testKey(t)})
	if err != nil {
		t.Fatalf("Open(v2 fixture): %v", err)
	}
	d.Close()
	backup := path + ".schema-2"
	checkNotices(t, d, "", "copied to "+backup+" before migrating it from schema 2")
	if schema, reader := metaOf(t, backup); schema != "2" || reader != "" {
		t.Errorf("backup: schema %q, min reader %q; want 2 and none (the fixture as it was)", schema, reader)
	}
	if got := dumpBuckets(t, backup, bucketDesired, bucketStatus); !mapsEqual(got, before) {
		t.Errorf("backup's records differ from the fixture's")
	}
	if schema, reader := metaOf(t, path); schema != strconv.Itoa(SchemaVersion) || reader != "3" {
		t.Errorf("migrated file: schema %q, min reader %q; want %d and 3", schema, reader, SchemaVersion)
	}
	if left, _ := filepath.Glob(path + ".schema-2.tmp-*"); len(left) != 0 {
		t.Errorf("temporary files left: %q", left)
	}
	// A file already at the current schema is not copied again.
	d, err = OpenWith(path, Options{SecretKey: testKey(t)})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if n := strings.Join(d.Notices(), "\n"); strings.Contains(n, "copied") {
		t.Errorf("reopen notices %q: a current file was backed up", n)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestBackupsPruned: a migration leaves only the keepBackups highest-numbered backups.
func TestBackupsPruned(t *testing.T) {
	path := copyFixture(t, "v2.db")
	for _, n := range []int{0, 1} {
		writeFile(t, backupName(path, n), []byte("an old backup"))
	}
	writeFile(t, path+".schema-x", []byte("not a backup"))
	d, err := OpenWith(path, Options{SecretKey: testKey(t)})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	got, err := backups(path)
	if err != nil || len(got) != 3 || got[0] != 2 || got[2] != 0 {
		t.Fatalf("backups %v, %v; want [2 1 0]", got, err)
	}
	// One more migration (played from schema 2 again by a fresh copy) would make four.
	writeFile(t, backupName(path, 3), []byte("another"))
	os.Remove(path)
	writeFile(t, path, readFixture(t, "v2.db"))
	d, err = OpenWith(path, Options{SecretKey: testKey(t)})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if got, _ := backups(path); len(got) != 3 || got[0] != 3 || got[2] != 1 {
		t.Errorf("backups %v, want [3 2 1]", got)
	}
	checkNotices(t, d, "", "removed the old backup "+backupName(path, 0))
	if _, err := os.Stat(path + ".schema-x"); err != nil {
		t.Errorf("a file that is not a backup was touched: %v", err)
	}
}

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestNewerAdditiveFileReadByOlder: a schema 4 binary (played with KnownSchema) opens the file
// the current binary migrated from the released schema 4 file, since schema 5 only added a
// bucket: it reads and writes the pods, and the file keeps schema 5 and its events.
func TestNewerAdditiveFileReadByOlder(t *testing.T) {
	path := copyFixture(t, "v4.db")
	key := readFixture(t, "v4.key")
	d, err := OpenWith(path, Options{SecretKey: key})
	if err != nil {
		t.Fatalf("Open(v4 fixture): %v", err)
	}
	ev := EventRecord{Type: "Warning", Reason: "BackOff", Message: "kept by the newer binary", Count: 1,
		FirstTime: time.Unix(1800000000, 0), LastTime: time.Unix(1800000000, 0)}
	pe := PodEvents{UID: "ca03c773-b1bb-5454-8fa9-5f3fc58c35bd", Namespace: "default", Name: "remote", Events: []EventRecord{ev}}
	if err := d.UpdateEvents([]PodEvents{pe}, nil); err != nil {
		t.Fatal(err)
	}
	d.Close()

	old, err := OpenWith(path, Options{SecretKey: key, KnownSchema: 4, RollBackNewer: true})
	if err != nil {
		t.Fatalf("schema 4 binary on a schema 5 file: %v", err)
	}
	checkNotices(t, old, "migrated", "written by a newer mqlet (schema 5)", "readable from schema 3", "used as it is")
	if old.RolledBack() != nil {
		t.Errorf("RolledBack = %+v for a readable file", old.RolledBack())
	}
	pods, bad, err := old.ListDesired()
	if err != nil || len(bad) != 0 || len(pods) != 5 {
		t.Fatalf("ListDesired: %d pods, %v, %v; want the fixture's 5", len(pods), bad, err)
	}
	if err := old.PutDesired(DesiredPod{Pod: testPod("default", "added-by-old", "uid-old"), Source: source.Ref{Kind: source.File, Origin: "/x.yaml"}}); err != nil {
		t.Fatalf("the older binary cannot write: %v", err)
	}
	old.Close()
	if schema, reader := metaOf(t, path); schema != "5" || reader != "3" {
		t.Errorf("after the older binary: schema %q, min reader %q; want 5 and 3 kept", schema, reader)
	}

	// The newer binary again: its events are still there, and so is the older one's pod.
	d, err = OpenWith(path, Options{SecretKey: key})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if evs, _, err := d.ListEvents(); err != nil || len(evs) != 1 || evs[0].Events[0].Message != ev.Message {
		t.Errorf("events after the older binary: %+v, %v", evs, err)
	}
	if _, ok, err := d.GetDesired("uid-old"); !ok || err != nil {
		t.Errorf("the older binary's pod: %v, %v", ok, err)
	}
}

// TestNewerIncompatibleRestoresBackup: a schema 2 binary on the file the current binary
// migrated from the released schema 2 file cannot use it (schema 3 is not additive); it restores
// state.db.schema-2, keeps the newer file as state.db.schema-5, and says so.
func TestNewerIncompatibleRestoresBackup(t *testing.T) {
	path := copyFixture(t, "v2.db")
	key := testKey(t)
	d, err := OpenWith(path, Options{SecretKey: key})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.PutDesired(DesiredPod{Pod: testPod("default", "after-upgrade", "uid-new"), Source: source.Ref{Kind: source.File, Origin: "/x.yaml"}}); err != nil {
		t.Fatal(err)
	}
	d.Close()
	newer := readFile(t, path)
	backup, aside := path+".schema-2", path+".schema-5"

	// Without the option: refused, naming the file, the schemas and the backup to restore.
	_, err = OpenWith(path, Options{SecretKey: key, KnownSchema: 2})
	if !errors.Is(err, ErrNewerSchema) {
		t.Fatalf("OpenWith = %v, want ErrNewerSchema", err)
	}
	for _, want := range []string{path, "schema version 5", "schema 3", "knows up to 2", "mv " + path + " " + aside + " && cp " + backup + " " + path} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if string(readFile(t, path)) != string(newer) {
		t.Fatal("a refused open changed the file")
	}

	old, err := OpenWith(path, Options{SecretKey: key, KnownSchema: 2, RollBackNewer: true})
	if err != nil {
		t.Fatalf("schema 2 binary with RollBackNewer: %v", err)
	}
	r := old.RolledBack()
	if r == nil || r.Backup != backup || r.BackupSchema != 2 || r.SetAside != aside || r.Schema != 5 {
		t.Fatalf("RolledBack = %+v, want backup %s (2), set aside %s (5)", r, backup, aside)
	}
	checkNotices(t, old, "migrated", "kept the file as "+aside, "restored the backup "+backup)
	checkFixturePods(t, old, v2FixturePods) // the pod added after the upgrade is not in it
	old.Close()
	if schema, _ := metaOf(t, path); schema != "2" {
		t.Errorf("restored file at schema %q, want 2", schema)
	}
	if string(readFile(t, aside)) != string(newer) {
		t.Errorf("%s is not the newer file as it was", aside)
	}
	if _, err := os.Stat(backup); err != nil {
		t.Errorf("the backup itself is gone: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*tmp*")); len(left) != 0 {
		t.Errorf("temporary files left: %q", left)
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*restore*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %q", left)
	}
}

// TestNewerIncompatibleWithoutBackup: with no backup of a schema it knows, the binary refuses
// the file with what to do; with RollBackNewer it sets it aside and starts from an empty file.
func TestNewerIncompatibleWithoutBackup(t *testing.T) {
	d, path := openTemp(t)
	if err := d.PutDesired(DesiredPod{Pod: testPod("default", "web", "uid-a"), Source: source.Ref{Kind: source.File, Origin: "/x.yaml"}}); err != nil {
		t.Fatal(err)
	}
	d.Close()
	// What a later, non-additive schema 6 would write.
	setSchemaVersion(t, path, "6")
	newer := readFile(t, path)

	_, err := OpenWith(path, Options{})
	if !errors.Is(err, ErrNewerSchema) {
		t.Fatalf("OpenWith = %v, want ErrNewerSchema", err)
	}
	for _, want := range []string{path, "schema version 6", "no backup", "mv " + path + " " + path + ".schema-6"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}

	d, err = OpenWith(path, Options{RollBackNewer: true})
	if err != nil {
		t.Fatalf("OpenWith(RollBackNewer): %v", err)
	}
	defer d.Close()
	r := d.RolledBack()
	if r == nil || r.Backup != "" || r.SetAside != path+".schema-6" || r.Schema != 6 {
		t.Fatalf("RolledBack = %+v, want no backup and %s.schema-6", r, path)
	}
	checkNotices(t, d, "", "kept the file as "+path+".schema-6", "no backup of schema <= 5", "started from an empty state")
	if pods, _, err := d.ListDesired(); err != nil || len(pods) != 0 {
		t.Errorf("ListDesired = %d pods, %v; want an empty state", len(pods), err)
	}
	if string(readFile(t, path+".schema-6")) != string(newer) {
		t.Errorf("the newer file was not kept as it was")
	}
}

// A backup that cannot be written does not stop the migration (a node must not stay down for
// it); the notice says so and what a rollback would then do.
func TestMigrationWithoutBackup(t *testing.T) {
	path := copyFixture(t, "v2.db")
	// A directory where the backup would go: the rename over it fails, even for root.
	if err := os.MkdirAll(filepath.Join(path+".schema-2", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := OpenWith(path, Options{SecretKey: testKey(t)})
	if err != nil {
		t.Fatalf("Open with the backup's name taken: %v", err)
	}
	defer d.Close()
	checkNotices(t, d, "", "back up state db "+path+" at schema 2", "migrating without it", "migrated schema version 4 -> 5")
	checkFixturePods(t, d, v2FixturePods)
	if left, _ := filepath.Glob(path + ".schema-2.tmp-*"); len(left) != 0 {
		t.Errorf("temporary files left: %q", left)
	}
}
