package nodestatus

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/hw"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
)

// world is what the fake readers of a manager test read; the test changes it between computations.
type world struct {
	mu       sync.Mutex
	ready    error
	pressure map[v1.NodeConditionType]bool
	celsius  float64
	images   []Image
	now      time.Time
}

func (w *world) set(f func(w *world)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f(w)
}

func (w *world) Conditions() map[v1.NodeConditionType]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[v1.NodeConditionType]bool{}
	for k, v := range w.pressure {
		out[k] = v
	}
	return out
}

func (w *world) clock() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.now
}

func (w *world) setters() []Setter {
	get := func(f func() any) any { w.mu.Lock(); defer w.mu.Unlock(); return f() }
	return []Setter{
		NodeAddress("edge-1", func() string { return "192.168.1.23" }),
		MachineInfo(Machine{CPUs: func() (int, error) { return 4, nil }, Memory: func() (int64, error) { return 4 << 30, nil },
			DiskCapacity: func(string) (int64, error) { return 32 << 30, nil }, MaxPods: 110}),
		Images(10, func(context.Context) ([]Image, error) { return get(func() any { return w.images }).([]Image), nil }),
		Labels("edge-1", "linux", "arm64", nil),
		HardwareFacts(func() (Hardware, error) {
			c := get(func() any { return w.celsius }).(float64)
			return Hardware{Temperatures: []hw.Temperature{{Zone: "thermal_zone0", Type: "cpu-thermal", Celsius: c}}}, nil
		}),
		PressureCondition(v1.NodeMemoryPressure, w, w.clock),
		PressureCondition(v1.NodeDiskPressure, w, w.clock),
		PressureCondition(v1.NodePIDPressure, w, w.clock),
		ReadyCondition(func() error { w.mu.Lock(); defer w.mu.Unlock(); return w.ready }, nil, w.clock),
	}
}

// failingStore fails its next puts while fail > 0.
type failingStore struct {
	*store.Memory
	mu   sync.Mutex
	fail int
	puts int
}

func (s *failingStore) PutNodeStatus(n *v1.Node) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.puts++
	if s.fail > 0 {
		s.fail--
		return errors.New("disk full")
	}
	return s.Memory.PutNodeStatus(n)
}

func (s *failingStore) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.puts
}

// harness runs a Manager whose period is long: computations happen on Trigger (and once at start),
// so each step is one computation.
type harness struct {
	t      *testing.T
	w      *world
	m      *Manager
	st     *failingStore
	handed chan *v1.Node
	stop   func()
}

func start(t *testing.T, w *world, st *failingStore, tweak func(o *Options)) *harness {
	t.Helper()
	h := &harness{t: t, w: w, st: st, handed: make(chan *v1.Node, 100)}
	o := Options{Name: "edge-1", Setters: w.setters(), Period: time.Hour, StartupPeriod: time.Hour, StartupGrace: time.Hour,
		Store: st, OnChange: func(n *v1.Node) { h.handed <- n }, Now: w.clock}
	if tweak != nil {
		tweak(&o)
	}
	h.m = New(o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.m.Run(ctx) }()
	h.stop = func() { cancel(); <-done }
	t.Cleanup(h.stop)
	h.waitComputed(1)
	return h
}

