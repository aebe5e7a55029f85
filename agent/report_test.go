package agent

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/agent/pod"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
)

// fakeReporter records what the agent reports, in order.
type fakeReporter struct {
	mu       sync.Mutex
	statuses []reportedStatus
	gone     []store.DesiredPod
	events   []event.Event
	order    []string // "status NAME" and "gone NAME", as reported
}

type reportedStatus struct {
	d  store.DesiredPod
	st v1.PodStatus
}

func (r *fakeReporter) PodStatus(d store.DesiredPod, st v1.PodStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.statuses = append(r.statuses, reportedStatus{d, st})
	r.order = append(r.order, "status "+d.Pod.Name)
}

func (r *fakeReporter) PodGone(d store.DesiredPod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gone = append(r.gone, d)
	r.order = append(r.order, "gone "+d.Pod.Name)
}

func (r *fakeReporter) Emit(e event.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *fakeReporter) snapshot() ([]reportedStatus, []store.DesiredPod, []event.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]reportedStatus(nil), r.statuses...), append([]store.DesiredPod(nil), r.gone...), append([]event.Event(nil), r.events...)
}

// eventsSince returns the events after the first n.
func (r *fakeReporter) eventsSince(n int) []event.Event {
	_, _, es := r.snapshot()
	return es[n:]
}

func mqttItem(p *v1.Pod, gen int64) source.Item {
	return source.Item{Pod: p, Ref: source.Ref{Kind: source.MQTT, Origin: "mqlet/v2/nodes/node-1/desired/pods/default/" + p.Name}, Generation: gen}
}

// waitApplied returns once every change given to src.send has been applied.
func waitApplied(t *testing.T, src *fakeSource) {
	t.Helper()
	eventually(t, "changes applied", func() bool { return src.applied.Load() == src.sent.Load() })
}

// Every status is reported with the version of the pod it was computed for: its source ref and
// generation, also while a newer version is on its way.
func TestReportsStatusWithGenerationAndRef(t *testing.T) {
	rt, st, src, rep := newFakeRuntime(), store.NewMemory(), newFakeSource(source.MQTT), &fakeReporter{}
	startAgentWith(t, Options{Report: rep}, rt, st, src)
	src.send(source.Change{Op: source.Resync})
	src.send(source.Change{Op: source.Upsert, Items: []source.Item{mqttItem(testPod("m"), 2)}})
	running := func(gen int64) func() bool {
		return func() bool {
			ss, _, _ := rep.snapshot()
			return len(ss) > 0 && ss[len(ss)-1].d.Generation == gen && ss[len(ss)-1].st.Phase == v1.PodRunning
		}
	}
	eventually(t, "generation 2 reported running", running(2))

	next := testPod("m")
	next.Spec.Containers[0].Image = "busybox:2"
	src.send(source.Change{Op: source.Upsert, Items: []source.Item{mqttItem(next, 3)}})
	eventually(t, "generation 3 reported running", func() bool {
		ss, _, _ := rep.snapshot()
		last := ss[len(ss)-1]
		return running(3)() && len(last.st.ContainerStatuses) == 1 && last.st.ContainerStatuses[0].Image == "busybox:2"
	})
	ss, _, _ := rep.snapshot()
	want := map[int64]string{2: "busybox:1", 3: "busybox:2"}
	for i, r := range ss {
		if r.d.Source != mqttItem(next, 0).Ref {
			t.Errorf("status %d: source %+v, want the item's ref", i, r.d.Source)
		}
		if img := r.d.Pod.Spec.Containers[0].Image; img != want[r.d.Generation] {
			t.Errorf("status %d: generation %d with a pod of image %s, want %s", i, r.d.Generation, img, want[r.d.Generation])
		}
		if r.d.Pod.Name != "m" || r.d.Pod.UID == "" {
			t.Errorf("status %d: pod %s/%s uid %q", i, r.d.Pod.Namespace, r.d.Pod.Name, r.d.Pod.UID)
		}
	}
	if _, gone, _ := rep.snapshot(); len(gone) != 0 {
		t.Errorf("PodGone reported for a running pod: %+v", gone)
	}
}

