// Package pod holds the per-pod worker that drives one pod's containers towards its spec, and the
// pure functions that turn what it sees into a Kubernetes PodStatus.
package pod

import (
	"fmt"
	"time"

	"github.com/mqlet/mqlet/agent/podspec"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Phase follows kubelet's getPhase: which containers are waiting, running, or terminated, and
// whether the restart policy will start the terminated ones again. Sidecars decide nothing: the
// app containers waiting for them keep the pod Pending, and a pod whose app containers finished
// is Succeeded or Failed whatever its sidecars do.
func Phase(spec *v1.PodSpec, init []v1.ContainerStatus, ctrs []v1.ContainerStatus) v1.PodPhase {
	for _, s := range init {
		if podspec.Sidecar(spec, s.Name) != nil {
			continue
		}
		switch {
		case s.State.Terminated != nil && s.State.Terminated.ExitCode == 0:
			continue
		case s.State.Terminated != nil && spec.RestartPolicy == v1.RestartPolicyNever:
			return v1.PodFailed
		default:
			return v1.PodPending
		}
	}
	var running, waiting, stopped, succeeded, unknown int
	for _, s := range ctrs {
		switch {
		case s.State.Running != nil:
			running++
		case s.State.Terminated != nil:
			stopped++
			if s.State.Terminated.ExitCode == 0 {
				succeeded++
			}
		case s.State.Waiting != nil:
			if s.LastTerminationState.Terminated != nil {
				stopped++ // waiting to restart after having run
			} else {
				waiting++
			}
		default:
			unknown++
		}
	}
	n := len(spec.Containers)
	switch {
	case waiting > 0 || unknown > 0 || len(ctrs) < n:
		return v1.PodPending
	case running > 0:
		return v1.PodRunning
	case running == 0 && stopped > 0:
		if spec.RestartPolicy == v1.RestartPolicyAlways {
			return v1.PodRunning // a restart is on its way
		}
		if stopped == succeeded {
			return v1.PodSucceeded
		}
		if spec.RestartPolicy == v1.RestartPolicyNever {
			return v1.PodFailed
		}
		return v1.PodRunning // OnFailure: the failed ones restart
	}
	return v1.PodPending
}

// Conditions are kubelet's pod conditions; Ready and ContainersReady follow the ready of the app
// containers and the sidecars (running, started, and passing their readiness probes). A condition
// that is False says which containers hold it, in kubelet's words: "containers with incomplete
// status: [...]" for init containers that have not succeeded and sidecars not started, "containers
// with unready status: [...]" for the others. Once an app container ran the pod stays initialized,
// whatever its sidecars do since (kubelet's HasAnyRegularContainerStarted).
func Conditions(spec *v1.PodSpec, phase v1.PodPhase, init, ctrs []v1.ContainerStatus, prev []v1.PodCondition, now metav1.Time) []v1.PodCondition {
	initDone := map[string]bool{}
	for _, s := range init {
		if podspec.Sidecar(spec, s.Name) != nil {
			initDone[s.Name] = s.State.Running != nil && s.Started != nil && *s.Started
			continue
		}
		initDone[s.Name] = s.State.Terminated != nil && s.State.Terminated.ExitCode == 0
	}
	appsRan := false
	for _, s := range ctrs {
		appsRan = appsRan || s.State.Running != nil || s.State.Terminated != nil
	}
	var incomplete []string
	for _, c := range spec.InitContainers {
		if !initDone[c.Name] && !appsRan {
			incomplete = append(incomplete, c.Name)
		}
	}
	readyOf := map[string]bool{}
	for _, s := range init {
		readyOf[s.Name] = s.Ready
	}
	for _, s := range ctrs {
		readyOf[s.Name] = s.Ready
	}
	var unready []string
	for i := range spec.InitContainers {
		if c := &spec.InitContainers[i]; podspec.IsSidecar(c) && !readyOf[c.Name] {
			unready = append(unready, c.Name)
		}
	}
	for _, c := range spec.Containers {
		if !readyOf[c.Name] {
			unready = append(unready, c.Name)
		}
	}
	ready := len(unready) == 0
	if phase == v1.PodSucceeded || phase == v1.PodFailed {
		ready = false
	}
	sandbox := phase != v1.PodSucceeded && phase != v1.PodFailed
	conds := []v1.PodCondition{
		cond(v1.PodReadyToStartContainers, sandbox, "", prev, now),
		cond(v1.PodInitialized, len(incomplete) == 0, "ContainersNotInitialized", prev, now),
		cond(v1.PodReady, ready, "ContainersNotReady", prev, now),
		cond(v1.ContainersReady, ready, "ContainersNotReady", prev, now),
		cond(v1.PodScheduled, true, "", prev, now),
	}
	if len(incomplete) > 0 {
		conds[1].Message = fmt.Sprintf("containers with incomplete status: %v", incomplete)
	}
	if !ready && len(unready) > 0 {
		conds[2].Message = fmt.Sprintf("containers with unready status: %v", unready)
		conds[3].Message = conds[2].Message
	}
	if phase == v1.PodSucceeded {
		conds[2].Reason, conds[3].Reason = "PodCompleted", "PodCompleted"
		conds[2].Message, conds[3].Message = "", ""
		conds[1].Reason, conds[1].Message = "PodCompleted", ""
	}
	return conds
}

// cond keeps the transition time of an unchanged condition, so that `describe` tells since when.
func cond(t v1.PodConditionType, ok bool, reason string, prev []v1.PodCondition, now metav1.Time) v1.PodCondition {
	c := v1.PodCondition{Type: t, Status: v1.ConditionFalse, LastTransitionTime: now}
	if ok {
		c.Status = v1.ConditionTrue
	} else {
		c.Reason = reason
	}
	for _, p := range prev {
		if p.Type == t && p.Status == c.Status {
			c.LastTransitionTime = p.LastTransitionTime
		}
	}
	return c
}

// backoffMessage is kubelet's CrashLoopBackOff wording.
func backoffMessage(d time.Duration, pod *v1.Pod, name string) string {
	return fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", d, name, pod.Name, pod.Namespace, pod.UID)
}
