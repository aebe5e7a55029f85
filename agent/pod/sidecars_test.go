package pod

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// sidecarSpec is a pod whose init containers named in sidecars have restartPolicy Always.
func sidecarSpec(policy v1.RestartPolicy, init []string, sidecars map[string]bool, ctrs ...string) *v1.PodSpec {
	s := specOf(policy, init, ctrs...)
	always := v1.ContainerRestartPolicyAlways
	for i := range s.InitContainers {
		if sidecars[s.InitContainers[i].Name] {
			s.InitContainers[i].RestartPolicy = &always
		}
	}
	return s
}

func startedAs(cs v1.ContainerStatus, started bool) v1.ContainerStatus {
	cs.Started = &started
	return cs
}

// Sidecars decide no phase: app containers waiting for them keep the pod Pending, finished app
// containers make it Succeeded or Failed whatever its sidecars do, and a sidecar's exit fails
// nothing.
func TestPhaseWithSidecars(t *testing.T) {
	side := map[string]bool{"s": true}
	tests := []struct {
		name   string
		policy v1.RestartPolicy
		init   []v1.ContainerStatus
		ctrs   []v1.ContainerStatus
		want   v1.PodPhase
	}{
		{"sidecar running, app waiting", v1.RestartPolicyNever, []v1.ContainerStatus{running("s")}, []v1.ContainerStatus{waiting("a", "PodInitializing")}, v1.PodPending},
		{"sidecar running, app running", v1.RestartPolicyNever, []v1.ContainerStatus{running("s")}, []v1.ContainerStatus{running("a")}, v1.PodRunning},
		{"never, app done, sidecar running", v1.RestartPolicyNever, []v1.ContainerStatus{running("s")}, []v1.ContainerStatus{exited("a", 0)}, v1.PodSucceeded},
		{"never, app failed, sidecar running", v1.RestartPolicyNever, []v1.ContainerStatus{running("s")}, []v1.ContainerStatus{exited("a", 1)}, v1.PodFailed},
		{"never, sidecar exited 1, app running", v1.RestartPolicyNever, []v1.ContainerStatus{exited("s", 1)}, []v1.ContainerStatus{running("a")}, v1.PodRunning},
		{"never, sidecar backing off, app running", v1.RestartPolicyNever, []v1.ContainerStatus{backingOff("s", 1)}, []v1.ContainerStatus{running("a")}, v1.PodRunning},
		{"onFailure, app done, sidecar stopped", v1.RestartPolicyOnFailure, []v1.ContainerStatus{exited("s", 137)}, []v1.ContainerStatus{exited("a", 0)}, v1.PodSucceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := sidecarSpec(tt.policy, []string{"s"}, side, "a")
			if got := Phase(spec, tt.init, tt.ctrs); got != tt.want {
				t.Errorf("Phase = %s, want %s", got, tt.want)
			}
		})
	}
}

// Initialized waits for regular init containers to succeed and sidecars to be started, and stays
// true once an app container ran; Ready and ContainersReady count the sidecars' ready.
func TestConditionsWithSidecars(t *testing.T) {
	spec := sidecarSpec(v1.RestartPolicyAlways, []string{"i", "s"}, map[string]bool{"s": true}, "a")
	now := metav1.NewTime(time.Unix(1000, 0))
	get := func(cs []v1.PodCondition, t v1.PodConditionType) v1.PodCondition {
		for _, c := range cs {
			if c.Type == t {
				return c
			}
		}
		return v1.PodCondition{}
	}
	notStarted := startedAs(running("s"), false)
	notStarted.Ready = false
	conds := Conditions(spec, v1.PodPending, []v1.ContainerStatus{exited("i", 0), notStarted}, []v1.ContainerStatus{waiting("a", "PodInitializing")}, nil, now)
	if c := get(conds, v1.PodInitialized); c.Status != v1.ConditionFalse || c.Message != "containers with incomplete status: [s]" {
		t.Errorf("sidecar not started: Initialized %s %q; want False naming s", c.Status, c.Message)
	}
	started := startedAs(running("s"), true)
	started.Ready = false // its readiness probe has not passed
	conds = Conditions(spec, v1.PodRunning, []v1.ContainerStatus{exited("i", 0), started}, []v1.ContainerStatus{running("a")}, nil, now)
	if c := get(conds, v1.PodInitialized); c.Status != v1.ConditionTrue {
		t.Errorf("sidecar started: Initialized %s %q; want True", c.Status, c.Message)
	}
	for _, ct := range []v1.PodConditionType{v1.PodReady, v1.ContainersReady} {
		if c := get(conds, ct); c.Status != v1.ConditionFalse || c.Message != "containers with unready status: [s]" {
			t.Errorf("unready sidecar: %s %s %q; want False naming s", ct, c.Status, c.Message)
		}
	}
	// The sidecar crashed and waits to restart: the pod was initialized and stays so.
	conds = Conditions(spec, v1.PodRunning, []v1.ContainerStatus{exited("i", 0), startedAs(backingOff("s", 1), false)}, []v1.ContainerStatus{running("a")}, nil, now)
	if c := get(conds, v1.PodInitialized); c.Status != v1.ConditionTrue {
		t.Errorf("sidecar restarting after the app ran: Initialized %s %q; want True", c.Status, c.Message)
	}
	if c := get(conds, v1.PodReady); c.Status != v1.ConditionFalse {
		t.Errorf("sidecar restarting: Ready %s; want False", c.Status)
	}
	ready := startedAs(running("s"), true)
	conds = Conditions(spec, v1.PodRunning, []v1.ContainerStatus{exited("i", 0), ready}, []v1.ContainerStatus{running("a")}, nil, now)
	if c := get(conds, v1.PodReady); c.Status != v1.ConditionTrue {
		t.Errorf("all ready: Ready %s %q", c.Status, c.Message)
	}
}

