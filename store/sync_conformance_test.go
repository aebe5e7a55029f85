package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/core/source"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The conformance cases for the records the MQTT sync needs; TestStateConformance runs them
// against DB and Memory.
var syncConformance = map[string]func(t *testing.T, s stateUnderTest){
	"objects round trip":              testObjectsRoundTrip,
	"objects refused input":           testObjectsRefused,
	"objects no aliasing":             testObjectsNoAliasing,
	"objects undecodable degrade":     testObjectsBadRecords,
	"marks round trip":                testMarks,
	"marks undecodable degrade":       testMarksBadRecords,
	"next session counts":             testNextSession,
	"outbox order and list":           testOutboxOrder,
	"outbox latest coalesces":         testOutboxCoalescing,
	"outbox events bounded by count":  testOutboxEventBound,
	"outbox bounded by bytes":         testOutboxByteBound,
	"outbox latest refused when full": testOutboxRefusedLatest,
	"outbox ack":                      testOutboxAck,
	"outbox ack many":                 testOutboxAckMany,
	"outbox refused input":            testOutboxRefusedInput,
	"outbox undecodable degrade":      testOutboxBadRecords,
}

var refObj = source.Ref{Kind: source.MQTT, Origin: "mqlet/nodes/n1/desired/configmaps/default/app"}

func testConfigMap(ns, name string, data map[string]string) *v1.ConfigMap {
	return &v1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": name}},
		Data:       data,
	}
}

func testSecret(ns, name string, data map[string][]byte) *v1.Secret {
	return &v1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Type:       v1.SecretTypeOpaque,
		Data:       data,
	}
}

func cmRecord(ns, name string, gen int64, data map[string]string) ObjectRecord {
	return ObjectRecord{Kind: KindConfigMap, Namespace: ns, Name: name, Generation: gen, Source: refObj, ConfigMap: testConfigMap(ns, name, data)}
}

func secretRecord(ns, name string, gen int64, data map[string][]byte) ObjectRecord {
	return ObjectRecord{Kind: KindSecret, Namespace: ns, Name: name, Generation: gen, Source: refObj, Secret: testSecret(ns, name, data)}
}

// listObjectNames lists objects as "Kind ns/name gN" and fails on any record error.
func listObjectNames(t *testing.T, s State) []string {
	t.Helper()
	objs, bad, err := s.ListObjects()
	if err != nil {
		t.Fatalf("ListObjects: %v", err)
	}
	if len(bad) != 0 {
		t.Errorf("ListObjects record errors: %v", bad)
	}
	out := []string{}
	for _, o := range objs {
		out = append(out, fmt.Sprintf("%s %s/%s g%d", o.Kind, o.Namespace, o.Name, o.Generation))
	}
	return out
}

func putObject(t *testing.T, s State, r ObjectRecord) {
	t.Helper()
	if err := s.PutObject(r); err != nil {
		t.Fatalf("PutObject(%s %s/%s): %v", r.Kind, r.Namespace, r.Name, err)
	}
}

// getObject returns a stored object and fails the test if it is not there.
func getObject(t *testing.T, s State, kind ObjectKind, namespace, name string) ObjectRecord {
	t.Helper()
	r, ok, err := s.GetObject(kind, namespace, name)
	if err != nil || !ok {
		t.Fatalf("GetObject(%s %s/%s) = found %v, %v", kind, namespace, name, ok, err)
	}
	return r
}

func testObjectsRoundTrip(t *testing.T, s stateUnderTest) {
	cm := cmRecord("default", "app", 3, map[string]string{"config.yaml": "a: 1"})
	sec := secretRecord("default", "app", 4, map[string][]byte{"password": []byte("s3cret")})
	putObject(t, s, cm)
	putObject(t, s, sec)
	putObject(t, s, cmRecord("a-b", "x", 0, nil)) // "a-b" sorts before "a" by bytes, after it by namespace
	putObject(t, s, cmRecord("a", "x", 0, nil))
	putObject(t, s, secretRecord("kube-system", "token", 1, map[string][]byte{"t": {0, 1, 2}}))

	got, ok, err := s.GetObject(KindConfigMap, "default", "app")
	if err != nil || !ok {
		t.Fatalf("GetObject(ConfigMap default/app) = _, %v, %v", ok, err)
	}
	if !reflect.DeepEqual(got, cm) {
		t.Errorf("configMap changed in round trip:\n got %+v\nwant %+v", got, cm)
	}
	got, ok, err = s.GetObject(KindSecret, "default", "app")
	if err != nil || !ok {
		t.Fatalf("GetObject(Secret default/app) = _, %v, %v", ok, err)
	}
	if !reflect.DeepEqual(got, sec) {
		t.Errorf("secret changed in round trip:\n got %+v\nwant %+v", got, sec)
	}
	if _, ok, err := s.GetObject(KindSecret, "default", "missing"); ok || err != nil {
		t.Errorf("GetObject(missing) = found %v, err %v", ok, err)
	}
	if _, _, err := s.GetObject("Pod", "default", "app"); err == nil || !strings.Contains(err.Error(), `"Pod"`) {
		t.Errorf("GetObject(kind Pod) = %v, want an error naming the kind", err)
	}

	want := []string{
		"ConfigMap a/x g0",
		"ConfigMap a-b/x g0",
		"ConfigMap default/app g3",
		"Secret default/app g4",
		"Secret kube-system/token g1",
	}
	if got := listObjectNames(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("ListObjects = %q, want %q", got, want)
	}

	// A put replaces; the object's namespace may be left out of its metadata.
	sec2 := secretRecord("default", "app", 5, map[string][]byte{"password": []byte("n3w")})
	sec2.Secret.Namespace = ""
	putObject(t, s, sec2)
	if got := getObject(t, s, KindSecret, "default", "app"); got.Generation != 5 || string(got.Secret.Data["password"]) != "n3w" {
		t.Errorf("after second put: generation %d data %q", got.Generation, got.Secret.Data)
	}

	if err := s.DeleteObject(KindSecret, "default", "app"); err != nil {
		t.Fatalf("DeleteObject: %v", err)
	}
	if err := s.DeleteObject(KindSecret, "default", "app"); err != nil {
		t.Errorf("DeleteObject twice: %v", err)
	}
	if _, ok, _ := s.GetObject(KindSecret, "default", "app"); ok {
		t.Errorf("secret still there after DeleteObject")
	}
	if _, ok, _ := s.GetObject(KindConfigMap, "default", "app"); !ok {
		t.Errorf("deleting the Secret default/app removed the ConfigMap of the same name")
	}
}

