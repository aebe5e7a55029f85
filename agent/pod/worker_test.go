package pod

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/core/source"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// waitLimit bounds every wait for the worker; it only matters when a test is failing.
const waitLimit = 10 * time.Second

// call is one request the worker made of the runtime.
type call struct {
	op       string // start, stop, remove
	id       string
	name     string
	restarts int
	grace    time.Duration
}

// fakeRuntime keeps containers in memory, the way ListContainers would show them from containerd.
type fakeRuntime struct {
	mu       sync.Mutex
	ctrs     map[string]*ctrd.Container
	calls    []call
	podFiles int
	startErr map[string]error // by container name: every start of it fails so
	// startedAt holds when each StartContainer call came (synctest's clock in a bubble).
	startedAt []time.Time
	stopErr   map[string]error // by container id: every stop of it fails so, and it keeps running

	// sandboxes holds the UIDs whose sandbox is set up; a pod not in it gets a new one (Created),
	// as after a reboot. Tests of an agent restart with the sandbox intact add the UID first.
	sandboxes map[types.UID]bool
	ensured   int // EnsureSandbox calls

	sandboxErr error    // every EnsureSandbox fails so while set (a broken CNI)
	podIPs     []string // the addresses EnsureSandbox gives pods (CNI)
}

func newFakeRuntime() *fakeRuntime {
	return &fakeRuntime{ctrs: map[string]*ctrd.Container{}, startErr: map[string]error{}, stopErr: map[string]error{}, sandboxes: map[types.UID]bool{}}
}

func (f *fakeRuntime) ListContainers(_ context.Context, podUID string) ([]ctrd.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []ctrd.Container
	for _, c := range f.ctrs {
		if podUID == "" || c.PodUID == podUID {
			out = append(out, *c)
		}
	}
	return out, nil
}

func (f *fakeRuntime) EnsureSandbox(_ context.Context, pod *v1.Pod) (*ctrd.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ensured++
	if f.sandboxErr != nil {
		return nil, f.sandboxErr
	}
	created := !f.sandboxes[pod.UID]
	f.sandboxes[pod.UID] = true
	return &ctrd.Sandbox{Ref: ctrd.RefOf(pod), Created: created, PodIPs: f.podIPs}, nil
}

func (f *fakeRuntime) StartContainer(_ context.Context, pod *v1.Pod, sb *ctrd.Sandbox, c *v1.Container, restarts int) (ctrd.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb == nil || sb.Ref.UID != pod.UID || !f.sandboxes[pod.UID] {
		return ctrd.Container{}, fmt.Errorf("fake runtime: start %s without the pod's sandbox", c.Name)
	}
	id := ctrd.ContainerID(string(pod.UID), c.Name, restarts)
	f.calls = append(f.calls, call{op: "start", id: id, name: c.Name, restarts: restarts})
	f.startedAt = append(f.startedAt, time.Now())
	if err := f.startErr[c.Name]; err != nil {
		return ctrd.Container{}, err
	}
	ctr := &ctrd.Container{
		ID: id, PodUID: string(pod.UID), PodName: pod.Name, PodNamespace: pod.Namespace, Name: c.Name,
		Hash: ctrspec.SpecHash(pod, c), RestartCount: restarts, Image: c.Image, CreatedAt: time.Now(),
		State: ctrd.StateRunning, Pid: 4242,
	}
	f.ctrs[id] = ctr
	return *ctr, nil
}

func (f *fakeRuntime) StopContainer(_ context.Context, id string, grace time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{op: "stop", id: id, grace: grace})
	if err := f.stopErr[id]; err != nil {
		return err
	}
	if c, ok := f.ctrs[id]; ok {
		// Like containerd: the task is deleted, the container record stays.
		c.State, c.Pid = ctrd.StateCreated, 0
	}
	return nil
}

func (f *fakeRuntime) RemoveContainer(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{op: "remove", id: id})
	delete(f.ctrs, id)
	return nil
}

func (f *fakeRuntime) RemoveSandbox(_ context.Context, ref ctrd.PodRef) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.podFiles++
	delete(f.sandboxes, ref.UID)
	return nil
}

// intact marks the pod's sandbox as set up, as an agent restart (not a reboot) finds it.
func (f *fakeRuntime) intact(uid string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sandboxes[types.UID(uid)] = true
}

func (f *fakeRuntime) add(c ctrd.Container) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ctrs[c.ID] = &c
}

// exit makes a running container's process end with code, as a containerd TaskExit would.
func (f *fakeRuntime) exit(t *testing.T, id string, code int32) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.ctrs[id]
	if !ok || c.State != ctrd.StateRunning {
		t.Fatalf("fake runtime: container %s is not running (present %v)", id, ok)
	}
	c.State, c.ExitCode, c.ExitedAt, c.Pid = ctrd.StateExited, code, time.Now(), 0
}

func (f *fakeRuntime) setStopErr(id string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopErr[id] = err
}

// running lists the ids of the containers whose task runs.
func (f *fakeRuntime) running() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id, c := range f.ctrs {
		if c.State == ctrd.StateRunning {
			ids = append(ids, id)
		}
	}
	return ids
}

// waitCalls waits until the worker has made at least n calls of op.
func (f *fakeRuntime) waitCalls(t *testing.T, op, id string, n int) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		got := 0
		for _, c := range f.callsOf(op) {
			if c.id == id {
				got++
			}
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d %s calls for %s within %s; runtime calls: %v", n, op, id, waitLimit, f.allCalls())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (f *fakeRuntime) callsOf(op string) []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []call
	for _, c := range f.calls {
		if c.op == op {
			out = append(out, c)
		}
	}
	return out
}

func (f *fakeRuntime) allCalls() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

