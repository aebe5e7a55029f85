package pod

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/podspec"
	"github.com/mqlet/mqlet/agent/probe"
	"github.com/mqlet/mqlet/core/event"
	v1 "k8s.io/api/core/v1"
)

// A container hook is one thing done around a container's run besides starting and stopping it: its
// lifecycle handlers and its probes. Like the sandbox's hooks (ctrd.Runtime's sandboxHooks),
// each has a Name and implements the phases it needs, found by type assertion, and gets what it
// uses when it is made rather than the whole worker: a new one (a readiness gate, a device
// health check) is a new hook in containerHooks, not an edit of the sync.
type containerHook interface{ Name() string }

// attempt is what a container hook acts on: one attempt of one container of the pod, and how
// probes and handlers reach it.
type attempt struct {
	pod    *v1.Pod
	spec   *v1.Container
	cur    ctrd.Container
	target probe.Target
}

// poststarter runs right after an attempt started; the sync waits for it, as kubelet's start waits
// for postStart. ctx ends when the pod starts terminating. An error kills the attempt, whose exit
// then goes the way of the pod's restart policy.
type poststarter interface {
	Poststart(ctx context.Context, a attempt) error
}

// prekiller runs before the stop signal of a running attempt, within its grace period (kubelet's
// kill runs preStop first); ctx ends when the grace period does. It reports whether it ran
// anything: only then is the grace left for the stop signal raised to kubelet's minimum.
type prekiller interface {
	Prekill(ctx context.Context, a attempt) bool
}

// healthChecker tells whether a running attempt must be killed (a failed liveness or startup
// probe): the Killing event's message and the grace period to kill it with (nil: the pod's).
type healthChecker interface {
	Unhealthy(a attempt) (message string, grace *time.Duration, kill bool)
}

// reportFunc emits an event about the pod and logs it (Worker.report).
type reportFunc func(pod *v1.Pod, typ event.Type, reason, message string, attrs ...any)

// containerHooks is the pod's hook list, in the order each phase runs them. probes is the pod's
// probe set, made when the worker runs.
func containerHooks(prober *probe.Prober, probes *probe.Set, report reportFunc) []containerHook {
	return []containerHook{
		postStartHook{prober: prober, report: report},
		preStopHook{prober: prober, report: report},
		probeKillHook{probes: probes},
	}
}

// postStartHook runs the container's lifecycle.postStart handler.
type postStartHook struct {
	prober *probe.Prober
	report reportFunc
}

func (postStartHook) Name() string { return "postStart" }

func (h postStartHook) Poststart(ctx context.Context, a attempt) error {
	if a.spec.Lifecycle == nil || a.spec.Lifecycle.PostStart == nil {
		return nil
	}
	err := h.prober.RunHook(ctx, a.target, a.spec.Lifecycle.PostStart)
	if err == nil || ctx.Err() != nil {
		return nil // done, or given up because the pod is being stopped
	}
	h.report(a.pod, event.Warning, "FailedPostStartHook", err.Error(), "container", a.spec.Name)
	return err
}

// preStopHook runs the container's lifecycle.preStop handler.
type preStopHook struct {
	prober *probe.Prober
	report reportFunc
}

func (preStopHook) Name() string { return "preStop" }

func (h preStopHook) Prekill(ctx context.Context, a attempt) bool {
	if a.spec.Lifecycle == nil || a.spec.Lifecycle.PreStop == nil {
		return false
	}
	if err := h.prober.RunHook(ctx, a.target, a.spec.Lifecycle.PreStop); err != nil && ctx.Err() == nil {
		h.report(a.pod, event.Warning, "FailedPreStopHook", err.Error(), "container", a.spec.Name)
	}
	return true
}

// probeKillHook kills an attempt whose liveness or startup probe failed, as kubelet does, with the
// probe's terminationGracePeriodSeconds when it sets one.
type probeKillHook struct{ probes *probe.Set }

func (probeKillHook) Name() string { return "liveness and startup probes" }

func (h probeKillHook) Unhealthy(a attempt) (string, *time.Duration, bool) {
	k, _, probeGrace, failed := h.probes.Failed(a.spec.Name, a.cur.ID)
	if !failed {
		return "", nil, false
	}
	msg := fmt.Sprintf("Container %s failed %s probe", a.spec.Name, strings.ToLower(k.String()))
	if a.pod.Spec.RestartPolicy != v1.RestartPolicyNever || podspec.IsSidecar(a.spec) {
		msg += ", will be restarted"
	}
	var g *time.Duration
	if probeGrace != nil {
		d := max(time.Duration(*probeGrace)*time.Second, MinGrace)
		g = &d
	}
	return msg, g, true
}
