package pod

import (
	"context"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	v1 "k8s.io/api/core/v1"
)

func TestWorkerFailStopsAndHolds(t *testing.T) {
	f := newFakeRuntime()
	h := startWorker(t, testPod(v1.RestartPolicyAlways, "a"), nil, f)
	h.waitFor("phase Running", phaseIs(v1.PodRunning))

	zero := time.Duration(0)
	h.w.Fail(Failure{Reason: ReasonEvicted, Message: "The node was low on resource: memory.", Grace: &zero})
	st := h.waitFor("phase Failed", phaseIs(v1.PodFailed))
	if st.Reason != ReasonEvicted || st.Message != "The node was low on resource: memory." {
		t.Errorf("status reason/message = %q/%q, want Evicted and the message", st.Reason, st.Message)
	}
	stops := f.callsOf("stop")
	if len(stops) != 1 || stops[0].grace != 0 {
		t.Fatalf("stop calls = %v, want one with grace 0", stops)
	}
	cs := statusOf(st, "a")
	if cs == nil || cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 137 {
		t.Fatalf("container a = %+v, want terminated with 137", cs)
	}
	// Nothing restarts it, whatever nudges it.
	h.resync()
	h.resync()
	if got := f.callsOf("start"); len(got) != 1 {
		t.Errorf("start calls after Fail = %v, want only the first", got)
	}
	if f := h.w.Failed(); f == nil || f.Reason != ReasonEvicted {
		t.Errorf("Failed() = %+v", f)
	}
}

func TestWorkerFailureRestored(t *testing.T) {
	prev := &v1.PodStatus{Phase: v1.PodFailed, Reason: "OutOfmemory", Message: "Node didn't have enough resource: memory"}
	f := newFakeRuntime()
	h := startWorker(t, testPod(v1.RestartPolicyAlways, "a"), prev, f)
	h.resync()
	if got := f.callsOf("start"); len(got) != 0 {
		t.Errorf("a pod stored as rejected was started after a restart: %v", got)
	}
	if got := h.w.Failed(); got == nil || got.Reason != "OutOfmemory" {
		t.Errorf("Failed() = %+v, want the stored verdict", got)
	}

	// A node shutdown is not a verdict that outlives the agent: the pod runs again.
	prev = &v1.PodStatus{Phase: v1.PodFailed, Reason: ReasonNodeShutdown}
	f2 := newFakeRuntime()
	h2 := startWorker(t, testPod(v1.RestartPolicyAlways, "a"), prev, f2)
	h2.waitFor("phase Running after a shutdown", phaseIs(v1.PodRunning))
}

// A failed pod stays Failed whatever spec it is handed: terminal is terminal under one UID.
func TestWorkerFailedStaysFailedOnUpdate(t *testing.T) {
	f := newFakeRuntime()
	h := startWorker(t, testPod(v1.RestartPolicyAlways, "a"), &v1.PodStatus{Phase: v1.PodFailed, Reason: "OutOfcpu"}, f)
	h.resync()
	h.w.Update(Desired{Pod: testPod(v1.RestartPolicyAlways, "a", "b")})
	h.resync()
	h.resync()
	if got := f.callsOf("start"); len(got) != 0 {
		t.Errorf("a failed pod started containers after an update: %v", got)
	}
	if p := h.w.Pod(); p.Status.Phase != v1.PodFailed {
		t.Errorf("phase %s after an update, want Failed", p.Status.Phase)
	}
}

// A deleted pod's deletionTimestamp is when it was deleted, the same on every read (it was the
// time of each read, so every status computed while terminating carried a new one).
func TestWorkerDeletionTimestampRecordedOnce(t *testing.T) {
	f := newFakeRuntime()
	h := startWorker(t, testPod(v1.RestartPolicyAlways, "a"), nil, f)
	h.waitFor("phase Running", phaseIs(v1.PodRunning))
	h.w.Delete()
	first := h.w.Pod().DeletionTimestamp
	time.Sleep(10 * time.Millisecond) // a later read at a later time
	second := h.w.Pod().DeletionTimestamp
	if first == nil || second == nil || !first.Time.Equal(second.Time) {
		t.Errorf("deletionTimestamp %v then %v, want one time recorded at Delete", first, second)
	}
}

// gatedRuntime holds every StartContainer until the test lets it through, so a test can act while a
// sync is in the middle of starting a pod.
type gatedRuntime struct {
	*fakeRuntime
	entered chan string   // the name of each container whose start began
	gate    chan struct{} // closed to let the starts through
}

func (g gatedRuntime) StartContainer(ctx context.Context, pod *v1.Pod, sb *ctrd.Sandbox, c *v1.Container, restarts int) (ctrd.Container, error) {
	g.entered <- c.Name
	<-g.gate
	return g.fakeRuntime.StartContainer(ctx, pod, sb, c, restarts)
}

// Once the node fails a pod, the sync under way starts nothing more of it: being stopped is a state
// of the worker (Terminating), not a check of deletion alone.
func TestWorkerStartsNothingOnceFailed(t *testing.T) {
	f := newFakeRuntime()
	g := gatedRuntime{fakeRuntime: f, entered: make(chan string, 2), gate: make(chan struct{})}
	h := startWorkerOn(t, testPod(v1.RestartPolicyAlways, "a", "b"), nil, g, f, nil)
	select {
	case <-g.entered: // a's start: the sync is under way
	case <-time.After(waitLimit):
		t.Fatal("no start within the wait limit")
	}
	h.w.Fail(Failure{Reason: ReasonEvicted, Message: "The node was low on resource: memory."})
	if s := h.w.State(); s.Phase != Terminating || s.Failure == nil || s.Failure.Reason != ReasonEvicted {
		t.Fatalf("state after Fail = %s, want terminating for Evicted", show(s))
	}
	close(g.gate)
	h.waitFor("phase Failed", phaseIs(v1.PodFailed))
	if got := f.callsOf("start"); len(got) != 1 || got[0].name != "a" {
		t.Errorf("start calls = %v, want only a's, begun before the verdict", got)
	}
	deadline := time.Now().Add(waitLimit)
	for h.w.State().Phase != Terminated {
		if time.Now().After(deadline) {
			t.Fatalf("state %s, want terminated once a was stopped", show(h.w.State()))
		}
		time.Sleep(5 * time.Millisecond)
	}
}
