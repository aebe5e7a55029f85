package pod

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/ctrspec"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// After a reboot the pod's sandbox is new (its network namespace went with the old boot), so what
// the init containers set up is gone: the pod starts again from the first init container, with
// growing restart counts, and the app container waits for it.
func TestWorkerNewSandboxRerunsInit(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, "a")
	pod.Spec.InitContainers = []v1.Container{{Name: "i", Image: "busybox:1.36", Command: []string{"true"}}}
	f := newFakeRuntime() // no sandbox for the pod: EnsureSandbox reports it Created
	f.add(ctrd.Container{ID: idOf("i", 0), PodUID: testUID, Name: "i", Hash: ctrspec.SpecHash(pod, &pod.Spec.InitContainers[0]),
		State: ctrd.StateCreated, CreatedAt: time.Now()})
	f.add(ctrd.Container{ID: idOf("a", 0), PodUID: testUID, Name: "a", Hash: ctrspec.SpecHash(pod, &pod.Spec.Containers[0]),
		State: ctrd.StateCreated, CreatedAt: time.Now()})
	prev := &v1.PodStatus{
		InitContainerStatuses: []v1.ContainerStatus{{Name: "i", ContainerID: ctrd.StatusContainerID(idOf("i", 0)),
			State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", ContainerID: ctrd.StatusContainerID(idOf("i", 0))}}}},
		ContainerStatuses: []v1.ContainerStatus{{Name: "a", ContainerID: ctrd.StatusContainerID(idOf("a", 0)),
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}},
	}
	h := startWorker(t, pod, prev, f)
	h.waitFor("init i running again", func(st *v1.PodStatus) bool { return isRunning(st, "i", 1) })
	if got := startedNames(f); got != "i" {
		t.Fatalf("started with a new sandbox: %s, want only the init container i first", got)
	}
	f.exit(t, idOf("i", 1), 0)
	h.w.Nudge()
	h.waitFor("a running after i", func(st *v1.PodStatus) bool { return isRunning(st, "a", 1) })
	starts := f.callsOf("start")
	if len(starts) != 2 || starts[0].name != "i" || starts[0].restarts != 1 || starts[1].name != "a" || starts[1].restarts != 1 {
		t.Errorf("starts = %v, want i attempt 1 then a attempt 1", starts)
	}
	for _, id := range []string{idOf("i", 0), idOf("a", 0)} {
		if left, _ := f.ListContainers(context.Background(), testUID); containsID(left, id) {
			t.Errorf("container %s of the old sandbox was not removed", id)
		}
	}
}

func containsID(cs []ctrd.Container, id string) bool {
	for _, c := range cs {
		if c.ID == id {
			return true
		}
	}
	return false
}

// The sandbox is set up once per pod instance, not at every sync, and again for a new spec.
func TestWorkerSandboxOncePerSpec(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, "a")
	f := newFakeRuntime()
	h := startWorker(t, pod, nil, f)
	h.waitFor("a running", func(st *v1.PodStatus) bool { return isRunning(st, "a", 0) })
	h.resync()
	h.resync()
	f.mu.Lock()
	n := f.ensured
	f.mu.Unlock()
	if n != 1 {
		t.Errorf("EnsureSandbox calls over three syncs = %d, want 1", n)
	}
	changed := pod.DeepCopy()
	changed.Spec.Volumes = []v1.Volume{{Name: "v", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
	h.w.Update(Desired{Pod: changed})
	h.resync()
	f.mu.Lock()
	n = f.ensured
	f.mu.Unlock()
	if n != 2 {
		t.Errorf("EnsureSandbox calls after a spec update = %d, want 2", n)
	}
}

// Teardown gives each container its own pod's grace when none is given (an orphan), raises 0 to
// kubelet's 2 s, and removes the sandbox only once every container is gone.
func TestTeardownGrace(t *testing.T) {
	ref := ctrd.PodRef{UID: types.UID(testUID)}
	ctrs := []ctrd.Container{
		{ID: "c7", PodUID: testUID, Name: "seven", Grace: 7 * time.Second},
		{ID: "c0", PodUID: testUID, Name: "zero", Grace: 0},
	}
	for _, tt := range []struct {
		name  string
		grace *time.Duration
		want  map[string]time.Duration
	}{
		{"own grace", nil, map[string]time.Duration{"c7": 7 * time.Second, "c0": MinGrace}},
		{"given 0", ptrTo(time.Duration(0)), map[string]time.Duration{"c7": MinGrace, "c0": MinGrace}},
		{"given 5s", ptrTo(5 * time.Second), map[string]time.Duration{"c7": 5 * time.Second, "c0": 5 * time.Second}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeRuntime()
			for _, c := range ctrs {
				c.State = ctrd.StateRunning
				f.add(c)
			}
			if err := Teardown(context.Background(), f, ref, ctrs, tt.grace, slog.New(slog.DiscardHandler)); err != nil {
				t.Fatalf("Teardown: %v", err)
			}
			stops := f.callsOf("stop")
			if len(stops) != len(tt.want) {
				t.Fatalf("stops = %v, want one per container", stops)
			}
			for _, s := range stops {
				if s.grace != tt.want[s.id] {
					t.Errorf("StopContainer(%s) grace = %s, want %s", s.id, s.grace, tt.want[s.id])
				}
			}
			if n := len(f.callsOf("remove")); n != len(ctrs) || f.podFiles != 1 {
				t.Errorf("removes = %d, RemoveSandbox calls = %d; want %d and 1", n, f.podFiles, len(ctrs))
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

// failingStop is a runtime whose StopContainer fails for one container.
type failingStop struct {
	*fakeRuntime
	id string
}

func (f failingStop) StopContainer(ctx context.Context, id string, grace time.Duration) error {
	if id == f.id {
		return errors.New("shim not answering")
	}
	return f.fakeRuntime.StopContainer(ctx, id, grace)
}

// A container that could not be stopped may still use the sandbox: it stays, and the error names
// the container.
func TestTeardownKeepsSandboxWhileAContainerRuns(t *testing.T) {
	f := failingStop{newFakeRuntime(), "c1"}
	ctrs := []ctrd.Container{{ID: "c1", Name: "one", PodUID: testUID}, {ID: "c2", Name: "two", PodUID: testUID}}
	err := Teardown(context.Background(), f, ctrd.PodRef{UID: types.UID(testUID)}, ctrs, nil, slog.New(slog.DiscardHandler))
	if err == nil || errors.Is(err, ErrSandboxLeft) {
		t.Fatalf("Teardown with a failing stop: err = %v, want the stop error", err)
	}
	if f.podFiles != 0 {
		t.Errorf("RemoveSandbox called %d times while container c1 may still run", f.podFiles)
	}
}
