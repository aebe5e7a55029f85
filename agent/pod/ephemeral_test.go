package pod

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// withDebugger is pod with an ephemeral container added, as the API's ephemeralcontainers
// subresource (kubectl debug --target) makes the new version: a copy, the rest unchanged.
func withDebugger(pod *v1.Pod, target string) *v1.Pod {
	p := pod.DeepCopy()
	p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, v1.EphemeralContainer{TargetContainerName: target,
		EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "debugger", Image: "busybox:1.36", Command: []string{"sleep", "3600"}}})
	return p
}

func ephemeralStatus(st *v1.PodStatus, name string) *v1.ContainerStatus {
	for i := range st.EphemeralContainerStatuses {
		if st.EphemeralContainerStatuses[i].Name == name {
			return &st.EphemeralContainerStatuses[i]
		}
	}
	return nil
}

func starts(f *fakeRuntime, name string) int {
	n := 0
	for _, c := range f.callsOf("start") {
		if c.name == name {
			n++
		}
	}
	return n
}

// An ephemeral container added to a running pod starts once, beside the app container, which is
// neither stopped nor restarted; it is reported in ephemeralContainerStatuses (never ready, no
// started flag) and not in the phase or the Ready condition; after it exits it is not started
// again, under the pod's restartPolicy Always, nor by a restarted agent.
func TestEphemeralContainerRunsOnce(t *testing.T) {
	f := newFakeRuntime()
	pod := testPod(v1.RestartPolicyAlways, "app")
	h := startWorker(t, pod, nil, f)
	h.waitFor("app running", func(st *v1.PodStatus) bool { return isRunning(st, "app", 0) })

	h.w.Update(Desired{Pod: withDebugger(pod, "app"), Generation: 2})
	st := h.waitFor("debugger running", func(st *v1.PodStatus) bool {
		cs := ephemeralStatus(st, "debugger")
		return cs != nil && cs.State.Running != nil
	})
	cs := ephemeralStatus(st, "debugger")
	if cs.Ready || cs.Started != nil || cs.RestartCount != 0 || cs.Image != "busybox:1.36" || cs.ContainerID != "containerd://"+idOf("debugger", 0) {
		t.Errorf("debugger status %+v: want not ready, no started flag, no restarts, its image and container id", cs)
	}
	if statusOf(st, "debugger") != nil {
		t.Errorf("debugger listed among the init or app container statuses: %s", describe(st))
	}
	if st.Phase != v1.PodRunning || condition(st.Conditions, v1.PodReady).Status != v1.ConditionTrue {
		t.Errorf("phase %s, Ready %s with a running debugger; want Running and Ready as before", st.Phase, condition(st.Conditions, v1.PodReady).Status)
	}
	if n := starts(f, "app"); n != 1 || len(f.callsOf("stop")) != 0 {
		t.Fatalf("app started %d times, stops %v: adding an ephemeral container disturbed it", n, f.callsOf("stop"))
	}

	f.exit(t, idOf("debugger", 0), 1)
	h.w.Nudge()
	st = h.waitFor("debugger terminated", func(st *v1.PodStatus) bool {
		cs := ephemeralStatus(st, "debugger")
		return cs != nil && cs.State.Terminated != nil
	})
	if t1 := ephemeralStatus(st, "debugger").State.Terminated; t1.ExitCode != 1 || t1.Reason != "Error" {
		t.Errorf("debugger terminated %+v; want exit 1, Error", t1)
	}
	h.resync()
	h.resync()
	if n := starts(f, "debugger"); n != 1 {
		t.Fatalf("debugger started %d times; an ephemeral container runs once whatever the pod's restartPolicy", n)
	}
	if st := h.waitFor("phase Running", phaseIs(v1.PodRunning)); condition(st.Conditions, v1.PodReady).Status != v1.ConditionTrue {
		t.Errorf("Ready %s after the debugger exited 1; want True (it is no part of readiness)", condition(st.Conditions, v1.PodReady).Status)
	}

	// An agent restart, with the exited debugger's record collected meanwhile: the stored status
	// says it ran, so it is not started again.
	prev := h.waitFor("any", func(*v1.PodStatus) bool { return true })
	f2 := newFakeRuntime()
	f2.intact(testUID)
	app := *f.ctrs[idOf("app", 0)]
	f2.add(app)
	h2 := startWorker(t, withDebugger(pod, "app"), prev, f2)
	h2.waitFor("app running", func(st *v1.PodStatus) bool { return isRunning(st, "app", 0) })
	h2.resync()
	if n := starts(f2, "debugger"); n != 0 {
		t.Errorf("a restarted agent started the finished debugger again (%d starts)", n)
	}
	if cs := ephemeralStatus(h2.waitFor("any", func(*v1.PodStatus) bool { return true }), "debugger"); cs == nil || cs.State.Terminated == nil || cs.State.Terminated.ExitCode != 1 {
		t.Errorf("debugger status after an agent restart %+v; want its exit kept", cs)
	}
}

// An ephemeral container starts while the init containers still run (kubelet starts them once the
// sandbox exists), and a pod whose app containers finished is Succeeded with the debugger still
// running, which is then stopped.
func TestEphemeralContainerBeforeInitAndInFinishedPod(t *testing.T) {
	f := newFakeRuntime()
	pod := testPod(v1.RestartPolicyNever, "app")
	pod.Spec.InitContainers = []v1.Container{{Name: "setup", Image: "busybox:1.36", Command: []string{"sleep", "3600"}}}
	h := startWorker(t, withDebugger(pod, "app"), nil, f)
	h.waitFor("setup running and debugger running", func(st *v1.PodStatus) bool {
		cs := ephemeralStatus(st, "debugger")
		return isRunning(st, "setup", 0) && cs != nil && cs.State.Running != nil
	})
	if n := starts(f, "app"); n != 0 {
		t.Fatalf("app started %d times before its init container finished", n)
	}
	f.exit(t, idOf("setup", 0), 0)
	h.w.Nudge()
	h.waitFor("app running", func(st *v1.PodStatus) bool { return isRunning(st, "app", 0) })
	f.exit(t, idOf("app", 0), 0)
	h.w.Nudge()
	h.waitFor("phase Succeeded", phaseIs(v1.PodSucceeded))
	f.waitCalls(t, "stop", idOf("debugger", 0), 1)
	h.resync()
	if slices.Contains(f.running(), idOf("debugger", 0)) {
		t.Errorf("debugger still running in a finished pod")
	}
	if n := starts(f, "debugger"); n != 1 {
		t.Errorf("debugger started %d times; want once", n)
	}
}
