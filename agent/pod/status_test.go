package pod

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func running(name string) v1.ContainerStatus {
	return v1.ContainerStatus{Name: name, Ready: true, State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}
}

func waiting(name, reason string) v1.ContainerStatus {
	return v1.ContainerStatus{Name: name, State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: reason}}}
}

func exited(name string, code int32) v1.ContainerStatus {
	return v1.ContainerStatus{Name: name, State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: code}}}
}

// backingOff is a container that ran, exited with code and now waits to be restarted.
func backingOff(name string, code int32) v1.ContainerStatus {
	s := waiting(name, "CrashLoopBackOff")
	s.LastTerminationState.Terminated = &v1.ContainerStateTerminated{ExitCode: code}
	return s
}

func specOf(policy v1.RestartPolicy, init []string, ctrs ...string) *v1.PodSpec {
	s := &v1.PodSpec{RestartPolicy: policy}
	for _, n := range init {
		s.InitContainers = append(s.InitContainers, v1.Container{Name: n})
	}
	for _, n := range ctrs {
		s.Containers = append(s.Containers, v1.Container{Name: n})
	}
	return s
}

func TestPhase(t *testing.T) {
	const (
		always    = v1.RestartPolicyAlways
		never     = v1.RestartPolicyNever
		onFailure = v1.RestartPolicyOnFailure
	)
	tests := []struct {
		name   string
		policy v1.RestartPolicy
		init   []v1.ContainerStatus
		ctrs   []v1.ContainerStatus
		want   v1.PodPhase
	}{
		{"all running", always, nil, []v1.ContainerStatus{running("a"), running("b")}, v1.PodRunning},
		{"one waiting, never ran", always, nil, []v1.ContainerStatus{running("a"), waiting("b", "ContainerCreating")}, v1.PodPending},
		{"all waiting", never, nil, []v1.ContainerStatus{waiting("a", "ErrImagePull"), waiting("b", "ContainerCreating")}, v1.PodPending},
		{"status with no state", always, nil, []v1.ContainerStatus{running("a"), {Name: "b"}}, v1.PodPending},
		{"never, all exit 0", never, nil, []v1.ContainerStatus{exited("a", 0), exited("b", 0)}, v1.PodSucceeded},
		{"never, one failed", never, nil, []v1.ContainerStatus{exited("a", 0), exited("b", 2)}, v1.PodFailed},
		{"never, one still running", never, nil, []v1.ContainerStatus{exited("a", 1), running("b")}, v1.PodRunning},
		{"always, all exit 0", always, nil, []v1.ContainerStatus{exited("a", 0), exited("b", 0)}, v1.PodRunning},
		{"always, terminated", always, nil, []v1.ContainerStatus{exited("a", 0), exited("b", 1)}, v1.PodRunning},
		{"always, backing off after a crash", always, nil, []v1.ContainerStatus{backingOff("a", 1), backingOff("b", 1)}, v1.PodRunning},
		{"onFailure, one failed", onFailure, nil, []v1.ContainerStatus{exited("a", 0), exited("b", 1)}, v1.PodRunning},
		{"onFailure, all succeeded", onFailure, nil, []v1.ContainerStatus{exited("a", 0), exited("b", 0)}, v1.PodSucceeded},
		{"init running", always, []v1.ContainerStatus{running("i")}, []v1.ContainerStatus{waiting("a", "PodInitializing")}, v1.PodPending},
		{"init waiting", never, []v1.ContainerStatus{waiting("i", "ErrImagePull")}, []v1.ContainerStatus{waiting("a", "PodInitializing")}, v1.PodPending},
		{"init failed, never", never, []v1.ContainerStatus{exited("i", 1)}, []v1.ContainerStatus{waiting("a", "PodInitializing")}, v1.PodFailed},
		{"second init failed, never", never, []v1.ContainerStatus{exited("i", 0), exited("j", 3)}, []v1.ContainerStatus{waiting("a", "PodInitializing")}, v1.PodFailed},
		{"init failed, onFailure retries", onFailure, []v1.ContainerStatus{exited("i", 1)}, []v1.ContainerStatus{waiting("a", "PodInitializing")}, v1.PodPending},
		{"init failed, always retries", always, []v1.ContainerStatus{backingOff("i", 1)}, []v1.ContainerStatus{waiting("a", "PodInitializing")}, v1.PodPending},
		{"init done, app running", never, []v1.ContainerStatus{exited("i", 0)}, []v1.ContainerStatus{running("a")}, v1.PodRunning},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var names, initNames []string
			for _, s := range tt.ctrs {
				names = append(names, s.Name)
			}
			for _, s := range tt.init {
				initNames = append(initNames, s.Name)
			}
			spec := specOf(tt.policy, initNames, names...)
			if got := Phase(spec, tt.init, tt.ctrs); got != tt.want {
				t.Errorf("Phase(policy %s) = %s, want %s", tt.policy, got, tt.want)
			}
		})
	}
}

func TestPhaseContainerWithoutStatus(t *testing.T) {
	spec := specOf(v1.RestartPolicyAlways, nil, "a", "b")
	if got := Phase(spec, nil, []v1.ContainerStatus{running("a")}); got != v1.PodPending {
		t.Errorf("Phase with container b not yet reported = %s, want Pending", got)
	}
}