func (h *harness) waitComputed(n uint64) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for h.m.Computations() < n {
		if time.Now().After(deadline) {
			h.t.Fatalf("only %d computations, want %d", h.m.Computations(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// step lets 10 s pass, runs one computation and returns what it handed on, nil if nothing
// (OnChange is called before the computation counts as done, so nothing can arrive late).
func (h *harness) step() *v1.Node {
	h.t.Helper()
	h.w.set(func(w *world) { w.now = w.now.Add(10 * time.Second) })
	c := h.m.Computations()
	h.m.Trigger()
	h.waitComputed(c + 1)
	return h.take()
}

func (h *harness) take() *v1.Node {
	select {
	case n := <-h.handed:
		return n
	default:
		return nil
	}
}

func newWorld() *world {
	return &world{ready: nil, celsius: 47.4, now: time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC),
		images: []Image{{Name: "mqlet.test/busybox:1", Digest: "sha256:c", Size: 3 << 20}}}
}

func TestManagerStoresAndHandsOnRealChangesOnly(t *testing.T) {
	w := newWorld()
	w.ready = errors.New("sources not read yet: file")
	st := &failingStore{Memory: store.NewMemory()}
	h := start(t, w, st, nil)

	// Not ready at start, within the grace: computed and readable, but neither stored nor handed.
	if got := h.take(); got != nil || st.count() != 0 {
		t.Fatalf("a NotReady status at start was handed (%v) or stored (%d)", got != nil, st.count())
	}
	if n := h.m.Node(); n == nil || isReady(n) || n.Kind != "Node" || n.Name != "edge-1" {
		t.Fatalf("Node() at start = %+v", n)
	}
	// Ready: stored and handed.
	w.set(func(w *world) { w.ready = nil })
	first := h.step()
	if first == nil || !isReady(first) || st.count() != 1 || h.m.Stored() != 1 {
		t.Fatalf("first ready status: handed %v, stores %d", first, st.count())
	}
	stored, ok, err := st.GetNodeStatus()
	if err != nil || !ok || !isReady(stored) {
		t.Fatalf("stored status: %v, %v, %v", stored, ok, err)
	}

	// Idle: every computation refreshes the heartbeats of Node(), and nothing is stored or handed,
	// even with the temperature wavering within its band.
	hb := condition(h.m.Node(), v1.NodeReady).LastHeartbeatTime
	for i, c := range []float64{47.6, 47.4, 49.0, 46.1} {
		w.set(func(w *world) { w.celsius = c })
		if got := h.step(); got != nil {
			t.Fatalf("idle step %d handed a status", i)
		}
	}
	if st.count() != 1 {
		t.Errorf("idle computations wrote the store: %d puts", st.count())
	}
	if now := condition(h.m.Node(), v1.NodeReady).LastHeartbeatTime; !now.After(hb.Time) {
		t.Errorf("Node()'s heartbeat did not move: %v then %v", hb, now)
	}

	// Each real change is stored and handed once.
	changes := []struct {
		what   string
		change func(w *world)
		check  func(n *v1.Node) bool
	}{
		{"memory pressure", func(w *world) { w.pressure = map[v1.NodeConditionType]bool{v1.NodeMemoryPressure: true} },
			func(n *v1.Node) bool { return condition(n, v1.NodeMemoryPressure).Status == v1.ConditionTrue }},
		{"temperature a step up", func(w *world) { w.celsius = 52 },
			func(n *v1.Node) bool { return n.Annotations[AnnotationTemperature] == "cpu-thermal=50C" }},
		{"a new image", func(w *world) { w.images = append(w.images, Image{Name: "app:1", Digest: "sha256:d", Size: 9 << 20}) },
			func(n *v1.Node) bool { return len(n.Status.Images) == 2 }},
		{"not ready", func(w *world) { w.ready = errors.New("containerd is not answering") },
			func(n *v1.Node) bool { return condition(n, v1.NodeReady).Reason == ReasonNotReady }},
	}
	for i, c := range changes {
		w.set(c.change)
		got := h.step()
		if got == nil || !c.check(got) {
			t.Fatalf("%s: handed %+v", c.what, got)
		}
		if st.count() != 2+i {
			t.Errorf("%s: %d puts, want %d", c.what, st.count(), 2+i)
		}
		if again := h.step(); again != nil {
			t.Errorf("%s: handed again with nothing new", c.what)
		}
	}
	// The transition time is the change's; the heartbeat keeps moving after it.
	notReady := condition(h.m.Node(), v1.NodeReady)
	if !notReady.LastHeartbeatTime.After(notReady.LastTransitionTime.Time) {
		t.Errorf("Ready after idle steps: heartbeat %v, transition %v", notReady.LastHeartbeatTime, notReady.LastTransitionTime)
	}
}

func TestManagerRestartKeepsTransitionTimesAndRestoresNothingNew(t *testing.T) {
	w := newWorld()
	st := &failingStore{Memory: store.NewMemory()}
	h := start(t, w, st, nil)
	first := h.take()
	if first == nil || st.count() != 1 {
		t.Fatalf("first status: %v, %d puts", first, st.count())
	}
	since := condition(first, v1.NodeReady).LastTransitionTime
	h.stop()

	// The same machine, later: the stored status is taken up, so Ready keeps its transition
	// time, also through a first computation that finds the agent not ready yet; the first
	// settled status is handed on (a link repeats it on reconnect) but not written.
	w.set(func(w *world) { w.now, w.ready = w.now.Add(time.Hour), errors.New("sources not read yet: file") })
	h2 := start(t, w, st, nil)
	if n := h2.take(); n != nil {
		t.Fatalf("a NotReady status at restart was handed on")
	}
	w.set(func(w *world) { w.ready = nil })
	again := h2.step()
	if again == nil {
		t.Fatalf("no status handed after the restart")
	}
	if got := condition(again, v1.NodeReady).LastTransitionTime; !got.Time.Equal(since.Time) {
		t.Errorf("Ready transition after restart %v, want %v", got, since)
	}
	if !again.CreationTimestamp.Time.Equal(first.CreationTimestamp.Time) || first.CreationTimestamp.IsZero() {
		t.Errorf("creationTimestamp %v after restart, want the first status's %v", again.CreationTimestamp, first.CreationTimestamp)
	}
	if st.count() != 1 {
		t.Errorf("restart with nothing changed wrote the store: %d puts", st.count())
	}
	if got := h2.step(); got != nil {
		t.Errorf("handed again after the restart's first")
	}

	// A stored status of another node name is not reused.
	h2.stop()
	h3 := start(t, w, st, func(o *Options) { o.Name = "edge-2" })
	if n := h3.take(); n == nil || n.Name != "edge-2" || condition(n, v1.NodeReady).LastTransitionTime.Time.Equal(since.Time) {
		t.Errorf("renamed node: %+v", n)
	}
}

func TestManagerStartupGraceEndsAndStoreErrorsRetry(t *testing.T) {
	w := newWorld()
	w.ready = errors.New("containerd is not answering")
	st := &failingStore{Memory: store.NewMemory(), fail: 1}
	h := start(t, w, st, func(o *Options) { o.StartupGrace = 30 * time.Second })
	if h.take() != nil {
		t.Fatalf("handed within the grace")
	}
	// The grace passes with the node still not ready: it reports so. The store fails once...
	w.set(func(w *world) { w.now = w.now.Add(time.Minute) })
	n := h.step()
	if n == nil || isReady(n) || st.count() != 1 || h.m.Stored() != 0 {
		t.Fatalf("after the grace: handed %v, puts %d, stored %d", n, st.count(), h.m.Stored())
	}
	// ...and is tried again on the next computation, which hands nothing new.
	if got := h.step(); got != nil || st.count() != 2 || h.m.Stored() != 1 {
		t.Errorf("retry: handed %v, puts %d, stored %d", got, st.count(), h.m.Stored())
	}
	if got := h.step(); got != nil || st.count() != 2 {
		t.Errorf("after a successful retry: handed %v, puts %d", got, st.count())
	}
}

func TestManagerReportFrequency(t *testing.T) {
	w := newWorld()
	st := &failingStore{Memory: store.NewMemory()}
	h := start(t, w, st, func(o *Options) { o.ReportFrequency = 5 * time.Minute })
	if h.take() == nil {
		t.Fatal("no first status")
	}
	w.set(func(w *world) { w.now = w.now.Add(4 * time.Minute) })
	if h.step() != nil {
		t.Errorf("handed before the report frequency passed")
	}
	w.set(func(w *world) { w.now = w.now.Add(time.Minute) })
	if h.step() == nil {
		t.Errorf("not handed once the report frequency passed")
	}
	if st.count() != 1 {
		t.Errorf("a periodic report wrote the store: %d puts", st.count())
	}
	if h.step() != nil {
		t.Errorf("handed again right after the periodic report")
	}
}

func TestManagerPeriod(t *testing.T) {
	// With a short period, computations happen on their own (no Trigger).
	w := newWorld()
	m := New(Options{Name: "edge-1", Setters: w.setters(), Period: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for m.Computations() < 5 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil || m.Computations() < 5 {
		t.Errorf("Run = %v after %d computations, want nil after at least 5", err, m.Computations())
	}
	if m.Node() == nil {
		t.Errorf("no status kept")
	}
}

func TestSignificant(t *testing.T) {
	base := func() *v1.Node {
		n := &v1.Node{}
		n.Name = "edge-1"
		n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: ReasonReady}}
		n.Status.Images = []v1.ContainerImage{{Names: []string{"a:1"}, SizeBytes: 1}}
		return n
	}
	same := []func(n *v1.Node){
		func(n *v1.Node) { n.Status.Conditions[0].LastHeartbeatTime.Time = time.Now() },
		func(n *v1.Node) { n.Status.Images[0].SizeBytes = 2 },
		func(n *v1.Node) { n.ResourceVersion = "7" },
	}
	for i, f := range same {
		n := base()
		f(n)
		if Significant(n) != Significant(base()) {
			t.Errorf("insignificant change %d changed the digest", i)
		}
	}
	differ := []func(n *v1.Node){
		func(n *v1.Node) { n.Status.Conditions[0].Status = v1.ConditionFalse },
		func(n *v1.Node) { n.Status.Conditions[0].Message = "x" },
		func(n *v1.Node) { n.Status.Images[0].Names = []string{"b:1"} },
		func(n *v1.Node) { n.Labels = map[string]string{"a": "b"} },
		func(n *v1.Node) { n.Annotations = map[string]string{"a": "b"} },
		func(n *v1.Node) { n.Spec.Taints = []v1.Taint{{Key: "k", Effect: v1.TaintEffectNoSchedule}} },
		func(n *v1.Node) {
			n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.0.0.1"}}
		},
		func(n *v1.Node) { n.Status.Capacity = v1.ResourceList{v1.ResourceCPU: q("1")} },
		func(n *v1.Node) { n.Status.Allocatable = v1.ResourceList{v1.ResourceCPU: q("1")} },
		func(n *v1.Node) { n.Status.NodeInfo.BootID = "b" },
	}
	for i, f := range differ {
		n := base()
		f(n)
		if Significant(n) == Significant(base()) {
			t.Errorf("significant change %d left the digest as it was", i)
		}
	}
}
