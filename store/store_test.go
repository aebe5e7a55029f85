package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/store/seal"
	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

var regen = flag.Bool("regen", false, "rewrite testdata/v0.db (a schema 0 file, as old releases wrote it)")

func testPod(ns, name, uid string) *v1.Pod {
	return &v1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), Labels: map[string]string{"app": name}},
		Spec: v1.PodSpec{
			RestartPolicy: v1.RestartPolicyAlways,
			Containers: []v1.Container{{
				Name:    "main",
				Image:   "busybox:latest",
				Command: []string{"sh", "-c", "while true; do echo " + name + "; sleep 5; done"},
				Resources: v1.ResourceRequirements{
					Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("32Mi"), v1.ResourceCPU: resource.MustParse("250m")},
				},
			}},
		},
	}
}

func testStatus(phase v1.PodPhase, restarts int32) *v1.PodStatus {
	// metav1.Time is encoded with whole seconds.
	start := metav1.NewTime(time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC))
	return &v1.PodStatus{
		Phase:     phase,
		StartTime: &start,
		Conditions: []v1.PodCondition{{
			Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: start,
		}},
		ContainerStatuses: []v1.ContainerStatus{{
			Name: "main", Ready: true, RestartCount: restarts, ContainerID: "containerd://abc",
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: start}},
		}},
	}
}

func openTemp(t testing.TB) (*DB, string) {
	t.Helper()
	return openTempWith(t, Options{})
}

func openTempWith(t testing.TB, o Options) (*DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), FileName)
	d, err := OpenWith(path, o)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d, path
}

