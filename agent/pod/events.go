package pod

import (
	"context"
	"fmt"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/podspec"
	"github.com/mqlet/mqlet/core/event"
	v1 "k8s.io/api/core/v1"
)

// Events about a pod's containers, with kubelet's reasons and wording. Each is one call from the
// place in the worker where the thing happens; the recorder behind Env.Emit deduplicates them.

// emitContainer sends an event about container name of pod, naming it by field path as kubelet
// does ("spec.containers{web}", "spec.initContainers{setup}").
func (w *Worker) emitContainer(pod *v1.Pod, name string, typ event.Type, reason, message string) {
	if w.env.Emit == nil {
		return
	}
	e := event.Event{Time: time.Now(), Type: typ, Reason: reason, Message: message, Object: event.PodObject(pod)}
	e.Object.FieldPath = fieldPath(pod, name)
	w.env.Emit(e)
}

// fieldPath is kubelet's reference to a container within its pod.
func fieldPath(pod *v1.Pod, name string) string {
	if isInit(pod, name) {
		return fmt.Sprintf("spec.initContainers{%s}", name)
	}
	if podspec.Ephemeral(&pod.Spec, name) != nil {
		return fmt.Sprintf("spec.ephemeralContainers{%s}", name)
	}
	return fmt.Sprintf("spec.containers{%s}", name)
}

// notifying returns ctx carrying a ctrd.Notifier that turns what StartContainer does (pull,
// create, start) into events about container c.
func (w *Worker) notifying(ctx context.Context, pod *v1.Pod, c *v1.Container) context.Context {
	return ctrd.WithNotifier(ctx, func(typ event.Type, reason, message string) {
		w.emitContainer(pod, c.Name, typ, reason, message)
	})
}

// startFailed reports a container that could not be started: kubelet's "Error: ..." event, which
// names the waiting reason for image errors and the cause for the others.
func (w *Worker) startFailed(pod *v1.Pod, c *v1.Container, se *ctrd.StartError) {
	msg := "Error: " + se.Reason
	switch se.Reason {
	case "ErrImagePull", "ErrImageNeverPull", "InvalidImageName":
	default:
		msg = "Error: " + se.Err.Error()
	}
	w.emitContainer(pod, c.Name, event.Warning, event.ReasonFailed, msg)
}

// waitingToRetry reports a container that waits out a back-off before its next start attempt:
// after a failed pull (ImagePullBackOff) or after it exited (CrashLoopBackOff).
func (w *Worker) waitingToRetry(pod *v1.Pod, c *v1.Container, r *record) {
	if r.failure != nil {
		if r.failure.Reason == "ErrImagePull" {
			w.emitContainer(pod, c.Name, event.Normal, event.ReasonBackOff, fmt.Sprintf("Back-off pulling image %q", c.Image))
			w.emitContainer(pod, c.Name, event.Warning, event.ReasonFailed, "Error: ImagePullBackOff")
		}
		return
	}
	w.emitContainer(pod, c.Name, event.Warning, event.ReasonBackOff,
		fmt.Sprintf("Back-off restarting failed container %s in pod %s_%s(%s)", c.Name, pod.Name, pod.Namespace, pod.UID))
}

// killing reports that the node stops a running container (kubelet's Killing).
func (w *Worker) killing(pod *v1.Pod, cs ...ctrd.Container) {
	for _, c := range cs {
		if c.State == ctrd.StateRunning {
			w.emitContainer(pod, c.Name, event.Normal, event.ReasonKilling, "Stopping container "+c.Name)
		}
	}
}