const testUID = "6f1c2d3e-4b5a-4c6d-8e9f-0a1b2c3d4e5f"

func testPod(policy v1.RestartPolicy, names ...string) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: types.UID(testUID)},
		Spec:       v1.PodSpec{RestartPolicy: policy},
	}
	for _, n := range names {
		p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: n, Image: "busybox:1.36", Command: []string{"sleep", "3600"}})
	}
	return p
}

// reported is one OnStatus call.
type reported struct {
	d  Desired
	st v1.PodStatus
}

// harness runs one worker against a fake runtime and keeps what it publishes.
type harness struct {
	t       *testing.T
	f       *fakeRuntime
	w       *Worker
	changed chan struct{}
	done    chan struct{} // closed when Run returns

	mu        sync.Mutex
	last      *v1.PodStatus
	published int
	reported  []reported // each published status with the version it was reported for
	gone      []*v1.Pod
}

func startWorker(t *testing.T, pod *v1.Pod, prev *v1.PodStatus, f *fakeRuntime) *harness {
	t.Helper()
	return startWorkerOn(t, pod, prev, f, f, nil)
}

// startWorkerOn is startWorker with rt (f, or a wrapper around it adding optional methods) as the
// runtime and emit, if not nil, given the worker's events.
func startWorkerOn(t *testing.T, pod *v1.Pod, prev *v1.PodStatus, rt Runtime, f *fakeRuntime, emit func(event.Event)) *harness {
	t.Helper()
	return startWorkerWith(t, Desired{Pod: pod}, prev, rt, f, emit)
}

