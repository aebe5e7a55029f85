package pod

import (
	"fmt"
	"time"

	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/podspec"
	"github.com/mqlet/mqlet/core/event"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Ephemeral containers (kubectl debug), as kubelet runs them: one that appears in the spec is
// started once the sandbox exists, whether or not the init containers are done; it is never
// restarted (restart policy Never, whatever the pod's), never replaced for a spec change, not
// probed and has no hooks (admission refuses probes, lifecycle, ports and resources on it); its
// status is status.ephemeralContainerStatuses, outside the pod's phase and Ready condition; it
// stops with the pod, and when the pod is done. Adding one changes no other container's spec
// hash, so nothing else restarts. The runtime puts it in the pod's namespaces and, with a
// targetContainerName, in the target's PID namespace (ctrd's ephemeral.go).

// syncEphemeral starts each ephemeral container not started yet and records how each ended. In a
// pod that is done it starts nothing; stopSidecars stopped what ran (stopped says it did in this
// sync, when containerd's view of them is stale).
func (w *Worker) syncEphemeral(pod *v1.Pod, newest map[string]*ctrd.Container, stopped bool, reconcile func(*v1.Container, *ctrd.Container) time.Duration) time.Duration {
	var next time.Duration
	for _, c := range podspec.EphemeralContainers(&pod.Spec) {
		cur := newest[c.Name]
		if w.done && (cur == nil || stopped || cur.State != ctrd.StateExited) {
			continue
		}
		if d := reconcile(&c, cur); d > 0 && (next == 0 || d < next) {
			next = d
		}
	}
	return next
}

// ephemeralStatuses is status.ephemeralContainerStatuses: like a container's, never ready and
// with no started flag, as kubelet reports them (its probe manager sets those only for init and
// app containers).
func (w *Worker) ephemeralStatuses(pod *v1.Pod, newest map[string]*ctrd.Container, now time.Time) []v1.ContainerStatus {
	var out []v1.ContainerStatus
	for _, c := range podspec.EphemeralContainers(&pod.Spec) {
		cs := w.containerStatus(pod, &c, newest[c.Name], now)
		cs.Started, cs.Ready = nil, false
		out = append(out, cs)
	}
	return append(out, w.refusedEphemeral(pod, now)...)
}

// refusedEphemeral are the statuses of the ephemeral containers admission left out for the node's
// policy (admission's ephemeral_refusal.go): terminated, never run, with reason PolicyDenied and
// the policy's words, so kubectl debug stops waiting and says why. Each is also reported once as a
// PolicyDenied event.
func (w *Worker) refusedEphemeral(pod *v1.Pod, now time.Time) []v1.ContainerStatus {
	var out []v1.ContainerStatus
	for _, r := range admission.RefusedEphemeralContainers(pod) {
		rec := w.rec(r.Name)
		if rec.terminated == nil {
			rec.terminated = &v1.ContainerStateTerminated{ExitCode: 128, Reason: admission.ReasonPolicyDenied, Message: r.Message,
				StartedAt: metav1.NewTime(now), FinishedAt: metav1.NewTime(now)}
			if w.env.Emit != nil {
				e := event.Event{Time: now, Type: event.Warning, Reason: admission.ReasonPolicyDenied, Message: r.Message, Object: event.PodObject(pod)}
				e.Object.FieldPath = fmt.Sprintf("spec.ephemeralContainers{%s}", r.Name) // not in the admitted spec
				w.env.Emit(e)
			}
		}
		out = append(out, v1.ContainerStatus{Name: r.Name, Image: r.Image, State: v1.ContainerState{Terminated: rec.terminated}})
	}
	return out
}

// ranOnce marks an ephemeral container that ran in a sandbox that is gone (a reboot) as finished
// with an unknown end, as kubelet reports a container it cannot find: it does not run again.
func ranOnce(r *record, now time.Time) {
	if r.terminated != nil || r.startedID == "" {
		return
	}
	r.terminated = &v1.ContainerStateTerminated{ExitCode: 137, Reason: "ContainerStatusUnknown",
		Message:     "The container could not be located when the pod was restarted",
		ContainerID: ctrd.StatusContainerID(r.startedID), StartedAt: metav1.NewTime(r.startedAt), FinishedAt: metav1.NewTime(now)}
}
