package pod

import (
	"context"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRemovalGrace(t *testing.T) {
	i64 := func(v int64) *int64 { return &v }
	now := metav1.Now()
	s := time.Second
	cases := []struct {
		name     string
		spec     *int64 // terminationGracePeriodSeconds
		deleting bool   // deletionTimestamp set
		deletion *int64 // deletionGracePeriodSeconds
		prev     time.Duration
		want     time.Duration
	}{
		{name: "spec only", spec: i64(30), want: 30 * s},
		{name: "no spec grace: kubelet's default", want: 30 * s},
		{name: "API grace wins over a longer spec", spec: i64(30), deleting: true, deletion: i64(5), want: 5 * s},
		{name: "API grace wins over a shorter spec", spec: i64(5), deleting: true, deletion: i64(60), want: 60 * s},
		{name: "API grace 0 (force): kubelet's minimum", spec: i64(3600), deleting: true, deletion: i64(0), want: MinGrace},
		{name: "API grace 1: kubelet's minimum", spec: i64(30), deleting: true, deletion: i64(1), want: MinGrace},
		{name: "negative API grace: kubelet's minimum", spec: i64(30), deleting: true, deletion: i64(-5), want: MinGrace},
		{name: "spec 0: kubelet's minimum", spec: i64(0), want: MinGrace},
		{name: "deleting without a grace: the spec's", spec: i64(30), deleting: true, want: 30 * s},
		{name: "a deletion grace without a deletionTimestamp is not a deletion", spec: i64(30), deletion: i64(5), want: 30 * s},
		{name: "shortened by a later delete", spec: i64(3600), deleting: true, deletion: i64(3), prev: 60 * s, want: 3 * s},
		{name: "never lengthened once begun", spec: i64(3600), deleting: true, deletion: i64(60), prev: 3 * s, want: 3 * s},
		{name: "a removal begun with the spec's grace, shortened by the API", spec: i64(3600), deleting: true, deletion: i64(3), prev: 3600 * s, want: 3 * s},
		{name: "an unchanged grace stays", spec: i64(30), deleting: true, deletion: i64(10), prev: 10 * s, want: 10 * s},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := &v1.Pod{Spec: v1.PodSpec{TerminationGracePeriodSeconds: tc.spec}}
			if tc.deleting {
				p.DeletionTimestamp = &now
			}
			p.DeletionGracePeriodSeconds = tc.deletion
			if got := removalGrace(p, tc.prev); got != tc.want {
				t.Fatalf("removalGrace = %v, want %v", got, tc.want)
			}
		})
	}
}

// stubbornRuntime is a fakeRuntime whose containers ignore their stop signal: a stop with a grace
// longer than a minute lasts until its context ends (the agent would wait that long before its
// SIGKILL); a shorter one ends as fakeRuntime's does.
type stubbornRuntime struct {
	*fakeRuntime
	waiting chan struct{} // receives when a long stop begins
}

func (s stubbornRuntime) StopContainer(ctx context.Context, id string, grace time.Duration) error {
	if grace <= time.Minute {
		return s.fakeRuntime.StopContainer(ctx, id, grace)
	}
	s.fakeRuntime.mu.Lock()
	s.fakeRuntime.calls = append(s.fakeRuntime.calls, call{op: "stop", id: id, grace: grace})
	s.fakeRuntime.mu.Unlock()
	s.waiting <- struct{}{}
	<-ctx.Done()
	return ctx.Err()
}

// A version of the pod with a deletionTimestamp is its deletion with the API's grace period, not the
// spec's; a later version with a shorter grace cuts the stop under way short and stops again with
// it; nothing is started again once the pod is gone although the deleted version stays desired.
func TestWorkerRemovesWithTheAPIsGrace(t *testing.T) {
	hour := int64(3600)
	withDeletion := func(p *v1.Pod, grace int64) *v1.Pod {
		p = p.DeepCopy()
		now := metav1.Now()
		p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &now, &grace
		return p
	}
	t.Run("deleted with a grace", func(t *testing.T) {
		pod := testPod(v1.RestartPolicyAlways, "a")
		pod.Spec.TerminationGracePeriodSeconds = &hour
		f := newFakeRuntime()
		h := startWorker(t, pod, nil, f)
		h.waitFor("phase Running", phaseIs(v1.PodRunning))
		h.w.Update(Desired{Pod: withDeletion(pod, 3), Generation: 2})
		select {
		case <-h.done:
		case <-time.After(waitLimit):
			t.Fatalf("Run did not return within %s of the deletion; runtime calls: %v", waitLimit, f.allCalls())
		}
		stops := f.callsOf("stop")
		if len(stops) != 1 || stops[0].grace != 3*time.Second {
			t.Fatalf("stops %v, want one with the API's 3s", stops)
		}
		if n := len(f.callsOf("start")); n != 1 {
			t.Errorf("%d starts, want 1", n)
		}
	})
	t.Run("shortened while stopping", func(t *testing.T) {
		pod := testPod(v1.RestartPolicyAlways, "a")
		pod.Spec.TerminationGracePeriodSeconds = &hour
		f := newFakeRuntime()
		rt := stubbornRuntime{f, make(chan struct{}, 4)}
		h := startWorkerOn(t, pod, nil, rt, f, nil)
		h.waitFor("phase Running", phaseIs(v1.PodRunning))
		h.w.Update(Desired{Pod: withDeletion(pod, 600), Generation: 2})
		select {
		case <-rt.waiting:
		case <-time.After(waitLimit):
			t.Fatalf("no stop with the 600s grace began; runtime calls: %v", f.allCalls())
		}
		// A longer grace changes nothing (it never grows), a shorter one cuts the stop short.
		h.w.Update(Desired{Pod: withDeletion(pod, 900), Generation: 3})
		h.w.Update(Desired{Pod: withDeletion(pod, 3), Generation: 4})
		select {
		case <-h.done:
		case <-time.After(waitLimit):
			t.Fatalf("Run did not return within %s of the shorter grace; runtime calls: %v", waitLimit, f.allCalls())
		}
		var graces []time.Duration
		for _, c := range f.callsOf("stop") {
			graces = append(graces, c.grace)
		}
		if want := []time.Duration{600 * time.Second, 3 * time.Second}; !slices.Equal(graces, want) {
			t.Fatalf("stops with graces %v, want %v", graces, want)
		}
	})
	t.Run("never ran", func(t *testing.T) {
		pod := withDeletion(testPod(v1.RestartPolicyAlways, "a"), 3)
		f := newFakeRuntime()
		h := startWorker(t, pod, nil, f)
		select {
		case <-h.done:
		case <-time.After(waitLimit):
			t.Fatalf("Run did not return within %s for a pod being deleted; runtime calls: %v", waitLimit, f.allCalls())
		}
		if n := len(f.callsOf("start")); n != 0 {
			t.Errorf("a pod that arrived being deleted was started %d times", n)
		}
	})
}
