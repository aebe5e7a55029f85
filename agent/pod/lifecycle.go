package pod

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The pod worker's lifecycle, after kubelet's pod workers (pkg/kubelet/pod_workers.go): a worker
// syncs its pod until the node decides to stop it, then every sync is a kill until the pod's
// containers are stopped (a verdict: the pod stays on the node, Failed) or removed with its sandbox
// (a deletion: the worker ends). Every change of state goes through transition, so "start nothing
// once the pod is being stopped" and "a stopped pod never runs again under its UID" are properties
// of the state, not checks scattered through the sync loop.

// WorkerPhase is where a pod worker is in the pod's life on the node (not the pod's phase, which
// its containers decide: see Phase). Worker phases only move forward, in the order declared.
type WorkerPhase uint8

const (
	// Syncing: the pod should run; each sync moves its containers towards the spec (kubelet's
	// SyncPod).
	Syncing WorkerPhase = iota
	// Terminating: the node stops the pod, for a verdict (State.Failure) or a removal
	// (State.Removing). Every sync is a kill and nothing starts, whatever update comes (kubelet's
	// SyncTerminatingPod).
	Terminating
	// Terminated: every container of a pod the node failed is stopped and stays stopped; a sync only
	// reports the final status (kubelet's SyncTerminatedPod). A removal may still follow.
	Terminated
	// Removed: the pod's containers and sandbox are gone and the worker has ended. Final.
	Removed
)

func (p WorkerPhase) String() string {
	switch p {
	case Syncing:
		return "syncing"
	case Terminating:
		return "terminating"
	case Terminated:
		return "terminated"
	case Removed:
		return "removed"
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// State is a worker's lifecycle record: its phase, what the termination is for, and when it began
// and ended.
type State struct {
	Phase WorkerPhase
	// Failure is the node's verdict the pod is held under (evicted, refused, past its deadline,
	// stopped for a node shutdown); nil for a pod that is only removed.
	Failure *Failure
	// Removing: the pod is no longer desired. The termination removes its containers and its
	// sandbox and ends in Removed rather than Terminated.
	Removing bool
	// RemovalAt is when the removal was asked for: the pod's deletionTimestamp, the same on every
	// read.
	RemovalAt metav1.Time
	// TerminatingAt is when the node first asked to stop the pod; TerminatedAt when its containers
	// were all found stopped (a verdict) or removed (a removal).
	TerminatingAt, TerminatedAt time.Time
}

// op is what can happen to a pod worker: the requests the agent makes (kubelet's UpdatePod with an
// update type) and the outcomes of the worker's own kill passes.
type op uint8

const (
	opUpdate  op = iota // a new version of the desired pod (Worker.Update)
	opFail              // the node's verdict (Worker.Fail, the active deadline); the first one holds
	opRefuse            // admission's verdict on a new spec (Worker.Refuse); it replaces the one held
	opDelete            // the pod is no longer desired (Worker.Delete)
	opStopped           // a kill pass found no container of the pod running
	opRemoved           // a teardown removed the pod's containers and sandbox
)

func (o op) String() string {
	switch o {
	case opUpdate:
		return "update"
	case opFail:
		return "fail"
	case opRefuse:
		return "refuse"
	case opDelete:
		return "delete"
	case opStopped:
		return "stopped"
	case opRemoved:
		return "removed"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// input is one thing that happens to a worker; failure comes with opFail and opRefuse.
type input struct {
	op      op
	failure *Failure
}

// refusal is transition's answer to an input the state does not take: the state stays as it was.
type refusal struct {
	phase  WorkerPhase
	op     op
	reason string
}

func (r *refusal) Error() string {
	return fmt.Sprintf("pod worker %s: %s ignored: %s", r.phase, r.op, r.reason)
}

// transition is the one place a worker's lifecycle changes: the state s becomes when in happens at
// now. It is pure. An input the state does not take is refused with an error saying why, and s is
// returned as it was; no input moves a phase backwards.
func transition(s State, in input, now time.Time) (State, error) {
	refuse := func(reason string) (State, error) {
		return s, &refusal{phase: s.Phase, op: in.op, reason: reason}
	}
	if s.Phase == Removed {
		return refuse("the worker has ended")
	}
	if (in.op == opFail || in.op == opRefuse) && in.failure == nil {
		return refuse("no verdict given")
	}
	switch in.op {
	case opUpdate:
		// Taken in every phase: a syncing worker syncs the new spec; a terminating or terminated
		// one keeps it (its grace period, the version its last status reports) and starts nothing.
		return s, nil
	case opFail, opRefuse:
		if s.Removing {
			return refuse("the pod is being removed")
		}
		if s.Phase == Syncing {
			s.Phase, s.TerminatingAt = Terminating, now
			s.Failure = in.failure
			return s, nil
		}
		if in.op == opFail {
			return refuse("the pod is held under its first verdict (" + s.Failure.Reason + ")")
		}
		// Admission's answer to a new spec replaces its answer to the old one; the pod stays
		// where it is on its way out.
		s.Failure = in.failure
		return s, nil
	case opDelete:
		if s.Removing {
			return refuse("the removal was asked for already")
		}
		s.Removing, s.RemovalAt = true, metav1.NewTime(now)
		if s.Phase == Syncing {
			s.Phase, s.TerminatingAt = Terminating, now
		}
		// A terminated pod stays Terminated: its containers are stopped, the removal takes what
		// is left.
		return s, nil
	case opStopped:
		switch {
		case s.Phase == Syncing:
			return refuse("the pod is not being stopped")
		case s.Phase == Terminated:
			return refuse("the pod is terminated already")
		case s.Removing:
			return refuse("a removal ends when the pod is removed, not stopped")
		}
		s.Phase, s.TerminatedAt = Terminated, now
		return s, nil
	case opRemoved:
		if !s.Removing {
			return refuse("the pod is not being removed")
		}
		s.Phase = Removed
		if s.TerminatedAt.IsZero() {
			s.TerminatedAt = now
		}
		return s, nil
	}
	return refuse("unknown input")
}

// work is what a sync does in a state.
type work uint8

const (
	syncPod       work = iota // start, restart and probe the containers towards the spec
	killPod                   // stop every container, keeping their exits; report the Failed status
	terminatedPod             // report the Failed status; every container is stopped already
	removePod                 // stop and remove every container, then the sandbox (Teardown)
	noWork                    // the worker has ended
)

// work is what the worker's next sync does in s.
func (s State) work() work {
	switch {
	case s.Phase == Removed:
		return noWork
	case s.Removing:
		return removePod
	case s.Phase == Syncing:
		return syncPod
	case s.Phase == Terminated:
		return terminatedPod
	}
	return killPod
}