// startWorkerWith is startWorkerOn with the version of the pod the worker starts from.
func startWorkerWith(t *testing.T, d Desired, prev *v1.PodStatus, rt Runtime, f *fakeRuntime, emit func(event.Event)) *harness {
	t.Helper()
	h := &harness{t: t, f: f, changed: make(chan struct{}, 1), done: make(chan struct{})}
	h.w = NewWorker(d, prev, Env{
		Runtime: rt,
		Log:     slog.New(slog.DiscardHandler),
		HostIP:  func() string { return "192.0.2.10" },
		Emit:    emit,
		OnStatus: func(d Desired, st v1.PodStatus) {
			h.mu.Lock()
			h.last = st.DeepCopy()
			h.published++
			h.reported = append(h.reported, reported{d, *st.DeepCopy()})
			h.mu.Unlock()
			h.poke()
		},
		OnGone: func(d Desired) {
			h.mu.Lock()
			h.gone = append(h.gone, d.Pod)
			h.mu.Unlock()
			h.poke()
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { defer close(h.done); h.w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(waitLimit):
			t.Errorf("worker did not return within %s of its context ending", waitLimit)
		}
	})
	return h
}

func (h *harness) poke() {
	select {
	case h.changed <- struct{}{}:
	default:
	}
}

// waitFor returns the first published status that satisfies ok, failing the test if none comes.
func (h *harness) waitFor(what string, ok func(st *v1.PodStatus) bool) *v1.PodStatus {
	h.t.Helper()
	deadline := time.After(waitLimit)
	for {
		h.mu.Lock()
		last := h.last
		h.mu.Unlock()
		if last != nil && ok(last) {
			return last
		}
		select {
		case <-h.changed:
		case <-deadline:
			h.t.Fatalf("no status with %s within %s; last status: %s; runtime calls: %v", what, waitLimit, describe(last), h.f.allCalls())
		}
	}
}

// resync nudges the worker and waits until a sync pass has completed, so a decision it would
// make is visible in the fake's calls.
func (h *harness) resync() {
	h.t.Helper()
	n := h.w.syncs.Load()
	h.w.Nudge()
	deadline := time.Now().Add(waitLimit)
	for h.w.syncs.Load() < n+1 {
		if time.Now().After(deadline) {
			h.t.Fatalf("worker did not sync within %s of a nudge", waitLimit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func describe(st *v1.PodStatus) string {
	if st == nil {
		return "none"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "phase=%s", st.Phase)
	for _, group := range [][]v1.ContainerStatus{st.InitContainerStatuses, st.ContainerStatuses, st.EphemeralContainerStatuses} {
		for _, cs := range group {
			fmt.Fprintf(&b, " %s(restarts=%d ", cs.Name, cs.RestartCount)
			switch s := cs.State; {
			case s.Running != nil:
				b.WriteString("running")
			case s.Waiting != nil:
				fmt.Fprintf(&b, "waiting:%s", s.Waiting.Reason)
			case s.Terminated != nil:
				fmt.Fprintf(&b, "terminated:%s/%d", s.Terminated.Reason, s.Terminated.ExitCode)
			}
			if lt := cs.LastTerminationState.Terminated; lt != nil {
				fmt.Fprintf(&b, " last=%s/%d", lt.Reason, lt.ExitCode)
			}
			b.WriteString(")")
		}
	}
	return b.String()
}

func statusOf(st *v1.PodStatus, name string) *v1.ContainerStatus {
	for _, group := range [][]v1.ContainerStatus{st.InitContainerStatuses, st.ContainerStatuses} {
		for i := range group {
			if group[i].Name == name {
				return &group[i]
			}
		}
	}
	return nil
}

func isRunning(st *v1.PodStatus, name string, restarts int32) bool {
	cs := statusOf(st, name)
	return cs != nil && cs.State.Running != nil && cs.RestartCount == restarts
}

func phaseIs(p v1.PodPhase) func(*v1.PodStatus) bool {
	return func(st *v1.PodStatus) bool { return st.Phase == p }
}

func idOf(name string, attempt int) string { return ctrd.ContainerID(testUID, name, attempt) }

func TestWorkerStartsNewPod(t *testing.T) {
	f := newFakeRuntime()
	h := startWorker(t, testPod(v1.RestartPolicyAlways, "a", "b"), nil, f)
	st := h.waitFor("phase Running", phaseIs(v1.PodRunning))

	starts := f.callsOf("start")
	if len(starts) != 2 {
		t.Fatalf("StartContainer calls = %v, want one each for a and b", starts)
	}
	seen := map[string]bool{}
	for _, c := range starts {
		seen[c.name] = true
		if c.restarts != 0 {
			t.Errorf("StartContainer(%s) restarts = %d, want 0 for a new pod", c.name, c.restarts)
		}
	}
	if !seen["a"] || !seen["b"] {
		t.Errorf("StartContainer calls = %v, want a and b", starts)
	}
	for _, n := range []string{"a", "b"} {
		cs := statusOf(st, n)
		if cs == nil || cs.State.Running == nil || !cs.Ready {
			t.Fatalf("status of %s = %+v, want running and ready", n, cs)
		}
		if want := "containerd://" + idOf(n, 0); cs.ContainerID != want {
			t.Errorf("status of %s ContainerID = %q, want %q", n, cs.ContainerID, want)
		}
	}
	if st.HostIP != "192.0.2.10" || st.QOSClass != v1.PodQOSBestEffort || st.StartTime == nil {
		t.Errorf("status HostIP=%q QOSClass=%q StartTime=%v, want 192.0.2.10, BestEffort and a start time", st.HostIP, st.QOSClass, st.StartTime)
	}
	if got := f.callsOf("stop"); len(got) != 0 {
		t.Errorf("StopContainer calls for a new pod = %v, want none", got)
	}
}

// An unchanged status must not be published again: each publish is a store write and an uplink
// message, and a sync runs on every containerd event of the pod.
func TestWorkerPublishesOnlyChanges(t *testing.T) {
	f := newFakeRuntime()
	h := startWorker(t, testPod(v1.RestartPolicyAlways, "a"), nil, f)
	h.waitFor("phase Running", phaseIs(v1.PodRunning))
	h.mu.Lock()
	before := h.published
	h.mu.Unlock()
	h.resync()
	h.resync()
	h.mu.Lock()
	after := h.published
	h.mu.Unlock()
	if after != before {
		t.Errorf("OnStatus called %d more times for syncs that changed nothing, want 0", after-before)
	}
}

func TestWorkerAdoptsRunningContainers(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, "a", "b")
	f := newFakeRuntime()
	f.intact(testUID) // an agent restart: the sandbox is still there
	created := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	storedStart := time.Date(2024, 5, 1, 11, 0, 0, 0, time.UTC)
	// a is the very attempt the stored status describes; b was restarted (attempt 2) since.
	f.add(ctrd.Container{ID: idOf("a", 0), PodUID: testUID, Name: "a", Hash: ctrspec.SpecHash(pod, &pod.Spec.Containers[0]),
		State: ctrd.StateRunning, CreatedAt: created})
	f.add(ctrd.Container{ID: idOf("b", 2), PodUID: testUID, Name: "b", Hash: ctrspec.SpecHash(pod, &pod.Spec.Containers[1]),
		RestartCount: 2, State: ctrd.StateRunning, CreatedAt: created})
	prev := &v1.PodStatus{Phase: v1.PodPending, ContainerStatuses: []v1.ContainerStatus{
		{Name: "a", ContainerID: "containerd://" + idOf("a", 0),
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: metav1.NewTime(storedStart)}}},
		{Name: "b", ContainerID: "containerd://" + idOf("b", 1), RestartCount: 1,
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: metav1.NewTime(storedStart)}}},
	}}
	h := startWorker(t, pod, prev, f)
	st := h.waitFor("phase Running", phaseIs(v1.PodRunning))

	if calls := f.allCalls(); len(calls) != 0 {
		t.Errorf("runtime calls for adopted containers with matching hashes = %v, want none", calls)
	}
	if got := statusOf(st, "a").State.Running.StartedAt.Time; !got.Equal(storedStart) {
		t.Errorf("a StartedAt = %v, want %v from the stored status (same container id)", got, storedStart)
	}
	b := statusOf(st, "b")
	if got := b.State.Running.StartedAt.Time; !got.Equal(created) {
		t.Errorf("b StartedAt = %v, want its creation time %v (stored status is of an older attempt)", got, created)
	}
	if b.RestartCount != 2 {
		t.Errorf("b RestartCount = %d, want 2 from the container's label", b.RestartCount)
	}
}

func TestWorkerRecreatesChangedContainer(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, "a", "b")
	f := newFakeRuntime()
	f.intact(testUID) // an agent restart: the sandbox is still there
	f.add(ctrd.Container{ID: idOf("a", 0), PodUID: testUID, Name: "a", Hash: "0123456789abcdef",
		State: ctrd.StateRunning, CreatedAt: time.Now()})
	f.add(ctrd.Container{ID: idOf("b", 0), PodUID: testUID, Name: "b", Hash: ctrspec.SpecHash(pod, &pod.Spec.Containers[1]),
		State: ctrd.StateRunning, CreatedAt: time.Now()})
	h := startWorker(t, pod, nil, f)
	h.waitFor("a running with restarts=1", func(st *v1.PodStatus) bool { return isRunning(st, "a", 1) && isRunning(st, "b", 0) })

	calls := f.allCalls()
	want := []call{{op: "stop", id: idOf("a", 0), grace: 30 * time.Second}, {op: "remove", id: idOf("a", 0)},
		{op: "start", id: idOf("a", 1), name: "a", restarts: 1}}
	if fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Errorf("runtime calls = %v, want %v (b untouched)", calls, want)
	}
}

