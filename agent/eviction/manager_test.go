package eviction

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/core/source"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
)

const Mi = 1 << 20

// fakeNode is the node as the manager sees it: signals, pods with their usage, and what was done.
type fakeNode struct {
	mu               sync.Mutex
	signals          map[Signal]Observation
	dedicatedImageFs bool
	pods             []Pod
	memory           map[types.UID]int64
	disk             map[types.UID]int64
	inodes           map[types.UID]int64
	procs            map[types.UID]int64
	evicted          []evictCall
	released         []types.UID
	events           []event.Event
	// onRelease runs when a pod's storage is released (frees its usage, say).
	onRelease func(uid types.UID)
	reclaims  []reclaimCall
	reclaimFn func(Signal, int64) int64
	// stuck: evicted pods never stop (a hung containerd shim).
	stuck bool
}

type evictCall struct {
	uid   types.UID
	msg   string
	grace *time.Duration
}

type reclaimCall struct {
	signal Signal
	amount int64
}

func newFakeNode() *fakeNode {
	return &fakeNode{signals: map[Signal]Observation{}, memory: map[types.UID]int64{}, disk: map[types.UID]int64{},
		inodes: map[types.UID]int64{}, procs: map[types.UID]int64{}}
}

func (f *fakeNode) set(s Signal, available, capacity int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.signals[s] = Observation{Available: available, Capacity: capacity}
}

func (f *fakeNode) Observe() Observations {
	f.mu.Lock()
	defer f.mu.Unlock()
	sig := map[Signal]Observation{}
	for k, v := range f.signals {
		sig[k] = v
	}
	return Observations{Signals: sig, DedicatedImageFs: f.dedicatedImageFs}
}

func (f *fakeNode) List() []Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Pod, len(f.pods))
	for i, p := range f.pods {
		out[i] = Pod{Pod: p.Pod.DeepCopy(), Source: p.Source}
	}
	return out
}

// Evict does what the agent's worker does: the pod ends Failed with reason Evicted.
func (f *fakeNode) Evict(uid types.UID, msg string, grace *time.Duration) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.pods {
		if p.Pod.UID == uid {
			if !f.stuck {
				p.Pod.Status.Phase, p.Pod.Status.Reason, p.Pod.Status.Message = v1.PodFailed, Reason, msg
			}
			f.evicted = append(f.evicted, evictCall{uid, msg, grace})
			return true
		}
	}
	return false
}

func (f *fakeNode) Release(p *v1.Pod) error {
	f.mu.Lock()
	f.released = append(f.released, p.UID)
	fn := f.onRelease
	f.mu.Unlock()
	if fn != nil {
		fn(p.UID)
	}
	return nil
}

func (f *fakeNode) Emit(e event.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, e)
}

func (f *fakeNode) ReclaimDisk(_ context.Context, s Signal, amount int64) (int64, error) {
	f.mu.Lock()
	f.reclaims = append(f.reclaims, reclaimCall{s, amount})
	fn := f.reclaimFn
	f.mu.Unlock()
	if fn != nil {
		return fn(s, amount), nil
	}
	return 0, nil
}

func lookup(m map[types.UID]int64, mu *sync.Mutex, p *v1.Pod) (int64, error) {
	mu.Lock()
	defer mu.Unlock()
	v, ok := m[p.UID]
	if !ok {
		return 0, fmt.Errorf("no stats for %s", p.Name)
	}
	return v, nil
}

func (f *fakeNode) Memory(p *v1.Pod) (int64, error)    { return lookup(f.memory, &f.mu, p) }
func (f *fakeNode) Processes(p *v1.Pod) (int64, error) { return lookup(f.procs, &f.mu, p) }
func (f *fakeNode) Disk(p *v1.Pod) (int64, int64, error) {
	b, err := lookup(f.disk, &f.mu, p)
	if err != nil {
		return 0, 0, err
	}
	n, _ := lookup(f.inodes, &f.mu, p)
	return b, n, nil
}

func (f *fakeNode) evictedNames() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, e := range f.evicted {
		for _, p := range f.pods {
			if p.Pod.UID == e.uid {
				out = append(out, p.Pod.Name)
			}
		}
	}
	return out
}

type podOpt func(*Pod)

func memRequest(q string) podOpt {
	return func(p *Pod) {
		p.Pod.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceMemory: resource.MustParse(q)}
	}
}