// testKey is a fresh node key, made the way the agent makes one.
func testKey(t testing.TB) []byte {
	t.Helper()
	key, err := seal.LoadOrCreateKey(filepath.Join(t.TempDir(), "node.key"))
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func TestReopenKeepsEverything(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := d.Notices(); len(n) != 0 {
		t.Errorf("fresh file: notices %q, want none", n)
	}
	pod := testPod("default", "web", "uid-web")
	put(t, d, pod, refAgent, 4)
	st := testStatus(v1.PodRunning, 1)
	if err := d.PutStatus("uid-web", st); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	before := readFile(t, path)

	d, err = Open(path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	got, ok, err := d.GetDesired("uid-web")
	if err != nil || !ok || !reflect.DeepEqual(got.Pod, pod) || got.Source != refAgent || got.Generation != 4 {
		t.Errorf("desired after reopen = %+v, %v, %v", got, ok, err)
	}
	gotSt, ok, err := d.GetStatus("uid-web")
	if err != nil || !ok || !apiequality.Semantic.DeepEqual(gotSt, st) {
		t.Errorf("status after reopen = %+v, %v, %v", gotSt, ok, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// Opening a current file and reading it must not write to it.
	if !bytes.Equal(before, readFile(t, path)) {
		t.Errorf("open + reads + close changed %s", path)
	}
}

func TestOpenEmptyExistingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := Open(path)
	if err != nil {
		t.Fatalf("Open(zero-length file): %v", err)
	}
	defer d.Close()
	if _, _, err := d.ListDesired(); err != nil {
		t.Errorf("ListDesired: %v", err)
	}
}

func TestOpenMissingDir(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no-such-dir", FileName)
	_, err := Open(path)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open(%s) = %v, want error naming the path", path, err)
	}
	if _, statErr := os.Stat(filepath.Dir(path)); !os.IsNotExist(statErr) {
		t.Errorf("Open created the parent directory")
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// validFile writes a current-schema file with enough records that its data pages extend well
// past its first half.
func validFile(t *testing.T, path string) {
	t.Helper()
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		uid := types.UID(fmt.Sprintf("uid-%02d", i))
		put(t, d, testPod("default", fmt.Sprintf("pod-%02d", i), string(uid)), source.Ref{Kind: source.File, Origin: "/pods/all.yaml", Doc: i}, 0)
		if err := d.PutStatus(uid, testStatus(v1.PodRunning, int32(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}

// metaTxid reads the transaction id of meta page i (bbolt format 2: page header 16 bytes, txid at
// offset 48 in the meta struct).
func metaTxid(b []byte, i int) uint64 {
	off := i*os.Getpagesize() + 16 + 48
	return binary.NativeEndian.Uint64(b[off : off+8])
}

// newestMetaField reads the uint64 at offset off in the meta struct of the meta page with the
// higher txid (16: root bucket page, 32: freelist page).
func newestMetaField(b []byte, off int) uint64 {
	i := 0
	if metaTxid(b, 1) > metaTxid(b, 0) {
		i = 1
	}
	at := i*os.Getpagesize() + 16 + off
	return binary.NativeEndian.Uint64(b[at : at+8])
}

// smashPage overwrites page id with random bytes.
func smashPage(b []byte, id uint64, seed int64) {
	ps := uint64(os.Getpagesize())
	rand.New(rand.NewSource(seed)).Read(b[id*ps : (id+1)*ps])
}

// flipMetaByte flips one byte of the root bucket page id in meta page i, which breaks its checksum.
func flipMetaByte(b []byte, i int) {
	b[i*os.Getpagesize()+16+16] ^= 0xff
}

func TestCorruptFilesRefused(t *testing.T) {
	cases := map[string]func(t *testing.T, path string){
		"random garbage 64KiB": func(t *testing.T, path string) {
			b := make([]byte, 64<<10)
			rand.New(rand.NewSource(1)).Read(b)
			writeFile(t, path, b)
		},
		"zeros 32KiB": func(t *testing.T, path string) {
			writeFile(t, path, make([]byte, 32<<10))
		},
		"short garbage": func(t *testing.T, path string) {
			writeFile(t, path, []byte("this is not a database\n"))
		},
		"valid db truncated to half": func(t *testing.T, path string) {
			validFile(t, path)
			b := readFile(t, path)
			writeFile(t, path, b[:len(b)/2])
		},
		"valid db with a flipped byte in both meta pages": func(t *testing.T, path string) {
			validFile(t, path)
			b := readFile(t, path)
			flipMetaByte(b, 0)
			flipMetaByte(b, 1)
			writeFile(t, path, b)
		},
		"valid db with garbage over its freelist page": func(t *testing.T, path string) {
			validFile(t, path)
			b := readFile(t, path)
			smashPage(b, newestMetaField(b, 32), 2)
			writeFile(t, path, b)
		},
		"valid db with garbage over its root page": func(t *testing.T, path string) {
			validFile(t, path)
			b := readFile(t, path)
			smashPage(b, newestMetaField(b, 16), 3)
			writeFile(t, path, b)
		},
		"valid db with a zeroed root page": func(t *testing.T, path string) {
			validFile(t, path)
			b := readFile(t, path)
			root := newestMetaField(b, 16)
			ps := uint64(os.Getpagesize())
			clear(b[root*ps : (root+1)*ps])
			writeFile(t, path, b)
		},
		"valid db with a page in use listed as free": func(t *testing.T, path string) {
			validFile(t, path)
			b := readFile(t, path)
			freelistInUse(t, b)
			writeFile(t, path, b)
		},
		"another program's bbolt file": func(t *testing.T, path string) {
			bdb, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = bdb.Update(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucket([]byte("v1"))
				if err != nil {
					return err
				}
				return b.Put([]byte("k"), []byte("v"))
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := bdb.Close(); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, setup := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			setup(t, path)
			before := readFile(t, path)

			d, err := Open(path)
			if err == nil {
				d.Close()
				t.Fatalf("Open succeeded on a corrupt file")
			}
			msg := err.Error()
			t.Logf("error: %s", msg)
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("error is not ErrCorrupt: %v", err)
			}
			for _, want := range []string{path, "corrupt", "mv " + path} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not contain %q", msg, want)
				}
			}
			if !bytes.Equal(before, readFile(t, path)) {
				t.Errorf("Open modified the corrupt file")
			}
			// The lock is released: a retry gives the same answer, not "locked".
			if _, err := Open(path); !errors.Is(err, ErrCorrupt) {
				t.Errorf("second Open = %v, want ErrCorrupt again", err)
			}
		})
	}
}

// One damaged meta page is what a torn commit leaves behind; bbolt opens from the other one,
// which describes the previous, complete transaction. That is accepted and reported.
func TestOneBadMetaPageRecovered(t *testing.T) {
	for _, which := range []string{"newest", "older"} {
		t.Run(which, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			validFile(t, path)
			b := readFile(t, path)
			newest := 0
			if metaTxid(b, 1) > metaTxid(b, 0) {
				newest = 1
			}
			page := newest
			if which == "older" {
				page = 1 - newest
			}
			flipMetaByte(b, page)
			writeFile(t, path, b)

			d, err := Open(path)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer d.Close()
			notices := strings.Join(d.Notices(), "\n")
			if !strings.Contains(notices, fmt.Sprintf("meta page %d", page)) || !strings.Contains(notices, path) {
				t.Errorf("notices %q do not report meta page %d of %s", notices, page, path)
			}
			pods, _, err := d.ListDesired()
			if err != nil {
				t.Fatalf("ListDesired: %v", err)
			}
			// The last transaction was one PutStatus, so every desired pod predates it.
			if len(pods) != 30 {
				t.Errorf("ListDesired has %d pods, want 30", len(pods))
			}
		})
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// setSchemaVersion sets the file's schema version and its minimum reader schema to version: a
// newer version then makes a file that older binaries cannot use.
func setSchemaVersion(t *testing.T, path, version string) {
	t.Helper()
	bdb, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	err = bdb.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketMeta).Put(keyMinReader, []byte(version)); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keySchemaVersion, []byte(version))
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestNewerSchemaRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	validFile(t, path)
	setSchemaVersion(t, path, "99")
	before := readFile(t, path)
	_, err := Open(path)
	if !errors.Is(err, ErrNewerSchema) {
		t.Fatalf("Open = %v, want ErrNewerSchema", err)
	}
	for _, want := range []string{path, "99", fmt.Sprint(SchemaVersion)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if !bytes.Equal(before, readFile(t, path)) {
		t.Errorf("Open modified a newer-schema file")
	}
}

func TestBadSchemaVersionRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	validFile(t, path)
	setSchemaVersion(t, path, "one")
	_, err := Open(path)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), `"one"`) {
		t.Fatalf("Open = %v, want ErrCorrupt quoting the bad version", err)
	}
}

func TestLockedFile(t *testing.T) {
	d, path := openTemp(t)
	_, err := Open(path)
	if err == nil {
		t.Fatal("second Open of the same file succeeded")
	}
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "locked") || !strings.Contains(err.Error(), path) {
		t.Errorf("second Open = %v, want a locked error naming %s", err, path)
	}
	// The first handle still works.
	if err := d.PutStatus("uid-a", testStatus(v1.PodRunning, 0)); err != nil {
		t.Errorf("first handle after failed second Open: %v", err)
	}
}

