package pod

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Every state a worker can be in, by what tells them apart (the timestamps are filled as they would
// be), and every input, each with the state it leads to or its refusal.
func TestTransition(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	now := t0.Add(time.Minute)
	evicted := &Failure{Reason: ReasonEvicted, Message: "low on memory"}
	refused := &Failure{Reason: "OutOfmemory", Message: "does not fit"}
	deadline := &Failure{Reason: ReasonDeadlineExceeded}

	syncing := State{Phase: Syncing}
	failing := State{Phase: Terminating, Failure: evicted, TerminatingAt: t0}
	removing := State{Phase: Terminating, Removing: true, RemovalAt: metav1.NewTime(t0), TerminatingAt: t0}
	failingRemoving := State{Phase: Terminating, Failure: evicted, Removing: true, RemovalAt: metav1.NewTime(t0), TerminatingAt: t0}
	terminated := State{Phase: Terminated, Failure: evicted, TerminatingAt: t0, TerminatedAt: t0}
	terminatedRemoving := State{Phase: Terminated, Failure: evicted, Removing: true, RemovalAt: metav1.NewTime(t0), TerminatingAt: t0, TerminatedAt: t0}
	removed := State{Phase: Removed, Removing: true, RemovalAt: metav1.NewTime(t0), TerminatingAt: t0, TerminatedAt: t0}

	update, del, stopped, gone := input{op: opUpdate}, input{op: opDelete}, input{op: opStopped}, input{op: opRemoved}
	fail := func(f *Failure) input { return input{op: opFail, failure: f} }
	refuse := func(f *Failure) input { return input{op: opRefuse, failure: f} }
	const refusedIt = "" // marks a row whose input the state refuses: the state stays as it was

	for _, tc := range []struct {
		name   string
		from   State
		in     input
		want   State
		refuse string // a word of the refusal's reason; refusedIt's "" never is one
	}{
		// Syncing: the pod runs; any kill request starts the termination.
		{"syncing/update", syncing, update, syncing, ""},
		{"syncing/fail", syncing, fail(evicted), failing.with(func(s *State) { s.TerminatingAt = now }), ""},
		{"syncing/refuse", syncing, refuse(refused), State{Phase: Terminating, Failure: refused, TerminatingAt: now}, ""},
		{"syncing/delete", syncing, del, State{Phase: Terminating, Removing: true, RemovalAt: metav1.NewTime(now), TerminatingAt: now}, ""},
		{"syncing/stopped", syncing, stopped, syncing, "not being stopped"},
		{"syncing/removed", syncing, gone, syncing, "not being removed"},
		{"syncing/fail without a verdict", syncing, input{op: opFail}, syncing, "no verdict"},

		// Terminating for a verdict: every update is a kill; the first verdict holds, admission's
		// replaces it; a deletion turns it into a removal; all stopped -> Terminated.
		{"failing/update", failing, update, failing, ""},
		{"failing/fail", failing, fail(deadline), failing, "first verdict"},
		{"failing/refuse", failing, refuse(refused), failing.with(func(s *State) { s.Failure = refused }), ""},
		{"failing/delete", failing, del, failingRemoving.with(func(s *State) { s.RemovalAt = metav1.NewTime(now) }), ""},
		{"failing/stopped", failing, stopped, failing.with(func(s *State) { s.Phase, s.TerminatedAt = Terminated, now }), ""},
		{"failing/removed", failing, gone, failing, "not being removed"},

		// Terminating for a removal: nothing but the end of the teardown changes it.
		{"removing/update", removing, update, removing, ""},
		{"removing/fail", removing, fail(evicted), removing, "being removed"},
		{"removing/refuse", removing, refuse(refused), removing, "being removed"},
		{"removing/delete", removing, del, removing, "asked for already"},
		{"removing/stopped", removing, stopped, removing, "ends when the pod is removed"},
		{"removing/removed", removing, gone, removing.with(func(s *State) { s.Phase, s.TerminatedAt = Removed, now }), ""},

		// Terminating for a verdict, then removed: the verdict stays with it.
		{"failing+removing/update", failingRemoving, update, failingRemoving, ""},
		{"failing+removing/fail", failingRemoving, fail(deadline), failingRemoving, "being removed"},
		{"failing+removing/refuse", failingRemoving, refuse(refused), failingRemoving, "being removed"},
		{"failing+removing/delete", failingRemoving, del, failingRemoving, "asked for already"},
		{"failing+removing/stopped", failingRemoving, stopped, failingRemoving, "ends when the pod is removed"},
		{"failing+removing/removed", failingRemoving, gone, failingRemoving.with(func(s *State) { s.Phase, s.TerminatedAt = Removed, now }), ""},

		// Terminated: terminal stays terminal; only admission's new verdict and a removal change it.
		{"terminated/update", terminated, update, terminated, ""},
		{"terminated/fail", terminated, fail(deadline), terminated, "first verdict"},
		{"terminated/refuse", terminated, refuse(refused), terminated.with(func(s *State) { s.Failure = refused }), ""},
		{"terminated/delete", terminated, del, terminatedRemoving.with(func(s *State) { s.RemovalAt = metav1.NewTime(now) }), ""},
		{"terminated/stopped", terminated, stopped, terminated, "terminated already"},
		{"terminated/removed", terminated, gone, terminated, "not being removed"},

		// Terminated, then removed: the teardown keeps the time the pod terminated.
		{"terminated+removing/update", terminatedRemoving, update, terminatedRemoving, ""},
		{"terminated+removing/fail", terminatedRemoving, fail(deadline), terminatedRemoving, "being removed"},
		{"terminated+removing/refuse", terminatedRemoving, refuse(refused), terminatedRemoving, "being removed"},
		{"terminated+removing/delete", terminatedRemoving, del, terminatedRemoving, "asked for already"},
		{"terminated+removing/stopped", terminatedRemoving, stopped, terminatedRemoving, "terminated already"},
		{"terminated+removing/removed", terminatedRemoving, gone, terminatedRemoving.with(func(s *State) { s.Phase = Removed }), ""},

		// Removed: final.
		{"removed/update", removed, update, removed, "ended"},
		{"removed/fail", removed, fail(evicted), removed, "ended"},
		{"removed/refuse", removed, refuse(refused), removed, "ended"},
		{"removed/delete", removed, del, removed, "ended"},
		{"removed/stopped", removed, stopped, removed, "ended"},
		{"removed/removed", removed, gone, removed, "ended"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := transition(tc.from, tc.in, now)
			if tc.refuse == refusedIt && err != nil {
				t.Fatalf("refused: %v; want %s", err, show(tc.want))
			}
			if tc.refuse != refusedIt {
				var r *refusal
				if !errors.As(err, &r) || !strings.Contains(r.reason, tc.refuse) {
					t.Fatalf("err %v; want a refusal saying %q", err, tc.refuse)
				}
			}
			if show(got) != show(tc.want) {
				t.Errorf("got  %s\nwant %s", show(got), show(tc.want))
			}
			if got.Phase < tc.from.Phase {
				t.Errorf("phase went back from %s to %s", tc.from.Phase, got.Phase)
			}
		})
	}
}

