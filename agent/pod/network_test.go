package pod

import (
	"errors"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// While the sandbox cannot be set up (a CNI plugin is missing) the pod waits, not Failed, its
// container showing the reason; it starts once the sandbox can be made, and then reports the
// sandbox's addresses as podIP/podIPs, the primary first.
func TestWorkerWaitsForSandboxThenReportsPodIPs(t *testing.T) {
	pod := testPod(v1.RestartPolicyAlways, "a")
	f := newFakeRuntime()
	f.sandboxErr = errors.New(`pod network (CNI): CNI plugin "bridge" of network "mqlet" (/etc/cni/net.d/10-mqlet.conflist) not found in /usr/lib/cni`)
	f.podIPs = []string{"10.89.0.7", "fd00::7"}
	h := startWorker(t, pod, nil, f)
	st := h.waitFor("a waiting with the sandbox's reason", func(st *v1.PodStatus) bool {
		cs := statusOf(st, "a")
		return cs != nil && cs.State.Waiting != nil && strings.Contains(cs.State.Waiting.Message, `CNI plugin "bridge"`)
	})
	if st.Phase != v1.PodPending || statusOf(st, "a").State.Waiting.Reason != "ContainerCreating" || st.PodIP != "" {
		t.Errorf("while the sandbox fails: phase %s, a %+v, podIP %q; want Pending, ContainerCreating, none",
			st.Phase, statusOf(st, "a").State.Waiting, st.PodIP)
	}
	if n := len(f.callsOf("start")); n != 0 {
		t.Fatalf("%d container starts without a sandbox", n)
	}
	f.mu.Lock()
	f.sandboxErr = nil
	f.mu.Unlock()
	// No nudge: the worker retries on its own (the wait is bounded by waitLimit).
	st = h.waitFor("a running after the sandbox is fixed", func(st *v1.PodStatus) bool { return isRunning(st, "a", 0) })
	if st.PodIP != "10.89.0.7" || len(st.PodIPs) != 2 || st.PodIPs[0].IP != "10.89.0.7" || st.PodIPs[1].IP != "fd00::7" {
		t.Errorf("podIP %q podIPs %v; want the sandbox's, primary first", st.PodIP, st.PodIPs)
	}
	if st.HostIP != "192.0.2.10" {
		t.Errorf("hostIP %q", st.HostIP)
	}
}

func TestSandboxRetry(t *testing.T) {
	want := []time.Duration{time.Second, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	for n, w := range want {
		if got := sandboxRetry(n); got != w {
			t.Errorf("sandboxRetry(%d) = %s, want %s", n, got, w)
		}
	}
	if got := sandboxRetry(100); got != sandboxRetryMax {
		t.Errorf("sandboxRetry(100) = %s", got)
	}
}