func TestWorkerNeverRestartsExited(t *testing.T) {
	for _, tt := range []struct {
		code   int32
		reason string
		phase  v1.PodPhase
	}{{0, "Completed", v1.PodSucceeded}, {3, "Error", v1.PodFailed}} {
		t.Run(tt.reason, func(t *testing.T) {
			f := newFakeRuntime()
			h := startWorker(t, testPod(v1.RestartPolicyNever, "a"), nil, f)
			h.waitFor("phase Running", phaseIs(v1.PodRunning))
			f.exit(t, idOf("a", 0), tt.code)
			h.w.Nudge()
			st := h.waitFor("phase "+string(tt.phase), phaseIs(tt.phase))
			term := statusOf(st, "a").State.Terminated
			if term == nil || term.Reason != tt.reason || term.ExitCode != tt.code {
				t.Fatalf("a state = %s, want terminated %s with exit code %d", describe(st), tt.reason, tt.code)
			}
			if term.ContainerID != "containerd://"+idOf("a", 0) || term.FinishedAt.IsZero() {
				t.Errorf("terminated state ContainerID=%q FinishedAt=%v, want the attempt's id and its exit time", term.ContainerID, term.FinishedAt)
			}
			h.resync()
			if starts := f.callsOf("start"); len(starts) != 1 {
				t.Errorf("StartContainer calls = %v, want only the first start with restartPolicy Never", starts)
			}
			if stops := f.callsOf("stop"); len(stops) != 0 {
				t.Errorf("StopContainer calls = %v, want none: the exited container stays for its logs and state", stops)
			}
		})
	}
}

func TestWorkerCrashLoopBackOff(t *testing.T) {
	f := newFakeRuntime()
	h := startWorker(t, testPod(v1.RestartPolicyAlways, "a"), nil, f)
	h.waitFor("a running", func(st *v1.PodStatus) bool { return isRunning(st, "a", 0) })

	f.exit(t, idOf("a", 0), 1)
	h.w.Nudge()
	st := h.waitFor("a restarted once", func(st *v1.PodStatus) bool { return isRunning(st, "a", 1) })
	if last := statusOf(st, "a").LastTerminationState.Terminated; last == nil || last.ExitCode != 1 {
		t.Errorf("after the first restart a = %s, want lastState terminated with exit code 1", describe(st))
	}
	starts := f.callsOf("start")
	if len(starts) != 2 || starts[1].restarts != 1 {
		t.Fatalf("StartContainer calls = %v, want an immediate second start with restarts=1", starts)
	}

	f.exit(t, idOf("a", 1), 2)
	h.w.Nudge()
	st = h.waitFor("a in CrashLoopBackOff", func(st *v1.PodStatus) bool {
		cs := statusOf(st, "a")
		return cs.State.Waiting != nil && cs.State.Waiting.Reason == "CrashLoopBackOff"
	})
	cs := statusOf(st, "a")
	if last := cs.LastTerminationState.Terminated; last == nil || last.ExitCode != 2 || last.Reason != "Error" {
		t.Errorf("a in back-off = %s, want lastState terminated Error with exit code 2", describe(st))
	}
	if !strings.Contains(cs.State.Waiting.Message, "back-off 10s") {
		t.Errorf("CrashLoopBackOff message = %q, want the 10s second back-off", cs.State.Waiting.Message)
	}
	if st.Phase != v1.PodRunning {
		t.Errorf("phase in back-off with restartPolicy Always = %s, want Running", st.Phase)
	}
	h.resync()
	if starts := f.callsOf("start"); len(starts) != 2 {
		t.Errorf("StartContainer calls during back-off = %v, want no third start", starts)
	}
}

func TestWorkerImagePullFailureWaits(t *testing.T) {
	f := newFakeRuntime()
	f.startErr["a"] = &ctrd.StartError{Reason: "ErrImagePull", Err: errors.New("pull busybox:1.36: connection refused")}
	h := startWorker(t, testPod(v1.RestartPolicyAlways, "a"), nil, f)
	st := h.waitFor("a waiting on its image", func(st *v1.PodStatus) bool {
		cs := statusOf(st, "a")
		return cs != nil && cs.State.Waiting != nil && cs.State.Waiting.Reason != "ContainerCreating"
	})
	w := statusOf(st, "a").State.Waiting
	if w.Reason != "ErrImagePull" && w.Reason != "ImagePullBackOff" {
		t.Errorf("a waiting reason = %q, want ErrImagePull or ImagePullBackOff", w.Reason)
	}
	if !strings.Contains(w.Message, "connection refused") {
		t.Errorf("a waiting message = %q, want the pull error", w.Message)
	}
	if st.Phase != v1.PodPending {
		t.Errorf("phase = %s, want Pending", st.Phase)
	}
	// Nudges (containerd events of other containers, relists) must not bypass the back-off.
	for range 6 {
		h.resync()
	}
	if starts := f.callsOf("start"); len(starts) != 1 {
		t.Errorf("StartContainer calls after nudges within the back-off of a failed pull = %d, want 1", len(starts))
	}
}

// Between a failed pull and its retry, the status says ImagePullBackOff, as kubelet's does: the
// worker must look again before the retry is due to show it.
func TestWorkerImagePullBackOffShownWhileWaiting(t *testing.T) {
	f := newFakeRuntime()
	f.startErr["a"] = &ctrd.StartError{Reason: "ErrImagePull", Err: errors.New("pull busybox:1.36: connection refused")}
	h := startWorker(t, testPod(v1.RestartPolicyAlways, "a"), nil, f)
	st := h.waitFor("a in ImagePullBackOff", func(st *v1.PodStatus) bool {
		cs := statusOf(st, "a")
		return cs != nil && cs.State.Waiting != nil && cs.State.Waiting.Reason == "ImagePullBackOff"
	})
	if starts := f.callsOf("start"); len(starts) != 1 {
		t.Errorf("StartContainer calls when ImagePullBackOff was shown = %d, want 1: it must be shown while waiting for the retry (%s back-off)", len(starts), backoffInitial)
	}
	if msg := statusOf(st, "a").State.Waiting.Message; !strings.Contains(msg, "connection refused") {
		t.Errorf("ImagePullBackOff message = %q, want the pull error", msg)
	}
}

