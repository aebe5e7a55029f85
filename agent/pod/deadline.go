package pod

import (
	"time"

	"github.com/mqlet/mqlet/core/event"
	v1 "k8s.io/api/core/v1"
)

// ReasonDeadlineExceeded and deadlineMessage are kubelet's words for a pod failed by its
// spec.activeDeadlineSeconds.
const (
	ReasonDeadlineExceeded = event.ReasonDeadlineExceeded
	deadlineMessage        = "Pod was active on the node longer than the specified deadline"
)

// activeDeadline enforces spec.activeDeadlineSeconds after each sync and returns when the worker
// must look again, the earlier of next (0: no wish) and the deadline. The deadline counts from
// status.startTime, which a restarted agent reads back from the stored status, so a restart does
// not give the pod a fresh allowance. The worker's own timer does the waiting: no loop over all
// pods. A pod past its deadline is failed like an evicted one (Fail): its containers are stopped
// and it stays Failed with reason DeadlineExceeded, as kubelet's activeDeadlineHandler does. A
// pod that already finished, failed or is being deleted is left alone.
func (w *Worker) activeDeadline(pod *v1.Pod, next time.Duration) time.Duration {
	secs := pod.Spec.ActiveDeadlineSeconds
	if secs == nil {
		return next
	}
	w.mu.Lock()
	start, phase, done := w.status.StartTime, w.status.Phase, w.life.Phase != Syncing
	w.mu.Unlock()
	if done || start == nil || phase == v1.PodSucceeded || phase == v1.PodFailed {
		return next
	}
	left := time.Until(start.Time.Add(time.Duration(*secs) * time.Second))
	if left > 0 {
		if next == 0 || left < next {
			return left
		}
		return next
	}
	w.env.Log.Info("pod exceeded its activeDeadlineSeconds; failing it", "activeDeadlineSeconds", *secs, "startTime", start.Time)
	w.emit(pod, event.Normal, event.ReasonDeadlineExceeded, deadlineMessage)
	w.Fail(Failure{Reason: ReasonDeadlineExceeded, Message: deadlineMessage})
	return next
}
