package nodemetrics

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/pod"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/core/prom"
	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/store"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// value finds the sample of family name whose labels include every pair of want.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	t.Helper()
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		for k, v := range want {
			found := false
			for _, l := range m.Label {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

func mustValue(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string, want float64) {
	t.Helper()
	got, ok := value(t, fams, name, labels)
	if !ok {
		t.Errorf("%s%v: no sample", name, labels)
		return
	}
	if got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

func TestReasonsMatchTheAgents(t *testing.T) {
	if ReasonEvicted != pod.ReasonEvicted {
		t.Errorf("ReasonEvicted %q, the agent evicts with %q", ReasonEvicted, pod.ReasonEvicted)
	}
}

func TestEventsCountedAndPassedOn(t *testing.T) {
	r := prom.NewRegistry()
	a := NewAgent(r, "v1.2.3", "abc")
	var got []string
	sink := a.Events(event.SinkFunc(func(e event.Event) { got = append(got, e.Reason) }))
	for _, e := range []event.Event{
		{Type: event.Warning, Reason: ReasonOOMKilled, Object: event.Object{Kind: event.KindPod, Namespace: "default", Name: "web", FieldPath: "spec.containers{app}"}},
		{Type: event.Warning, Reason: ReasonOOMKilled, Object: event.Object{Kind: event.KindPod, Namespace: "default", Name: "web", FieldPath: "spec.containers{app}"}},
		{Type: event.Warning, Reason: ReasonOOMKilled, Object: event.Object{Kind: event.KindPod, Namespace: "tools", Name: "job", FieldPath: "spec.initContainers{setup}"}},
		{Type: event.Warning, Reason: ReasonEvicted},
		{Type: event.Warning, Reason: event.ReasonRejected},
	} {
		sink.Emit(e)
	}
	if len(got) != 5 {
		t.Errorf("next sink got %v, want all 5 events", got)
	}
	a.Events(nil).Emit(event.Event{Type: event.Normal, Reason: "Quiet"}) // nobody listening: still counted
	fams := parseText(t, writeText(t, r))
	mustValue(t, fams, "mqlet_container_oom_kills_total", map[string]string{"namespace": "default", "pod": "web", "container": "app"}, 2)
	mustValue(t, fams, "mqlet_container_oom_kills_total", map[string]string{"namespace": "tools", "pod": "job", "container": "setup"}, 1)
	// An Evicted event is also what admission emits for a pod it refuses under node pressure: it
	// is counted as an event, not as an eviction (Agent.Evictions counts those).
	if f := fams["mqlet_pod_evictions_total"]; f != nil {
		t.Errorf("an Evicted event made mqlet_pod_evictions_total: %v", f)
	}
	mustValue(t, fams, "mqlet_events_total", map[string]string{"type": "Warning", "reason": "Evicted"}, 1)
	mustValue(t, fams, "mqlet_events_total", map[string]string{"type": "Warning", "reason": "Rejected"}, 1)
	mustValue(t, fams, "mqlet_events_total", map[string]string{"type": "Normal", "reason": "Quiet"}, 1)
	mustValue(t, fams, "mqlet_build_info", map[string]string{"version": "v1.2.3", "commit": "abc"}, 1)
}

// Evictions are the eviction manager's count by signal, read at each scrape; the signals with a
// threshold are listed at 0 before their first eviction, and a signal without one (an emptyDir
// over its sizeLimit) appears once it has evicted.
func TestEvictionsBySignal(t *testing.T) {
	r := prom.NewRegistry()
	a := NewAgent(r, "dev", "x")
	counts := map[string]int64{}
	a.Evictions([]string{"memory.available", "nodefs.available"}, func() map[string]int64 { return counts })
	fams := parseText(t, writeText(t, r))
	mustValue(t, fams, "mqlet_pod_evictions_total", map[string]string{"eviction_signal": "memory.available"}, 0)
	mustValue(t, fams, "mqlet_pod_evictions_total", map[string]string{"eviction_signal": "nodefs.available"}, 0)
	if n := len(fams["mqlet_pod_evictions_total"].Metric); n != 2 {
		t.Errorf("%d eviction series before any eviction, want 2", n)
	}
	counts = map[string]int64{"memory.available": 2, "emptydirfs.limit": 1}
	fams = parseText(t, writeText(t, r))
	mustValue(t, fams, "mqlet_pod_evictions_total", map[string]string{"eviction_signal": "memory.available"}, 2)
	mustValue(t, fams, "mqlet_pod_evictions_total", map[string]string{"eviction_signal": "nodefs.available"}, 0)
	mustValue(t, fams, "mqlet_pod_evictions_total", map[string]string{"eviction_signal": "emptydirfs.limit"}, 1)
	if n := len(fams["mqlet_pod_evictions_total"].Metric); n != 3 {
		t.Errorf("%d eviction series, want 3", n)
	}
}

func TestSyncsAndPulls(t *testing.T) {
	r := prom.NewRegistry()
	a := NewAgent(r, "dev", "x")
	fams := parseText(t, writeText(t, r))
	// Before any pull both results exist at 0, so the first failure is a visible increase.
	mustValue(t, fams, "mqlet_image_pulls_total", map[string]string{"result": "failure"}, 0)
	mustValue(t, fams, "mqlet_image_pulls_total", map[string]string{"result": "success"}, 0)

	a.ObserveSync(3 * time.Millisecond)
	a.ObserveSync(2 * time.Second)
	a.ImagePulled("r/x:1", 4*time.Second, nil)
	a.ImagePulled("r/x:2", time.Second, errors.New("no route"))
	fams = parseText(t, writeText(t, r))
	mustValue(t, fams, "mqlet_pod_sync_duration_seconds", nil, 2)
	if s := fams["mqlet_pod_sync_duration_seconds"].Metric[0].GetHistogram().GetSampleSum(); s != 2.003 {
		t.Errorf("sync sum %v, want 2.003", s)
	}
	mustValue(t, fams, "mqlet_image_pulls_total", map[string]string{"result": "success"}, 1)
	mustValue(t, fams, "mqlet_image_pulls_total", map[string]string{"result": "failure"}, 1)
	mustValue(t, fams, "mqlet_image_pull_duration_seconds", nil, 1) // failures are not timed
}

// Writes to a real bbolt file are timed by operation; reads are not; a write that fails (the file
// closed) is counted as an error and its error passed back unchanged.
func TestStoreWritesTimed(t *testing.T) {
	db, err := store.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	r := prom.NewRegistry()
	a := NewAgent(r, "dev", "x")
	st := a.Store(db)
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "a", UID: "u1"}}
	if err := st.PutDesired(store.DesiredPod{Pod: p, Source: source.Ref{Kind: source.File, Origin: "/etc/mqlet/pods/a.yaml"}}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutStatus("u1", &v1.PodStatus{Phase: v1.PodRunning}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutStatus("u1", &v1.PodStatus{Phase: v1.PodFailed}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.ListDesired(); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := st.GetStatus("u1"); err != nil || !ok {
		t.Fatalf("read through the decorator: %v %v", ok, err)
	}
	db.Close()
	werr := st.DeleteStatus("u1")
	if werr == nil {
		t.Fatal("a write to a closed store succeeded")
	}
	fams := parseText(t, writeText(t, r))
	mustValue(t, fams, "mqlet_store_write_duration_seconds", map[string]string{"operation": "put_desired"}, 1)
	mustValue(t, fams, "mqlet_store_write_duration_seconds", map[string]string{"operation": "put_status"}, 2)
	mustValue(t, fams, "mqlet_store_write_duration_seconds", map[string]string{"operation": "delete_status"}, 1)
	mustValue(t, fams, "mqlet_store_write_errors_total", map[string]string{"operation": "delete_status"}, 1)
	if _, ok := value(t, fams, "mqlet_store_write_errors_total", map[string]string{"operation": "put_status"}); ok {
		t.Error("an error counted for put_status, which succeeded")
	}
	for _, m := range fams["mqlet_store_write_duration_seconds"].Metric {
		for _, l := range m.Label {
			if l.GetValue() == "list_desired" || l.GetValue() == "get_status" {
				t.Errorf("a read was timed as a write: %v", l.GetValue())
			}
		}
	}
	if s, _ := value(t, fams, "mqlet_store_write_duration_seconds", map[string]string{"operation": "put_status"}); s != 2 {
		t.Errorf("put_status count %v", s)
	}
}

func TestPodFigures(t *testing.T) {
	r := prom.NewRegistry()
	a := NewAgent(r, "dev", "x")
	running := v1.ContainerState{Running: &v1.ContainerStateRunning{}}
	pods := []v1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}, Status: v1.PodStatus{Phase: v1.PodRunning,
			InitContainerStatuses: []v1.ContainerStatus{{Name: "init", State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{}}}},
			ContainerStatuses: []v1.ContainerStatus{{Name: "app", State: running, RestartCount: 4},
				{Name: "side", State: running}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "db"}, Status: v1.PodStatus{Phase: v1.PodRunning,
			ContainerStatuses: []v1.ContainerStatus{{Name: "db", State: running, RestartCount: 1}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "job"}, Status: v1.PodStatus{Phase: v1.PodPending,
			ContainerStatuses: []v1.ContainerStatus{{Name: "job", State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "ErrImagePull"}}}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "new"}}, // no status yet
	}
	calls := 0
	a.Pods(func() []v1.Pod { calls++; return pods })
	fams := parseText(t, writeText(t, r))
	mustValue(t, fams, "mqlet_pods", map[string]string{"phase": "Running"}, 2)
	mustValue(t, fams, "mqlet_pods", map[string]string{"phase": "Pending"}, 1)
	mustValue(t, fams, "mqlet_pods", map[string]string{"phase": "Failed"}, 0)
	mustValue(t, fams, "mqlet_pods", map[string]string{"phase": "Succeeded"}, 0)
	if n := len(fams["mqlet_pods"].Metric); n != 5 {
		t.Errorf("%d phases reported, want the 5 of Kubernetes (a pod without a status has no phase)", n)
	}
	mustValue(t, fams, "mqlet_containers", map[string]string{"state": "running"}, 3)
	mustValue(t, fams, "mqlet_containers", map[string]string{"state": "waiting"}, 1)
	mustValue(t, fams, "mqlet_containers", map[string]string{"state": "terminated"}, 1)
	mustValue(t, fams, "mqlet_container_restarts_total", map[string]string{"namespace": "default", "pod": "web", "container": "app"}, 4)
	mustValue(t, fams, "mqlet_container_restarts_total", map[string]string{"namespace": "default", "pod": "db", "container": "db"}, 1)
	mustValue(t, fams, "mqlet_container_restarts_total", map[string]string{"namespace": "default", "pod": "web", "container": "init"}, 0)
	if calls == 0 {
		t.Error("the pods were never read")
	}
}

func TestMQTTFigures(t *testing.T) {
	r := prom.NewRegistry()
	a := NewAgent(r, "dev", "x")
	up := false
	statsErr := error(nil)
	a.MQTT(func() bool { return up }, func() (store.OutboxStats, error) {
		return store.OutboxStats{Entries: 7, Bytes: 2048, DroppedEvents: 3}, statsErr
	})
	fams := parseText(t, writeText(t, r))
	mustValue(t, fams, "mqlet_mqtt_connected", nil, 0)
	mustValue(t, fams, "mqlet_mqtt_outbox_entries", nil, 7)
	mustValue(t, fams, "mqlet_mqtt_outbox_bytes", nil, 2048)
	mustValue(t, fams, "mqlet_mqtt_outbox_dropped_events_total", nil, 3)
	up, statsErr = true, errors.New("store closed")
	fams = parseText(t, writeText(t, r))
	mustValue(t, fams, "mqlet_mqtt_connected", nil, 1)
	if fams["mqlet_mqtt_outbox_entries"] != nil {
		t.Error("outbox depth reported although it could not be read")
	}
}