// A deleted pod is reported gone once its containers are, with the last version the node had,
// although it left the desired set when the delete arrived.
func TestReportsPodGone(t *testing.T) {
	rt, st, src, rep := newFakeRuntime(), store.NewMemory(), newFakeSource(source.MQTT), &fakeReporter{}
	a := startAgentWith(t, Options{Report: rep}, rt, st, src)
	src.send(source.Change{Op: source.Resync, Items: []source.Item{mqttItem(testPod("m"), 4), mqttItem(testPod("keep"), 1)}})
	eventually(t, "m runs", func() bool { return rt.podContainers(uidOf(a, "m")) == 1 })
	uid := uidOf(a, "m")
	src.send(source.Change{Op: source.Delete, Keys: []string{"default/m"}})
	eventually(t, "m reported gone", func() bool { _, gone, _ := rep.snapshot(); return len(gone) == 1 })
	_, gone, _ := rep.snapshot()
	if d := gone[0]; d.Pod.UID != uid || d.Generation != 4 || d.Source != mqttItem(testPod("m"), 0).Ref {
		t.Errorf("gone %s generation %d source %+v, want uid %s generation 4 and the item's ref", d.Pod.UID, d.Generation, d.Source, uid)
	}
	if rt.podContainers(uid) != 0 {
		t.Errorf("reported gone before its containers were")
	}
	// m's statuses all come before its PodGone: one worker reports both, in order.
	rep.mu.Lock()
	defer rep.mu.Unlock()
	var ofM []string
	for _, o := range rep.order {
		if strings.HasSuffix(o, " m") {
			ofM = append(ofM, o)
		}
	}
	if len(ofM) < 2 || ofM[len(ofM)-1] != "gone m" || slices.Index(ofM, "gone m") != len(ofM)-1 {
		t.Errorf("reports about m: %v, want statuses then one gone", ofM)
	}
}

// Containers of a pod the agent has no record of (deleted while it was down, store lost) are
// removed once every source has spoken, and reported gone by name.
func TestReportsLeftoverPodGone(t *testing.T) {
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.File)
	a := startAgent(t, rt, st, src)
	src.send(resync(fileItem(testPod("old"), "old.yaml")))
	eventually(t, "old runs", func() bool { return rt.podContainers(uidOf(a, "old")) == 1 })
	uid := uidOf(a, "old")
	a.stopAgent()

	rep := &fakeReporter{}
	src = newFakeSource(source.File)
	a = startAgentWith(t, Options{Report: rep}, rt, store.NewMemory(), src)
	src.send(resync())
	eventually(t, "leftover reported gone", func() bool {
		a.Relist(context.Background(), false)
		_, gone, _ := rep.snapshot()
		return len(gone) == 1
	})
	_, gone, _ := rep.snapshot()
	if d := gone[0]; d.Pod.UID != uid || d.Pod.Namespace+"/"+d.Pod.Name != "default/old" || d.Source != (source.Ref{}) {
		t.Errorf("gone %+v %+v, want default/old with no source", d.Pod.ObjectMeta, d.Source)
	}
}

// A status computed for a version that has since been replaced reports that version's generation,
// not the newest one's; the worker hands each status back with its version (pod's
// TestWorkerReportsTheVersionEachStatusWasComputedFor), and the agent reports what it is handed.
func TestStatusOfAReplacedVersion(t *testing.T) {
	rep := &fakeReporter{}
	a := New(Options{NodeName: "n", Log: slog.New(slog.DiscardHandler), Report: rep}, newFakeRuntime(), store.NewMemory())
	version := func(gen int64) store.DesiredPod {
		p := testPod("p")
		p.UID = "uid-p"
		return store.DesiredPod{Pod: p, Source: source.Ref{Kind: source.MQTT, Origin: "t/p"}, Generation: gen}
	}
	old, cur := version(1), version(2)
	a.mu.Lock()
	a.desired["uid-p"] = cur
	a.mu.Unlock()
	a.onStatus(pod.Desired(old), v1.PodStatus{Phase: v1.PodPending})
	a.onStatus(pod.Desired(cur), v1.PodStatus{Phase: v1.PodRunning})
	ss, _, _ := rep.snapshot()
	if len(ss) != 2 || ss[0].d.Generation != 1 || ss[0].d.Pod != old.Pod || ss[1].d.Generation != 2 || ss[1].d.Pod != cur.Pod {
		t.Errorf("reported %+v, want generation 1 then 2 with the pods they were computed for", ss)
	}
}

func eventLines(es []event.Event) string {
	var lines []string
	for _, e := range es {
		lines = append(lines, fmt.Sprintf("%s %s %s %s/%s [%s]: %s", e.Type, e.Reason, e.Object.Kind, e.Object.Namespace, e.Object.Name, e.Source, e.Message))
	}
	return strings.Join(lines, "\n")
}