func condition(cs []v1.PodCondition, typ v1.PodConditionType) v1.PodCondition {
	for _, c := range cs {
		if c.Type == typ {
			return c
		}
	}
	return v1.PodCondition{}
}

func TestConditions(t *testing.T) {
	spec := specOf(v1.RestartPolicyAlways, nil, "a", "b")
	t0 := metav1.NewTime(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	t2 := metav1.NewTime(t0.Add(2 * time.Minute))

	notReady := Conditions(spec, v1.PodRunning, nil, []v1.ContainerStatus{running("a"), waiting("b", "ContainerCreating")}, nil, t0)
	for _, typ := range []v1.PodConditionType{v1.PodReady, v1.ContainersReady} {
		c := condition(notReady, typ)
		if c.Status != v1.ConditionFalse || c.Reason != "ContainersNotReady" {
			t.Errorf("%s with container b waiting = %s/%q, want False/ContainersNotReady", typ, c.Status, c.Reason)
		}
	}
	if c := condition(notReady, v1.PodInitialized); c.Status != v1.ConditionTrue {
		t.Errorf("Initialized with no init containers = %s, want True", c.Status)
	}

	// Unchanged: the transition time stays where it was.
	again := Conditions(spec, v1.PodRunning, nil, []v1.ContainerStatus{running("a"), waiting("b", "ContainerCreating")}, notReady, t1)
	if c := condition(again, v1.PodReady); !c.LastTransitionTime.Equal(&t0) {
		t.Errorf("Ready unchanged: LastTransitionTime = %v, want the earlier %v", c.LastTransitionTime, t0)
	}

	// Flipped: the transition time is now.
	ready := Conditions(spec, v1.PodRunning, nil, []v1.ContainerStatus{running("a"), running("b")}, again, t2)
	c := condition(ready, v1.PodReady)
	if c.Status != v1.ConditionTrue {
		t.Fatalf("Ready with all containers ready = %s, want True", c.Status)
	}
	if !c.LastTransitionTime.Equal(&t2) {
		t.Errorf("Ready flipped to True: LastTransitionTime = %v, want %v", c.LastTransitionTime, t2)
	}
	if c := condition(ready, v1.PodScheduled); !c.LastTransitionTime.Equal(&t0) {
		t.Errorf("PodScheduled never changed: LastTransitionTime = %v, want %v", c.LastTransitionTime, t0)
	}
}

func TestConditionsInitAndCompleted(t *testing.T) {
	now := metav1.Now()
	spec := specOf(v1.RestartPolicyNever, []string{"i"}, "a")
	conds := Conditions(spec, v1.PodPending, []v1.ContainerStatus{running("i")}, []v1.ContainerStatus{waiting("a", "PodInitializing")}, nil, now)
	if c := condition(conds, v1.PodInitialized); c.Status != v1.ConditionFalse || c.Reason != "ContainersNotInitialized" ||
		c.Message != "containers with incomplete status: [i]" {
		t.Errorf("Initialized with init container running = %s/%q/%q, want False/ContainersNotInitialized/kubelet's message", c.Status, c.Reason, c.Message)
	}
	if c := condition(conds, v1.PodReady); c.Message != "containers with unready status: [a]" {
		t.Errorf("Ready's message = %q, want kubelet's naming the unready container", c.Message)
	}
	// Two init containers, the first done: the second (and one with no status yet) is incomplete.
	spec2 := specOf(v1.RestartPolicyAlways, []string{"i1", "i2", "i3"}, "a")
	conds = Conditions(spec2, v1.PodPending, []v1.ContainerStatus{exited("i1", 0), exited("i2", 1)}, nil, nil, now)
	if c := condition(conds, v1.PodInitialized); c.Message != "containers with incomplete status: [i2 i3]" {
		t.Errorf("Initialized message = %q, want the init containers that have not succeeded", c.Message)
	}
	// A succeeded pod's containers are terminated, not ready, and kubelet says why.
	conds = Conditions(spec, v1.PodSucceeded, []v1.ContainerStatus{exited("i", 0)}, []v1.ContainerStatus{exited("a", 0)}, nil, now)
	if c := condition(conds, v1.PodReady); c.Status != v1.ConditionFalse || c.Reason != "PodCompleted" {
		t.Errorf("Ready of a succeeded pod = %s/%q, want False/PodCompleted", c.Status, c.Reason)
	}
	if c := condition(conds, v1.PodInitialized); c.Status != v1.ConditionTrue {
		t.Errorf("Initialized after init exit 0 = %s, want True", c.Status)
	}
	if c := condition(conds, v1.PodReady); c.Message != "" {
		t.Errorf("Ready of a succeeded pod has message %q, want none (PodCompleted says it)", c.Message)
	}
}

func TestBackoffDelay(t *testing.T) {
	want := []time.Duration{0, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second,
		160 * time.Second, 5 * time.Minute, 5 * time.Minute}
	for crashes, w := range want {
		if got := backoffDelay(crashes); got != w {
			t.Errorf("backoffDelay(%d) = %s, want %s", crashes, got, w)
		}
	}
	if got := backoffDelay(1000); got != backoffMax {
		t.Errorf("backoffDelay(1000) = %s, want the cap %s", got, backoffMax)
	}
	if got := backoffDelay(-1); got != 0 {
		t.Errorf("backoffDelay(-1) = %s, want 0", got)
	}
}