func TestWorkerStartErrorWithoutReason(t *testing.T) {
	f := newFakeRuntime()
	f.startErr["a"] = errors.New("netns: permission denied")
	h := startWorker(t, testPod(v1.RestartPolicyAlways, "a"), nil, f)
	st := h.waitFor("a waiting with RunContainerError", func(st *v1.PodStatus) bool {
		cs := statusOf(st, "a")
		return cs != nil && cs.State.Waiting != nil && cs.State.Waiting.Reason == "RunContainerError"
	})
	if msg := statusOf(st, "a").State.Waiting.Message; !strings.Contains(msg, "permission denied") {
		t.Errorf("waiting message = %q, want the start error", msg)
	}
}

func TestWorkerOOMKilled(t *testing.T) {
	f := newFakeRuntime()
	h := startWorker(t, testPod(v1.RestartPolicyNever, "a"), nil, f)
	h.waitFor("a running", func(st *v1.PodStatus) bool { return isRunning(st, "a", 0) })
	h.w.OOM(idOf("a", 0))
	f.exit(t, idOf("a", 0), 137)
	h.w.Nudge()
	st := h.waitFor("a terminated OOMKilled", func(st *v1.PodStatus) bool {
		term := statusOf(st, "a").State.Terminated
		return term != nil && term.Reason == "OOMKilled"
	})
	term := statusOf(st, "a").State.Terminated
	if term.ExitCode != 137 || term.Signal != 9 {
		t.Errorf("OOMKilled state exit code %d signal %d, want 137 and 9", term.ExitCode, term.Signal)
	}
	if st.Phase != v1.PodFailed {
		t.Errorf("phase = %s, want Failed", st.Phase)
	}
}

// Without an OOM report, exit 137 is an ordinary error: the reason must come from the OOM event.
func TestWorkerKilledWithoutOOMIsError(t *testing.T) {
	f := newFakeRuntime()
	h := startWorker(t, testPod(v1.RestartPolicyNever, "a"), nil, f)
	h.waitFor("a running", func(st *v1.PodStatus) bool { return isRunning(st, "a", 0) })
	f.exit(t, idOf("a", 0), 137)
	h.w.Nudge()
	st := h.waitFor("phase Failed", phaseIs(v1.PodFailed))
	if term := statusOf(st, "a").State.Terminated; term == nil || term.Reason != "Error" {
		t.Errorf("a = %s, want terminated Error", describe(st))
	}
}

func TestWorkerDelete(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, "a", "b")
	g := int64(7)
	pod.Spec.TerminationGracePeriodSeconds = &g
	f := newFakeRuntime()
	h := startWorker(t, pod, nil, f)
	h.waitFor("phase Running", phaseIs(v1.PodRunning))

	h.w.Delete()
	select {
	case <-h.done:
	case <-time.After(waitLimit):
		t.Fatalf("Run did not return within %s of Delete; runtime calls: %v", waitLimit, f.allCalls())
	}
	stopped, removed := map[string]bool{}, map[string]bool{}
	for _, c := range f.callsOf("stop") {
		stopped[c.id] = true
		if c.grace != 7*time.Second {
			t.Errorf("StopContainer(%s) grace = %s, want the pod's 7s", c.id, c.grace)
		}
	}
	for _, c := range f.callsOf("remove") {
		removed[c.id] = true
	}
	for _, id := range []string{idOf("a", 0), idOf("b", 0)} {
		if !stopped[id] || !removed[id] {
			t.Errorf("container %s stopped=%v removed=%v, want both", id, stopped[id], removed[id])
		}
	}
	if left, _ := f.ListContainers(context.Background(), testUID); len(left) != 0 {
		t.Errorf("containers left after Delete: %v", left)
	}
	f.mu.Lock()
	files := f.podFiles
	f.mu.Unlock()
	if files != 1 {
		t.Errorf("RemoveSandbox calls = %d, want 1", files)
	}
	h.mu.Lock()
	gone := h.gone
	h.mu.Unlock()
	if len(gone) != 1 || gone[0].UID != pod.UID {
		t.Errorf("OnGone calls = %v, want one for pod %s", gone, pod.UID)
	}
}

func initPod(policy v1.RestartPolicy) *v1.Pod {
	p := testPod(policy, "app")
	for _, n := range []string{"init1", "init2"} {
		p.Spec.InitContainers = append(p.Spec.InitContainers, v1.Container{Name: n, Image: "busybox:1.36", Command: []string{"true"}})
	}
	return p
}

func startedNames(f *fakeRuntime) string {
	var names []string
	for _, c := range f.callsOf("start") {
		names = append(names, c.name)
	}
	return strings.Join(names, ",")
}

