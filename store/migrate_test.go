package store

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/source"
	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
)

// copyFixture copies testdata/name to a temp state file, so that Open's migration never writes
// the committed fixture.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("read fixture: %v", err)
	}
	path := filepath.Join(t.TempDir(), FileName)
	writeFile(t, path, b)
	return path
}

// TestMigrateV1Fixture opens a copy of testdata/v1.db, written by the released schema 1 binary
// (mqlet 98acc04, `mqlet agent --once`; see testdata/README): three pods from two manifest files,
// one of them with two documents, and the status that agent recorded for each.
func TestMigrateV1Fixture(t *testing.T) {
	path := copyFixture(t, "v1.db")
	d, err := Open(path)
	if err != nil {
		t.Fatalf("Open(v1 fixture): %v", err)
	}
	notices := checkNotices(t, d, "", "migrated schema version 1 -> 2", "rewrote 3 desired pods", path)
	if strings.Contains(notices, "is not") || strings.Contains(notices, "left") {
		t.Errorf("notices %q report a record the migration could not read", notices)
	}

	type want struct {
		uid   string
		ref   source.Ref
		phase v1.PodPhase
	}
	wants := map[string]want{
		"default/job":   {"c36a6a22-e267-5555-bf99-ae98bb0ecc64", source.Ref{Kind: source.File, Origin: "/tmp/v1fix/pods/b.yaml", Doc: 0}, v1.PodSucceeded},
		"default/web":   {"3169c6b8-9aab-548b-a454-4c4e3fb93d3f", source.Ref{Kind: source.File, Origin: "/tmp/v1fix/pods/a.yaml", Doc: 0}, v1.PodRunning},
		"tools/sidecar": {"486d9658-8e9c-5626-9d7a-1b10b5351e11", source.Ref{Kind: source.File, Origin: "/tmp/v1fix/pods/b.yaml", Doc: 1}, v1.PodRunning},
	}
	pods, bad, err := d.ListDesired()
	if err != nil || len(bad) != 0 {
		t.Fatalf("ListDesired: %v, record errors %v", err, bad)
	}
	var keys []string
	for _, p := range pods {
		key := p.Pod.Namespace + "/" + p.Pod.Name
		keys = append(keys, key)
		w, ok := wants[key]
		if !ok {
			continue
		}
		if string(p.Pod.UID) != w.uid || p.Source != w.ref || p.Generation != 0 {
			t.Errorf("%s: uid %s source %+v generation %d; want %s %+v 0", key, p.Pod.UID, p.Source, p.Generation, w.uid, w.ref)
		}
		if len(p.Pod.Spec.Containers) != 1 || p.Pod.Spec.Containers[0].Image != "mqlet.test/busybox:1" {
			t.Errorf("%s: containers %+v, want one running mqlet.test/busybox:1", key, p.Pod.Spec.Containers)
		}
	}
	if want := []string{"default/job", "default/web", "tools/sidecar"}; !reflect.DeepEqual(keys, want) {
		t.Errorf("desired pods %q, want %q", keys, want)
	}

	statuses, bad, err := d.ListStatus()
	if err != nil || len(bad) != 0 {
		t.Fatalf("ListStatus: %v, record errors %v", err, bad)
	}
	if len(statuses) != len(wants) {
		t.Errorf("ListStatus has %d records, want %d", len(statuses), len(wants))
	}
	for key, w := range wants {
		st, ok, err := d.GetStatus(k8stypes.UID(w.uid))
		if err != nil || !ok {
			t.Errorf("%s: GetStatus = found %v, %v", key, ok, err)
			continue
		}
		if st.Phase != w.phase || len(st.ContainerStatuses) != 1 || st.ContainerStatuses[0].Name != "main" ||
			!strings.HasPrefix(st.ContainerStatuses[0].ContainerID, "containerd://") {
			t.Errorf("%s: status phase %s containers %+v; want %s and one containerd container named main",
				key, st.Phase, st.ContainerStatuses, w.phase)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	// The migration is written: the second open has nothing to do.
	d, err = Open(path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer d.Close()
	if n := d.Notices(); len(n) != 0 {
		t.Errorf("second open of a migrated file: notices %q, want none", n)
	}
	if got, _, _ := d.GetDesired(k8stypes.UID(wants["tools/sidecar"].uid)); got.Source != wants["tools/sidecar"].ref {
		t.Errorf("sidecar source after reopen: %+v", got.Source)
	}
}

// TestMigrateV2Fixture opens a copy of testdata/v2.db, written by the released schema 2 binary
// (mqlet cd5235d, `mqlet agent --once`; see testdata/README): the same three pods as v1.db with
// typed sources, and their status. Migration 2 -> 3 must keep them as they are and add the empty
// buckets of the MQTT sync, which then work.
func TestMigrateV2Fixture(t *testing.T) {
	path := copyFixture(t, "v2.db")
	before := dumpBuckets(t, path, bucketDesired, bucketStatus)
	d, err := OpenWith(path, Options{SecretKey: testKey(t)})
	if err != nil {
		t.Fatalf("Open(v2 fixture): %v", err)
	}
	checkNotices(t, d, "1 -> 2", "migrated schema version 2 -> 3", "added buckets objects, sync_marks, outbox, outbox_latest", path)
	checkFixturePods(t, d, map[string]fixturePod{
		"default/job":   {"c36a6a22-e267-5555-bf99-ae98bb0ecc64", source.Ref{Kind: source.File, Origin: "/tmp/v2fix/pods/b.yaml", Doc: 0}, 0, v1.PodSucceeded},
		"default/web":   {"3169c6b8-9aab-548b-a454-4c4e3fb93d3f", source.Ref{Kind: source.File, Origin: "/tmp/v2fix/pods/a.yaml", Doc: 0}, 0, v1.PodRunning},
		"tools/sidecar": {"486d9658-8e9c-5626-9d7a-1b10b5351e11", source.Ref{Kind: source.File, Origin: "/tmp/v2fix/pods/b.yaml", Doc: 1}, 0, v1.PodRunning},
	})

	// The new buckets exist, empty, and work.
	if objs, bad, err := d.ListObjects(); err != nil || len(objs)+len(bad) != 0 {
		t.Errorf("ListObjects on a migrated file = %v, %v, %v; want empty", objs, bad, err)
	}
	if st := stats(t, d); st != (OutboxStats{}) {
		t.Errorf("outbox stats on a migrated file = %+v, want zero", st)
	}
	putObject(t, d, secretRecord("default", "s", 1, map[string][]byte{"k": []byte("v")}))
	if err := d.PutMarks([]SyncMark{{Key: "pods/default/web", Generation: 1}}); err != nil {
		t.Fatal(err)
	}
	if n, err := d.NextSession(); err != nil || n != 1 {
		t.Errorf("NextSession on a migrated file = %d, %v; want 1", n, err)
	}
	if seqs := queue(t, d, OutboxLimits{}, latest("st", "x")); seqs[0] != 1 {
		t.Errorf("first outbox seq on a migrated file = %d, want 1", seqs[0])
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	// Schema 2's records are byte for byte what they were; the file is at the current schema with
	// every bucket, and a second open has nothing to do.
	if after := dumpBuckets(t, path, bucketDesired, bucketStatus); !reflect.DeepEqual(after, before) {
		t.Errorf("migration changed desired_pods or pod_status")
	}
	bdb, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = bdb.View(func(tx *bolt.Tx) error {
		if v := string(tx.Bucket(bucketMeta).Get(keySchemaVersion)); v != fmt.Sprint(SchemaVersion) {
			t.Errorf("schema_version = %q, want %d", v, SchemaVersion)
		}
		for _, b := range []string{"objects", "sync_marks", "outbox", "outbox_latest", "node_status"} {
			if tx.Bucket([]byte(b)) == nil {
				t.Errorf("bucket %s missing after migration", b)
			}
		}
		return nil
	})
	bdb.Close()
	d, err = Open(path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer d.Close()
	if n := d.Notices(); len(n) != 0 {
		t.Errorf("second open of a migrated file: notices %q, want none", n)
	}
}

// checkNotices checks that d's notices mention each of wants and, when skipped is set, not that
// migration (a file of a later schema must not go through an earlier step); it returns them.
func checkNotices(t *testing.T, d *DB, skipped string, wants ...string) string {
	t.Helper()
	notices := strings.Join(d.Notices(), "\n")
	for _, want := range wants {
		if !strings.Contains(notices, want) {
			t.Errorf("notices %q do not mention %q", notices, want)
		}
	}
	if skipped != "" && strings.Contains(notices, skipped) {
		t.Errorf("notices %q: the file went through %s", notices, skipped)
	}
	return notices
}

// fixturePod is what a fixture's desired pod and its status read after migration.
type fixturePod struct {
	uid   string
	ref   source.Ref
	gen   int64
	phase v1.PodPhase
}

// checkFixturePods checks that the desired pods are exactly wants, each with one
// mqlet.test/busybox:1 container and a status of its phase with one containerd container.
func checkFixturePods(t *testing.T, d *DB, wants map[string]fixturePod) {
	t.Helper()
	pods, bad, err := d.ListDesired()
	if err != nil || len(bad) != 0 {
		t.Fatalf("ListDesired: %v, record errors %v", err, bad)
	}
	var keys []string
	for _, p := range pods {
		k := p.Pod.Namespace + "/" + p.Pod.Name
		keys = append(keys, k)
		w := wants[k]
		if string(p.Pod.UID) != w.uid || p.Source != w.ref || p.Generation != w.gen {
			t.Errorf("%s: uid %s source %+v generation %d; want %s %+v %d", k, p.Pod.UID, p.Source, p.Generation, w.uid, w.ref, w.gen)
		}
		if len(p.Pod.Spec.Containers) != 1 || p.Pod.Spec.Containers[0].Image != "mqlet.test/busybox:1" {
			t.Errorf("%s: containers %+v, want one running mqlet.test/busybox:1", k, p.Pod.Spec.Containers)
		}
		st, ok, err := d.GetStatus(p.Pod.UID)
		if err != nil || !ok || st.Phase != w.phase || len(st.ContainerStatuses) != 1 ||
			!strings.HasPrefix(st.ContainerStatuses[0].ContainerID, "containerd://") {
			t.Errorf("%s: status %+v, %v, %v; want %s with one containerd container", k, st, ok, err, w.phase)
		}
	}
	if want := slices.Sorted(maps.Keys(wants)); !reflect.DeepEqual(keys, want) {
		t.Errorf("desired pods %q, want %q", keys, want)
	}
}

// dumpBuckets copies every key and value of the named buckets, read-only.
func dumpBuckets(t *testing.T, path string, names ...[]byte) map[string]string {
	t.Helper()
	bdb, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	out := map[string]string{}
	err = bdb.View(func(tx *bolt.Tx) error {
		for _, name := range names {
			b := tx.Bucket(name)
			if b == nil {
				return fmt.Errorf("no bucket %s", name)
			}
			if err := b.ForEach(func(k, v []byte) error {
				out[string(name)+"/"+string(k)] = string(v)
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("%s: buckets %q are empty", path, names)
	}
	return out
}

// writeV1 writes a schema 1 file with raw bbolt calls: desired_pods values as given.
func writeV1(t *testing.T, path string, desired map[string][]byte) {
	t.Helper()
	bdb, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = bdb.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		if err := meta.Put(keySchemaVersion, []byte("1")); err != nil {
			return err
		}
		if _, err := tx.CreateBucket(bucketStatus); err != nil {
			return err
		}
		b, err := tx.CreateBucket(bucketDesired)
		if err != nil {
			return err
		}
		for k, v := range desired {
			if v == nil {
				if _, err := b.CreateBucket([]byte(k)); err != nil {
					return err
				}
				continue
			}
			if err := b.Put([]byte(k), v); err != nil {
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

// TestMigrateV1OddRecords: sources the manifest dir never wrote keep their pod with a best-effort
// Ref and a notice; a value that is not a schema 1 record is kept as it is, reported on load, and
// does not stop Open.
func TestMigrateV1OddRecords(t *testing.T) {
	rec := func(uid, src string) []byte {
		b, err := json.Marshal(desiredRecordV1{Source: src, Pod: testPod("default", "p-"+uid, uid)})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	path := filepath.Join(t.TempDir(), FileName)
	writeV1(t, path, map[string][]byte{
		"uid-file":    rec("uid-file", "file:/etc/mqlet/pods/a#b.yaml#3"),
		"uid-mqtt":    rec("uid-mqtt", "mqtt:nodes/n1/pods/x"),
		"uid-bare":    rec("uid-bare", "file:"),
		"uid-baddoc":  rec("uid-baddoc", "file:/p.yaml#x"),
		"uid-nocolon": rec("uid-nocolon", "weird"),
		"uid-garbage": []byte("{not json"),
		"uid-nested":  nil,
	})
	d, err := Open(path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer d.Close()
	wantRefs := map[string]source.Ref{
		"uid-file":    {Kind: source.File, Origin: "/etc/mqlet/pods/a#b.yaml", Doc: 3},
		"uid-mqtt":    {Kind: source.MQTT, Origin: "nodes/n1/pods/x"},
		"uid-bare":    {Kind: source.File},
		"uid-baddoc":  {Kind: source.File, Origin: "/p.yaml#x"},
		"uid-nocolon": {Kind: "weird"},
	}
	pods, bad, err := d.ListDesired()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]source.Ref{}
	for _, p := range pods {
		got[string(p.Pod.UID)] = p.Source
	}
	if !reflect.DeepEqual(got, wantRefs) {
		t.Errorf("sources after migration:\n got %+v\nwant %+v", got, wantRefs)
	}
	var badKeys []string
	for _, e := range bad {
		badKeys = append(badKeys, e.Key)
	}
	if want := []string{"uid-garbage", "uid-nested"}; !reflect.DeepEqual(badKeys, want) {
		t.Errorf("record errors for %q, want %q", badKeys, want)
	}
	notices := strings.Join(d.Notices(), "\n")
	for _, want := range []string{
		`desired_pods/uid-mqtt: source "mqtt:nodes/n1/pods/x" is not`,
		`desired_pods/uid-bare: source "file:" is not`,
		`desired_pods/uid-baddoc: source "file:/p.yaml#x" is not`,
		`desired_pods/uid-nocolon: source "weird" is not`,
		"left desired_pods/uid-garbage as it is",
		"left nested bucket desired_pods/uid-nested",
		"rewrote 5 desired pods",
	} {
		if !strings.Contains(notices, want) {
			t.Errorf("notices do not mention %q:\n%s", want, notices)
		}
	}
	if strings.Contains(notices, "uid-file:") {
		t.Errorf("a well-formed file source got a notice:\n%s", notices)
	}
}

func TestParseSourceV1(t *testing.T) {
	for in, want := range map[string]struct {
		ref source.Ref
		ok  bool
	}{
		"file:/etc/mqlet/pods/web.yaml#0": {source.Ref{Kind: source.File, Origin: "/etc/mqlet/pods/web.yaml"}, true},
		"file:/x/a#1.yaml#12":             {source.Ref{Kind: source.File, Origin: "/x/a#1.yaml", Doc: 12}, true},
		"file:/x.yaml#-1":                 {source.Ref{Kind: source.File, Origin: "/x.yaml#-1"}, false},
		"file:/x.yaml#01":                 {source.Ref{Kind: source.File, Origin: "/x.yaml#01"}, false},
		"file:#0":                         {source.Ref{Kind: source.File, Origin: "#0"}, false},
		"file:":                           {source.Ref{Kind: source.File}, false},
		"mqtt:a:b":                        {source.Ref{Kind: source.MQTT, Origin: "a:b"}, false},
		"":                                {source.Ref{}, false},
	} {
		ref, ok := parseSourceV1(in)
		if ref != want.ref || ok != want.ok {
			t.Errorf("parseSourceV1(%q) = %+v, %v; want %+v, %v", in, ref, ok, want.ref, want.ok)
		}
	}
}

// TestMigrateV3Fixture opens a copy of testdata/v3.db, written by the released schema 3 binary
// (mqlet 1b8f24f running as a daemon with a broker; see testdata/README): desired pods from the
// manifest dir and from MQTT, their status, a ConfigMap and a sealed Secret, sync marks, the
// session counter and an undelivered outbox entry. Migration 3 -> 4 must keep every one of them
// byte for byte, each still readable through the store, and add the node_status bucket, which
// then works.
func TestMigrateV3Fixture(t *testing.T) {
	path := copyFixture(t, "v3.db")
	schema3 := [][]byte{bucketMeta, bucketDesired, bucketStatus, bucketObjects, bucketMarks, bucketOutbox, bucketOutboxLatest}
	before := dumpBuckets(t, path, schema3...)
	key, err := os.ReadFile(filepath.Join("testdata", "v3.key"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := OpenWith(path, Options{SecretKey: key})
	if err != nil {
		t.Fatalf("Open(v3 fixture): %v", err)
	}
	checkNotices(t, d, "2 -> 3", "migrated schema version 3 -> 4", "added bucket node_status", path)

	// Desired pods and their status.
	checkFixturePods(t, d, map[string]fixturePod{
		"default/job":    {"c36a6a22-e267-5555-bf99-ae98bb0ecc64", source.Ref{Kind: source.File, Origin: "/tmp/v3fix/pods/b.yaml", Doc: 0}, 0, v1.PodSucceeded},
		"default/late":   {"c03a54cb-3b02-58c6-bb3b-efcde66e2343", source.Ref{Kind: source.File, Origin: "/tmp/v3fix/pods/c.yaml", Doc: 0}, 0, v1.PodRunning},
		"default/remote": {"ca03c773-b1bb-5454-8fa9-5f3fc58c35bd", source.Ref{Kind: source.MQTT, Origin: "mqlet/v1/nodes/fixture-node/desired/pods/default/remote"}, 3, v1.PodRunning},
		"default/web":    {"3169c6b8-9aab-548b-a454-4c4e3fb93d3f", source.Ref{Kind: source.File, Origin: "/tmp/v3fix/pods/a.yaml", Doc: 0}, 0, v1.PodRunning},
		"tools/sidecar":  {"486d9658-8e9c-5626-9d7a-1b10b5351e11", source.Ref{Kind: source.File, Origin: "/tmp/v3fix/pods/b.yaml", Doc: 1}, 0, v1.PodRunning},
	})

	// The ConfigMap, and the Secret opened with the node key of the agent that sealed it.
	objs, bad, err := d.ListObjects()
	if err != nil || len(bad) != 0 || len(objs) != 2 {
		t.Fatalf("ListObjects = %d objects, record errors %v, %v; want 2", len(objs), bad, err)
	}
	cm, ok, err := d.GetObject(KindConfigMap, "default", "app-config")
	if err != nil || !ok || cm.Generation != 3 || cm.Source.Kind != source.MQTT || cm.ConfigMap.Data["greeting"] != "hello from mqtt" {
		t.Errorf("configmap: %+v, %v, %v", cm, ok, err)
	}
	sec, ok, err := d.GetObject(KindSecret, "default", "app-secret")
	if err != nil || !ok || sec.Generation != 3 || string(sec.Secret.Data["token"]) != "s3cr3t" {
		t.Errorf("secret: %+v, %v, %v", sec, ok, err)
	}

	// Sync marks, the session counter and the outbox entry left undelivered.
	marks, bad, err := d.ListMarks()
	if err != nil || len(bad) != 0 {
		t.Fatalf("ListMarks: %v, %v", err, bad)
	}
	for _, k := range []string{"configmaps/default/app-config", "secrets/default/app-secret", "pods/default/remote", "index"} {
		if m, ok := marks[k]; !ok || m.Generation != 3 || m.Deleted {
			t.Errorf("mark %s = %+v, %v; want generation 3", k, m, ok)
		}
	}
	if len(marks) != 4 {
		t.Errorf("marks %v, want 4", marks)
	}
	entries, err := d.OutboxList(0)
	if err != nil || len(entries) != 1 {
		t.Fatalf("OutboxList = %d entries, %v; want 1", len(entries), err)
	}
	e := entries[0]
	if e.Seq != 21 || e.Topic != "mqlet/v1/nodes/fixture-node/status/pods/default/late" || !e.Retained || !e.Latest ||
		!strings.Contains(string(e.Payload), `"name":"late"`) {
		t.Errorf("outbox entry %+v", e)
	}
	if st := stats(t, d); st.Entries != 1 || st.Events != 0 {
		t.Errorf("outbox stats %+v", st)
	}
	if n, err := d.NextSession(); err != nil || n != 6 {
		t.Errorf("NextSession = %d, %v; want 6 (the fixture's session was 5)", n, err)
	}

	// The new bucket works.
	if n, ok, err := d.GetNodeStatus(); n != nil || ok || err != nil {
		t.Errorf("GetNodeStatus on a migrated file = %v, %v, %v; want none", n, ok, err)
	}
	if err := d.PutNodeStatus(testNode("fixture-node", v1.ConditionTrue, time.Now())); err != nil {
		t.Fatal(err)
	}
	if n, ok, err := d.GetNodeStatus(); err != nil || !ok || n.Name != "fixture-node" {
		t.Errorf("GetNodeStatus after a put = %v, %v, %v", n, ok, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	// What schema 3 wrote is as it was, apart from the meta keys this test moved (the schema
	// version, and the session NextSession took).
	after := dumpBuckets(t, path, schema3...)
	for k, v := range before {
		switch k {
		case "meta/schema_version", "meta/session":
			continue
		}
		if after[k] != v {
			t.Errorf("migration changed %s", k)
		}
	}
	if after["meta/schema_version"] != fmt.Sprint(SchemaVersion) {
		t.Errorf("schema_version = %q, want %d", after["meta/schema_version"], SchemaVersion)
	}
	d, err = Open(path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer d.Close()
	if n := d.Notices(); len(n) != 0 {
		t.Errorf("second open of a migrated file: notices %q, want none", n)
	}
}

// TestMigrateV4Fixture opens a copy of testdata/v4.db, written by the released schema 4 binary
// (mqlet 48e134a as a daemon with a broker; see testdata/README): desired pods from the manifest
// dir and from MQTT, their status, a ConfigMap and a sealed Secret, sync marks, the session
// counter, an undelivered outbox entry and the node's status. Migration 4 -> 5 must keep every one
// of them byte for byte, each still readable through the store, and add the events bucket, which
// then works.
func TestMigrateV4Fixture(t *testing.T) {
	path := copyFixture(t, "v4.db")
	schema4 := [][]byte{bucketMeta, bucketDesired, bucketStatus, bucketObjects, bucketMarks, bucketOutbox, bucketOutboxLatest, bucketNodeStatus}
	before := dumpBuckets(t, path, schema4...)
	key, err := os.ReadFile(filepath.Join("testdata", "v4.key"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := OpenWith(path, Options{SecretKey: key})
	if err != nil {
		t.Fatalf("Open(v4 fixture): %v", err)
	}
	checkNotices(t, d, "3 -> 4", "migrated schema version 4 -> 5", "added bucket events", path)

	checkFixturePods(t, d, map[string]fixturePod{
		"default/job":    {"c36a6a22-e267-5555-bf99-ae98bb0ecc64", source.Ref{Kind: source.File, Origin: "/tmp/v4fix/pods/b.yaml", Doc: 0}, 0, v1.PodSucceeded},
		"default/late":   {"c03a54cb-3b02-58c6-bb3b-efcde66e2343", source.Ref{Kind: source.File, Origin: "/tmp/v4fix/pods/c.yaml", Doc: 0}, 0, v1.PodRunning},
		"default/remote": {"ca03c773-b1bb-5454-8fa9-5f3fc58c35bd", source.Ref{Kind: source.MQTT, Origin: "mqlet/v1/nodes/fixture-node/desired/pods/default/remote"}, 1, v1.PodRunning},
		"default/web":    {"3169c6b8-9aab-548b-a454-4c4e3fb93d3f", source.Ref{Kind: source.File, Origin: "/tmp/v4fix/pods/a.yaml", Doc: 0}, 0, v1.PodRunning},
		"tools/sidecar":  {"486d9658-8e9c-5626-9d7a-1b10b5351e11", source.Ref{Kind: source.File, Origin: "/tmp/v4fix/pods/b.yaml", Doc: 1}, 0, v1.PodRunning},
	})

	objs, bad, err := d.ListObjects()
	if err != nil || len(bad) != 0 || len(objs) != 2 {
		t.Fatalf("ListObjects = %d objects, record errors %v, %v; want 2", len(objs), bad, err)
	}
	cm, ok, err := d.GetObject(KindConfigMap, "default", "app-config")
	if err != nil || !ok || cm.Generation != 1 || cm.Source.Kind != source.MQTT || cm.ConfigMap.Data["greeting"] != "hello from mqtt" {
		t.Errorf("configmap: %+v, %v, %v", cm, ok, err)
	}
	sec, ok, err := d.GetObject(KindSecret, "default", "app-secret")
	if err != nil || !ok || sec.Generation != 1 || string(sec.Secret.Data["token"]) != "s3cr3t" {
		t.Errorf("secret: %+v, %v, %v", sec, ok, err)
	}
	marks, bad, err := d.ListMarks()
	if err != nil || len(bad) != 0 {
		t.Fatalf("ListMarks: %v, %v", err, bad)
	}
	for _, k := range []string{"configmaps/default/app-config", "secrets/default/app-secret", "pods/default/remote", "index"} {
		if m, ok := marks[k]; !ok || m.Generation != 1 || m.Deleted {
			t.Errorf("mark %s = %+v, %v; want generation 1", k, m, ok)
		}
	}
	entries, err := d.OutboxList(0)
	if err != nil || len(entries) != 1 {
		t.Fatalf("OutboxList = %d entries, %v; want 1", len(entries), err)
	}
	if e := entries[0]; e.Seq != 11 || e.Topic != "mqlet/v1/nodes/fixture-node/status/pods/default/late" || !e.Retained || !e.Latest ||
		!strings.Contains(string(e.Payload), `"name":"late"`) {
		t.Errorf("outbox entry %+v", e)
	}
	if n, ok, err := d.GetNodeStatus(); err != nil || !ok || n.Name != "fixture-node" || len(n.Status.Conditions) == 0 {
		t.Errorf("node status of the fixture = %v, %v, %v; want fixture-node with conditions", n, ok, err)
	}
	if n, err := d.NextSession(); err != nil || n != 5 {
		t.Errorf("NextSession = %d, %v; want 5 (the fixture's session was 4)", n, err)
	}

	// The new bucket starts empty and works.
	if got := listEventUIDs(t, d); len(got) != 0 {
		t.Errorf("events of a migrated file = %v, want none", got)
	}
	if err := d.UpdateEvents([]PodEvents{testEvents("3169c6b8-9aab-548b-a454-4c4e3fb93d3f", "web", 2)}, nil); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := d.GetEvents("3169c6b8-9aab-548b-a454-4c4e3fb93d3f"); err != nil || !ok || len(got.Events) != 2 {
		t.Errorf("GetEvents after a put = %+v, %v, %v", got, ok, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	after := dumpBuckets(t, path, schema4...)
	for k, v := range before {
		switch k {
		case "meta/schema_version", "meta/session":
			continue
		}
		if after[k] != v {
			t.Errorf("migration changed %s", k)
		}
	}
	if before["meta/schema_version"] != "4" || after["meta/schema_version"] != fmt.Sprint(SchemaVersion) {
		t.Errorf("schema_version %q -> %q, want 4 -> %d", before["meta/schema_version"], after["meta/schema_version"], SchemaVersion)
	}
	d, err = Open(path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer d.Close()
	if n := d.Notices(); len(n) != 0 {
		t.Errorf("second open of a migrated file: notices %q, want none", n)
	}
}
