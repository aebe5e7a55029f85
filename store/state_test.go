package store

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/source"
	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// stateUnderTest is one implementation of State plus a way to plant a raw value, as a damaged or
// foreign record would be found on disk.
type stateUnderTest struct {
	State
	setRaw func(t *testing.T, bucket, key string, val []byte)
}

// implementations are what the conformance suite runs against: the bbolt file (real, in a temp
// dir) and the in-memory twin.
func implementations() map[string]func(t *testing.T) stateUnderTest {
	return map[string]func(t *testing.T) stateUnderTest{
		"bbolt": func(t *testing.T) stateUnderTest {
			d, _ := openTempWith(t, Options{SecretKey: testKey(t)})
			return stateUnderTest{State: d, setRaw: func(t *testing.T, bucket, key string, val []byte) {
				t.Helper()
				err := d.bolt.Update(func(tx *bolt.Tx) error {
					return tx.Bucket([]byte(bucket)).Put([]byte(key), val)
				})
				if err != nil {
					t.Fatalf("plant %s/%s: %v", bucket, key, err)
				}
			}}
		},
		"memory": func(t *testing.T) stateUnderTest {
			m := NewMemory()
			return stateUnderTest{State: m, setRaw: func(t *testing.T, bucket, key string, val []byte) {
				t.Helper()
				if err := m.SetRaw(bucket, key, val); err != nil {
					t.Fatal(err)
				}
			}}
		},
	}
}

func TestStateConformance(t *testing.T) {
	cases := map[string]func(t *testing.T, s stateUnderTest){
		"desired round trip":           testDesiredRoundTrip,
		"desired refused input":        testDesiredRefused,
		"update desired":               testUpdateDesired,
		"status round trip":            testStatusRoundTrip,
		"no aliasing":                  testNoAliasing,
		"undecodable records degrade":  testBadRecords,
		"times keep whole seconds":     testWholeSeconds,
		"closed state refuses all ops": testClosed,
		"node status":                  testNodeStatus,
		"events round trip":            testEventsRoundTrip,
		"events refused input":         testEventsRefused,
		"events bad records":           testEventsBadRecords,
	}
	for name, run := range syncConformance {
		cases[name] = run
	}
	for impl, open := range implementations() {
		t.Run(impl, func(t *testing.T) {
			for name, run := range cases {
				t.Run(name, func(t *testing.T) { run(t, open(t)) })
			}
		})
	}
}

var (
	refWeb   = source.Ref{Kind: source.File, Origin: "/etc/mqlet/pods/web.yaml"}
	refDB    = source.Ref{Kind: source.File, Origin: "/etc/mqlet/pods/db.yaml", Doc: 1}
	refAgent = source.Ref{Kind: source.MQTT, Origin: "mqlet/nodes/n1/pods/kube-system/agent"}
)

func put(t *testing.T, s State, p *v1.Pod, ref source.Ref, gen int64) {
	t.Helper()
	if err := s.PutDesired(DesiredPod{Pod: p, Source: ref, Generation: gen}); err != nil {
		t.Fatalf("PutDesired(%s): %v", p.UID, err)
	}
}

// listNames lists the desired pods as "ns/name=uid@source gN" and fails on any record error.
func listNames(t *testing.T, s State) []string {
	t.Helper()
	pods, bad, err := s.ListDesired()
	if err != nil {
		t.Fatalf("ListDesired: %v", err)
	}
	if len(bad) != 0 {
		t.Errorf("ListDesired record errors: %v", bad)
	}
	out := []string{}
	for _, p := range pods {
		out = append(out, fmt.Sprintf("%s/%s=%s@%s g%d", p.Pod.Namespace, p.Pod.Name, p.Pod.UID, p.Source, p.Generation))
	}
	return out
}

