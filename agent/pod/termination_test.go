package pod

import (
	"strings"
	"sync"
	"testing"

	"github.com/mqlet/mqlet/agent/ctrd"
	v1 "k8s.io/api/core/v1"
)

// msgRuntime is the fake runtime with termination messages: what each attempt "wrote".
type msgRuntime struct {
	*fakeRuntime
	mu    sync.Mutex
	msgs  map[string]string // container ID -> message
	reads map[string]int
}

func (m *msgRuntime) TerminationMessage(c ctrd.Container, spec *v1.Container) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads[c.ID]++
	return m.msgs[c.ID] + "|" + string(spec.TerminationMessagePolicy)
}

func startMsgWorker(t *testing.T, pod *v1.Pod, rt *msgRuntime) *harness {
	t.Helper()
	return startWorkerOn(t, pod, nil, rt, rt.fakeRuntime, nil)
}

func TestTerminationMessageInStateAndLastState(t *testing.T) {
	rt := &msgRuntime{fakeRuntime: newFakeRuntime(), msgs: map[string]string{}, reads: map[string]int{}}
	pod := testPod(v1.RestartPolicyAlways, "a")
	pod.Spec.Containers[0].TerminationMessagePolicy = v1.TerminationMessageFallbackToLogsOnError
	h := startMsgWorker(t, pod, rt)
	h.waitFor("a running", func(st *v1.PodStatus) bool { return isRunning(st, "a", 0) })
	rt.mu.Lock()
	rt.msgs[idOf("a", 0)] = "bye"
	rt.mu.Unlock()
	rt.exit(t, idOf("a", 0), 1)
	h.w.Nudge()
	st := h.waitFor("a's exit with its message", func(st *v1.PodStatus) bool {
		cs := statusOf(st, "a")
		return cs != nil && cs.LastTerminationState.Terminated != nil
	})
	want := "bye|FallbackToLogsOnError"
	if got := statusOf(st, "a").LastTerminationState.Terminated.Message; got != want {
		t.Errorf("lastState.terminated.message = %q, want %q", got, want)
	}
}

func TestTerminationMessagesShareThePodBound(t *testing.T) {
	rt := &msgRuntime{fakeRuntime: newFakeRuntime(), msgs: map[string]string{}, reads: map[string]int{}}
	pod := testPod(v1.RestartPolicyNever, "a", "b", "c", "d")
	h := startMsgWorker(t, pod, rt)
	h.waitFor("phase Running", phaseIs(v1.PodRunning))
	rt.mu.Lock()
	rt.msgs[idOf("a", 0)] = strings.Repeat("x", ctrd.MaxTerminationMessage)
	rt.msgs[idOf("b", 0)] = "short"
	rt.mu.Unlock()
	rt.exit(t, idOf("a", 0), 2)
	rt.exit(t, idOf("b", 0), 0)
	h.w.Nudge()
	st := h.waitFor("a and b terminated", func(st *v1.PodStatus) bool {
		return statusOf(st, "a").State.Terminated != nil && statusOf(st, "b").State.Terminated != nil
	})
	// 12 KiB over 4 containers: 3 KiB each, as kubelet's status manager cuts them.
	if got := len(statusOf(st, "a").State.Terminated.Message); got != 3<<10 {
		t.Errorf("a's message is %d bytes, want 3072", got)
	}
	if got := statusOf(st, "b").State.Terminated.Message; got != "short|" {
		t.Errorf("b's message = %q", got)
	}
	// The exited containers stay (restartPolicy Never) and every sync reports them: their
	// messages are read once all the same.
	h.resync()
	h.resync()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if n := rt.reads[idOf("a", 0)]; n != 1 {
		t.Errorf("the message of one exit was read %d times, want once", n)
	}
}
