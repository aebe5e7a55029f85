package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// These tests run the agent's desired-set logic, relist, teardown and restore against an in-memory
// store and a fake runtime: no containerd (make unit). The real runtime is covered by the e2e
// tests in cmd/mqlet/e2e.

// fakeRuntime keeps containers and sandboxes in maps. Containers start running and stay so until
// stopped.
type fakeRuntime struct {
	mu         sync.Mutex
	ctrs       map[string]ctrd.Container
	sandboxes  map[types.UID]bool
	removedSbx []types.UID
	starts     int
	listErr    error // ListContainers fails with it (containerd unreachable)
}

func newFakeRuntime() *fakeRuntime {
	return &fakeRuntime{ctrs: map[string]ctrd.Container{}, sandboxes: map[types.UID]bool{}}
}

func (f *fakeRuntime) ListContainers(_ context.Context, podUID string) ([]ctrd.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.listErr != nil {
		return nil, f.listErr
	}
	var out []ctrd.Container
	for _, c := range f.ctrs {
		if podUID == "" || c.PodUID == podUID {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b ctrd.Container) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

func (f *fakeRuntime) EnsureSandbox(_ context.Context, p *v1.Pod) (*ctrd.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	created := !f.sandboxes[p.UID]
	f.sandboxes[p.UID] = true
	return &ctrd.Sandbox{Ref: ctrd.RefOf(p), Created: created}, nil
}

func (f *fakeRuntime) StartContainer(_ context.Context, p *v1.Pod, _ *ctrd.Sandbox, c *v1.Container, restarts int) (ctrd.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := ctrd.ContainerID(string(p.UID), c.Name, restarts)
	ct := ctrd.Container{ID: id, PodUID: string(p.UID), PodName: p.Name, PodNamespace: p.Namespace, Name: c.Name,
		Hash: ctrspec.SpecHash(p, c), RestartCount: restarts, CreatedAt: time.Now(), State: ctrd.StateRunning, Pid: 100}
	f.ctrs[id] = ct
	f.starts++
	return ct, nil
}

func (f *fakeRuntime) StopContainer(_ context.Context, id string, _ time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.ctrs[id]; ok && c.State == ctrd.StateRunning {
		c.State, c.ExitCode, c.ExitedAt = ctrd.StateExited, 137, time.Now()
		f.ctrs[id] = c
	}
	return nil
}

func (f *fakeRuntime) RemoveContainer(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.ctrs, id)
	return nil
}

func (f *fakeRuntime) RemoveSandbox(_ context.Context, ref ctrd.PodRef) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sandboxes, ref.UID)
	f.removedSbx = append(f.removedSbx, ref.UID)
	return nil
}

func (f *fakeRuntime) ListSandboxes() ([]ctrd.PodRef, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []ctrd.PodRef
	for uid := range f.sandboxes {
		out = append(out, ctrd.PodRef{UID: uid})
	}
	return out, nil
}

func (f *fakeRuntime) Events(ctx context.Context, _ func(ctrd.Event)) error {
	<-ctx.Done()
	return ctx.Err()
}

func (f *fakeRuntime) ImportArchiveIfMissing(context.Context, string) ([]string, error) {
	return nil, nil
}

func (f *fakeRuntime) LogPath(p *v1.Pod, name string, restarts int) string {
	return fmt.Sprintf("/logs/%s/%s/%d.log", p.UID, name, restarts)
}

func (f *fakeRuntime) podContainers(uid types.UID) int {
	cs, _ := f.ListContainers(context.Background(), string(uid))
	return len(cs)
}

// fakeSource delivers what the test sends it, in order.
type fakeSource struct {
	kind source.Kind
	ch   chan source.Change
	// sent and applied count changes given to send and changes Apply has returned from.
	sent, applied atomic.Int64
}

// send queues c; waitApplied waits until it has been applied.
func (s *fakeSource) send(c source.Change) {
	s.sent.Add(1)
	s.ch <- c
}

func newFakeSource(k source.Kind) *fakeSource {
	return &fakeSource{kind: k, ch: make(chan source.Change, 16)}
}

func (s *fakeSource) Kind() source.Kind { return s.kind }

func (s *fakeSource) Run(ctx context.Context, deliver func(source.Change) source.Result) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case c := <-s.ch:
			deliver(c)
			s.applied.Add(1)
		}
	}
}