func testDesiredRoundTrip(t *testing.T, s stateUnderTest) {
	web := testPod("default", "web", "uid-web")
	put(t, s, web, refWeb, 0)
	put(t, s, testPod("kube-system", "agent", "uid-agent"), refAgent, 7)
	put(t, s, testPod("default", "db", "uid-db"), refDB, 0)

	got, ok, err := s.GetDesired("uid-web")
	if err != nil || !ok {
		t.Fatalf("GetDesired(uid-web) = _, %v, %v; want found", ok, err)
	}
	if got.Source != refWeb || got.Generation != 0 {
		t.Errorf("GetDesired(uid-web) source %+v generation %d, want %+v 0", got.Source, got.Generation, refWeb)
	}
	if !reflect.DeepEqual(got.Pod, web) {
		t.Errorf("pod changed in round trip:\n got %+v\nwant %+v", got.Pod, web)
	}
	if got, _, _ := s.GetDesired("uid-agent"); got.Source != refAgent || got.Generation != 7 {
		t.Errorf("GetDesired(uid-agent) source %+v generation %d, want %+v 7", got.Source, got.Generation, refAgent)
	}

	want := []string{
		"default/db=uid-db@file /etc/mqlet/pods/db.yaml#1 g0",
		"default/web=uid-web@file /etc/mqlet/pods/web.yaml#0 g0",
		"kube-system/agent=uid-agent@mqtt mqlet/nodes/n1/pods/kube-system/agent g7",
	}
	if got := listNames(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("ListDesired = %q, want %q", got, want)
	}

	web2 := testPod("default", "web", "uid-web")
	web2.Spec.Containers[0].Image = "busybox:2"
	put(t, s, web2, refWeb, 1)
	if got, _, _ := s.GetDesired("uid-web"); got.Pod.Spec.Containers[0].Image != "busybox:2" || got.Generation != 1 {
		t.Errorf("after second put: image %q generation %d, want busybox:2 1", got.Pod.Spec.Containers[0].Image, got.Generation)
	}

	if err := s.DeleteDesired("uid-web"); err != nil {
		t.Fatalf("DeleteDesired: %v", err)
	}
	if _, ok, err := s.GetDesired("uid-web"); ok || err != nil {
		t.Errorf("GetDesired after delete = found %v, err %v; want not found", ok, err)
	}
	if err := s.DeleteDesired("uid-never-existed"); err != nil {
		t.Errorf("DeleteDesired(missing) = %v, want nil", err)
	}
}

func testDesiredRefused(t *testing.T, s stateUnderTest) {
	for name, tc := range map[string]struct {
		p    DesiredPod
		want []string
	}{
		"no uid":    {DesiredPod{Pod: testPod("default", "x", ""), Source: refWeb}, []string{"default/x", "uid"}},
		"nil pod":   {DesiredPod{Source: refWeb}, []string{"no Pod"}},
		"no source": {DesiredPod{Pod: testPod("default", "y", "uid-y")}, []string{"default/y", "uid-y", "source kind"}},
	} {
		err := s.PutDesired(tc.p)
		if err == nil {
			t.Errorf("%s: PutDesired succeeded, want error", name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not name %q", name, err, w)
			}
		}
	}
	if got := listNames(t, s); len(got) != 0 {
		t.Errorf("refused puts stored %q", got)
	}
}

func testUpdateDesired(t *testing.T, s stateUnderTest) {
	put(t, s, testPod("default", "a", "uid-a"), source.Ref{Kind: source.File, Origin: "/pods/a.yaml"}, 0)
	put(t, s, testPod("default", "b", "uid-b"), source.Ref{Kind: source.File, Origin: "/pods/b.yaml"}, 0)
	put(t, s, testPod("default", "c", "uid-c"), refAgent, 3)

	a2 := testPod("default", "a", "uid-a")
	a2.Labels["v"] = "2"
	err := s.UpdateDesired([]DesiredPod{
		{Pod: a2, Source: source.Ref{Kind: source.File, Origin: "/pods/a.yaml"}},
		{Pod: testPod("default", "d", "uid-d"), Source: source.Ref{Kind: source.File, Origin: "/pods/d.yaml", Doc: 2}},
	}, []types.UID{"uid-b", "uid-never-existed"})
	if err != nil {
		t.Fatalf("UpdateDesired: %v", err)
	}
	want := []string{
		"default/a=uid-a@file /pods/a.yaml#0 g0",
		"default/c=uid-c@mqtt mqlet/nodes/n1/pods/kube-system/agent g3",
		"default/d=uid-d@file /pods/d.yaml#2 g0",
	}
	if got := listNames(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("after update: %q, want %q", got, want)
	}
	if got, _, _ := s.GetDesired("uid-a"); got.Pod.Labels["v"] != "2" {
		t.Errorf("uid-a not updated: labels %v", got.Pod.Labels)
	}
	if err := s.UpdateDesired(nil, nil); err != nil {
		t.Errorf("UpdateDesired(nil, nil) = %v", err)
	}

	// Invalid input changes nothing, not even its valid part.
	ok := DesiredPod{Pod: testPod("default", "x", "uid-x"), Source: refWeb}
	for name, tc := range map[string]struct {
		put  []DesiredPod
		del  []types.UID
		want string
	}{
		"duplicate uid":      {[]DesiredPod{ok, {Pod: testPod("default", "x2", "uid-x"), Source: refWeb}}, nil, "uid-x appears twice"},
		"put and delete":     {[]DesiredPod{ok}, []types.UID{"uid-a", "uid-x"}, "uid-x is also in put"},
		"missing uid":        {[]DesiredPod{ok, {Pod: testPod("default", "y", ""), Source: refWeb}}, []types.UID{"uid-a"}, "put[1]"},
		"missing source":     {[]DesiredPod{ok, {Pod: testPod("default", "y", "uid-y")}}, nil, "source kind"},
		"empty uid deletion": {[]DesiredPod{ok}, []types.UID{""}, "del[0]"},
	} {
		err := s.UpdateDesired(tc.put, tc.del)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: UpdateDesired = %v, want an error containing %q", name, err, tc.want)
		}
	}
	if got := listNames(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("failed UpdateDesired changed the state: %q, want %q", got, want)
	}
}