func testObjectsRefused(t *testing.T, s stateUnderTest) {
	mismatch := cmRecord("default", "a", 0, nil)
	mismatch.ConfigMap.Name = "b"
	otherNS := secretRecord("default", "a", 0, nil)
	otherNS.Secret.Namespace = "kube-system"
	both := cmRecord("default", "a", 0, nil)
	both.Secret = testSecret("default", "a", nil)
	noSource := cmRecord("default", "a", 0, nil)
	noSource.Source = source.Ref{}
	for name, tc := range map[string]struct {
		r    ObjectRecord
		want string
	}{
		"unknown kind":         {ObjectRecord{Kind: "Pod", Namespace: "default", Name: "a", Source: refObj}, `kind "Pod"`},
		"empty namespace":      {cmRecord("", "a", 0, nil), "namespace"},
		"name with slash":      {cmRecord("default", "a/b", 0, nil), "name"},
		"configMap missing":    {ObjectRecord{Kind: KindConfigMap, Namespace: "default", Name: "a", Source: refObj}, "needs ConfigMap"},
		"secret missing":       {ObjectRecord{Kind: KindSecret, Namespace: "default", Name: "a", Source: refObj, ConfigMap: testConfigMap("default", "a", nil)}, "needs Secret"},
		"both set":             {both, "Secret nil"},
		"metadata other name":  {mismatch, "names default/b"},
		"metadata other space": {otherNS, "names kube-system/a"},
		"no source":            {noSource, "source kind"},
	} {
		err := s.PutObject(tc.r)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: PutObject = %v, want an error containing %q", name, err, tc.want)
		}
	}
	if got := listObjectNames(t, s); len(got) != 0 {
		t.Errorf("refused puts stored %q", got)
	}
}

func testObjectsNoAliasing(t *testing.T, s stateUnderTest) {
	cm := cmRecord("default", "app", 1, map[string]string{"k": "v"})
	sec := secretRecord("default", "app", 1, map[string][]byte{"k": []byte("v")})
	putObject(t, s, cm)
	putObject(t, s, sec)
	cm.ConfigMap.Data["k"] = "changed-after-put"
	sec.Secret.Data["k"][0] = 'X'

	gotCM := getObject(t, s, KindConfigMap, "default", "app")
	gotSec := getObject(t, s, KindSecret, "default", "app")
	if gotCM.ConfigMap.Data["k"] != "v" || string(gotSec.Secret.Data["k"]) != "v" {
		t.Fatalf("editing what was put changed what is stored: %q %q", gotCM.ConfigMap.Data, gotSec.Secret.Data)
	}
	gotCM.ConfigMap.Data["k"] = "changed-after-get"
	gotSec.Secret.Data["k"][0] = 'Y'
	listed, _, _ := s.ListObjects()
	for _, o := range listed {
		if o.ConfigMap != nil {
			o.ConfigMap.Labels["app"] = "changed-after-list"
		}
		if o.Secret != nil {
			o.Secret.Data["k"] = []byte("changed-after-list")
		}
	}
	again := getObject(t, s, KindConfigMap, "default", "app")
	againSec := getObject(t, s, KindSecret, "default", "app")
	if again.ConfigMap.Data["k"] != "v" || again.ConfigMap.Labels["app"] != "app" || string(againSec.Secret.Data["k"]) != "v" {
		t.Errorf("editing a returned object changed the stored one: %+v %q", again.ConfigMap, againSec.Secret.Data)
	}
}

