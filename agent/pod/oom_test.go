package pod

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/mqlet/mqlet/agent/cgroup"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/core/event"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// oomRuntime is the fake runtime plus the cgroup OOM counters of ctrd.Runtime.OOMKilled.
type oomRuntime struct {
	*fakeRuntime
	mu     sync.Mutex
	killed map[string]bool // container id -> the counters show an OOM kill
	err    error
	checks []string // ids asked about
}

func (o *oomRuntime) OOMKilled(_ context.Context, c ctrd.Container) (bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.checks = append(o.checks, c.ID)
	return o.killed[c.ID], o.err
}

func (o *oomRuntime) checked() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.checks...)
}

// startOOMWorker is startWorker with rt as the runtime and events kept in ev.
func startOOMWorker(t *testing.T, pod *v1.Pod, rt Runtime, f *fakeRuntime, ev *eventLog) *harness {
	t.Helper()
	return startWorkerOn(t, pod, nil, rt, f, ev.emit)
}

func limitedPod(policy v1.RestartPolicy) *v1.Pod {
	p := testPod(policy, "a")
	p.Spec.Containers[0].Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse("20Mi")}
	return p
}

// An exit nobody saw an OOM event for (the agent was down) is OOMKilled when the container's
// cgroup counters say so: read once, before anything removes the container, with one event.
func TestWorkerOOMFromCgroupCounters(t *testing.T) {
	f := newFakeRuntime()
	rt := &oomRuntime{fakeRuntime: f, killed: map[string]bool{idOf("a", 0): true}}
	ev := &eventLog{}
	h := startOOMWorker(t, limitedPod(v1.RestartPolicyNever), rt, f, ev)
	h.waitFor("a running", func(st *v1.PodStatus) bool { return isRunning(st, "a", 0) })
	f.exit(t, idOf("a", 0), 137)
	h.w.Nudge()
	st := h.waitFor("a terminated", func(st *v1.PodStatus) bool { return statusOf(st, "a").State.Terminated != nil })
	if term := statusOf(st, "a").State.Terminated; term.Reason != ReasonOOMKilled || term.ExitCode != 137 {
		t.Errorf("a = %s, want terminated OOMKilled/137", describe(st))
	}
	for range 3 {
		h.resync()
	}
	if got := rt.checked(); len(got) != 1 || got[0] != idOf("a", 0) {
		t.Errorf("counters read for %v, want once for %s", got, idOf("a", 0))
	}
	evs := ev.with(ReasonOOMKilled)
	if len(evs) != 1 {
		t.Fatalf("OOMKilled events: %+v, want one", ev.events)
	}
	e := evs[0]
	if e.Type != event.Warning || e.Object.Kind != event.KindPod || e.Object.Name != "web" || e.Object.UID != testUID ||
		!strings.Contains(e.Message, "Container a was OOM-killed") || !strings.Contains(e.Message, "20Mi") || !strings.Contains(e.Message, "137") {
		t.Errorf("event %+v", e)
	}
}

// Exit 137 whose counters show no OOM kill (a kill -9 from outside) stays an Error, with no event;
// a cgroup already gone tells nothing either.
func TestWorkerKilledWithoutOOMCounters(t *testing.T) {
	for _, err := range []error{nil, fmt.Errorf("x: %w", cgroup.ErrNoCgroup)} {
		f := newFakeRuntime()
		rt := &oomRuntime{fakeRuntime: f, killed: map[string]bool{}, err: err}
		ev := &eventLog{}
		h := startOOMWorker(t, limitedPod(v1.RestartPolicyNever), rt, f, ev)
		h.waitFor("a running", func(st *v1.PodStatus) bool { return isRunning(st, "a", 0) })
		f.exit(t, idOf("a", 0), 137)
		h.w.Nudge()
		st := h.waitFor("phase Failed", phaseIs(v1.PodFailed))
		if term := statusOf(st, "a").State.Terminated; term == nil || term.Reason != "Error" {
			t.Errorf("counter error %v: a = %s, want terminated Error", err, describe(st))
		}
		if len(rt.checked()) != 1 || len(ev.events) != 0 {
			t.Errorf("counter error %v: checks %v, events %+v; want one check, no event", err, rt.checked(), ev.events)
		}
	}
}

// Live OOM events: every OOM-killed attempt gets its own event, none twice, and the container
// restarts per its policy (Always) in the meantime.
func TestWorkerOOMEventPerKill(t *testing.T) {
	f := newFakeRuntime()
	rt := &oomRuntime{fakeRuntime: f, killed: map[string]bool{}}
	ev := &eventLog{}
	h := startOOMWorker(t, limitedPod(v1.RestartPolicyAlways), rt, f, ev)
	for attempt := range 2 {
		h.waitFor(fmt.Sprintf("a running, attempt %d", attempt), func(st *v1.PodStatus) bool { return isRunning(st, "a", int32(attempt)) })
		h.w.OOM(idOf("a", attempt))
		f.exit(t, idOf("a", attempt), 137)
		h.w.Nudge()
		ev.waitFor(t, ReasonOOMKilled, attempt+1)
	}
	st := h.waitFor("a in back-off after its second OOM kill", func(st *v1.PodStatus) bool {
		cs := statusOf(st, "a")
		return cs.State.Waiting != nil && cs.State.Waiting.Reason == "CrashLoopBackOff"
	})
	if last := statusOf(st, "a").LastTerminationState.Terminated; last == nil || last.Reason != ReasonOOMKilled {
		t.Errorf("a = %s, want last state OOMKilled", describe(st))
	}
	h.resync()
	if n := len(ev.with(ReasonOOMKilled)); n != 2 {
		t.Errorf("%d OOMKilled events for two kills: %+v", n, ev.events)
	}
	if got := rt.checked(); len(got) != 0 {
		t.Errorf("counters read %v although the events told", got)
	}
}