func testPod(name string) *v1.Pod {
	p := &v1.Pod{}
	p.Name = name
	p.Spec.Containers = []v1.Container{{Name: "c", Image: "busybox:1"}}
	return p
}

func fileItem(p *v1.Pod, file string) source.Item {
	return source.Item{Pod: p, Ref: source.Ref{Kind: source.File, Origin: "/pods/" + file}}
}

func resync(items ...source.Item) source.Change {
	return source.Change{Op: source.Resync, Items: items}
}

type testAgent struct {
	*Agent
	rt     *fakeRuntime
	st     store.State
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startAgent(t *testing.T, rt *fakeRuntime, st store.State, sources ...source.Source) *testAgent {
	t.Helper()
	return startAgentWith(t, Options{}, rt, st, sources...)
}

// startAgentWith runs an agent with opts; the node name, periods and logger are the tests'.
func startAgentWith(t *testing.T, opts Options, rt *fakeRuntime, st store.State, sources ...source.Source) *testAgent {
	t.Helper()
	opts.NodeName, opts.RelistPeriod, opts.SweepPeriod = "node-1", time.Hour, time.Hour
	opts.Log = slog.New(slog.DiscardHandler)
	a := New(opts, rt, st, sources...)
	ctx, cancel := context.WithCancel(context.Background())
	ta := &testAgent{Agent: a, rt: rt, st: st, cancel: cancel, done: make(chan error, 1)}
	go func() { ta.done <- a.Run(ctx) }()
	t.Cleanup(ta.stopAgent)
	return ta
}

func (ta *testAgent) stopAgent() {
	ta.once.Do(func() {
		ta.cancel()
		select {
		case <-ta.done:
		case <-time.After(10 * time.Second):
			panic("agent did not stop within 10s")
		}
	})
}

// eventually polls cond for up to 5 s (bounded; the fakes act at once).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (ta *testAgent) podNames() string {
	var names []string
	for _, p := range ta.Pods() {
		names = append(names, p.Namespace+"/"+p.Name)
	}
	return strings.Join(names, " ")
}

func storedNames(t *testing.T, st store.State) string {
	t.Helper()
	ds, bad, err := st.ListDesired()
	if err != nil || len(bad) > 0 {
		t.Fatalf("ListDesired: %v %v", err, bad)
	}
	var names []string
	for _, d := range ds {
		names = append(names, d.Pod.Namespace+"/"+d.Pod.Name)
	}
	return strings.Join(names, " ")
}

func TestResyncChangesDesiredSet(t *testing.T) {
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.File)
	a := startAgent(t, rt, st, src)
	src.ch <- resync(fileItem(testPod("a"), "a.yaml"), fileItem(testPod("b"), "b.yaml"))
	eventually(t, "both pods run", func() bool { return a.podNames() == "default/a default/b" && rt.podContainers(uidOf(a, "b")) == 1 })
	if got := storedNames(t, st); got != "default/a default/b" {
		t.Fatalf("store holds %q", got)
	}
	ds, _, _ := st.ListDesired()
	if ds[0].Source != (source.Ref{Kind: source.File, Origin: "/pods/a.yaml"}) {
		t.Errorf("stored source %+v, want the typed ref of a.yaml", ds[0].Source)
	}
	bUID := uidOf(a, "b")
	src.ch <- resync(fileItem(testPod("a"), "a.yaml"))
	eventually(t, "b removed", func() bool { return a.podNames() == "default/a" && rt.podContainers(bUID) == 0 })
	if got := storedNames(t, st); got != "default/a" {
		t.Errorf("store holds %q after b went", got)
	}
	if err := a.Ready(); err != nil {
		t.Errorf("Ready: %v", err)
	}
}