func testStatusRoundTrip(t *testing.T, s stateUnderTest) {
	running := testStatus(v1.PodRunning, 2)
	if err := s.PutStatus("uid-a", running); err != nil {
		t.Fatalf("PutStatus: %v", err)
	}
	if err := s.PutStatus("uid-b", testStatus(v1.PodPending, 0)); err != nil {
		t.Fatalf("PutStatus: %v", err)
	}
	got, ok, err := s.GetStatus("uid-a")
	if err != nil || !ok {
		t.Fatalf("GetStatus(uid-a) = _, %v, %v", ok, err)
	}
	if !apiequality.Semantic.DeepEqual(got, running) { // times come back in time.Local
		t.Errorf("status changed in round trip:\n got %+v\nwant %+v", got, running)
	}
	if _, ok, err := s.GetStatus("uid-missing"); ok || err != nil {
		t.Errorf("GetStatus(missing) = found %v, err %v", ok, err)
	}
	all, bad, err := s.ListStatus()
	if err != nil || len(bad) != 0 {
		t.Fatalf("ListStatus: %v, record errors %v", err, bad)
	}
	if len(all) != 2 || all["uid-b"] == nil || all["uid-b"].Phase != v1.PodPending || all["uid-a"].ContainerStatuses[0].RestartCount != 2 {
		t.Errorf("ListStatus = %+v", all)
	}
	if err := s.DeleteStatus("uid-a"); err != nil {
		t.Fatalf("DeleteStatus: %v", err)
	}
	if err := s.DeleteStatus("uid-a"); err != nil {
		t.Errorf("DeleteStatus twice: %v", err)
	}
	if _, ok, _ := s.GetStatus("uid-a"); ok {
		t.Errorf("status still there after DeleteStatus")
	}
	if err := s.PutStatus("uid-c", nil); err == nil || !strings.Contains(err.Error(), "uid-c") {
		t.Errorf("PutStatus(nil) = %v, want error naming uid-c", err)
	}
	if err := s.PutStatus("", running); err == nil || !strings.Contains(err.Error(), "empty pod uid") {
		t.Errorf("PutStatus(empty uid) = %v, want error saying so", err)
	}
}

// A caller that edits what it put or what it got must not change what is stored.
func testNoAliasing(t *testing.T, s stateUnderTest) {
	pod := testPod("default", "web", "uid-web")
	put(t, s, pod, refWeb, 0)
	pod.Spec.Containers[0].Image = "changed-after-put"
	got, _, _ := s.GetDesired("uid-web")
	if img := got.Pod.Spec.Containers[0].Image; img != "busybox:latest" {
		t.Errorf("editing the put pod changed the stored one: image %q", img)
	}
	got.Pod.Labels["app"] = "changed-after-get"
	listed, _, _ := s.ListDesired()
	listed[0].Pod.Spec.Containers[0].Command[0] = "changed-after-list"
	again, _, _ := s.GetDesired("uid-web")
	if again.Pod.Labels["app"] != "web" || again.Pod.Spec.Containers[0].Command[0] != "sh" {
		t.Errorf("editing a returned pod changed the stored one: labels %v command %q",
			again.Pod.Labels, again.Pod.Spec.Containers[0].Command)
	}

	st := testStatus(v1.PodRunning, 1)
	if err := s.PutStatus("uid-web", st); err != nil {
		t.Fatal(err)
	}
	st.Phase = v1.PodFailed
	gotSt, _, _ := s.GetStatus("uid-web")
	gotSt.ContainerStatuses[0].RestartCount = 99
	all, _, _ := s.ListStatus()
	all["uid-web"].Conditions[0].Status = v1.ConditionFalse
	final, _, _ := s.GetStatus("uid-web")
	if final.Phase != v1.PodRunning || final.ContainerStatuses[0].RestartCount != 1 || final.Conditions[0].Status != v1.ConditionTrue {
		t.Errorf("editing a put or returned status changed the stored one: %+v", final)
	}
}