// writeV0 writes a file the way releases before the meta bucket did: one "pods" bucket,
// "namespace/name" -> v1.Pod JSON, using raw bbolt calls only.
func writeV0(t testing.TB, path string) {
	t.Helper()
	bdb, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = bdb.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("pods"))
		if err != nil {
			return err
		}
		for _, p := range []*v1.Pod{
			testPod("default", "web", "0b5c1f7e-0000-4000-8000-000000000001"),
			testPod("kube-system", "agent", "0b5c1f7e-0000-4000-8000-000000000002"),
			testPod("default", "no-uid", ""),
		} {
			v, err := json.Marshal(p)
			if err != nil {
				return err
			}
			if err := b.Put([]byte(p.Namespace+"/"+p.Name), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := bdb.Close(); err != nil {
		t.Fatal(err)
	}
}

func checkMigratedV0(t *testing.T, path string) {
	t.Helper()
	d, err := Open(path)
	if err != nil {
		t.Fatalf("Open(v0 file): %v", err)
	}
	// Schema 0 did not record which file a pod came from; through 1 -> 2 it stays a file pod
	// with no origin.
	want := []string{
		"default/web=0b5c1f7e-0000-4000-8000-000000000001@file #0 g0",
		"kube-system/agent=0b5c1f7e-0000-4000-8000-000000000002@file #0 g0",
	}
	if got := listNames(t, d); !reflect.DeepEqual(got, want) {
		t.Errorf("desired after migration = %q, want %q", got, want)
	}
	got, ok, err := d.GetDesired("0b5c1f7e-0000-4000-8000-000000000001")
	if err != nil || !ok || got.Pod.Spec.Containers[0].Image != "busybox:latest" {
		t.Errorf("GetDesired(web) = %+v, %v, %v", got, ok, err)
	}
	notices := strings.Join(d.Notices(), "\n")
	for _, want := range []string{"0 -> 1", "default/no-uid", "moved 2 pods", "1 -> 2", "rewrote 2 desired pods",
		`source "file:" is not`} {
		if !strings.Contains(notices, want) {
			t.Errorf("notices %q do not mention %q", notices, want)
		}
	}
	if err := d.PutStatus("0b5c1f7e-0000-4000-8000-000000000001", testStatus(v1.PodRunning, 0)); err != nil {
		t.Errorf("PutStatus after migration: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	bdb, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = bdb.View(func(tx *bolt.Tx) error {
		if tx.Bucket([]byte("pods")) != nil {
			t.Errorf("v0 bucket \"pods\" still present after migration")
		}
		if v := string(tx.Bucket(bucketMeta).Get(keySchemaVersion)); v != fmt.Sprint(SchemaVersion) {
			t.Errorf("schema_version = %q, want %d", v, SchemaVersion)
		}
		return nil
	})
	bdb.Close()

	d, err = Open(path)
	if err != nil {
		t.Fatalf("reopen after migration: %v", err)
	}
	defer d.Close()
	if n := d.Notices(); len(n) != 0 {
		t.Errorf("second open of a migrated file: notices %q, want none", n)
	}
	if got := listNames(t, d); !reflect.DeepEqual(got, want) {
		t.Errorf("desired after reopen = %q, want %q", got, want)
	}
}

func TestMigrateV0(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	writeV0(t, path)
	checkMigratedV0(t, path)
}

// TestMigrateV0Fixture opens a copy of testdata/v0.db through every migration (0 -> 1 -> 2 -> 3). That
// file was made by writeV0, not by a schema 0 release (see testdata/README), so it only pins what
// writeV0 wrote when it was made. Regenerate with: go test ./store -run TestMigrateV0Fixture -regen
func TestMigrateV0Fixture(t *testing.T) {
	fixture := filepath.Join("testdata", "v0.db")
	if *regen {
		_ = os.Remove(fixture)
		writeV0(t, fixture)
	}
	b, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatalf("read fixture: %v", err)
	}
	path := filepath.Join(t.TempDir(), FileName)
	writeFile(t, path, b)
	checkMigratedV0(t, path)
}