// Ready carries the runtime's health: false with kubelet's "container runtime is down" and
// containerd's own error while listing fails, true again once it answers.
func TestReadyNamesRuntimeDown(t *testing.T) {
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.File)
	a := startAgent(t, rt, st, src)
	src.ch <- resync(fileItem(testPod("a"), "a.yaml"))
	eventually(t, "ready", func() bool { return a.Ready() == nil })
	down := errors.New("dial unix /run/containerd/containerd.sock: connect: connection refused")
	rt.mu.Lock()
	rt.listErr = down
	rt.mu.Unlock()
	if err := a.Relist(context.Background(), false); !errors.Is(err, down) {
		t.Fatalf("Relist with containerd down: %v", err)
	}
	err := a.Ready()
	if err == nil || err.Error() != "container runtime is down: containerd: "+down.Error() {
		t.Errorf("Ready with containerd down: %v, want kubelet's reason with containerd's error", err)
	}
	rt.mu.Lock()
	rt.listErr = nil
	rt.mu.Unlock()
	if err := a.Relist(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if err := a.Ready(); err != nil {
		t.Errorf("Ready once containerd answers again: %v", err)
	}
}

func uidOf(a *testAgent, name string) types.UID {
	for _, p := range a.Pods() {
		if p.Name == name {
			return p.UID
		}
	}
	return ""
}

func TestUpsertAndDeleteFromAnEventSource(t *testing.T) {
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.MQTT)
	a := startAgent(t, rt, st, src)
	src.ch <- source.Change{Op: source.Resync}
	item := source.Item{Pod: testPod("m"), Ref: source.Ref{Kind: source.MQTT, Origin: "t/pods/default/m"}, Generation: 2}
	src.ch <- source.Change{Op: source.Upsert, Items: []source.Item{item}}
	eventually(t, "m runs", func() bool { return a.podNames() == "default/m" })
	// An older generation replayed changes nothing.
	old := item
	old.Pod = testPod("m")
	old.Pod.Spec.Containers[0].Image = "busybox:old"
	old.Generation = 1
	src.ch <- source.Change{Op: source.Upsert, Items: []source.Item{old}}
	src.ch <- source.Change{Op: source.Delete, Keys: []string{"default/other"}} // unknown: ignored
	eventually(t, "changes applied", func() bool { return len(src.ch) == 0 })
	a.applyMu.Lock() // the last change is applied once Apply returns
	a.applyMu.Unlock()
	ds, _, _ := st.ListDesired()
	if len(ds) != 1 || ds[0].Generation != 2 || ds[0].Pod.Spec.Containers[0].Image != "busybox:1" {
		t.Fatalf("stored %+v, want generation 2 kept", ds)
	}
	src.ch <- source.Change{Op: source.Delete, Keys: []string{"default/m"}}
	eventually(t, "m deleted", func() bool { return a.podNames() == "" && storedNames(t, st) == "" })
}

// Two sources may not claim the same namespace/name: the second is refused with a reason the API
// shows, and the first keeps running.
func TestNameClashBetweenSources(t *testing.T) {
	rt, st := newFakeRuntime(), store.NewMemory()
	files, mqtt := newFakeSource(source.File), newFakeSource(source.MQTT)
	a := startAgent(t, rt, st, files, mqtt)
	files.ch <- resync(fileItem(testPod("web"), "web.yaml"))
	eventually(t, "file pod runs", func() bool { return rt.podContainers(uidOf(a, "web")) == 1 })
	p := testPod("web")
	p.Spec.Containers[0].Image = "other:1"
	mqtt.ch <- source.Change{Op: source.Resync, Items: []source.Item{{Pod: p, Ref: source.Ref{Kind: source.MQTT, Origin: "topic/web"}, Generation: 1}}}
	eventually(t, "clash rejected", func() bool { return len(a.Rejected()) == 1 })
	r := a.Rejected()[0]
	if r.Ref.Kind != source.MQTT || r.Key != "default/web" || !strings.Contains(r.Reason, "already defined by file /pods/web.yaml") {
		t.Errorf("rejection %+v", r)
	}
	ds, _, _ := st.ListDesired()
	if len(ds) != 1 || ds[0].Source.Kind != source.File || ds[0].Pod.Spec.Containers[0].Image != "busybox:1" {
		t.Errorf("stored %+v, want the file's pod only", ds)
	}
	// The file pod going away frees the name; the next MQTT resync takes it.
	files.ch <- resync()
	eventually(t, "file pod gone", func() bool { return storedNames(t, st) == "" })
	mqtt.ch <- source.Change{Op: source.Resync, Items: []source.Item{{Pod: p, Ref: source.Ref{Kind: source.MQTT, Origin: "topic/web"}, Generation: 1}}}
	eventually(t, "mqtt pod admitted", func() bool {
		ds, _, _ := st.ListDesired()
		return len(ds) == 1 && ds[0].Source.Kind == source.MQTT && len(a.Rejected()) == 0
	})
}