func TestWorkerInitContainersInOrder(t *testing.T) {
	f := newFakeRuntime()
	h := startWorker(t, initPod(v1.RestartPolicyAlways), nil, f)

	st := h.waitFor("init1 running", func(st *v1.PodStatus) bool { return isRunning(st, "init1", 0) })
	if got := startedNames(f); got != "init1" {
		t.Fatalf("started while init1 runs: %s, want only init1", got)
	}
	if st.Phase != v1.PodPending {
		t.Errorf("phase while initialising = %s, want Pending", st.Phase)
	}
	if w := statusOf(st, "app").State.Waiting; w == nil || w.Reason != "PodInitializing" {
		t.Errorf("app while initialising = %s, want waiting PodInitializing", describe(st))
	}
	// kubelet's default waiting reason for every container of a pod with init containers.
	if w := statusOf(st, "init2").State.Waiting; w == nil || w.Reason != "PodInitializing" {
		t.Errorf("init2 before its turn = %s, want waiting PodInitializing", describe(st))
	}

	f.exit(t, idOf("init1", 0), 0)
	h.w.Nudge()
	h.waitFor("init2 running", func(st *v1.PodStatus) bool { return isRunning(st, "init2", 0) })
	if got := startedNames(f); got != "init1,init2" {
		t.Fatalf("started while init2 runs: %s, want init1,init2", got)
	}

	f.exit(t, idOf("init2", 0), 0)
	h.w.Nudge()
	st = h.waitFor("phase Running", phaseIs(v1.PodRunning))
	if got := startedNames(f); got != "init1,init2,app" {
		t.Errorf("started: %s, want init1,init2,app", got)
	}
	for _, n := range []string{"init1", "init2"} {
		if term := statusOf(st, n).State.Terminated; term == nil || term.Reason != "Completed" {
			t.Errorf("%s after initialisation = %s, want terminated Completed", n, describe(st))
		}
		if !statusOf(st, n).Ready {
			t.Errorf("%s succeeded but is not ready: kubelet reports a completed init container ready", n)
		}
	}
}

func TestWorkerInitContainerFailsPod(t *testing.T) {
	f := newFakeRuntime()
	h := startWorker(t, initPod(v1.RestartPolicyNever), nil, f)
	h.waitFor("init1 running", func(st *v1.PodStatus) bool { return isRunning(st, "init1", 0) })
	f.exit(t, idOf("init1", 0), 1)
	h.w.Nudge()
	st := h.waitFor("phase Failed", phaseIs(v1.PodFailed))
	if term := statusOf(st, "init1").State.Terminated; term == nil || term.Reason != "Error" || term.ExitCode != 1 {
		t.Errorf("init1 = %s, want terminated Error exit 1", describe(st))
	}
	h.resync()
	if got := startedNames(f); got != "init1" {
		t.Errorf("started after init1 failed with restartPolicy Never: %s, want only init1", got)
	}
}

// After a reboot (tasks gone, container records kept) a container that had finished for good is
// not run again, and a Never container whose end went unseen is reported, not restarted.
func TestWorkerAfterRebootDoesNotRerunFinished(t *testing.T) {
	for _, tt := range []struct {
		name   string
		policy v1.RestartPolicy
		prev   v1.ContainerState
		reason string
		phase  v1.PodPhase
	}{
		{"completed job", v1.RestartPolicyNever,
			v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", ContainerID: "containerd://" + idOf("a", 0)}},
			"Completed", v1.PodSucceeded},
		{"OnFailure succeeded", v1.RestartPolicyOnFailure,
			v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", ContainerID: "containerd://" + idOf("a", 0)}},
			"Completed", v1.PodSucceeded},
		{"Never, was running", v1.RestartPolicyNever,
			v1.ContainerState{Running: &v1.ContainerStateRunning{}},
			"ContainerStatusUnknown", v1.PodFailed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pod := testPod(tt.policy, "a")
			f := newFakeRuntime()
			f.add(ctrd.Container{ID: idOf("a", 0), PodUID: testUID, Name: "a", Hash: ctrspec.SpecHash(pod, &pod.Spec.Containers[0]),
				State: ctrd.StateCreated, CreatedAt: time.Now()})
			prev := &v1.PodStatus{ContainerStatuses: []v1.ContainerStatus{{Name: "a", ContainerID: "containerd://" + idOf("a", 0), State: tt.prev}}}
			h := startWorker(t, pod, prev, f)
			st := h.waitFor("phase "+string(tt.phase), phaseIs(tt.phase))
			h.resync()
			if starts := f.callsOf("start"); len(starts) != 0 {
				t.Errorf("started again after the reboot: %v", starts)
			}
			if term := statusOf(st, "a").State.Terminated; term == nil || term.Reason != tt.reason {
				t.Errorf("state = %+v, want terminated %s", statusOf(st, "a").State, tt.reason)
			}
		})
	}
}

// A restart that fails to start keeps the restart count it was going for; it doesn't fall back to 0.
func TestWorkerFailedRestartKeepsCount(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, "a")
	f := newFakeRuntime()
	h := startWorker(t, pod, nil, f)
	h.waitFor("a running", func(st *v1.PodStatus) bool { return isRunning(st, "a", 0) })
	f.mu.Lock()
	f.startErr["a"] = &ctrd.StartError{Reason: "RunContainerError", Err: errors.New("runc failed")}
	f.mu.Unlock()
	f.exit(t, idOf("a", 0), 1)
	h.w.Nudge()
	st := h.waitFor("a failing to restart", func(st *v1.PodStatus) bool {
		w := statusOf(st, "a").State.Waiting
		return w != nil && w.Reason == "RunContainerError"
	})
	if rc := statusOf(st, "a").RestartCount; rc != 1 {
		t.Errorf("restartCount after a failed restart = %d, want 1", rc)
	}
	if starts := f.callsOf("start"); len(starts) != 2 || starts[1].restarts != 1 {
		t.Errorf("starts = %v, want attempt 0 then attempt 1", starts)
	}
}