func testBadRecords(t *testing.T, s stateUnderTest) {
	put(t, s, testPod("default", "good", "uid-good"), refWeb, 0)
	if err := s.PutStatus("uid-good", testStatus(v1.PodRunning, 0)); err != nil {
		t.Fatal(err)
	}
	other, err := encodeDesired(DesiredPod{Pod: testPod("default", "other", "uid-other"), Source: refWeb})
	if err != nil {
		t.Fatal(err)
	}
	s.setRaw(t, "desired_pods", "uid-garbage", []byte("\x00not json"))
	s.setRaw(t, "desired_pods", "uid-nopod", []byte(`{"source":{"kind":"file"},"generation":0}`))
	s.setRaw(t, "desired_pods", "uid-elsewhere", other) // a pod stored under another pod's key
	s.setRaw(t, "pod_status", "uid-garbage", []byte("{truncated"))

	pods, bad, err := s.ListDesired()
	if err != nil {
		t.Fatalf("ListDesired: %v", err)
	}
	if len(pods) != 1 || pods[0].Pod.UID != "uid-good" {
		t.Errorf("ListDesired loaded %d pods, want only uid-good", len(pods))
	}
	var keys []string
	for _, e := range bad {
		if e.Bucket != "desired_pods" || e.Err == nil {
			t.Errorf("record error %+v: want bucket desired_pods and a cause", e)
		}
		keys = append(keys, e.Key)
	}
	if want := []string{"uid-elsewhere", "uid-garbage", "uid-nopod"}; !reflect.DeepEqual(keys, want) {
		t.Errorf("ListDesired record errors for %q, want %q", keys, want)
	}

	for _, key := range []types.UID{"uid-garbage", "uid-nopod", "uid-elsewhere"} {
		_, found, err := s.GetDesired(key)
		var re RecordError
		if err == nil || !errors.As(err, &re) || re.Key != string(key) || !strings.Contains(err.Error(), "desired_pods/"+string(key)) {
			t.Errorf("GetDesired(%s) = found %v, err %v; want a RecordError naming desired_pods/%s", key, found, err, key)
		}
	}

	statuses, badSt, err := s.ListStatus()
	if err != nil {
		t.Fatalf("ListStatus: %v", err)
	}
	if len(statuses) != 1 || statuses["uid-good"] == nil {
		t.Errorf("ListStatus loaded %v, want only uid-good", statuses)
	}
	if len(badSt) != 1 || badSt[0].Bucket != "pod_status" || badSt[0].Key != "uid-garbage" {
		t.Errorf("ListStatus record errors %v, want one for pod_status/uid-garbage", badSt)
	}
	if _, _, err := s.GetStatus("uid-garbage"); err == nil || !strings.Contains(err.Error(), "pod_status/uid-garbage") {
		t.Errorf("GetStatus(uid-garbage) = %v, want an error naming pod_status/uid-garbage", err)
	}

	// A bad record is repaired by a put and removed by a delete, like any other.
	put(t, s, testPod("default", "garbage", "uid-garbage"), refWeb, 0)
	if err := s.DeleteDesired("uid-nopod"); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateDesired(nil, []types.UID{"uid-elsewhere"}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutStatus("uid-garbage", testStatus(v1.PodSucceeded, 0)); err != nil {
		t.Fatal(err)
	}
	if got, want := listNames(t, s), []string{
		"default/garbage=uid-garbage@file /etc/mqlet/pods/web.yaml#0 g0",
		"default/good=uid-good@file /etc/mqlet/pods/web.yaml#0 g0",
	}; !reflect.DeepEqual(got, want) {
		t.Errorf("after repair: %q, want %q", got, want)
	}
	if _, badSt, _ := s.ListStatus(); len(badSt) != 0 {
		t.Errorf("ListStatus after repair: record errors %v", badSt)
	}
}

// Memory must not be kinder than the file: what the file truncates, Memory truncates too.
func testWholeSeconds(t *testing.T, s stateUnderTest) {
	st := testStatus(v1.PodRunning, 0)
	at := metav1.NewTime(time.Date(2025, 3, 4, 5, 6, 7, 890_000_000, time.UTC))
	st.StartTime = &at
	if err := s.PutStatus("uid-t", st); err != nil {
		t.Fatal(err)
	}
	got, _, err := s.GetStatus("uid-t")
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC); !got.StartTime.Time.Equal(want) {
		t.Errorf("StartTime came back %v, want %v", got.StartTime.Time, want)
	}
}