// Two manifests with the same explicit UID: the second is refused, the rest apply.
func TestDuplicateUIDRefusedRestApplied(t *testing.T) {
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.File)
	a := startAgent(t, rt, st, src)
	one, two := testPod("one"), testPod("two")
	one.UID, two.UID = "same-uid", "same-uid"
	src.ch <- resync(fileItem(one, "a.yaml"), fileItem(two, "b.yaml"), fileItem(testPod("three"), "c.yaml"))
	eventually(t, "one and three run", func() bool { return a.podNames() == "default/one default/three" })
	rs := a.Rejected()
	if len(rs) != 1 || rs[0].Key != "default/two" || !strings.Contains(rs[0].Reason, "already used by pod default/one") {
		t.Fatalf("rejected %+v", rs)
	}
	// The clash does not freeze other changes; the incumbent wins even when listed second.
	four := testPod("four")
	src.ch <- resync(fileItem(two, "b.yaml"), fileItem(one, "a.yaml"), fileItem(testPod("three"), "c.yaml"), fileItem(four, "d.yaml"))
	eventually(t, "four added", func() bool { return a.podNames() == "default/four default/one default/three" })
}

// A pod whose new version fails admission keeps running as it was; a file that cannot be read
// keeps the pods stored from it.
func TestRejectedOrUnreadableKeepsStoredPods(t *testing.T) {
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.File)
	a := startAgent(t, rt, st, src)
	src.ch <- resync(fileItem(testPod("a"), "a.yaml"), fileItem(testPod("b"), "b.yaml"))
	eventually(t, "pods run", func() bool { return a.podNames() == "default/a default/b" })
	bad := testPod("a")
	bad.Spec.Containers[0].Image = ""
	src.ch <- source.Change{Op: source.Resync, Items: []source.Item{fileItem(bad, "a.yaml")},
		Rejections: []source.Rejection{{Ref: source.Ref{Kind: source.File, Origin: "/pods/b.yaml", Doc: -1}, Reason: "file is empty", Keep: true}}}
	eventually(t, "rejections listed", func() bool { return len(a.Rejected()) == 2 })
	for _, p := range a.Pods() {
		if p.DeletionTimestamp != nil {
			t.Errorf("pod %s is being deleted", p.Name)
		}
	}
	if got := storedNames(t, st); got != "default/a default/b" {
		t.Errorf("store holds %q", got)
	}
	ds, _, _ := st.ListDesired()
	if ds[0].Pod.Spec.Containers[0].Image != "busybox:1" {
		t.Errorf("the rejected version replaced the stored one: %+v", ds[0].Pod.Spec.Containers[0])
	}
}

// UIDs from a manifest name directories: a hostile one is refused before anything reaches a path.
func TestHostileUIDRejected(t *testing.T) {
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.File)
	a := startAgent(t, rt, st, src)
	p := testPod("evil")
	p.UID = "../../../../etc"
	src.ch <- resync(fileItem(p, "evil.yaml"))
	eventually(t, "rejected", func() bool { return len(a.Rejected()) == 1 })
	if !strings.Contains(a.Rejected()[0].Reason, "metadata.uid") || a.podNames() != "" || storedNames(t, st) != "" {
		t.Errorf("rejected %+v, pods %q", a.Rejected(), a.podNames())
	}
}

