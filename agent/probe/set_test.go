package probe

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// toggleServer answers 200 or 500 as told, and counts requests.
type toggleServer struct {
	*httptest.Server
	ok   atomic.Bool
	hits atomic.Int64
}

func newToggleServer(t *testing.T) *toggleServer {
	s := &toggleServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		if !s.ok.Load() {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// waitUntil polls cond every 20 ms of the bubble's clock and fails with what when it does not
// hold within 20 s of it. Inside a synctest bubble the clock moves only while every goroutine of
// the bubble waits on a timer or a channel, never during a probe's request: the bound is in probe
// time, not in how fast the machine is.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func httpProbe(port int, failure, success int32) *v1.Probe {
	return &v1.Probe{ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(int32(port))}},
		PeriodSeconds: 1, FailureThreshold: failure, SuccessThreshold: success}
}

// Readiness follows the probe both ways, after exactly the thresholds' number of results in a
// row; every change nudges the pod's worker; Stop ends the probe and no request follows. The
// probes run on the bubble's clock (testing/synctest): a request is answered by a real server
// outside it, and the counts are exact.
func TestSetReadinessThresholdsAndStop(t *testing.T) {
	srv := newToggleServer(t)
	port := serverPort(t, srv.URL)
	synctest.Test(t, func(t *testing.T) {
		c := &v1.Container{Name: "web", ReadinessProbe: httpProbe(port, 2, 2)}
		var nudges atomic.Int64
		var mu sync.Mutex
		var failures int
		s := NewProber().NewSet(context.Background(), func() { nudges.Add(1) }, func(_ string, warning bool, reason, _ string) {
			if warning && reason == "Unhealthy" {
				mu.Lock()
				failures++
				mu.Unlock()
			}
		}, nil)
		defer s.Stop()
		s.Sync([]Running{{Target: Target{Pod: &v1.Pod{}, Container: c, ContainerID: "a1", PodIP: "127.0.0.1"}, StartedAt: time.Now()}})
		ready := func() bool { _, r := s.Status(c, "a1"); return r }

		srv.ok.Store(true)
		waitUntil(t, "ready", ready)
		// successThreshold 2: ready at the second successful request, not before.
		if n := srv.hits.Load(); n != 2 {
			t.Errorf("ready after %d requests, want 2 (successThreshold)", n)
		}
		if nudges.Load() != 1 {
			t.Errorf("%d nudges for one change to ready", nudges.Load())
		}
		if _, r := s.Status(c, "other-attempt"); r {
			t.Error("another container attempt reads as ready")
		}

		srv.ok.Store(false)
		hitsAtFlip := srv.hits.Load()
		waitUntil(t, "not ready", func() bool { return !ready() })
		if n := srv.hits.Load() - hitsAtFlip; n != 2 {
			t.Errorf("not ready after %d failed requests, want 2 (failureThreshold)", n)
		}
		mu.Lock()
		if failures != 2 {
			t.Errorf("%d Unhealthy events for 2 failed probes", failures)
		}
		mu.Unlock()

		s.Stop()
		after := srv.hits.Load()
		time.Sleep(10 * time.Second) // ten periods
		if n := srv.hits.Load(); n != after {
			t.Errorf("%d requests in the ten periods after Stop", n-after)
		}
	})
}

// Liveness and readiness wait for the startup probe; a liveness failure is final for the attempt
// and reported by Failed with the probe's own grace period.
func TestSetStartupHoldsOthersAndLivenessFails(t *testing.T) {
	startup := newToggleServer(t)
	live := newToggleServer(t)
	startupPort, livePort := serverPort(t, startup.URL), serverPort(t, live.URL)
	synctest.Test(t, func(t *testing.T) {
		grace := int64(7)
		lp := httpProbe(livePort, 1, 1)
		lp.TerminationGracePeriodSeconds = &grace
		c := &v1.Container{Name: "app", StartupProbe: httpProbe(startupPort, 100, 1), LivenessProbe: lp}
		s := NewProber().NewSet(context.Background(), func() {}, func(string, bool, string, string) {}, nil)
		defer s.Stop()
		s.Sync([]Running{{Target: Target{Pod: &v1.Pod{}, Container: c, ContainerID: "a1", PodIP: "127.0.0.1"}, StartedAt: time.Now()}})

		time.Sleep(5 * time.Second)
		if n := startup.hits.Load(); n < 4 || n > 6 {
			t.Fatalf("startup probed %d times in 5 periods", n)
		}
		if started, _ := s.Status(c, "a1"); started {
			t.Fatal("started while the startup probe fails")
		}
		if live.hits.Load() != 0 {
			t.Fatalf("liveness probed %d times before startup passed", live.hits.Load())
		}
		if _, _, _, failed := s.Failed("app", "a1"); failed {
			t.Fatal("failed before any liveness probe")
		}

		startup.ok.Store(true)
		waitUntil(t, "started", func() bool { started, _ := s.Status(c, "a1"); return started })
		waitUntil(t, "liveness failed", func() bool { _, _, _, f := s.Failed("app", "a1"); return f })
		k, out, g, _ := s.Failed("app", "a1")
		if k != Liveness || g == nil || *g != 7 || out == "" {
			t.Errorf("Failed: kind %v grace %v output %q, want liveness, 7 and the failure", k, g, out)
		}
		if n := live.hits.Load(); n != 1 {
			t.Errorf("liveness failed after %d requests, want 1 (failureThreshold)", n)
		}
		time.Sleep(10 * time.Second)
		if n := live.hits.Load(); n != 1 {
			t.Errorf("liveness probed %d more times after failing (it must hold until the container is replaced)", n-1)
		}
		// A new attempt of the container starts over.
		live.ok.Store(true)
		s.Sync([]Running{{Target: Target{Pod: &v1.Pod{}, Container: c, ContainerID: "a2", PodIP: "127.0.0.1"}, StartedAt: time.Now()}})
		if _, _, _, f := s.Failed("app", "a2"); f {
			t.Error("the new attempt inherits the old one's failure")
		}
	})
}