// Each rejection is an event when it is new or its reason changed; a resync that repeats it says
// nothing, so an idle link stays idle.
func TestEventsOncePerNewRejection(t *testing.T) {
	rt, st, src, rep := newFakeRuntime(), store.NewMemory(), newFakeSource(source.File), &fakeReporter{}
	a := startAgentWith(t, Options{Report: rep}, rt, st, src)
	bad := testPod("a")
	bad.Spec.Containers[0].Image = ""
	send := func(c source.Change) { src.send(c); waitApplied(t, src) }

	send(resync(fileItem(bad, "a.yaml"), fileItem(testPod("b"), "b.yaml")))
	es := rep.eventsSince(0)
	if len(es) != 1 {
		t.Fatalf("events:\n%s\nwant one Rejected", eventLines(es))
	}
	e := es[0]
	if e.Type != event.Warning || e.Reason != event.ReasonRejected || e.Object != (event.Object{Kind: "Pod", Namespace: "default", Name: "a"}) ||
		e.Source != "file /pods/a.yaml#0" || !strings.Contains(e.Message, "spec.containers[0].image: Required value") || e.Time.IsZero() {
		t.Errorf("event %+v", e)
	}

	for range 3 {
		send(resync(fileItem(bad, "a.yaml"), fileItem(testPod("b"), "b.yaml")))
	}
	if es := rep.eventsSince(1); len(es) != 0 {
		t.Fatalf("a resync repeating the rejection emitted:\n%s", eventLines(es))
	}

	worse := testPod("a")
	worse.Spec.Containers[0].Image = "busy box"
	send(resync(fileItem(worse, "a.yaml"), fileItem(testPod("b"), "b.yaml")))
	if es := rep.eventsSince(1); len(es) != 1 || !strings.Contains(es[0].Message, "whitespace") {
		t.Fatalf("a changed reason emitted:\n%s\nwant one event about the whitespace", eventLines(es))
	}

	// Fixed: no event, not listed; broken again the same way: new again.
	send(resync(fileItem(testPod("a"), "a.yaml"), fileItem(testPod("b"), "b.yaml")))
	if len(a.Rejected()) != 0 || len(rep.eventsSince(2)) != 0 {
		t.Fatalf("after the fix: rejected %v, events\n%s", a.Rejected(), eventLines(rep.eventsSince(2)))
	}
	send(resync(fileItem(worse, "a.yaml"), fileItem(testPod("b"), "b.yaml")))
	if es := rep.eventsSince(2); len(es) != 1 {
		t.Fatalf("broken again emitted:\n%s\nwant one event", eventLines(es))
	}

	// A file that is not readable is about the node, not a pod.
	send(source.Change{Op: source.Resync, Items: []source.Item{fileItem(testPod("a"), "a.yaml")},
		Rejections: []source.Rejection{{Ref: source.Ref{Kind: source.File, Origin: "/pods/b.yaml", Doc: -1}, Reason: "file is empty", Keep: true}}})
	es = rep.eventsSince(3)
	if len(es) != 1 || es[0].Object != (event.Object{Kind: "Node", Name: "node-1"}) || es[0].Source != "file /pods/b.yaml" || es[0].Message != "file is empty" {
		t.Errorf("unreadable file emitted:\n%s", eventLines(es))
	}
}

// Clashes get their own reasons: NameClash between sources, DuplicateUID within one; each once.
func TestEventsForClashes(t *testing.T) {
	rt, st, rep := newFakeRuntime(), store.NewMemory(), &fakeReporter{}
	files, mqtt := newFakeSource(source.File), newFakeSource(source.MQTT)
	a := startAgentWith(t, Options{Report: rep}, rt, st, files, mqtt)
	one, two := testPod("one"), testPod("two")
	one.UID, two.UID = "same-uid", "same-uid"
	for range 2 {
		files.send(resync(fileItem(testPod("web"), "web.yaml"), fileItem(one, "one.yaml"), fileItem(two, "two.yaml")))
		waitApplied(t, files)
		mqtt.send(source.Change{Op: source.Resync, Items: []source.Item{mqttItem(testPod("web"), 1)}})
		waitApplied(t, mqtt)
	}
	es := rep.eventsSince(0)
	if len(es) != 2 {
		t.Fatalf("events:\n%s\nwant DuplicateUID and NameClash once each", eventLines(es))
	}
	if e := es[0]; e.Reason != event.ReasonDuplicateUID || e.Object != (event.Object{Kind: "Pod", Namespace: "default", Name: "two", UID: "same-uid"}) ||
		e.Source != "file /pods/two.yaml#0" || !strings.Contains(e.Message, "already used by pod default/one") {
		t.Errorf("duplicate UID event %+v", e)
	}
	if e := es[1]; e.Reason != event.ReasonNameClash || e.Object.Name != "web" || e.Object.UID != uidOf(a, "web") ||
		e.Source != "mqtt mqlet/v2/nodes/node-1/desired/pods/default/web" || !strings.Contains(e.Message, "already defined by file /pods/web.yaml") {
		t.Errorf("name clash event %+v", e)
	}
}