// After a containerd restart (tasks gone, the pod's sandbox intact), an init container that had
// completed is not run again and does not hold the app containers back; the app container whose
// task vanished restarts (OnFailure). After a reboot the sandbox is new and init runs again: see
// TestWorkerNewSandboxRerunsInit.
func TestWorkerAfterRebootInitStaysDone(t *testing.T) {
	pod := testPod(v1.RestartPolicyOnFailure, "a")
	pod.Spec.InitContainers = []v1.Container{{Name: "i", Image: "busybox:1.36", Command: []string{"true"}}}
	f := newFakeRuntime()
	f.intact(testUID) // an agent restart: the sandbox is still there
	f.add(ctrd.Container{ID: idOf("i", 0), PodUID: testUID, Name: "i", Hash: ctrspec.SpecHash(pod, &pod.Spec.InitContainers[0]),
		State: ctrd.StateCreated, CreatedAt: time.Now()})
	f.add(ctrd.Container{ID: idOf("a", 0), PodUID: testUID, Name: "a", Hash: ctrspec.SpecHash(pod, &pod.Spec.Containers[0]),
		State: ctrd.StateCreated, CreatedAt: time.Now()})
	prev := &v1.PodStatus{
		InitContainerStatuses: []v1.ContainerStatus{{Name: "i", ContainerID: "containerd://" + idOf("i", 0),
			State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", ContainerID: "containerd://" + idOf("i", 0)}}}},
		ContainerStatuses: []v1.ContainerStatus{{Name: "a", ContainerID: "containerd://" + idOf("a", 0),
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}},
	}
	h := startWorker(t, pod, prev, f)
	h.waitFor("a running again", func(st *v1.PodStatus) bool { return isRunning(st, "a", 1) })
	for _, c := range f.callsOf("start") {
		if c.name == "i" {
			t.Errorf("the completed init container ran again: %v", c)
		}
	}
}

// An attempt that cannot be stopped may still run: its replacement must wait until the stop
// succeeds, or two instances of the container would run at once.
func TestWorkerStartsNothingWhileOldAttemptCannotBeStopped(t *testing.T) {
	for _, tt := range []struct {
		name string
		old  []ctrd.Container // what containerd holds for container a; the first is stuck
	}{
		{"spec changed", []ctrd.Container{{ID: idOf("a", 0), PodUID: testUID, Name: "a", Hash: "0123456789abcdef",
			State: ctrd.StateRunning, CreatedAt: time.Now()}}},
		{"older attempt beside an exited one", []ctrd.Container{
			{ID: idOf("a", 0), PodUID: testUID, Name: "a", State: ctrd.StateRunning, CreatedAt: time.Now()},
			{ID: idOf("a", 1), PodUID: testUID, Name: "a", RestartCount: 1, State: ctrd.StateExited, ExitCode: 1,
				CreatedAt: time.Now().Add(-time.Hour), ExitedAt: time.Now().Add(-time.Hour)}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pod := testPod(v1.RestartPolicyAlways, "a")
			f := newFakeRuntime()
			f.intact(testUID) // the pod's sandbox survives: only the stuck attempt is in the way
			for _, c := range tt.old {
				if c.Hash == "" {
					c.Hash = ctrspec.SpecHash(pod, &pod.Spec.Containers[0])
				}
				f.add(c)
			}
			stuck := tt.old[0].ID
			f.setStopErr(stuck, errors.New("shim not answering"))
			h := startWorker(t, pod, nil, f)
			// A second stop means the worker has finished the sync that failed the first and retried.
			f.waitCalls(t, "stop", stuck, 2)
			if starts := f.callsOf("start"); len(starts) != 0 {
				t.Fatalf("StartContainer calls while %s could not be stopped = %v, want none (running: %v)", stuck, starts, f.running())
			}

			f.setStopErr(stuck, nil)
			want := len(tt.old)
			h.waitFor("a running again", func(st *v1.PodStatus) bool { return isRunning(st, "a", int32(want)) })
			if ids := f.running(); len(ids) != 1 || ids[0] != idOf("a", want) {
				t.Errorf("running containers = %v, want only %s", ids, idOf("a", want))
			}
		})
	}
}

// A try that failed after containerd made something under its id (RunContainerError: a shim's
// bundle dir that a killed containerd left, say) is not retried under the same id, which would fail
// the same way forever: the next try is the next attempt, with a new id. A failure before anything
// was made (ErrImagePull) retries the same attempt. The back-off runs on synctest's clock.
func TestWorkerFailedStartMovesToNewID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeRuntime()
		f.startErr["a"] = &ctrd.StartError{Reason: "RunContainerError", Err: errors.New("failed to start shim: mkdir /run/containerd/x: file exists")}
		h := startWorker(t, testPod(v1.RestartPolicyAlways, "a"), nil, f)
		synctest.Wait() // attempt 0 failed; the worker waits out its back-off
		f.mu.Lock()
		f.startErr["a"] = &ctrd.StartError{Reason: "ErrImagePull", Err: errors.New("pull busybox:1: connection refused")}
		f.mu.Unlock()
		time.Sleep(backoffMax)
		synctest.Wait() // attempt 1 failed to pull, once or more
		f.mu.Lock()
		delete(f.startErr, "a")
		f.mu.Unlock()
		time.Sleep(backoffMax)
		synctest.Wait()
		var ids []string
		for _, c := range f.callsOf("start") {
			ids = append(ids, c.id)
		}
		if len(ids) < 3 || ids[0] != idOf("a", 0) || slices.ContainsFunc(ids[1:], func(id string) bool { return id != idOf("a", 1) }) {
			t.Errorf("start ids %v, want %s, then %s for every later try (attempt 0 fails in containerd, attempt 1 fails to pull, then runs)",
				ids, idOf("a", 0), idOf("a", 1))
		}
		h.waitFor("a running as attempt 1", func(st *v1.PodStatus) bool { return isRunning(st, "a", 1) })
	})
}

