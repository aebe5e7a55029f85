package pod

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	v1 "k8s.io/api/core/v1"
)

// execRuntime is the fake runtime with Exec: each command's first word is recorded, in the order of
// the runtime's calls, and commands named in fail exit 1.
type execRuntime struct {
	*fakeRuntime
	fail map[string]bool
}

func (e execRuntime) Exec(_ context.Context, id string, cmd []string, _ time.Duration) (ctrd.ExecResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls = append(e.calls, call{op: "exec " + cmd[0], id: id})
	if e.fail[cmd[0]] {
		return ctrd.ExecResult{ExitCode: 1, Output: []byte("no")}, nil
	}
	return ctrd.ExecResult{}, nil
}

func withHooks(pod *v1.Pod, postStart, preStop string) *v1.Pod {
	pod.Spec.Containers[0].Lifecycle = &v1.Lifecycle{
		PostStart: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{postStart}}},
		PreStop:   &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{preStop}}},
	}
	return pod
}

func opsOf(calls []call) []string {
	var out []string
	for _, c := range calls {
		if c.op != "remove" {
			out = append(out, c.op)
		}
	}
	return out
}

// The container hook list at work: postStart runs right after the start, preStop before the stop
// signal of a deletion, each once, in that order around the runtime's calls.
func TestContainerHooksRunAroundStartAndStop(t *testing.T) {
	f := newFakeRuntime()
	ev := &eventLog{}
	h := startWorkerOn(t, withHooks(testPod(v1.RestartPolicyAlways, "a"), "post", "pre"), nil, execRuntime{fakeRuntime: f}, f, ev.emit)
	h.waitFor("a running", func(st *v1.PodStatus) bool { return isRunning(st, "a", 0) })
	h.w.Delete()
	select {
	case <-h.done:
	case <-time.After(waitLimit):
		t.Fatalf("worker did not end after Delete; calls %v", f.allCalls())
	}
	if got, want := opsOf(f.allCalls()), []string{"start", "exec post", "exec pre", "stop"}; !slices.Equal(got, want) {
		t.Errorf("runtime calls %v, want %v", got, want)
	}
	if n := len(ev.with("FailedPostStartHook")) + len(ev.with("FailedPreStopHook")); n != 0 {
		t.Errorf("%d events of a hook failing, want none", n)
	}
}

// A postStart handler that fails gets its event and its container killed (its preStop first), and
// the exit goes the way of the restart policy; a failing preStop gets its event and the stop
// goes on.
func TestContainerHooksFailing(t *testing.T) {
	f := newFakeRuntime()
	ev := &eventLog{}
	rt := execRuntime{fakeRuntime: f, fail: map[string]bool{"post": true, "pre": true}}
	h := startWorkerOn(t, withHooks(testPod(v1.RestartPolicyNever, "a"), "post", "pre"), nil, rt, f, ev.emit)
	h.waitFor("a stopped after its failed postStart", func(st *v1.PodStatus) bool {
		cs := statusOf(st, "a")
		return cs != nil && cs.State.Running == nil && len(f.callsOf("stop")) > 0
	})
	if got, want := opsOf(f.allCalls()), []string{"start", "exec post", "exec pre", "stop"}; !slices.Equal(got, want) {
		t.Errorf("runtime calls %v, want %v", got, want)
	}
	for _, want := range []string{"FailedPostStartHook", "Killing", "FailedPreStopHook"} {
		ev.waitFor(t, want, 1)
	}
	if got := len(f.callsOf("start")); got != 1 {
		t.Errorf("%d starts of a restartPolicy Never container, want 1", got)
	}
}
