package pod

import (
	"context"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/core/event"
	v1 "k8s.io/api/core/v1"
)

// ReasonFailedCreatePodSandBox is kubelet's event reason for a sandbox that could not be set up
// (the pod network among them); the pod waits and the set-up is retried.
const ReasonFailedCreatePodSandBox = "FailedCreatePodSandBox"

// sandboxRetryMax bounds the wait between set-up attempts of a sandbox. Most failures are the
// node's (a CNI plugin missing, a bad network configuration) and go away when the operator fixes
// it; kubelet retries those every few seconds, and the pod should start soon after the fix.
const sandboxRetryMax = 10 * time.Second

// sandboxRetry is the wait after the n-th consecutive failed set-up: 1 s doubling to sandboxRetryMax.
func sandboxRetry(n int) time.Duration {
	if n <= 1 {
		return time.Second
	}
	return min(time.Second<<min(n-1, 8), sandboxRetryMax)
}

// sandboxFailed makes a pod whose sandbox cannot be set up wait visibly rather than fail: its
// containers that never started show ContainerCreating (PodInitializing) with the reason as their
// message, and the first failure and every different one after it is an event.
func (w *Worker) sandboxFailed(ctx context.Context, pod *v1.Pod, observed []ctrd.Container, err error) time.Duration {
	msg := "failed to set up the pod sandbox: " + err.Error()
	if w.sbErr != msg {
		w.emit(pod, event.Warning, ReasonFailedCreatePodSandBox, msg)
	}
	w.sbErr = msg
	w.finishSync(pod, observed, newestAttempts(observed), time.Now())
	return sandboxRetry(w.sbFailures)
}

// podIPs is the pod's addresses from its sandbox (CNI), primary first; none before it is set up.
func (w *Worker) podIPs() []string {
	if w.sb == nil {
		return nil
	}
	return w.sb.PodIPs
}

// setPodIPs fills status.podIP and podIPs from the sandbox (a hostNetwork pod's are the host's).
func (w *Worker) setPodIPs(st *v1.PodStatus) {
	ips := w.podIPs()
	if len(ips) == 0 {
		return
	}
	st.PodIP, st.PodIPs = ips[0], make([]v1.PodIP, 0, len(ips))
	for _, ip := range ips {
		st.PodIPs = append(st.PodIPs, v1.PodIP{IP: ip})
	}
}