func TestMigrationsCoverEveryVersion(t *testing.T) {
	steps := migrations(func(string, ...any) {})
	if len(steps) != SchemaVersion {
		t.Fatalf("%d migration steps for schema version %d", len(steps), SchemaVersion)
	}
	for i, s := range steps {
		if s.from != i {
			t.Errorf("step %d migrates from %d", i, s.from)
		}
	}
}

func BenchmarkPutStatusParallel(b *testing.B) {
	d, _ := openTemp(b)
	st := testStatus(v1.PodRunning, 0)
	// Many pod workers on few CPUs: the case Batch is for (it folds them into one fsync).
	b.SetParallelism(16)
	var n sync.Mutex
	next := 0
	b.RunParallel(func(pb *testing.PB) {
		n.Lock()
		uid := types.UID(fmt.Sprintf("uid-%d", next))
		next++
		n.Unlock()
		for pb.Next() {
			if err := d.PutStatus(uid, st); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// flipBits flips n random bits among the first size bytes of b.
func flipBits(b []byte, size, n int, seed int64) {
	r := rand.New(rand.NewSource(seed))
	for range n {
		i := r.Intn(size * 8)
		b[i/8] ^= 1 << (i % 8)
	}
}

// A few flipped bits anywhere in a real state file either make Open refuse it as corrupt, or leave
// a file that bbolt's own consistency check passes, so writes cannot hit a broken freelist later
// (before the fix, bbolt panicked in its batch goroutine: "page 9 already freed").
func TestBitFlippedFileRefusedOrConsistent(t *testing.T) {
	dir := t.TempDir()
	orig := filepath.Join(dir, "orig.db")
	validFile(t, orig)
	good := readFile(t, orig)
	// The flips land in the pages in use (below the high-water mark): the rest of the file is
	// slack that bbolt grew into, where a flip changes nothing.
	inUse := int(newestMetaField(good, 40)) * os.Getpagesize()
	const files = 150
	refused := 0
	for seed := int64(1); seed <= files; seed++ {
		path := filepath.Join(dir, fmt.Sprintf("flip-%d.db", seed))
		b := bytes.Clone(good)
		flipBits(b, inUse, 3, seed)
		writeFile(t, path, b)
		d, err := Open(path)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("seed %d: Open = %v, want ErrCorrupt or success", seed, err)
			}
			refused++
			continue
		}
		var problems []string
		if err := d.bolt.View(func(tx *bolt.Tx) error {
			for e := range tx.Check() {
				problems = append(problems, e.Error())
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if len(problems) > 0 {
			d.Close()
			t.Fatalf("seed %d: Open accepted a file that fails bbolt's check: %s", seed, strings.Join(problems, "; "))
		}
		// The accepted file takes writes: records rewritten, then half the pods deleted, which
		// rewrites and frees pages all over the file.
		var del []types.UID
		for i := range 30 {
			uid := types.UID(fmt.Sprintf("uid-%02d", i))
			if i%3 == 0 {
				if err := d.PutStatus(uid, testStatus(v1.PodSucceeded, int32(i+1))); err != nil {
					t.Fatalf("seed %d: PutStatus: %v", seed, err)
				}
			}
			if i%2 == 0 {
				del = append(del, uid)
			}
		}
		if err := d.UpdateDesired(nil, del); err != nil {
			t.Fatalf("seed %d: UpdateDesired: %v", seed, err)
		}
		if err := d.Close(); err != nil {
			t.Fatalf("seed %d: Close: %v", seed, err)
		}
		os.Remove(path)
	}
	t.Logf("%d of %d files refused", refused, files)
}

// With SetAsideDamaged, a damaged file (bits flipped in its tree, or truncated as by a power cut)
// is renamed with the time and a new empty file takes its place; the damaged bytes are kept as
// they were.
func TestDamagedFileSetAside(t *testing.T) {
	now := time.Date(2026, 11, 27, 10, 25, 0, 0, time.UTC)
	cases := map[string]func(b []byte) []byte{
		"truncated to half": func(b []byte) []byte { return b[:len(b)/2] },
		"garbage over its root page": func(b []byte) []byte {
			smashPage(b, newestMetaField(b, 16), 3)
			return b
		},
		"a page in use listed as free": func(b []byte) []byte {
			freelistInUse(t, b)
			return b
		},
	}
	for name, damage := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			validFile(t, path)
			bad := damage(readFile(t, path))
			writeFile(t, path, bad)

			d, err := OpenWith(path, Options{SetAsideDamaged: true, Now: func() time.Time { return now }})
			if err != nil {
				t.Fatalf("OpenWith: %v", err)
			}
			defer d.Close()
			want := path + ".corrupt-20261127T102500Z"
			sa := d.SetAside()
			if sa == nil || sa.Path != want || !errors.Is(sa.Cause, ErrCorrupt) {
				t.Fatalf("SetAside() = %+v, want %s with an ErrCorrupt cause", sa, want)
			}
			if !bytes.Equal(readFile(t, want), bad) {
				t.Errorf("the set-aside file is not the damaged file as it was")
			}
			if n := strings.Join(d.Notices(), "\n"); !strings.Contains(n, want) {
				t.Errorf("notices %q do not name %s", n, want)
			}
			pods, _, err := d.ListDesired()
			if err != nil || len(pods) != 0 {
				t.Errorf("new state holds %d pods (err %v), want empty", len(pods), err)
			}
			put(t, d, testPod("default", "web", "uid-web"), source.Ref{Kind: source.File, Origin: "/pods/web.yaml"}, 0)
		})
	}
}

// A second damaged file within the same second does not overwrite the first one set aside.
func TestSetAsideKeepsEarlierOne(t *testing.T) {
	now := func() time.Time { return time.Date(2026, 11, 27, 10, 25, 0, 0, time.UTC) }
	path := filepath.Join(t.TempDir(), FileName)
	first := bytes.Repeat([]byte("first damaged "), 1000)
	writeFile(t, path, first)
	d, err := OpenWith(path, Options{SetAsideDamaged: true, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	writeFile(t, path, bytes.Repeat([]byte("second damaged "), 1000))
	d, err = OpenWith(path, Options{SetAsideDamaged: true, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if got := d.SetAside().Path; got != path+".corrupt-20261127T102500Z.2" {
		t.Errorf("second file set aside as %s", got)
	}
	if !bytes.Equal(readFile(t, path+".corrupt-20261127T102500Z"), first) {
		t.Errorf("the first set-aside file was overwritten")
	}
}

// What is not damage is still refused with SetAsideDamaged, and left in place: an intact bbolt
// file of another program, a newer schema, a file locked by a running agent.
func TestSetAsideOnlyDamage(t *testing.T) {
	o := Options{SetAsideDamaged: true}
	t.Run("foreign", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), FileName)
		bdb, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := bdb.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("v1")); return err }); err != nil {
			t.Fatal(err)
		}
		bdb.Close()
		if _, err := OpenWith(path, o); !errors.Is(err, ErrCorrupt) {
			t.Errorf("OpenWith = %v, want ErrCorrupt", err)
		}
		assertAlone(t, path)
	})
	t.Run("newer schema", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), FileName)
		validFile(t, path)
		setSchemaVersion(t, path, "99")
		if _, err := OpenWith(path, o); !errors.Is(err, ErrNewerSchema) {
			t.Errorf("OpenWith = %v, want ErrNewerSchema", err)
		}
		assertAlone(t, path)
	})
	t.Run("locked", func(t *testing.T) {
		_, path := openTemp(t)
		if _, err := openSettingAside(path, 100*time.Millisecond, o); !errors.Is(err, ErrLocked) {
			t.Errorf("OpenWith = %v, want ErrLocked", err)
		}
		assertAlone(t, path)
	})
}

// assertAlone fails unless path is the only file in its directory.
func assertAlone(t *testing.T, path string) {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*"))
	if len(names) != 1 || names[0] != path {
		t.Errorf("files %v, want %s alone", names, path)
	}
}

// freelistInUse writes the root page's id over the first entry of the newest freelist page, so
// the page is both in use and free: what bbolt later panics on ("page already freed").
func freelistInUse(t *testing.T, b []byte) {
	t.Helper()
	ps := uint64(os.Getpagesize())
	fl, root := newestMetaField(b, 32), newestMetaField(b, 16)
	hdr := b[fl*ps:]
	count := binary.NativeEndian.Uint16(hdr[10:])
	if count == 0 || count == 0xFFFF {
		t.Fatalf("freelist page %d has count %d; the fixture needs a short non-empty freelist", fl, count)
	}
	binary.NativeEndian.PutUint64(hdr[16:], root)
}