// A container adopted by a restarted agent that never stored its status (killed between the start
// and the store write) reports the startedAt the first agent reported: both read the container
// record's creation time. Before, the first reported the time the start returned and the second
// the record's, which at whole seconds could differ (a flaky TestAgentKill9AdoptsRunningContainers).
func TestWorkerStartedAtSameAfterAdoption(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, "a")
	f := newFakeRuntime()
	h := startWorker(t, pod, nil, f)
	st := h.waitFor("a running", func(st *v1.PodStatus) bool { return isRunning(st, "a", 0) })
	before := statusOf(st, "a").State.Running.StartedAt

	adopted := startWorker(t, pod, nil, f) // no stored status
	st = adopted.waitFor("a adopted", func(st *v1.PodStatus) bool { return isRunning(st, "a", 0) })
	if after := statusOf(st, "a").State.Running.StartedAt; !after.Time.Equal(before.Time) {
		t.Errorf("startedAt %v before adoption, %v after", before.Time, after.Time)
	}
	if starts := f.callsOf("start"); len(starts) != 1 {
		t.Errorf("the adopting worker started %d containers more", len(starts)-1)
	}
}

// Kubelet's back-off, asserted on synctest's clock: a container that keeps exiting is restarted at
// once after its first exit, then 10 s, 20 s and 40 s after the next ones, not a moment sooner,
// however often the worker is nudged meanwhile.
func TestWorkerRestartBackOffExact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeRuntime()
		t0 := time.Now()
		h := startWorker(t, testPod(v1.RestartPolicyAlways, "a"), nil, f)
		synctest.Wait()
		waits := []time.Duration{0, backoffInitial, 2 * backoffInitial, 4 * backoffInitial}
		for attempt, wait := range waits {
			f.exit(t, idOf("a", attempt), 1)
			h.w.Nudge()
			synctest.Wait()
			if wait > 0 {
				time.Sleep(wait - time.Millisecond)
				h.w.Nudge() // a relist's nudge does not cut the back-off short
				synctest.Wait()
				if n := len(f.callsOf("start")); n != attempt+1 {
					t.Fatalf("attempt %d started before its %s back-off", attempt+1, wait)
				}
				time.Sleep(time.Millisecond)
				synctest.Wait()
			}
		}
		var got []time.Duration
		f.mu.Lock()
		for _, at := range f.startedAt {
			got = append(got, at.Sub(t0))
		}
		f.mu.Unlock()
		want := []time.Duration{0, 0, 10 * time.Second, 30 * time.Second, 70 * time.Second}
		if !slices.Equal(got, want) {
			t.Errorf("starts at %v, want %v", got, want)
		}
	})
}

// Each status goes back with the version of the pod it was computed for, although a burst of
// updates came while it was computed: what the node reports as observed is what it acted on, and
// the newest version is what it ends on.
func TestWorkerReportsTheVersionEachStatusWasComputedFor(t *testing.T) {
	f := newFakeRuntime()
	g := gatedRuntime{fakeRuntime: f, entered: make(chan string, 16), gate: make(chan struct{})}
	version := func(gen int64) Desired {
		p := testPod(v1.RestartPolicyAlways, "a")
		p.Spec.Containers[0].Image = fmt.Sprintf("busybox:%d", gen)
		return Desired{Pod: p, Source: source.Ref{Kind: source.MQTT, Origin: "t/web"}, Generation: gen}
	}
	h := startWorkerWith(t, version(1), nil, g, f, nil)
	select {
	case <-g.entered: // the first sync is starting busybox:1
	case <-time.After(waitLimit):
		t.Fatal("no start within the wait limit")
	}
	for gen := int64(2); gen <= 12; gen++ {
		h.w.Update(version(gen))
	}
	close(g.gate)
	h.waitFor("a running busybox:12", func(st *v1.PodStatus) bool {
		cs := statusOf(st, "a")
		return cs != nil && cs.State.Running != nil && cs.Image == "busybox:12"
	})
	h.mu.Lock()
	all := slices.Clone(h.reported)
	h.mu.Unlock()
	var gens []int64
	for _, r := range all {
		d := r.d
		gens = append(gens, d.Generation)
		if img := d.Pod.Spec.Containers[0].Image; img != fmt.Sprintf("busybox:%d", d.Generation) {
			t.Errorf("a status reported generation %d with a pod of image %s", d.Generation, img)
		}
		// The status shows the image of the spec it was computed from.
		if cs := statusOf(&r.st, "a"); cs == nil || cs.Image != d.Pod.Spec.Containers[0].Image {
			t.Errorf("a status computed for %v reported with generation %d (%s)", cs, d.Generation, d.Pod.Spec.Containers[0].Image)
		}
		if d.Source.Origin != "t/web" {
			t.Errorf("a status reported source %+v", d.Source)
		}
	}
	if len(gens) < 2 || gens[0] != 1 || gens[len(gens)-1] != 12 || !slices.IsSorted(gens) {
		t.Errorf("generations reported %v, want 1 first, 12 last, never going back", gens)
	}
}

// A spec update that changes nothing the node runs (tolerations) still bumps the generation the
// status reports, so the API's observedGeneration follows (conformance: pod generation; the status
// was not published again and observedGeneration stayed 1).
func TestWorkerReportsANewGeneration(t *testing.T) {
	f := newFakeRuntime()
	pod := testPod(v1.RestartPolicyAlways, "a")
	pod.Generation = 1
	h := startWorker(t, pod, nil, f)
	h.waitFor("phase Running at generation 1", func(st *v1.PodStatus) bool {
		return st.Phase == v1.PodRunning && st.ObservedGeneration == 1
	})
	next := pod.DeepCopy()
	next.Generation = 2
	next.Spec.Tolerations = []v1.Toleration{{Key: "k", Operator: v1.TolerationOpExists}}
	h.w.Update(Desired{Pod: next})
	h.waitFor("observedGeneration 2", func(st *v1.PodStatus) bool { return st.ObservedGeneration == 2 })
}
