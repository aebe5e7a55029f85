package objects

import (
	"errors"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func cmRecord(name, origin, val string) store.ObjectRecord {
	return store.ObjectRecord{Kind: store.KindConfigMap, Namespace: "default", Name: name,
		Source:    source.Ref{Kind: source.File, Origin: origin},
		ConfigMap: &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Data: map[string]string{"k": val}}}
}

type recorder struct {
	changed []Key
	events  []event.Event
}

func newStore(t *testing.T) (*Store, *store.Memory, *recorder) {
	t.Helper()
	mem := store.NewMemory()
	s := New(mem, nil)
	rec := &recorder{}
	s.Connect(event.SinkFunc(func(e event.Event) { rec.events = append(rec.events, e) }), func(k Key) { rec.changed = append(rec.changed, k) })
	return s, mem, rec
}

func TestSyncFilesPutsChangesAndDeletes(t *testing.T) {
	s, _, rec := newStore(t)
	s.SyncFiles([]store.ObjectRecord{cmRecord("a", "/m/a.yaml", "1"), cmRecord("b", "/m/b.yaml", "1")}, nil)
	if len(rec.changed) != 2 {
		t.Fatalf("changed %v, want a and b", rec.changed)
	}
	cm, err := s.ConfigMap("default", "a")
	if err != nil || cm.Data["k"] != "1" {
		t.Fatalf("ConfigMap a: %v %v", cm, err)
	}
	rec.changed = nil
	// Same set again: nothing announced. Then a changes and b goes.
	s.SyncFiles([]store.ObjectRecord{cmRecord("a", "/m/a.yaml", "1"), cmRecord("b", "/m/b.yaml", "1")}, nil)
	if len(rec.changed) != 0 {
		t.Errorf("an unchanged resync announced %v", rec.changed)
	}
	s.SyncFiles([]store.ObjectRecord{cmRecord("a", "/m/a.yaml", "2")}, nil)
	if len(rec.changed) != 2 {
		t.Errorf("changed %v, want a (changed) and b (deleted)", rec.changed)
	}
	if _, err := s.ConfigMap("default", "b"); !ctrspec.IsNotFound(err) {
		t.Errorf("ConfigMap b after its file went: %v, want a NotFoundError", err)
	}
	// A file that cannot be read now keeps what it stored, even when no object of it is listed.
	s.SyncFiles(nil, []string{"/m/a.yaml"})
	if cm, err := s.ConfigMap("default", "a"); err != nil || cm.Data["k"] != "2" {
		t.Errorf("ConfigMap a of a kept file: %v %v", cm, err)
	}
}

func TestSourcesClaimNames(t *testing.T) {
	s, mem, rec := newStore(t)
	mqtt := s.Guard(mem, source.MQTT)
	r := cmRecord("shared", "", "from-mqtt")
	r.Source = source.Ref{Kind: source.MQTT, Origin: "topic/x"}
	if err := mqtt.PutObject(r); err != nil {
		t.Fatal(err)
	}
	// The file comes second: refused with an event, once, and MQTT's object stays.
	for range 2 {
		refused, _ := s.SyncFiles([]store.ObjectRecord{cmRecord("shared", "/m/s.yaml", "from-file")}, nil)
		if len(refused) != 1 || !strings.Contains(refused[0].Error(), "ConfigMap default/shared is already defined by mqtt topic/x; this one from file is ignored") {
			t.Fatalf("refused %v", refused)
		}
	}
	if len(rec.events) != 1 || rec.events[0].Reason != event.ReasonNameClash {
		t.Errorf("events %v, want one NameClash", rec.events)
	}
	if cm, _ := s.ConfigMap("default", "shared"); cm.Data["k"] != "from-mqtt" {
		t.Errorf("the file's object replaced MQTT's")
	}

	// And the other way round: MQTT may neither replace nor delete the file's object.
	s.SyncFiles([]store.ObjectRecord{cmRecord("filed", "/m/f.yaml", "from-file")}, nil)
	r = cmRecord("filed", "", "from-mqtt")
	r.Source = source.Ref{Kind: source.MQTT}
	err := mqtt.PutObject(r)
	var verdict interface{ Refusal() }
	if !errors.As(err, &verdict) {
		t.Fatalf("MQTT put over a file's object: %v, want a refusal", err)
	}
	if err := mqtt.DeleteObject(store.KindConfigMap, "default", "filed"); err != nil {
		t.Fatal(err)
	}
	if cm, err := s.ConfigMap("default", "filed"); err != nil || cm.Data["k"] != "from-file" {
		t.Errorf("MQTT deleted or replaced the file's object: %v %v", cm, err)
	}
}

func TestSecretFoldsStringData(t *testing.T) {
	s, mem, _ := newStore(t)
	sec := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "s"},
		Data: map[string][]byte{"a": []byte("1"), "b": []byte("old")}, StringData: map[string]string{"b": "new"}}
	if err := s.Guard(mem, source.MQTT).PutObject(store.ObjectRecord{Kind: store.KindSecret, Namespace: "default", Name: "s", Secret: sec}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Secret("default", "s")
	if err != nil || string(got.Data["a"]) != "1" || string(got.Data["b"]) != "new" || got.StringData != nil {
		t.Errorf("Secret = %v, %v", got, err)
	}
	if _, err := s.Secret("default", "nope"); !ctrspec.IsNotFound(err) || err.Error() != "Secret default/nope not found" {
		t.Errorf("missing Secret: %v", err)
	}
}

// failingPuts is a store whose object puts fail, as on a full disk.
type failingPuts struct{ *store.Memory }

func (failingPuts) PutObject(store.ObjectRecord) error {
	return errors.New("write /var/lib/mqlet/state.db: no space left on device")
}

// A ConfigMap the store could not take is reported to the caller, which delivers the directory
// again: before, it was logged and the change was lost until the file changed again.
func TestSyncFilesReportsStoreFailure(t *testing.T) {
	s := New(failingPuts{store.NewMemory()}, nil)
	_, err := s.SyncFiles([]store.ObjectRecord{cmRecord("a", "/m/a.yaml", "1")}, nil)
	if err == nil || !strings.Contains(err.Error(), "no space left on device") || !strings.Contains(err.Error(), "default/a") {
		t.Errorf("SyncFiles = %v, want the store failure naming ConfigMap default/a", err)
	}
}