// After a restart the stored pods run again before any source speaks, and nothing is removed
// until every source has delivered its full set (an empty store must not make orphans of
// everything; a source that has not spoken must not either).
func TestRestoreAndOrphansOnlyAfterAllSourcesSynced(t *testing.T) {
	rt, st := newFakeRuntime(), store.NewMemory()
	files, mqtt := newFakeSource(source.File), newFakeSource(source.MQTT)
	a := startAgent(t, rt, st, files, mqtt)
	files.ch <- resync(fileItem(testPod("a"), "a.yaml"), fileItem(testPod("gone"), "g.yaml"))
	eventually(t, "pods run", func() bool { return rt.podContainers(uidOf(a, "a")) == 1 && rt.podContainers(uidOf(a, "gone")) == 1 })
	aUID, goneUID := uidOf(a, "a"), uidOf(a, "gone")
	a.stopAgent()
	startsBefore := rt.starts

	// "gone" is deleted while the agent is down; the store was also lost.
	st = store.NewMemory()
	files, mqtt = newFakeSource(source.File), newFakeSource(source.MQTT)
	a = startAgent(t, rt, st, files, mqtt)
	if err := a.Relist(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if rt.podContainers(goneUID) != 1 || rt.podContainers(aUID) != 1 {
		t.Fatalf("containers removed before the sources were read")
	}
	if err := a.Ready(); err == nil || !strings.Contains(err.Error(), "file") {
		t.Errorf("Ready = %v, want not ready until the sources are read", err)
	}
	files.ch <- resync(fileItem(testPod("a"), "a.yaml"))
	eventually(t, "a adopted", func() bool { return uidOf(a, "a") == aUID })
	if err := a.Relist(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if rt.podContainers(goneUID) != 1 {
		t.Fatalf("orphan removed before the mqtt source had spoken")
	}
	mqtt.ch <- source.Change{Op: source.Resync}
	eventually(t, "orphan torn down", func() bool {
		a.Relist(context.Background(), false)
		return rt.podContainers(goneUID) == 0 && slices.Contains(rt.removedSbx, goneUID)
	})
	if rt.podContainers(aUID) != 1 || rt.starts != startsBefore {
		t.Errorf("adopted pod was restarted (starts %d -> %d)", startsBefore, rt.starts)
	}
}

// Restore: the stored pods and statuses come back with a fresh agent, before any source speaks.
func TestRestoreFromStore(t *testing.T) {
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.File)
	a := startAgent(t, rt, st, src)
	src.ch <- resync(fileItem(testPod("a"), "a.yaml"))
	eventually(t, "a runs", func() bool {
		s, ok, _ := st.GetStatus(uidOf(a, "a"))
		return ok && s.Phase == v1.PodRunning
	})
	a.stopAgent()
	a = startAgent(t, rt, st, newFakeSource(source.File)) // this source never speaks
	eventually(t, "a restored", func() bool {
		ps := a.Pods()
		return len(ps) == 1 && ps[0].Name == "a" && ps[0].Status.Phase == v1.PodRunning
	})
}

// The sweep removes leftovers that belong to no desired pod and no container: sandboxes (pod
// dirs, mounts, logs, cgroups) and status records.
func TestSweepRemovesLeftovers(t *testing.T) {
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.File)
	rt.sandboxes["left-sandbox"] = true
	st.PutStatus("left-status", &v1.PodStatus{Phase: v1.PodRunning})
	a := startAgent(t, rt, st, src)
	src.ch <- resync(fileItem(testPod("a"), "a.yaml"))
	eventually(t, "a runs", func() bool { return rt.podContainers(uidOf(a, "a")) == 1 })
	eventually(t, "leftovers swept", func() bool {
		a.Relist(context.Background(), true)
		_, ok, _ := st.GetStatus("left-status")
		rt.mu.Lock()
		defer rt.mu.Unlock()
		return !ok && !rt.sandboxes["left-sandbox"]
	})
	if _, ok, _ := st.GetStatus(uidOf(a, "a")); !ok || !rt.sandboxes[uidOf(a, "a")] {
		t.Errorf("the sweep removed a wanted pod's status or sandbox")
	}
}

// lockProbeStore checks, during each desired-set write, that the agent's routing/API lock is
// free: the store write must not happen under it.
type lockProbeStore struct {
	store.State
	a      *Agent
	writes int
	held   bool
	fail   error
}

func (s *lockProbeStore) UpdateDesired(put []store.DesiredPod, del []types.UID) error {
	s.writes++
	if s.a.mu.TryLock() {
		s.a.mu.Unlock()
	} else {
		s.held = true
	}
	if s.fail != nil {
		return s.fail
	}
	return s.State.UpdateDesired(put, del)
}