// A pod from MQTT that the policy refuses is a rejection and a PolicyDenied event; an upsert
// repeating it says nothing more, and a fixed version clears it.
func TestPolicyDenied(t *testing.T) {
	rt, st, src, rep := newFakeRuntime(), store.NewMemory(), newFakeSource(source.MQTT), &fakeReporter{}
	a := startAgentWith(t, Options{Report: rep}, rt, st, src)
	priv := testPod("p")
	yes := true
	priv.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: &yes}
	src.send(source.Change{Op: source.Resync})
	for range 2 {
		src.send(source.Change{Op: source.Upsert, Items: []source.Item{mqttItem(priv, 1)}})
	}
	waitApplied(t, src)
	es := rep.eventsSince(0)
	if len(es) != 1 || es[0].Reason != event.ReasonPolicyDenied || es[0].Type != event.Warning ||
		!strings.Contains(es[0].Message, "spec.containers[0].securityContext.privileged") || !strings.Contains(es[0].Message, "mqttPolicy.allowPrivileged") {
		t.Fatalf("events:\n%s\nwant one PolicyDenied", eventLines(es))
	}
	if rs := a.Rejected(); len(rs) != 1 || rs[0].Key != "default/p" || storedNames(t, st) != "" {
		t.Fatalf("rejected %+v, stored %q", rs, storedNames(t, st))
	}

	src.send(source.Change{Op: source.Upsert, Items: []source.Item{mqttItem(testPod("p"), 2)}})
	waitApplied(t, src)
	if rs := a.Rejected(); len(rs) != 0 || storedNames(t, st) != "default/p" || len(rep.eventsSince(1)) != 0 {
		t.Fatalf("after the fix: rejected %+v, stored %q, events\n%s", rs, storedNames(t, st), eventLines(rep.eventsSince(1)))
	}

	// Allowed by the node's policy, the same pod runs.
	rt2, st2, src2 := newFakeRuntime(), store.NewMemory(), newFakeSource(source.MQTT)
	startAgentWith(t, Options{Report: rep, MQTTPolicy: admission.Policy{AllowPrivileged: true}}, rt2, st2, src2)
	src2.send(source.Change{Op: source.Resync, Items: []source.Item{mqttItem(priv, 1)}})
	waitApplied(t, src2)
	if storedNames(t, st2) != "default/p" {
		t.Errorf("privileged pod not admitted although the policy allows it")
	}
}

// Events are emitted with none of the agent's locks held.
func TestEventsEmittedOutsideLocks(t *testing.T) {
	var a *Agent
	var held []string
	calls := 0
	rep := event.SinkFunc(func(event.Event) {
		calls++
		if a.mu.TryLock() {
			a.mu.Unlock()
		} else {
			held = append(held, "mu")
		}
		if a.applyMu.TryLock() {
			a.applyMu.Unlock()
		} else {
			held = append(held, "applyMu")
		}
	})
	a = New(Options{NodeName: "n", Log: slog.New(slog.DiscardHandler), Report: sinkOnly{rep}}, newFakeRuntime(), store.NewMemory())
	bad := testPod("a")
	bad.Spec.Containers[0].Image = ""
	a.Apply(source.File, resync(fileItem(bad, "a.yaml"))) // rejections only: no worker runs meanwhile
	if calls != 1 || len(held) != 0 {
		t.Errorf("%d events, emitted with %v held; want 1 with no lock held", calls, held)
	}
}

// sinkOnly is a Reporter that only takes events.
type sinkOnly struct{ event.Sink }

func (sinkOnly) PodStatus(store.DesiredPod, v1.PodStatus) {}
func (sinkOnly) PodGone(store.DesiredPod)                 {}