func testObjectsBadRecords(t *testing.T, s stateUnderTest) {
	putObject(t, s, cmRecord("default", "good", 0, nil))
	putObject(t, s, secretRecord("default", "good", 0, map[string][]byte{"k": []byte("v")}))
	s.setRaw(t, "objects", "ConfigMap/default/garbage", []byte("{not json"))
	s.setRaw(t, "objects", "Secret/default/garbage", []byte("\x01not a sealed value, not json"))
	s.setRaw(t, "objects", "Pod/default/x", []byte(`{}`))
	// A ConfigMap stored under another name's key would be handed to pods under that name.
	s.setRaw(t, "objects", "ConfigMap/default/elsewhere",
		[]byte(`{"source":{"kind":"mqtt"},"generation":0,"configMap":{"metadata":{"name":"good","namespace":"default"}}}`))
	s.setRaw(t, "objects", "ConfigMap/default/empty", []byte(`{"source":{"kind":"mqtt"},"generation":0}`))

	objs, bad, err := s.ListObjects()
	if err != nil {
		t.Fatalf("ListObjects: %v", err)
	}
	if len(objs) != 2 {
		t.Errorf("ListObjects loaded %d objects, want the 2 good ones", len(objs))
	}
	var keys []string
	for _, e := range bad {
		if e.Bucket != "objects" || e.Err == nil {
			t.Errorf("record error %+v: want bucket objects and a cause", e)
		}
		keys = append(keys, e.Key)
	}
	want := []string{"ConfigMap/default/elsewhere", "ConfigMap/default/empty", "ConfigMap/default/garbage", "Pod/default/x", "Secret/default/garbage"}
	if !reflect.DeepEqual(keys, want) {
		t.Errorf("record errors for %q, want %q", keys, want)
	}
	for _, k := range []struct {
		kind ObjectKind
		name string
	}{{KindConfigMap, "garbage"}, {KindSecret, "garbage"}, {KindConfigMap, "elsewhere"}} {
		_, _, err := s.GetObject(k.kind, "default", k.name)
		var re RecordError
		key := string(k.kind) + "/default/" + k.name
		if err == nil || !errors.As(err, &re) || re.Key != key || !strings.Contains(err.Error(), "objects/"+key) {
			t.Errorf("GetObject(%s) = %v; want a RecordError naming objects/%s", key, err, key)
		}
	}
	// A bad record is repaired by a put and removed by a delete, like any other.
	putObject(t, s, secretRecord("default", "garbage", 1, nil))
	if err := s.DeleteObject(KindConfigMap, "default", "garbage"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.GetObject(KindSecret, "default", "garbage"); !ok || err != nil {
		t.Errorf("repaired secret: found %v, %v", ok, err)
	}
}

func testMarks(t *testing.T, s stateUnderTest) {
	marks := []SyncMark{
		{Key: "pods/default/web", Generation: 3},
		{Key: "configmaps/default/app", Generation: 1},
		{Key: "secrets/default/app", Generation: 7, Deleted: true},
		{Key: "pods/default/web", Generation: 4}, // later in the slice wins
	}
	if err := s.PutMarks(marks); err != nil {
		t.Fatalf("PutMarks: %v", err)
	}
	got, bad, err := s.ListMarks()
	if err != nil || len(bad) != 0 {
		t.Fatalf("ListMarks: %v, record errors %v", err, bad)
	}
	want := map[string]SyncMark{
		"pods/default/web":       {Key: "pods/default/web", Generation: 4},
		"configmaps/default/app": {Key: "configmaps/default/app", Generation: 1},
		"secrets/default/app":    {Key: "secrets/default/app", Generation: 7, Deleted: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ListMarks = %+v, want %+v", got, want)
	}
	// A tombstone replaced by a newer generation, and back.
	if err := s.PutMarks([]SyncMark{{Key: "secrets/default/app", Generation: 8}, {Key: "pods/default/web", Generation: 5, Deleted: true}}); err != nil {
		t.Fatal(err)
	}
	got, _, _ = s.ListMarks()
	if !reflect.DeepEqual(got["secrets/default/app"], SyncMark{Key: "secrets/default/app", Generation: 8}) ||
		!reflect.DeepEqual(got["pods/default/web"], SyncMark{Key: "pods/default/web", Generation: 5, Deleted: true}) {
		t.Errorf("after second put: %+v", got)
	}
	if err := s.DeleteMarks([]string{"pods/default/web", "never/there"}); err != nil {
		t.Fatalf("DeleteMarks: %v", err)
	}
	got, _, _ = s.ListMarks()
	if _, ok := got["pods/default/web"]; len(got) != 2 || ok {
		t.Errorf("after DeleteMarks: %+v", got)
	}
	if err := s.PutMarks(nil); err != nil {
		t.Errorf("PutMarks(nil) = %v", err)
	}
	if err := s.DeleteMarks(nil); err != nil {
		t.Errorf("DeleteMarks(nil) = %v", err)
	}
	// Invalid input changes nothing, not even its valid part.
	if err := s.PutMarks([]SyncMark{{Key: "pods/default/new", Generation: 1}, {Generation: 2}}); err == nil || !strings.Contains(err.Error(), "marks[1]") {
		t.Errorf("PutMarks with an empty key = %v, want an error naming marks[1]", err)
	}
	if err := s.DeleteMarks([]string{"configmaps/default/app", ""}); err == nil || !strings.Contains(err.Error(), "keys[1]") {
		t.Errorf("DeleteMarks with an empty key = %v, want an error naming keys[1]", err)
	}
	if got, _, _ := s.ListMarks(); len(got) != 2 || got["pods/default/new"].Key != "" || got["configmaps/default/app"].Generation != 1 {
		t.Errorf("refused calls changed the marks: %+v", got)
	}
	// UpdateMarks: puts and deletes together, every field kept; bad input changes nothing.
	idx := SyncMark{Key: "index", Generation: 9, Digest: "d1", Data: []byte(`{"revision":9}`)}
	ref := SyncMark{Key: "pods/default/bad", Generation: 9, Digest: "d2", Refused: "policy: privileged"}
	if err := s.UpdateMarks([]SyncMark{idx, ref}, []string{"configmaps/default/app", "never/there"}); err != nil {
		t.Fatalf("UpdateMarks: %v", err)
	}
	got, _, _ = s.ListMarks()
	if _, ok := got["configmaps/default/app"]; ok || !reflect.DeepEqual(got["index"], idx) || !reflect.DeepEqual(got["pods/default/bad"], ref) {
		t.Errorf("after UpdateMarks: %+v", got)
	}
	if err := s.UpdateMarks([]SyncMark{{Key: "pods/default/x", Generation: 1}}, []string{"index", ""}); err == nil || !strings.Contains(err.Error(), "del[1]") {
		t.Errorf("UpdateMarks with an empty key = %v, want an error naming del[1]", err)
	}
	if got, _, _ := s.ListMarks(); got["index"].Generation != 9 || got["pods/default/x"].Key != "" {
		t.Errorf("a refused UpdateMarks changed the marks: %+v", got)
	}
}

func testMarksBadRecords(t *testing.T, s stateUnderTest) {
	if err := s.PutMarks([]SyncMark{{Key: "pods/default/good", Generation: 1}}); err != nil {
		t.Fatal(err)
	}
	s.setRaw(t, "sync_marks", "pods/default/bad", []byte("{"))
	got, bad, err := s.ListMarks()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["pods/default/good"].Generation != 1 {
		t.Errorf("ListMarks = %+v, want only the good mark", got)
	}
	if len(bad) != 1 || bad[0].Bucket != "sync_marks" || bad[0].Key != "pods/default/bad" {
		t.Errorf("record errors %v, want one for sync_marks/pods/default/bad", bad)
	}
}

func testNextSession(t *testing.T, s stateUnderTest) {
	for want := int64(1); want <= 3; want++ {
		if got, err := s.NextSession(); err != nil || got != want {
			t.Fatalf("NextSession = %d, %v; want %d", got, err, want)
		}
	}
	// A damaged counter must not restart at 1: a repeated session number would let the control
	// plane take the new session's messages for the old one's.
	s.setRaw(t, "meta", "session", []byte("x"))
	if got, err := s.NextSession(); err == nil || !strings.Contains(err.Error(), "meta/session") {
		t.Errorf("NextSession on a damaged counter = %d, %v; want an error naming meta/session", got, err)
	}
}

func queue(t *testing.T, s State, lim OutboxLimits, entries ...OutboxEntry) []uint64 {
	t.Helper()
	seqs, err := s.OutboxPut(entries, lim)
	if err != nil {
		t.Fatalf("OutboxPut: %v", err)
	}
	if len(seqs) != len(entries) {
		t.Fatalf("OutboxPut returned %d seqs for %d entries", len(seqs), len(entries))
	}
	return seqs
}

func event(topic, payload string) OutboxEntry {
	return OutboxEntry{Topic: topic, Payload: []byte(payload)}
}

func latest(topic, payload string) OutboxEntry {
	return OutboxEntry{Topic: topic, Payload: []byte(payload), Retained: true, Latest: true}
}

// listOutbox lists the outbox as "seq topic=payload" with L for Latest and R for retained.
func listOutbox(t *testing.T, s State) []string {
	t.Helper()
	entries, err := s.OutboxList(0)
	if err != nil {
		t.Fatalf("OutboxList: %v", err)
	}
	out := []string{}
	for _, e := range entries {
		flags := ""
		if e.Latest {
			flags += "L"
		}
		if e.Retained {
			flags += "R"
		}
		out = append(out, fmt.Sprintf("%d%s %s=%s", e.Seq, flags, e.Topic, e.Payload))
	}
	return out
}

func stats(t *testing.T, s State) OutboxStats {
	t.Helper()
	st, err := s.OutboxStats()
	if err != nil {
		t.Fatalf("OutboxStats: %v", err)
	}
	return st
}

func testOutboxOrder(t *testing.T, s stateUnderTest) {
	if got := listOutbox(t, s); len(got) != 0 {
		t.Fatalf("new outbox holds %q", got)
	}
	if st := stats(t, s); st != (OutboxStats{}) {
		t.Errorf("new outbox stats %+v, want zero", st)
	}
	seqs := queue(t, s, OutboxLimits{},
		event("n1/events", "e1"),
		latest("n1/status/pods/default/web", "running"),
		OutboxEntry{Topic: "n1/events", Payload: []byte("e2"), Retained: true},
	)
	if want := []uint64{1, 2, 3}; !reflect.DeepEqual(seqs, want) {
		t.Errorf("seqs %v, want %v", seqs, want)
	}
	more := queue(t, s, OutboxLimits{}, event("n1/events", "e3"))
	want := []string{"1 n1/events=e1", "2LR n1/status/pods/default/web=running", "3R n1/events=e2", "4 n1/events=e3"}
	if more[0] != 4 || !reflect.DeepEqual(listOutbox(t, s), want) {
		t.Errorf("outbox = %q (last seq %d), want %q", listOutbox(t, s), more[0], want)
	}
	for limit, n := range map[int]int{1: 1, 3: 3, 4: 4, 10: 4, -1: 4} {
		got, err := s.OutboxList(limit)
		if err != nil || len(got) != n || got[0].Seq != 1 {
			t.Errorf("OutboxList(%d) = %d entries (%v); want %d from seq 1", limit, len(got), err, n)
		}
	}
	wantStats := OutboxStats{Entries: 4, Events: 3, Bytes: int64(3*len("n1/events") + 6 + len("n1/status/pods/default/web") + 7)}
	if st := stats(t, s); st != wantStats {
		t.Errorf("stats %+v, want %+v", st, wantStats)
	}
	// What OutboxList returns is the caller's.
	got, _ := s.OutboxList(1)
	got[0].Payload[0] = 'X'
	if again, _ := s.OutboxList(1); string(again[0].Payload) != "e1" {
		t.Errorf("editing a listed payload changed the stored one: %q", again[0].Payload)
	}
	// Seqs are not reused once everything is acked.
	for _, e := range listOutboxEntries(t, s) {
		if err := s.OutboxAck(e.Topic, e.Seq); err != nil {
			t.Fatal(err)
		}
	}
	if seqs := queue(t, s, OutboxLimits{}, event("n1/events", "e4")); seqs[0] != 5 {
		t.Errorf("seq after acking everything = %d, want 5", seqs[0])
	}
	if st := stats(t, s); st != (OutboxStats{Entries: 1, Events: 1, Bytes: int64(len("n1/events") + 2)}) {
		t.Errorf("stats after acks and one put: %+v", st)
	}
}

func listOutboxEntries(t *testing.T, s State) []OutboxEntry {
	t.Helper()
	entries, err := s.OutboxList(0)
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

func testOutboxCoalescing(t *testing.T, s stateUnderTest) {
	const topic = "n1/status/pods/default/web"
	first := queue(t, s, OutboxLimits{}, latest(topic, "pending"), event("n1/events", "e1"))
	second := queue(t, s, OutboxLimits{}, latest(topic, "running-longer"))
	if second[0] <= first[1] {
		t.Errorf("replacing entry got seq %d, want after %d: it is newer than the event", second[0], first[1])
	}
	want := []string{fmt.Sprintf("%d n1/events=e1", first[1]), fmt.Sprintf("%dLR %s=running-longer", second[0], topic)}
	if got := listOutbox(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after replacing: %q, want %q", got, want)
	}
	// The replaced entry's bytes are freed.
	wantStats := OutboxStats{Entries: 2, Events: 1, Bytes: int64(len(topic) + len("running-longer") + len("n1/events") + 2)}
	if st := stats(t, s); st != wantStats {
		t.Errorf("stats %+v, want %+v", st, wantStats)
	}
	// The broker's ack of the first version arrives late: the second stays queued.
	if err := s.OutboxAck(topic, first[0]); err != nil {
		t.Fatalf("ack of the replaced seq: %v", err)
	}
	if got := listOutbox(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("ack of the replaced seq changed the outbox: %q, want %q", got, want)
	}
	if err := s.OutboxAck(topic, second[0]); err != nil {
		t.Fatal(err)
	}
	// The topic is free again: a new put is queued, not compared with anything.
	third := queue(t, s, OutboxLimits{}, latest(topic, "succeeded"))
	want = []string{fmt.Sprintf("%d n1/events=e1", first[1]), fmt.Sprintf("%dLR %s=succeeded", third[0], topic)}
	if got := listOutbox(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after ack and a new put: %q, want %q", got, want)
	}
	// Two versions in one put: the later one is kept.
	two := queue(t, s, OutboxLimits{}, latest("n1/online", "1"), latest("n1/online", "2"))
	got := listOutboxEntries(t, s)
	if last := got[len(got)-1]; last.Seq != two[1] || string(last.Payload) != "2" || len(got) != 3 {
		t.Errorf("two versions in one put: outbox %q", listOutbox(t, s))
	}
	if st := stats(t, s); st.Entries != 3 || st.Events != 1 {
		t.Errorf("stats %+v, want 3 entries, 1 event", st)
	}
}

func testOutboxEventBound(t *testing.T, s stateUnderTest) {
	lim := OutboxLimits{MaxEvents: 3}
	queue(t, s, lim, latest("n1/status", "s"))
	for i := 1; i <= 5; i++ {
		queue(t, s, lim, event("n1/events", fmt.Sprintf("e%d", i)))
	}
	// The Latest entry is older than every event but is not one: it stays.
	want := []string{"1LR n1/status=s", "4 n1/events=e3", "5 n1/events=e4", "6 n1/events=e5"}
	if got := listOutbox(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("outbox %q, want %q", got, want)
	}
	if st := stats(t, s); st.Events != 3 || st.Entries != 4 || st.DroppedEvents != 2 {
		t.Errorf("stats %+v, want 3 events, 4 entries, 2 dropped", st)
	}
	// Several at once, past the bound within the put itself: the oldest go, the put's own
	// included.
	queue(t, s, lim, event("n1/events", "e6"), event("n1/events", "e7"), event("n1/events", "e8"), event("n1/events", "e9"))
	want = []string{"1LR n1/status=s", "8 n1/events=e7", "9 n1/events=e8", "10 n1/events=e9"}
	if got := listOutbox(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("outbox %q, want %q", got, want)
	}
	if st := stats(t, s); st.DroppedEvents != 6 || st.Events != 3 {
		t.Errorf("stats %+v, want 6 dropped, 3 events", st)
	}
	// The default bound is 1000.
	var many []OutboxEntry
	for i := range 1005 {
		many = append(many, event("e", fmt.Sprint(i)))
	}
	queue(t, s, OutboxLimits{}, many...)
	if st := stats(t, s); st.Events != DefaultOutboxMaxEvents || st.DroppedEvents != 6+3+5 {
		t.Errorf("stats after 1005 events under the default bound: %+v", st)
	}
	if got := listOutboxEntries(t, s); string(got[1].Payload) != "5" {
		t.Errorf("oldest event kept is %q, want \"5\"", got[1].Payload)
	}
}

func testOutboxByteBound(t *testing.T, s stateUnderTest) {
	// Each event is 10 bytes: topic "ev" (2) + 8 bytes of payload.
	lim := OutboxLimits{MaxBytes: 45}
	for i := 1; i <= 4; i++ {
		queue(t, s, lim, event("ev", fmt.Sprintf("payload%d", i)))
	}
	if st := stats(t, s); st.Bytes != 40 || st.DroppedEvents != 0 {
		t.Fatalf("stats %+v, want 40 bytes and nothing dropped", st)
	}
	queue(t, s, lim, event("ev", "payload5"))
	if got, want := listOutbox(t, s), []string{"2 ev=payload2", "3 ev=payload3", "4 ev=payload4", "5 ev=payload5"}; !reflect.DeepEqual(got, want) {
		t.Errorf("outbox %q, want %q", got, want)
	}
	// A Latest entry of 20 bytes makes room by dropping the two oldest events.
	queue(t, s, lim, latest("st", "latest-of-18b-----"))
	if got, want := listOutbox(t, s), []string{"4 ev=payload4", "5 ev=payload5", "6LR st=latest-of-18b-----"}; !reflect.DeepEqual(got, want) {
		t.Errorf("outbox %q, want %q", got, want)
	}
	if st := stats(t, s); st != (OutboxStats{Entries: 3, Bytes: 40, Events: 2, DroppedEvents: 3}) {
		t.Errorf("stats %+v", st)
	}
	// An event larger than the bound alone is refused; one that would fit alone but not beside
	// the Latest entries is refused too, without dropping the events already queued.
	for _, e := range []OutboxEntry{event("ev", strings.Repeat("x", 44)), event("ev", strings.Repeat("x", 24))} {
		seqs, err := s.OutboxPut([]OutboxEntry{e}, lim)
		if !errors.Is(err, ErrOutboxFull) || !strings.Contains(err.Error(), "topic ev") || len(seqs) != 1 || seqs[0] != 0 {
			t.Errorf("event of %d bytes: seqs %v, err %v; want seq 0 and ErrOutboxFull naming topic ev", entrySize(e), seqs, err)
		}
	}
	if got, want := listOutbox(t, s), []string{"4 ev=payload4", "5 ev=payload5", "6LR st=latest-of-18b-----"}; !reflect.DeepEqual(got, want) {
		t.Errorf("refused events changed the outbox: %q, want %q", got, want)
	}
	if st := stats(t, s); st.DroppedEvents != 5 || st.Bytes != 40 {
		t.Errorf("stats %+v, want the 2 refused events counted as dropped (5) and 40 bytes", st)
	}
	// Replacing the Latest entry counts the old one's bytes as freed: 40 - 20 + 25 fits as it is,
	// 40 - 20 + 26 after dropping one event.
	p25, p26 := "latest-of-23b"+strings.Repeat("-", 10), "latest-of-24b"+strings.Repeat("-", 11)
	queue(t, s, lim, latest("st", p25))
	if got, want := listOutbox(t, s), []string{"4 ev=payload4", "5 ev=payload5", "7LR st=" + p25}; !reflect.DeepEqual(got, want) {
		t.Errorf("outbox %q, want %q", got, want)
	}
	queue(t, s, lim, latest("st", p26))
	if got, want := listOutbox(t, s), []string{"5 ev=payload5", "8LR st=" + p26}; !reflect.DeepEqual(got, want) {
		t.Errorf("outbox %q, want %q", got, want)
	}
	if st := stats(t, s); st != (OutboxStats{Entries: 2, Bytes: 36, Events: 1, DroppedEvents: 6}) {
		t.Errorf("stats %+v", st)
	}
}

func testOutboxRefusedLatest(t *testing.T, s stateUnderTest) {
	lim := OutboxLimits{MaxBytes: 30}
	queue(t, s, lim, event("ev", "12345678"), latest("a", strings.Repeat("a", 14)))
	// 15 bytes of Latest entries are queued; "b" (16 bytes) would need 31 even with every event
	// dropped: it is refused, and nothing is dropped for it. The event after it is still queued
	// and needs room (25 + 7 > 30), so the oldest event goes.
	seqs, err := s.OutboxPut([]OutboxEntry{
		latest("b", strings.Repeat("b", 15)),
		event("ev", "after"),
	}, lim)
	if !errors.Is(err, ErrOutboxFull) || !strings.Contains(err.Error(), "topic b") {
		t.Fatalf("OutboxPut = %v, want ErrOutboxFull naming topic b", err)
	}
	if want := []uint64{0, 3}; !reflect.DeepEqual(seqs, want) {
		t.Errorf("seqs %v, want %v: 0 for the refused entry, a seq for the event after it", seqs, want)
	}
	want := []string{"2LR a=" + strings.Repeat("a", 14), "3 ev=after"}
	if got := listOutbox(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("outbox %q, want %q", got, want)
	}
	if st := stats(t, s); st.RefusedLatest != 1 || st.DroppedEvents != 1 {
		t.Errorf("stats %+v, want 1 refused latest, 1 dropped event", st)
	}
	// A refused replacement leaves the previous entry for the topic queued.
	_, err = s.OutboxPut([]OutboxEntry{latest("a", strings.Repeat("A", 40))}, lim)
	if !errors.Is(err, ErrOutboxFull) || !strings.Contains(err.Error(), "topic a") {
		t.Errorf("oversized replacement: %v, want ErrOutboxFull naming topic a", err)
	}
	if got := listOutbox(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("a refused replacement changed the outbox: %q, want %q", got, want)
	}
	// Two refusals in one put: both named, both ErrOutboxFull.
	_, err = s.OutboxPut([]OutboxEntry{latest("c", strings.Repeat("c", 40)), latest("d", strings.Repeat("d", 40))}, lim)
	if !errors.Is(err, ErrOutboxFull) || !strings.Contains(err.Error(), "topic c") || !strings.Contains(err.Error(), "topic d") {
		t.Errorf("two refusals: %v", err)
	}
	if st := stats(t, s); st.RefusedLatest != 4 {
		t.Errorf("RefusedLatest %d, want 4", st.RefusedLatest)
	}
}

func testOutboxAck(t *testing.T, s stateUnderTest) {
	seqs := queue(t, s, OutboxLimits{}, event("ev", "1"), latest("st", "a"), event("ev", "2"))
	if err := s.OutboxAck("ev", seqs[0]); err != nil {
		t.Fatalf("ack: %v", err)
	}
	if err := s.OutboxAck("ev", seqs[0]); err != nil {
		t.Errorf("second ack of the same seq: %v", err)
	}
	if err := s.OutboxAck("ev", 999); err != nil {
		t.Errorf("ack of a seq never given: %v", err)
	}
	// An ack naming another topic than the entry's is a caller's mix-up: refused, nothing removed.
	if err := s.OutboxAck("ev", seqs[1]); err == nil || !strings.Contains(err.Error(), "topic st") {
		t.Errorf("ack with the wrong topic = %v, want an error naming the entry's topic", err)
	}
	want := []string{fmt.Sprintf("%dLR st=a", seqs[1]), fmt.Sprintf("%d ev=2", seqs[2])}
	if got := listOutbox(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("outbox %q, want %q", got, want)
	}
	if err := s.OutboxAck("st", seqs[1]); err != nil {
		t.Fatal(err)
	}
	if st := stats(t, s); st != (OutboxStats{Entries: 1, Events: 1, Bytes: 3}) {
		t.Errorf("stats after acks: %+v", st)
	}
	// The Latest index was cleared with the entry: a new version is a plain new entry.
	again := queue(t, s, OutboxLimits{}, latest("st", "b"))
	if got := listOutbox(t, s); len(got) != 2 || got[1] != fmt.Sprintf("%dLR st=b", again[0]) {
		t.Errorf("outbox %q", got)
	}
}

// OutboxAckMany removes many entries with OutboxAck's rules for each: gone ones and a Latest
// entry replaced by a newer one are skipped (the newer stays), a mixed-up topic refuses the call.
func testOutboxAckMany(t *testing.T, s stateUnderTest) {
	if err := s.OutboxAckMany(nil); err != nil {
		t.Fatalf("OutboxAckMany(nil) = %v", err)
	}
	seqs := queue(t, s, OutboxLimits{}, event("ev", "1"), latest("st", "a"), event("ev", "2"), latest("node", "n"))
	newer := queue(t, s, OutboxLimits{}, latest("st", "b")) // replaces st=a
	before := listOutbox(t, s)

	// One ref naming the wrong topic: nothing at all is removed, and the error names the entry's
	// topic.
	err := s.OutboxAckMany([]OutboxRef{{"ev", seqs[0]}, {"ev", newer[0]}, {"node", seqs[3]}})
	if err == nil || !strings.Contains(err.Error(), "topic st") || !strings.Contains(err.Error(), fmt.Sprint(newer[0])) {
		t.Errorf("OutboxAckMany with a wrong topic = %v, want an error naming entry %d's topic st", err, newer[0])
	}
	if got := listOutbox(t, s); !reflect.DeepEqual(got, before) {
		t.Errorf("a refused OutboxAckMany changed the outbox: %q, was %q", got, before)
	}

	// The first event, the replaced st=a (gone already: st=b stays), node, ev again and a seq never
	// given.
	err = s.OutboxAckMany([]OutboxRef{{"ev", seqs[0]}, {"st", seqs[1]}, {"node", seqs[3]}, {"ev", seqs[0]}, {"ev", 999}})
	if err != nil {
		t.Fatalf("OutboxAckMany: %v", err)
	}
	want := []string{fmt.Sprintf("%d ev=2", seqs[2]), fmt.Sprintf("%dLR st=b", newer[0])}
	if got := listOutbox(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("outbox %q, want %q", got, want)
	}
	if st := stats(t, s); st != (OutboxStats{Entries: 2, Events: 1, Bytes: 6}) {
		t.Errorf("stats after OutboxAckMany: %+v", st)
	}
	// node's Latest index went with its entry: a new version is a plain new entry.
	again := queue(t, s, OutboxLimits{}, latest("node", "m"))
	if err := s.OutboxAckMany([]OutboxRef{{"ev", seqs[2]}, {"st", newer[0]}}); err != nil {
		t.Fatal(err)
	}
	if got, want := listOutbox(t, s), []string{fmt.Sprintf("%dLR node=m", again[0])}; !reflect.DeepEqual(got, want) {
		t.Errorf("outbox %q, want %q", got, want)
	}
	if st := stats(t, s); st != (OutboxStats{Entries: 1, Bytes: 5}) {
		t.Errorf("stats: %+v", st)
	}
}

func testOutboxRefusedInput(t *testing.T, s stateUnderTest) {
	_, err := s.OutboxPut([]OutboxEntry{event("ev", "1"), {Payload: []byte("no topic")}}, OutboxLimits{})
	if err == nil || !strings.Contains(err.Error(), "entries[1]") || errors.Is(err, ErrOutboxFull) {
		t.Errorf("OutboxPut with an empty topic = %v, want an error naming entries[1]", err)
	}
	if got := listOutbox(t, s); len(got) != 0 {
		t.Errorf("refused put queued %q", got)
	}
	if seqs, err := s.OutboxPut(nil, OutboxLimits{}); err != nil || len(seqs) != 0 {
		t.Errorf("OutboxPut(nil) = %v, %v", seqs, err)
	}
}

func testOutboxBadRecords(t *testing.T, s stateUnderTest) {
	queue(t, s, OutboxLimits{}, event("ev", "1"))
	// Planted between puts, as damage would be: a value that does not decode, at a seq below the
	// next one.
	s.setRaw(t, "outbox", string(binary.BigEndian.AppendUint64(nil, 0)), []byte("garbage!"))
	queue(t, s, OutboxLimits{}, latest("st", "a"))
	if got, want := listOutbox(t, s), []string{"1 ev=1", "2LR st=a"}; !reflect.DeepEqual(got, want) {
		t.Errorf("OutboxList = %q, want %q (the damaged entry skipped)", got, want)
	}
	if st := stats(t, s); st != (OutboxStats{Entries: 2, Events: 1, Bytes: 6}) {
		t.Errorf("stats %+v: the damaged entry must not count", st)
	}
	// It is removed when a put looks for the oldest event to drop, and is not counted as one.
	queue(t, s, OutboxLimits{MaxEvents: 1}, event("ev", "2"))
	if got, want := listOutbox(t, s), []string{"2LR st=a", "3 ev=2"}; !reflect.DeepEqual(got, want) {
		t.Errorf("OutboxList = %q, want %q", got, want)
	}
	if st := stats(t, s); st != (OutboxStats{Entries: 2, Events: 1, Bytes: 6, DroppedEvents: 1}) {
		t.Errorf("stats %+v", st)
	}
	if err := s.OutboxAck("ev", 0); err != nil {
		t.Errorf("ack of a removed damaged entry = %v, want nil", err)
	}

	// Damaged counters are rebuilt from the entries that decode (the persistent counts restart
	// at 0).
	s.setRaw(t, "outbox", string(binary.BigEndian.AppendUint64(nil, 1)), []byte{1, 0, 200})
	s.setRaw(t, "meta", "outbox_counters", []byte("{bad"))
	if st := stats(t, s); st != (OutboxStats{Entries: 2, Events: 1, Bytes: 6}) {
		t.Errorf("stats from damaged counters: %+v", st)
	}
	if err := s.OutboxAck("ev", 1); err == nil || !strings.Contains(err.Error(), "entry 1") {
		t.Errorf("ack of a damaged entry = %v, want an error naming it", err)
	}
	queue(t, s, OutboxLimits{MaxEvents: 1}, event("ev", "3"))
	if got, want := listOutbox(t, s), []string{"2LR st=a", "4 ev=3"}; !reflect.DeepEqual(got, want) {
		t.Errorf("OutboxList = %q, want %q", got, want)
	}
	if st := stats(t, s); st != (OutboxStats{Entries: 2, Events: 1, Bytes: 6, DroppedEvents: 1}) {
		t.Errorf("stats after a put on rebuilt counters: %+v", st)
	}
}