// What a sync does in each state.
func TestStateWork(t *testing.T) {
	f := &Failure{Reason: ReasonEvicted}
	for _, tc := range []struct {
		s    State
		want work
	}{
		{State{Phase: Syncing}, syncPod},
		{State{Phase: Terminating, Failure: f}, killPod},
		{State{Phase: Terminated, Failure: f}, terminatedPod},
		{State{Phase: Terminating, Removing: true}, removePod},
		{State{Phase: Terminating, Failure: f, Removing: true}, removePod},
		{State{Phase: Terminated, Failure: f, Removing: true}, removePod},
		{State{Phase: Removed, Removing: true}, noWork},
	} {
		if got := tc.s.work(); got != tc.want {
			t.Errorf("%s: work %d, want %d", show(tc.s), got, tc.want)
		}
	}
}

// with returns s changed by edit, for the table's expected states.
func (s State) with(edit func(*State)) State { edit(&s); return s }

func show(s State) string {
	f := "-"
	if s.Failure != nil {
		f = s.Failure.Reason
	}
	return fmt.Sprintf("{%s failure=%s removing=%v removalAt=%s terminatingAt=%s terminatedAt=%s}", s.Phase, f, s.Removing,
		s.RemovalAt.UTC().Format(time.TimeOnly), s.TerminatingAt.Format(time.TimeOnly), s.TerminatedAt.Format(time.TimeOnly))
}