func TestNoStoreWriteUnderTheAgentLock(t *testing.T) {
	rt, src := newFakeRuntime(), newFakeSource(source.File)
	st := &lockProbeStore{State: store.NewMemory()}
	a := New(Options{NodeName: "n", Log: slog.New(slog.DiscardHandler)}, rt, st, src)
	st.a = a
	a.runCtx, a.stop = context.WithCancel(context.Background())
	defer a.shutdown()
	a.Apply(source.File, resync(fileItem(testPod("a"), "a.yaml")))
	if st.writes != 1 || st.held {
		t.Errorf("writes %d, lock held during a write: %v", st.writes, st.held)
	}
}

// A failed store write acts on nothing: what runs is always what the store says.
func TestStoreFailureActsOnNothing(t *testing.T) {
	rt, src := newFakeRuntime(), newFakeSource(source.File)
	st := &lockProbeStore{State: store.NewMemory(), fail: errors.New("disk full")}
	a := New(Options{NodeName: "n", Log: slog.New(slog.DiscardHandler)}, rt, st, src)
	st.a = a
	a.runCtx, a.stop = context.WithCancel(context.Background())
	defer a.shutdown()
	a.Apply(source.File, resync(fileItem(testPod("a"), "a.yaml")))
	if len(a.Pods()) != 0 {
		t.Errorf("a worker started although the store write failed")
	}
}

// Every goroutine the agent starts ends when it stops (workers, event follower, relist, sources,
// teardowns).
func TestRunLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.File)
	a := startAgent(t, rt, st, src)
	src.ch <- resync(fileItem(testPod("a"), "a.yaml"), fileItem(testPod("b"), "b.yaml"))
	eventually(t, "pods run", func() bool { return rt.podContainers(uidOf(a, "a")) == 1 && rt.podContainers(uidOf(a, "b")) == 1 })
	a.stopAgent()
	eventually(t, "goroutines end", func() bool { return runtime.NumGoroutine() <= before })
}

// A deletion carried by a version admission refuses (the API's pod after kubectl debug added an
// ephemeral container the policy denies) still deletes the version that runs, or the pod could
// never be deleted; a refused version without a deletion changes nothing.
func TestRefusedVersionStillDeletes(t *testing.T) {
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.MQTT)
	a := startAgent(t, rt, st, src)
	src.ch <- source.Change{Op: source.Resync}
	ref := source.Ref{Kind: source.MQTT, Origin: "t/pods/default/m"}
	src.ch <- source.Change{Op: source.Upsert, Items: []source.Item{{Pod: testPod("m"), Ref: ref, Generation: 1}}}
	eventually(t, "m runs", func() bool { return a.podNames() == "default/m" && rt.podContainers(uidOf(a, "m")) == 1 })
	uid := uidOf(a, "m")

	// A version the policy refuses whole (an app container made privileged; a refused ephemeral
	// container alone is left out instead, ephemeral_refusal_test.go).
	bad := testPod("m")
	bad.UID = uid
	privileged := true
	bad.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: &privileged}
	src.ch <- source.Change{Op: source.Upsert, Items: []source.Item{{Pod: bad, Ref: ref, Generation: 2}}}
	eventually(t, "the version refused", func() bool { return len(a.Rejected()) == 1 })
	for _, p := range a.Pods() {
		if p.DeletionTimestamp != nil || p.Spec.Containers[0].SecurityContext != nil && p.Spec.Containers[0].SecurityContext.Privileged != nil {
			t.Fatalf("the refused version reached the pod: deletion %v, security context %+v", p.DeletionTimestamp, p.Spec.Containers[0].SecurityContext)
		}
	}

	deleting := bad.DeepCopy()
	now, grace := metav1.Now(), int64(1)
	deleting.DeletionTimestamp, deleting.DeletionGracePeriodSeconds = &now, &grace
	src.ch <- source.Change{Op: source.Upsert, Items: []source.Item{{Pod: deleting, Ref: ref, Generation: 3}}}
	eventually(t, "m's containers stopped and removed", func() bool { return rt.podContainers(uid) == 0 })
	ds, _, _ := st.ListDesired()
	if len(ds) != 1 || ds[0].Pod.DeletionTimestamp == nil || ds[0].Pod.Spec.Containers[0].SecurityContext != nil && ds[0].Pod.Spec.Containers[0].SecurityContext.Privileged != nil || ds[0].Generation != 3 {
		t.Errorf("stored %+v; want the running version with the deletion, at generation 3", ds)
	}
}