func diskRequest(q string) podOpt {
	return func(p *Pod) {
		p.Pod.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceEphemeralStorage: resource.MustParse(q)}
	}
}

func priority(n int32) podOpt { return func(p *Pod) { p.Pod.Spec.Priority = &n } }

func fromFile(p *Pod) {
	p.Source = source.Ref{Kind: source.File, Origin: "/etc/mqlet/pods/" + p.Pod.Name + ".yaml"}
}

func grace(s int64) podOpt { return func(p *Pod) { p.Pod.Spec.TerminationGracePeriodSeconds = &s } }

func (f *fakeNode) addPod(name string, opts ...podOpt) types.UID {
	p := Pod{Pod: &v1.Pod{}, Source: source.Ref{Kind: source.MQTT, Origin: "mqlet/v2/nodes/n/desired/pods/default/" + name}}
	p.Pod.Name, p.Pod.Namespace, p.Pod.UID = name, "default", types.UID("uid-"+name)
	p.Pod.Spec.Containers = []v1.Container{{Name: "c", Image: "busybox"}}
	p.Pod.Status.Phase = v1.PodRunning
	for _, o := range opts {
		o(&p)
	}
	f.mu.Lock()
	f.pods = append(f.pods, p)
	f.mu.Unlock()
	return p.Pod.UID
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func mustThresholds(t *testing.T, hard, soft, grace, reclaim map[string]string) []Threshold {
	t.Helper()
	ts, err := ParseThresholds(hard, soft, grace, reclaim)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newTestManager(f *fakeNode, c *clock, o Options) *Manager {
	o.Observer, o.Usage, o.Pods, o.Events, o.Now, o.Log = f, f, f, f, c.now, quietLog()
	if o.Reclaimer == nil && f.reclaimFn != nil {
		o.Reclaimer = f
	}
	o.NodeName = "n"
	return New(o)
}

// round runs one round the way Run does: synchronize, and after an eviction the release.
func (m *Manager) round() *Pod {
	p := m.synchronize(context.Background(), false)
	if p != nil {
		m.waitStopped(context.Background(), p.Pod.UID)
		m.releaseEvicted()
	}
	return p
}

func TestHardMemoryEvictsAtOnceWithKubeletsMessage(t *testing.T) {
	f := newFakeNode()
	c := &clock{t: time.Unix(1000, 0)}
	f.set(SignalMemoryAvailable, 500*Mi, 4096*Mi)
	hog := f.addPod("hog", memRequest("64Mi"), grace(30))
	f.memory[hog] = 300 * Mi
	m := newTestManager(f, c, Options{Thresholds: mustThresholds(t, map[string]string{"memory.available": "100Mi"}, nil, nil, nil),
		PressureTransitionPeriod: 5 * time.Minute})

	if p := m.round(); p != nil || m.MemoryPressure() {
		t.Fatalf("above the threshold: evicted %v, pressure %v", p, m.MemoryPressure())
	}
	f.set(SignalMemoryAvailable, 80*Mi, 4096*Mi)
	p := m.round()
	if p == nil || p.Pod.Name != "hog" {
		t.Fatalf("below a hard threshold: evicted %v, want hog at once", p)
	}
	e := f.evicted[0]
	want := "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. " +
		"Pod hog was using 300Mi, request is 64Mi, has larger consumption of memory. "
	if e.msg != want {
		t.Errorf("message\n %q\nwant\n %q", e.msg, want)
	}
	if e.grace == nil || *e.grace != 0 {
		t.Errorf("hard eviction grace = %v, want 0", e.grace)
	}
	var ev *event.Event
	for i := range f.events {
		if f.events[i].Reason == "Evicted" {
			ev = &f.events[i]
		}
	}
	if ev == nil || ev.Type != event.Warning || ev.Object.Kind != event.KindPod || ev.Object.UID != hog || ev.Message != want {
		t.Errorf("Evicted event = %+v", ev)
	}
	if !m.MemoryPressure() || !m.Conditions()[v1.NodeMemoryPressure] || m.Conditions()[v1.NodeDiskPressure] {
		t.Errorf("conditions = %v, want MemoryPressure only", m.Conditions())
	}
	if len(f.released) != 1 || f.released[0] != hog {
		t.Errorf("released = %v, want the evicted pod's storage freed", f.released)
	}
	if got := m.Evictions(); len(got) != 1 || got[SignalMemoryAvailable] != 1 {
		t.Errorf("Evictions() = %v, want memory.available: 1", got)
	}
}

func TestSoftThresholdWaitsForItsGracePeriod(t *testing.T) {
	f := newFakeNode()
	c := &clock{t: time.Unix(1000, 0)}
	f.set(SignalMemoryAvailable, 400*Mi, 4096*Mi)
	a := f.addPod("a", grace(60))
	f.memory[a] = 100 * Mi
	m := newTestManager(f, c, Options{
		Thresholds:               mustThresholds(t, nil, map[string]string{"memory.available": "500Mi"}, map[string]string{"memory.available": "1m30s"}, nil),
		PressureTransitionPeriod: time.Minute, MaxPodGracePeriod: 20 * time.Second})

	if m.round() != nil {
		t.Fatal("soft threshold evicted at once")
	}
	if !m.MemoryPressure() {
		t.Errorf("soft threshold crossed: no MemoryPressure (the condition does not wait for the grace period)")
	}
	c.advance(89 * time.Second)
	if m.round() != nil {
		t.Fatal("soft threshold evicted before its grace period")
	}
	// Relieved for a moment: the grace period starts again.
	f.set(SignalMemoryAvailable, 600*Mi, 4096*Mi)
	c.advance(time.Second)
	m.round()
	f.set(SignalMemoryAvailable, 400*Mi, 4096*Mi)
	c.advance(time.Second)
	if m.round() != nil {
		t.Fatal("the grace period did not restart after the signal recovered")
	}
	c.advance(90 * time.Second)
	if p := m.round(); p == nil {
		t.Fatal("soft threshold held past its grace period: nothing evicted")
	}
	// Pod grace 60 s, capped by evictionMaxPodGracePeriod 20 s.
	if g := f.evicted[0].grace; g == nil || *g != 20*time.Second {
		t.Errorf("soft eviction grace = %v, want 20s", g)
	}
}

func TestSoftEvictionGraceIsThePodsWhenUncappedOrShorter(t *testing.T) {
	for _, tt := range []struct {
		max  time.Duration
		want *time.Duration
	}{
		{0, nil}, // the pod's own
		{time.Minute, ptr(10 * time.Second)},
	} {
		f := newFakeNode()
		c := &clock{t: time.Unix(1000, 0)}
		f.set(SignalMemoryAvailable, 400*Mi, 4096*Mi)
		f.memory[f.addPod("a", grace(10))] = Mi
		m := newTestManager(f, c, Options{MaxPodGracePeriod: tt.max,
			Thresholds: mustThresholds(t, nil, map[string]string{"memory.available": "500Mi"}, map[string]string{"memory.available": "1s"}, nil)})
		m.round()
		c.advance(time.Second)
		if m.round() == nil {
			t.Fatal("nothing evicted")
		}
		got := f.evicted[0].grace
		if (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
			t.Errorf("max %v: grace %v, want %v", tt.max, got, tt.want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestMinimumReclaimKeepsEvicting(t *testing.T) {
	f := newFakeNode()
	c := &clock{t: time.Unix(1000, 0)}
	f.set(SignalMemoryAvailable, 90*Mi, 4096*Mi)
	a, b := f.addPod("a"), f.addPod("b")
	f.memory[a], f.memory[b] = 200*Mi, 100*Mi
	m := newTestManager(f, c, Options{Thresholds: mustThresholds(t, map[string]string{"memory.available": "100Mi"}, nil, nil,
		map[string]string{"memory.available": "500Mi"})})

	if p := m.round(); p == nil || p.Pod.Name != "a" {
		t.Fatalf("first round evicted %v, want a (larger use)", p)
	}
	// Above the threshold but not above threshold + minimum reclaim (600Mi): the pressure is not
	// relieved yet, so the next pod goes.
	f.set(SignalMemoryAvailable, 300*Mi, 4096*Mi)
	c.advance(10 * time.Second)
	if p := m.round(); p == nil || p.Pod.Name != "b" {
		t.Fatalf("second round evicted %v, want b: minimum reclaim not met", p)
	}
	f.set(SignalMemoryAvailable, 700*Mi, 4096*Mi)
	c.advance(10 * time.Second)
	if p := m.round(); p != nil {
		t.Fatalf("minimum reclaim met, still evicted %v", p.Pod.Name)
	}
	// A new crossing is judged against the threshold alone, not threshold + reclaim.
	f.set(SignalMemoryAvailable, 300*Mi, 4096*Mi)
	f.memory[f.addPod("c")] = Mi
	c.advance(10 * time.Second)
	if p := m.round(); p != nil {
		t.Fatalf("above the threshold after relief: evicted %v", p.Pod.Name)
	}
}

func TestPressureTransitionPeriod(t *testing.T) {
	f := newFakeNode()
	c := &clock{t: time.Unix(1000, 0)}
	f.set(SignalNodeFsAvailable, 5*Mi, 100*Mi)
	f.set(SignalPIDAvailable, 10, 1000)
	m := newTestManager(f, c, Options{PressureTransitionPeriod: 5 * time.Minute,
		Thresholds: mustThresholds(t, map[string]string{"nodefs.available": "10%", "pid.available": "5%"}, nil, nil, nil)})
	m.round()
	if got := m.Conditions(); !got[v1.NodeDiskPressure] || !got[v1.NodePIDPressure] || got[v1.NodeMemoryPressure] {
		t.Fatalf("conditions = %v, want DiskPressure and PIDPressure", got)
	}
	f.set(SignalNodeFsAvailable, 50*Mi, 100*Mi)
	f.set(SignalPIDAvailable, 900, 1000)
	c.advance(4*time.Minute + 59*time.Second)
	m.round()
	if got := m.Conditions(); !got[v1.NodeDiskPressure] || !got[v1.NodePIDPressure] {
		t.Fatalf("conditions dropped before the transition period: %v", got)
	}
	c.advance(time.Second)
	m.round()
	if got := m.Conditions(); got[v1.NodeDiskPressure] || got[v1.NodePIDPressure] {
		t.Fatalf("conditions held past the transition period: %v", got)
	}
	// With no transition period a condition still shows while its threshold is met.
	m.o.PressureTransitionPeriod = 0
	f.set(SignalPIDAvailable, 10, 1000)
	m.round()
	if !m.Conditions()[v1.NodePIDPressure] {
		t.Errorf("no PIDPressure while pid.available is below its threshold (transition period 0)")
	}
}

func TestMemoryRanking(t *testing.T) {
	f := newFakeNode()
	c := &clock{t: time.Unix(1000, 0)}
	// within: uses less than it requests, and the most in absolute terms.
	within := f.addPod("within", memRequest("1Gi"))
	f.memory[within] = 900 * Mi
	// over-high: over its request, high priority.
	overHigh := f.addPod("over-high", memRequest("10Mi"), priority(1000))
	f.memory[overHigh] = 500 * Mi
	// over-small and over-big: over their requests at default priority; big by more.
	overSmall := f.addPod("over-small", memRequest("10Mi"))
	f.memory[overSmall] = 30 * Mi
	overBig := f.addPod("over-big", memRequest("100Mi"))
	f.memory[overBig] = 300 * Mi
	m := newTestManager(f, c, Options{Thresholds: mustThresholds(t, map[string]string{"memory.available": "100Mi"}, nil, nil, nil)})

	var cs []candidate
	for _, p := range f.List() {
		cs = append(cs, m.measure(p, v1.ResourceMemory))
	}
	rank(v1.ResourceMemory, cs)
	var got []string
	for _, c := range cs {
		got = append(got, c.Pod.Pod.Name)
	}
	want := "over-big over-small over-high within"
	if strings.Join(got, " ") != want {
		t.Errorf("memory ranking = %v, want %s", got, want)
	}

	// A pod whose usage cannot be read ranks first (kubelet: a pod with no stats is the cheapest).
	f.addPod("nostats")
	cs = nil
	for _, p := range f.List() {
		cs = append(cs, m.measure(p, v1.ResourceMemory))
	}
	rank(v1.ResourceMemory, cs)
	if cs[0].Pod.Pod.Name != "nostats" {
		t.Errorf("first = %s, want the pod without stats", cs[0].Pod.Pod.Name)
	}
}

func TestDiskAndPIDRanking(t *testing.T) {
	f := newFakeNode()
	c := &clock{t: time.Unix(1000, 0)}
	small := f.addPod("small", diskRequest("1Mi"))
	f.disk[small], f.inodes[small], f.procs[small] = 2*Mi, 900, 400
	big := f.addPod("big", diskRequest("100Mi"))
	f.disk[big], f.inodes[big], f.procs[big] = 90*Mi, 10, 5
	low := f.addPod("low", priority(-5))
	f.disk[low], f.inodes[low], f.procs[low] = 0, 1, 1
	m := newTestManager(f, c, Options{})

	order := func(r v1.ResourceName) string {
		var cs []candidate
		for _, p := range f.List() {
			cs = append(cs, m.measure(p, r))
		}
		rank(r, cs)
		var got []string
		for _, c := range cs {
			got = append(got, c.Pod.Pod.Name)
		}
		return strings.Join(got, " ")
	}
	// Disk: "small" exceeds its request; "big" uses more but within; "low" uses nothing (does
	// not exceed 0) but has the lowest priority.
	if got := order(v1.ResourceEphemeralStorage); got != "small low big" {
		t.Errorf("disk ranking = %s, want small low big", got)
	}
	// Inodes are ranked by inodes (no request): all exceed 0; priority first, then count.
	if got := order(resourceInodes); got != "low small big" {
		t.Errorf("inode ranking = %s, want low small big", got)
	}
	// PIDs: priority, then the most processes.
	if got := order(resourcePIDs); got != "low small big" {
		t.Errorf("pid ranking = %s, want low small big", got)
	}
}

func TestManifestAndCriticalPodsAreNeverEvicted(t *testing.T) {
	f := newFakeNode()
	c := &clock{t: time.Unix(1000, 0)}
	f.set(SignalMemoryAvailable, 10*Mi, 4096*Mi)
	// Each of these would rank first by kubelet's rules: far over its request, lowest priority.
	static := f.addPod("static", fromFile, priority(-100))
	f.memory[static] = 2000 * Mi
	nodeCritical := f.addPod("node-critical", func(p *Pod) { p.Pod.Spec.PriorityClassName = "system-node-critical" })
	f.memory[nodeCritical] = 1900 * Mi
	clusterCritical := f.addPod("cluster-critical", priority(2000000000))
	f.memory[clusterCritical] = 1800 * Mi
	m := newTestManager(f, c, Options{Thresholds: mustThresholds(t, map[string]string{"memory.available": "100Mi"}, nil, nil, nil)})
	if p := m.round(); p != nil {
		t.Fatalf("evicted %s; manifest-dir and critical pods must never be", p.Pod.Name)
	}
	ordinary := f.addPod("ordinary", memRequest("1Gi"))
	f.memory[ordinary] = Mi
	if p := m.round(); p == nil || p.Pod.Name != "ordinary" {
		t.Fatalf("evicted %v, want the ordinary pod (the only one that may go)", p)
	}
	if p := m.round(); p != nil {
		t.Fatalf("evicted %s after the last evictable pod", p.Pod.Name)
	}
	if got := f.evictedNames(); len(got) != 1 {
		t.Errorf("evictions = %v", got)
	}
}

func TestOnePodPerRoundAndTerminalPodsSkipped(t *testing.T) {
	f := newFakeNode()
	c := &clock{t: time.Unix(1000, 0)}
	f.set(SignalMemoryAvailable, 10*Mi, 4096*Mi)
	for _, n := range []string{"a", "b", "c"} {
		f.memory[f.addPod(n)] = 100 * Mi
	}
	done := f.addPod("done")
	f.memory[done] = 4000 * Mi
	f.pods[len(f.pods)-1].Pod.Status.Phase = v1.PodSucceeded
	m := newTestManager(f, c, Options{Thresholds: mustThresholds(t, map[string]string{"memory.available": "100Mi"}, nil, nil, nil)})
	m.round()
	if got := f.evictedNames(); len(got) != 1 || got[0] == "done" {
		t.Fatalf("first round evicted %v, want one running pod", got)
	}
	m.round()
	m.round()
	if got := f.evictedNames(); len(got) != 3 || strings.Contains(strings.Join(got, ","), "done") {
		t.Fatalf("after three rounds evicted %v, want a, b, c one per round", got)
	}
}

func TestDiskPressureReclaimsNodeLevelFirst(t *testing.T) {
	f := newFakeNode()
	c := &clock{t: time.Unix(1000, 0)}
	f.set(SignalImageFsAvailable, 10*Mi, 1000*Mi)
	f.set(SignalNodeFsAvailable, 10*Mi, 1000*Mi)
	pod := f.addPod("writer")
	f.disk[pod] = 500 * Mi
	// Image GC frees enough for imagefs (on the same file system as nodefs).
	f.reclaimFn = func(s Signal, amount int64) int64 {
		f.set(SignalImageFsAvailable, 400*Mi, 1000*Mi)
		f.set(SignalNodeFsAvailable, 400*Mi, 1000*Mi)
		return 390 * Mi
	}
	m := newTestManager(f, c, Options{Thresholds: mustThresholds(t,
		map[string]string{"nodefs.available": "10%", "imagefs.available": "15%"}, nil, nil, map[string]string{"nodefs.available": "5%"})})
	if p := m.round(); p != nil {
		t.Fatalf("evicted %s although image GC relieved the pressure", p.Pod.Name)
	}
	// nodefs needs 10% + 5% of 1000Mi = 150Mi; 10Mi available.
	if len(f.reclaims) != 1 || f.reclaims[0].signal != SignalNodeFsAvailable || f.reclaims[0].amount != 140*Mi {
		t.Errorf("reclaims = %+v, want one for nodefs.available of 140Mi", f.reclaims)
	}

	// GC that frees too little: one pod goes, with kubelet's disk message.
	f.set(SignalNodeFsAvailable, 10*Mi, 1000*Mi)
	f.reclaimFn = func(Signal, int64) int64 { return Mi }
	p := m.round()
	if p == nil || p.Pod.Name != "writer" {
		t.Fatalf("evicted %v, want writer", p)
	}
	if !strings.HasPrefix(f.evicted[0].msg, "The node was low on resource: ephemeral-storage. Threshold quantity: 100Mi, available: 10Mi. ") {
		t.Errorf("message %q", f.evicted[0].msg)
	}
}

func TestNodeFsOnDedicatedImageFsIsNotReclaimedByImageGC(t *testing.T) {
	f := newFakeNode()
	f.dedicatedImageFs = true
	c := &clock{t: time.Unix(1000, 0)}
	f.set(SignalNodeFsAvailable, 10*Mi, 1000*Mi)
	f.set(SignalImageFsAvailable, 900*Mi, 1000*Mi)
	f.disk[f.addPod("writer")] = 500 * Mi
	f.reclaimFn = func(Signal, int64) int64 { return 0 }
	m := newTestManager(f, c, Options{Thresholds: mustThresholds(t, map[string]string{"nodefs.available": "10%"}, nil, nil, nil)})
	if p := m.round(); p == nil {
		t.Fatal("nothing evicted")
	}
	if len(f.reclaims) != 0 {
		t.Errorf("image GC asked to relieve nodefs on a dedicated imagefs: %+v", f.reclaims)
	}
}

// Freeing an evicted pod's storage can be what relieves the pressure (an agent restart between an
// eviction and its release): then nobody else goes.
func TestReleasingEvictedPodsComesBeforeEvictingMore(t *testing.T) {
	f := newFakeNode()
	c := &clock{t: time.Unix(1000, 0)}
	f.set(SignalNodeFsAvailable, 10*Mi, 1000*Mi)
	old := f.addPod("old")
	f.pods[0].Pod.Status.Phase, f.pods[0].Pod.Status.Reason = v1.PodFailed, Reason
	f.disk[f.addPod("innocent")] = Mi
	f.onRelease = func(uid types.UID) {
		if uid == old {
			f.set(SignalNodeFsAvailable, 500*Mi, 1000*Mi)
		}
	}
	m := newTestManager(f, c, Options{Thresholds: mustThresholds(t, map[string]string{"nodefs.available": "10%"}, nil, nil, nil)})
	if p := m.round(); p != nil {
		t.Fatalf("evicted %s; releasing the evicted pod's storage was enough", p.Pod.Name)
	}
	if len(f.released) != 1 || f.released[0] != old {
		t.Errorf("released %v, want the old evicted pod", f.released)
	}
}

func TestPercentageThresholdMessageAndUnobservedSignals(t *testing.T) {
	f := newFakeNode()
	c := &clock{t: time.Unix(1000, 0)}
	// imagefs is not observed at all (its dir is unreadable): its threshold is not judged.
	f.set(SignalNodeFsInodesFree, 40, 1000)
	f.inodes[f.addPod("many-files")] = 500
	f.disk[f.pods[0].Pod.UID] = 0
	m := newTestManager(f, c, Options{Thresholds: mustThresholds(t,
		map[string]string{"nodefs.inodesFree": "5%", "imagefs.available": "15%"}, nil, nil, nil)})
	if m.round() == nil {
		t.Fatal("nothing evicted")
	}
	want := "The node was low on resource: inodes. Threshold quantity: 50, available: 40. "
	if f.evicted[0].msg != want {
		t.Errorf("message %q, want %q", f.evicted[0].msg, want)
	}
}

type fakeNotifier struct {
	c      chan struct{}
	mu     sync.Mutex
	armed  [][]int64
	closed bool
}

func (n *fakeNotifier) C() <-chan struct{} { return n.c }
func (n *fakeNotifier) Arm(l []int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.armed = append(n.armed, l)
}
func (n *fakeNotifier) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	return nil
}

// Run looks at memory at once when the notifier fires, not at the next period; it arms the notifier
// at the usage where memory.available meets the threshold; it ends with its context.
func TestRunWakesOnNotification(t *testing.T) {
	f := newFakeNode()
	f.set(SignalMemoryAvailable, 1000*Mi, 4096*Mi)
	hog := f.addPod("hog")
	f.memory[hog] = 500 * Mi
	n := &fakeNotifier{c: make(chan struct{}, 1)}
	m := New(Options{Thresholds: mustThresholds(t, map[string]string{"memory.available": "100Mi"}, nil, nil, nil),
		MonitoringPeriod: time.Hour, Observer: observerWith(f, 300*Mi), Usage: f, Pods: f, Notifier: n, Log: quietLog()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()

	waitUntil(t, "notifier armed", func() bool { n.mu.Lock(); defer n.mu.Unlock(); return len(n.armed) > 0 })
	n.mu.Lock()
	// capacity 4096Mi - threshold 100Mi + inactive file 300Mi.
	if got := n.armed[0]; len(got) != 1 || got[0] != (4096-100+300)*Mi {
		t.Errorf("armed at %v, want [%d]", got, (4096-100+300)*Mi)
	}
	n.mu.Unlock()
	f.set(SignalMemoryAvailable, 50*Mi, 4096*Mi)
	n.c <- struct{}{}
	waitUntil(t, "hog evicted after the notification", func() bool { return len(f.evictedNames()) == 1 })
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not end with its context")
	}
	if !n.closed {
		t.Errorf("notifier not closed when Run ended")
	}
}

type inactiveObserver struct {
	*fakeNode
	inactive int64
}

func (o *inactiveObserver) Observe() Observations {
	obs := o.fakeNode.Observe()
	mem := obs.Signals[SignalMemoryAvailable]
	obs.Memory.Capacity, obs.Memory.Available, obs.Memory.InactiveFile = mem.Capacity, mem.Available, o.inactive
	return obs
}

func observerWith(f *fakeNode, inactive int64) Observer { return &inactiveObserver{f, inactive} }

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A notification that finds memory.available still above the threshold (inactive file pages grew
// since the level was set) re-arms the notifier at once at the level that now holds; without a
// notification the level is refreshed every 10 s only.
func TestNotificationRearmsAtTheCurrentLevel(t *testing.T) {
	f := newFakeNode()
	c := &clock{t: time.Unix(1000, 0)}
	f.set(SignalMemoryAvailable, 1000*Mi, 4096*Mi)
	n := &fakeNotifier{c: make(chan struct{}, 1)}
	obs := &inactiveObserver{fakeNode: f, inactive: 300 * Mi}
	m := New(Options{Thresholds: mustThresholds(t, map[string]string{"memory.available": "100Mi"}, nil, nil, nil),
		Observer: obs, Usage: f, Pods: f, Notifier: n, Now: c.now, Log: quietLog()})
	ctx := context.Background()
	m.synchronize(ctx, false)
	obs.inactive = 500 * Mi
	c.advance(time.Second)
	m.synchronize(ctx, false)
	if len(n.armed) != 1 {
		t.Fatalf("armed %d times within 10 s without a notification, want once", len(n.armed))
	}
	m.synchronize(ctx, true)
	if len(n.armed) != 2 || n.armed[1][0] != (4096-100+500)*Mi {
		t.Fatalf("after a notification armed %v, want a second arming at %d", n.armed, (4096-100+500)*Mi)
	}
	c.advance(10 * time.Second)
	m.synchronize(ctx, false)
	if len(n.armed) != 3 {
		t.Errorf("not re-armed after 10 s: %v", n.armed)
	}
}

// A pod whose stop hangs does not hold the node hostage: after the cleanup timeout the next pod goes.
// A pod evicted and then given a new spec (it runs again) can be evicted again.
func TestStuckEvictionMovesOnAndNewSpecIsACandidateAgain(t *testing.T) {
	f := newFakeNode()
	f.stuck = true
	c := &clock{t: time.Unix(1000, 0)}
	f.set(SignalMemoryAvailable, 10*Mi, 4096*Mi)
	a := f.addPod("a", func(p *Pod) { p.Pod.Annotations = map[string]string{"kubernetes.io/config.hash": "v1"} })
	f.memory[a] = 300 * Mi
	f.memory[f.addPod("b")] = 100 * Mi
	m := newTestManager(f, c, Options{CleanupTimeout: 50 * time.Millisecond,
		Thresholds: mustThresholds(t, map[string]string{"memory.available": "100Mi"}, nil, nil, nil)})
	m.round()
	m.round()
	if got := f.evictedNames(); strings.Join(got, ",") != "a,b" {
		t.Fatalf("evicted %v, want a then b (a's stop hangs)", got)
	}
	f.mu.Lock()
	f.pods[0].Pod.Annotations["kubernetes.io/config.hash"] = "v2"
	f.mu.Unlock()
	m.round()
	if got := f.evictedNames(); strings.Join(got, ",") != "a,b,a" {
		t.Fatalf("evicted %v, want a again once it runs a new spec", got)
	}
}

// allocatableMemory.available (kubelet's): with systemReserved set, the pods' cgroup nears its
// limit while memory.available looks healthy. Its threshold, derived from the hard memory one,
// evicts the ranked pod with kubelet's memory message, MemoryPressure set, before the kernel would
// OOM-kill in the pods' cgroup.
func TestAllocatableMemoryEvictsBeforeTheCgroupLimit(t *testing.T) {
	f := newFakeNode()
	c := &clock{t: time.Unix(1000, 0)}
	f.set(SignalMemoryAvailable, 2000*Mi, 4096*Mi) // the node is fine
	f.set(SignalAllocatableMemoryAvailable, 300*Mi, 1024*Mi)
	small := f.addPod("small", memRequest("64Mi"))
	hog := f.addPod("hog", memRequest("64Mi"))
	f.memory[small], f.memory[hog] = 100*Mi, 600*Mi
	ts := mustThresholds(t, map[string]string{"memory.available": "100Mi", "nodefs.available": "10%"},
		map[string]string{"memory.available": "500Mi"}, map[string]string{"memory.available": "1m"}, nil)
	ts = append(ts, AllocatableThresholds(ts)...)
	m := newTestManager(f, c, Options{Thresholds: ts, PressureTransitionPeriod: time.Minute})
	if p := m.round(); p != nil || m.MemoryPressure() {
		t.Fatalf("pods' cgroup 300Mi from its limit: evicted %v, pressure %v", p, m.MemoryPressure())
	}
	f.set(SignalAllocatableMemoryAvailable, 90*Mi, 1024*Mi)
	p := m.round()
	if p == nil || p.Pod.Name != "hog" {
		t.Fatalf("pods' cgroup 90Mi from its limit: evicted %v, want hog", p)
	}
	want := "The node was low on resource: memory. Threshold quantity: 100Mi, available: 90Mi. " +
		"Pod hog was using 600Mi, request is 64Mi, has larger consumption of memory. "
	if f.evicted[0].msg != want {
		t.Errorf("message\n %q\nwant\n %q", f.evicted[0].msg, want)
	}
	if !m.MemoryPressure() {
		t.Errorf("no MemoryPressure while the pods' cgroup is under its threshold")
	}
	if got := m.Evictions(); got[SignalAllocatableMemoryAvailable] != 1 {
		t.Errorf("Evictions() = %v, want allocatableMemory.available: 1", got)
	}
	// Only the hard memory threshold has an allocatable twin (kubelet's rule).
	if got := AllocatableThresholds(ts); len(got) != 1 || got[0].Value.String() != "100Mi" || !got[0].Hard() {
		t.Errorf("AllocatableThresholds = %+v, want one hard 100Mi", got)
	}
}