func testClosed(t *testing.T, s stateUnderTest) {
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	p := DesiredPod{Pod: testPod("default", "a", "uid-a"), Source: refWeb}
	for name, call := range map[string]func() error{
		"PutDesired":    func() error { return s.PutDesired(p) },
		"UpdateDesired": func() error { return s.UpdateDesired([]DesiredPod{p}, nil) },
		"GetDesired":    func() error { _, _, err := s.GetDesired("uid-a"); return err },
		"ListDesired":   func() error { _, _, err := s.ListDesired(); return err },
		"DeleteDesired": func() error { return s.DeleteDesired("uid-a") },
		"PutStatus":     func() error { return s.PutStatus("uid-a", testStatus(v1.PodRunning, 0)) },
		"GetStatus":     func() error { _, _, err := s.GetStatus("uid-a"); return err },
		"ListStatus":    func() error { _, _, err := s.ListStatus(); return err },
		"DeleteStatus":  func() error { return s.DeleteStatus("uid-a") },
		"PutObject":     func() error { return s.PutObject(cmRecord("default", "a", 0, nil)) },
		"GetObject":     func() error { _, _, err := s.GetObject(KindConfigMap, "default", "a"); return err },
		"ListObjects":   func() error { _, _, err := s.ListObjects(); return err },
		"DeleteObject":  func() error { return s.DeleteObject(KindConfigMap, "default", "a") },
		"PutMarks":      func() error { return s.PutMarks([]SyncMark{{Key: "pods/default/a"}}) },
		"ListMarks":     func() error { _, _, err := s.ListMarks(); return err },
		"DeleteMarks":   func() error { return s.DeleteMarks([]string{"pods/default/a"}) },
		"NextSession":   func() error { _, err := s.NextSession(); return err },
		"OutboxPut":     func() error { _, err := s.OutboxPut([]OutboxEntry{event("ev", "1")}, OutboxLimits{}); return err },
		"OutboxList":    func() error { _, err := s.OutboxList(0); return err },
		"OutboxAck":     func() error { return s.OutboxAck("ev", 1) },
		"OutboxAckMany": func() error { return s.OutboxAckMany([]OutboxRef{{"ev", 1}}) },
		"OutboxStats":   func() error { _, err := s.OutboxStats(); return err },
		"PutNodeStatus": func() error { return s.PutNodeStatus(testNode("edge-1", v1.ConditionTrue, time.Now())) },
		"GetNodeStatus": func() error { _, _, err := s.GetNodeStatus(); return err },
		"UpdateEvents":  func() error { return s.UpdateEvents([]PodEvents{testEvents("uid-a", "a", 1)}, nil) },
		"GetEvents":     func() error { _, _, err := s.GetEvents("uid-a"); return err },
		"ListEvents":    func() error { _, _, err := s.ListEvents(); return err },
		"DeleteEvents":  func() error { return s.DeleteEvents("uid-a") },
	} {
		if err := call(); err == nil {
			t.Errorf("%s after Close succeeded", name)
		}
	}
}

// TestBadRecordDoesNotStopOpen: a garbage value is data, not file corruption; the file opens and
// the other records load.
func TestBadRecordDoesNotStopOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	validFile(t, path)
	bdb, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = bdb.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketDesired).Put([]byte("uid-05"), []byte("garbage")); err != nil {
			return err
		}
		if _, err := tx.Bucket(bucketDesired).CreateBucket([]byte("uid-nested")); err != nil {
			return err
		}
		return tx.Bucket(bucketStatus).Put([]byte("uid-07"), []byte("garbage"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := bdb.Close(); err != nil {
		t.Fatal(err)
	}

	d, err := Open(path)
	if err != nil {
		t.Fatalf("Open with one garbage record: %v", err)
	}
	defer d.Close()
	pods, bad, err := d.ListDesired()
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 29 || len(bad) != 2 || bad[0].Key != "uid-05" || bad[1].Key != "uid-nested" {
		t.Errorf("ListDesired: %d pods, record errors %v; want 29 pods and errors for uid-05, uid-nested", len(pods), bad)
	}
	st, badSt, err := d.ListStatus()
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 29 || len(badSt) != 1 || badSt[0].Key != "uid-07" {
		t.Errorf("ListStatus: %d statuses, record errors %v; want 29 and an error for uid-07", len(st), badSt)
	}
}