// orderRuntime records the order stop signals reach it; app containers take a while to stop.
type orderRuntime struct {
	Runtime
	mu    sync.Mutex
	order []string
	slow  map[string]bool
}

func (r *orderRuntime) StopContainer(_ context.Context, id string, _ time.Duration) error {
	if r.slow[id] {
		time.Sleep(50 * time.Millisecond) // the app handles SIGTERM; the order must not depend on it being quick
	}
	r.mu.Lock()
	r.order = append(r.order, id)
	r.mu.Unlock()
	return nil
}
func (r *orderRuntime) RemoveContainer(context.Context, string) error    { return nil }
func (r *orderRuntime) RemoveSandbox(context.Context, ctrd.PodRef) error { return nil }

// Teardown through withOrderedStop stops the app containers first, then the sidecars in reverse
// spec order; regular init containers stop with the app containers.
func TestOrderedStop(t *testing.T) {
	spec := sidecarSpec(v1.RestartPolicyAlways, []string{"s1", "i", "s2"}, map[string]bool{"s1": true, "s2": true}, "a", "b")
	pod := &v1.Pod{Spec: *spec}
	pod.UID = testUID
	var ctrs []ctrd.Container
	for _, n := range []string{"s1", "i", "s2", "a", "b"} {
		ctrs = append(ctrs, ctrd.Container{ID: n, Name: n, State: ctrd.StateExited})
	}
	rt := &orderRuntime{slow: map[string]bool{"a": true, "b": true, "i": true}}
	w := NewWorker(Desired{Pod: pod}, nil, Env{Runtime: rt})
	g := 10 * time.Second
	if err := Teardown(context.Background(), w.withOrderedStop(pod, ctrs...), ctrd.RefOf(pod), ctrs, &g, nil); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(rt.order, " ")
	if !strings.HasSuffix(got, " s2 s1") || strings.Index(got, "s2") < 5 {
		t.Errorf("stop order %q; want a, b and i (in any order), then s2, then s1", got)
	}
}

// The worker's sidecar life against the fake runtime: the init container after a sidecar starts
// once the sidecar runs, not when it exits; a sidecar that exits is restarted under restartPolicy
// Never without failing the pod; once the app container finished, the pod is Succeeded and the
// sidecar is stopped and not started again.
func TestWorkerSidecarLife(t *testing.T) {
	pod := testPod(v1.RestartPolicyNever, "app")
	always := v1.ContainerRestartPolicyAlways
	pod.Spec.InitContainers = []v1.Container{
		{Name: "side", Image: "busybox:1.36", Command: []string{"sleep", "3600"}, RestartPolicy: &always},
		{Name: "init", Image: "busybox:1.36", Command: []string{"true"}},
	}
	f := newFakeRuntime()
	h := startWorker(t, pod, nil, f)
	h.waitFor("init running beside the sidecar", func(st *v1.PodStatus) bool {
		return isRunning(st, "side", 0) && isRunning(st, "init", 0)
	})
	f.exit(t, idOf("init", 0), 0)
	h.w.Nudge()
	h.waitFor("app running", func(st *v1.PodStatus) bool { return isRunning(st, "app", 0) && st.Phase == v1.PodRunning })

	f.exit(t, idOf("side", 0), 2)
	h.w.Nudge()
	st := h.waitFor("sidecar restarted", func(st *v1.PodStatus) bool { return isRunning(st, "side", 1) })
	if st.Phase != v1.PodRunning {
		t.Errorf("phase %s after the sidecar exited with 2; want Running", st.Phase)
	}
	if last := statusOf(st, "side").LastTerminationState.Terminated; last == nil || last.ExitCode != 2 {
		t.Errorf("sidecar's last state %s; want terminated with 2", describe(st))
	}

	f.exit(t, idOf("app", 0), 0)
	h.w.Nudge()
	st = h.waitFor("Succeeded with the sidecar stopped", func(st *v1.PodStatus) bool {
		return st.Phase == v1.PodSucceeded && statusOf(st, "side").State.Terminated != nil
	})
	h.resync()
	h.resync()
	if got := startedNames(f); got != "side,init,app,side" {
		t.Errorf("started %s; want side,init,app,side (the sidecar not started again once the pod is done)", got)
	}
	if n := len(f.callsOf("stop")); n == 0 {
		t.Errorf("the sidecar was never stopped")
	}
	if r := f.running(); len(r) != 0 {
		t.Errorf("running after the pod succeeded: %v", r)
	}
}
