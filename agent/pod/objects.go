package pod

import (
	"context"
	"errors"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/core/event"
	v1 "k8s.io/api/core/v1"
)

// ReasonFailedMount is kubelet's event reason for a volume that could not be set up; the runtime
// uses it as the waiting reason too.
const ReasonFailedMount = ctrd.ReasonFailedMount

// VolumeRefresher is a runtime whose configMap, secret, downwardAPI and projected volumes follow
// their sources while containers run (*ctrd.Runtime). RefreshVolumes rewrites the pod's
// volumes that are set up already and returns what failed, one error per volume.
type VolumeRefresher interface {
	RefreshVolumes(ctx context.Context, pod *v1.Pod) []error
}

// ObjectsChanged says a ConfigMap or Secret the pod uses was added, changed or removed. The worker
// then tries again at once a container that waits for one (CreateContainerConfigError) or whose
// pull failed (an imagePullSecret), instead of after its back-off, and rewrites the pod's mounted volumes in place. Env of running containers
// stays as it was started, as with kubelet.
func (w *Worker) ObjectsChanged() {
	w.mu.Lock()
	w.objects = true
	w.mu.Unlock()
	w.Nudge()
}

// objectsChanged runs on the worker's goroutine before a sync (loop-owned records).
func (w *Worker) objectsChanged(ctx context.Context, pod *v1.Pod) {
	for name, r := range w.recs {
		// A changed imagePullSecret may be what a failing pull was missing.
		if r.failure != nil && (r.failure.Reason == "CreateContainerConfigError" || r.failure.Reason == "ErrImagePull") {
			if !r.retryAt.IsZero() {
				w.env.Log.Debug("an object the pod uses changed; retrying the container at once", "container", name, "reason", r.failure.Reason)
			}
			r.retryAt = time.Time{}
		}
	}
	vr, ok := w.env.Runtime.(VolumeRefresher)
	if !ok {
		return
	}
	for _, err := range vr.RefreshVolumes(ctx, pod) {
		w.env.Log.Warn("volume not updated", "err", err)
		w.emit(pod, event.Warning, ReasonFailedMount, err.Error())
	}
}

// reportMountFailure emits FailedMount when a container could not start because one of its
// volumes could not be set up.
func (w *Worker) reportMountFailure(pod *v1.Pod, se *ctrd.StartError) {
	var me *ctrd.MountError
	if errors.As(se.Err, &me) {
		w.emit(pod, event.Warning, ReasonFailedMount, me.Error())
	}
}
