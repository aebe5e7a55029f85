package pod

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/core/event"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// eventLog keeps what a worker emits.
type eventLog struct {
	mu     sync.Mutex
	events []event.Event
}

func (l *eventLog) emit(e event.Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

// with returns the events of reason seen so far.
func (l *eventLog) with(reason string) []event.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []event.Event
	for _, e := range l.events {
		if e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// waitFor waits until at least n events of reason were emitted and returns them.
func (l *eventLog) waitFor(t *testing.T, reason string, n int) []event.Event {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		if got := l.with(reason); len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			l.mu.Lock()
			defer l.mu.Unlock()
			t.Fatalf("fewer than %d %s events within %s; emitted: %+v", n, reason, waitLimit, l.events)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startWorkerWithEvents is startWorker with the worker's events kept.
func startWorkerWithEvents(t *testing.T, pod *v1.Pod, prev *v1.PodStatus, f *fakeRuntime) (*harness, *eventLog) {
	t.Helper()
	l := &eventLog{}
	return startWorkerOn(t, pod, prev, f, f, l.emit), l
}

// A container that keeps crashing is reported waiting in back-off (kubelet's BackOff with its
// wording, about the container by field path), once per look at an exit it waits out; the first
// restart is immediate and reports none.
func TestWorkerEmitsBackOff(t *testing.T) {
	f := newFakeRuntime()
	pod := testPod(v1.RestartPolicyAlways, "a")
	h, l := startWorkerWithEvents(t, pod, nil, f)
	h.waitFor("a running", func(st *v1.PodStatus) bool { return isRunning(st, "a", 0) })
	f.exit(t, idOf("a", 0), 1)
	h.w.Nudge()
	h.waitFor("a restarted once", func(st *v1.PodStatus) bool { return isRunning(st, "a", 1) })
	if got := l.with(event.ReasonBackOff); len(got) != 0 {
		t.Errorf("BackOff events before any back-off: %+v", got)
	}
	f.exit(t, idOf("a", 1), 2)
	h.w.Nudge()
	got := l.waitFor(t, event.ReasonBackOff, 1)[0]
	want := "Back-off restarting failed container a in pod web_default(" + testUID + ")"
	if got.Type != event.Warning || got.Message != want || got.Object.UID != pod.UID || got.Object.FieldPath != "spec.containers{a}" {
		t.Errorf("BackOff event = %+v, want Warning %q about spec.containers{a}", got, want)
	}
}

// A failed pull is reported as kubelet does: "Error: ErrImagePull", then while it waits to retry,
// a BackOff about the image and "Error: ImagePullBackOff".
func TestWorkerEmitsPullFailure(t *testing.T) {
	f := newFakeRuntime()
	f.startErr["a"] = &ctrd.StartError{Reason: "ErrImagePull", Err: errors.New("pull busybox:1.36: connection refused")}
	_, l := startWorkerWithEvents(t, testPod(v1.RestartPolicyAlways, "a"), nil, f)
	failed := l.waitFor(t, event.ReasonFailed, 2)
	if failed[0].Message != "Error: ErrImagePull" || failed[1].Message != "Error: ImagePullBackOff" || failed[0].Type != event.Warning {
		t.Errorf("Failed events = %+v, want Error: ErrImagePull then Error: ImagePullBackOff", failed)
	}
	if b := l.waitFor(t, event.ReasonBackOff, 1)[0]; b.Message != `Back-off pulling image "busybox:1.36"` || b.Type != event.Normal {
		t.Errorf("BackOff event = %+v", b)
	}
}

// Other start failures name their cause.
func TestWorkerEmitsStartFailureCause(t *testing.T) {
	f := newFakeRuntime()
	f.startErr["a"] = &ctrd.StartError{Reason: "CreateContainerConfigError", Err: errors.New(`configmap "app" not found`)}
	_, l := startWorkerWithEvents(t, testPod(v1.RestartPolicyAlways, "a"), nil, f)
	if e := l.waitFor(t, event.ReasonFailed, 1)[0]; e.Message != `Error: configmap "app" not found` {
		t.Errorf("Failed event = %+v", e)
	}
}

// Deleting a pod reports each running container being stopped.
func TestWorkerEmitsKilling(t *testing.T) {
	f := newFakeRuntime()
	h, l := startWorkerWithEvents(t, testPod(v1.RestartPolicyAlways, "a", "b"), nil, f)
	h.waitFor("phase Running", phaseIs(v1.PodRunning))
	h.w.Delete()
	kills := l.waitFor(t, event.ReasonKilling, 2)
	msgs := map[string]bool{}
	for _, e := range kills {
		msgs[e.Message+" "+e.Object.FieldPath] = true
	}
	if !msgs["Stopping container a spec.containers{a}"] || !msgs["Stopping container b spec.containers{b}"] {
		t.Errorf("Killing events = %+v", kills)
	}
}

// A pod running longer than activeDeadlineSeconds is failed with DeadlineExceeded, its containers
// stopped, and the event emitted; the worker's own timer fires it, no nudge needed, exactly at the
// deadline (synctest's clock).
func TestWorkerActiveDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeRuntime()
		pod := testPod(v1.RestartPolicyAlways, "a")
		secs := int64(1)
		pod.Spec.ActiveDeadlineSeconds = &secs
		h, l := startWorkerWithEvents(t, pod, nil, f)
		synctest.Wait()
		running := h.waitFor("phase Running", phaseIs(v1.PodRunning))
		deadline := running.StartTime.Add(time.Second)
		time.Sleep(time.Until(deadline) - time.Millisecond)
		synctest.Wait()
		if p := h.w.Pod(); p.Status.Phase != v1.PodRunning {
			t.Fatalf("phase %s a millisecond before the deadline, want Running", p.Status.Phase)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		st := h.waitFor("phase Failed", phaseIs(v1.PodFailed))
		if st.Reason != "DeadlineExceeded" || st.Message != "Pod was active on the node longer than the specified deadline" {
			t.Errorf("status reason/message = %q/%q", st.Reason, st.Message)
		}
		if stops := f.callsOf("stop"); len(stops) != 1 || stops[0].id != idOf("a", 0) {
			t.Errorf("stop calls = %v, want a's container stopped", stops)
		}
		if cs := statusOf(st, "a"); cs == nil || cs.State.Terminated == nil {
			t.Errorf("container a = %+v, want terminated", cs)
		}
		if e := l.waitFor(t, event.ReasonDeadlineExceeded, 1); e[0].Message != deadlineMessage || e[0].Type != event.Normal {
			t.Errorf("DeadlineExceeded event = %+v", e[0])
		}
	})
}

// The deadline counts from the start time stored before an agent restart: a restarted agent does
// not give the pod a fresh allowance.
func TestWorkerActiveDeadlineSurvivesRestart(t *testing.T) {
	f := newFakeRuntime()
	f.intact(testUID)
	f.add(ctrd.Container{ID: idOf("a", 0), PodUID: testUID, PodName: "web", PodNamespace: "default", Name: "a",
		Hash:  ctrspec.SpecHash(testPod(v1.RestartPolicyAlways, "a"), &testPod(v1.RestartPolicyAlways, "a").Spec.Containers[0]),
		State: ctrd.StateRunning, CreatedAt: time.Now().Add(-time.Hour)})
	pod := testPod(v1.RestartPolicyAlways, "a")
	secs := int64(600)
	pod.Spec.ActiveDeadlineSeconds = &secs
	started := metav1.NewTime(time.Now().Add(-time.Hour))
	prev := &v1.PodStatus{Phase: v1.PodRunning, StartTime: &started}
	h, _ := startWorkerWithEvents(t, pod, prev, f)
	st := h.waitFor("phase Failed", phaseIs(v1.PodFailed))
	if st.Reason != "DeadlineExceeded" {
		t.Errorf("reason %q, want DeadlineExceeded", st.Reason)
	}
	if starts := f.callsOf("start"); len(starts) != 0 {
		t.Errorf("start calls %v: the adopted container should only have been stopped", starts)
	}
}

// A pod that finished before its deadline stays Succeeded.
func TestWorkerActiveDeadlineSparesFinishedPod(t *testing.T) {
	f := newFakeRuntime()
	pod := testPod(v1.RestartPolicyNever, "a")
	secs := int64(1)
	pod.Spec.ActiveDeadlineSeconds = &secs
	h, l := startWorkerWithEvents(t, pod, nil, f)
	h.waitFor("a running", func(st *v1.PodStatus) bool { return isRunning(st, "a", 0) })
	f.exit(t, idOf("a", 0), 0)
	h.w.Nudge()
	st := h.waitFor("phase Succeeded", phaseIs(v1.PodSucceeded))
	// Past the deadline, a sync must still leave it Succeeded.
	time.Sleep(time.Until(st.StartTime.Time.Add(1100 * time.Millisecond)))
	h.resync()
	h.mu.Lock()
	last := h.last
	h.mu.Unlock()
	if last.Phase != v1.PodSucceeded || strings.Contains(last.Reason, "Deadline") || len(l.with(event.ReasonDeadlineExceeded)) != 0 {
		t.Errorf("finished pod after its deadline: %s (reason %q)", describe(last), last.Reason)
	}
}
