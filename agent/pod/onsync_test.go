package pod

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// Every sync and every teardown attempt is reported to Env.OnSync with how long it took (the
// metrics' sync latency).
func TestWorkerReportsSyncDurations(t *testing.T) {
	f := newFakeRuntime()
	var mu sync.Mutex
	var took []time.Duration
	running, gone := make(chan struct{}, 1), make(chan struct{})
	w := NewWorker(Desired{Pod: testPod(v1.RestartPolicyAlways, "a")}, nil, Env{
		Runtime: f,
		Log:     slog.New(slog.DiscardHandler),
		OnStatus: func(_ Desired, st v1.PodStatus) {
			if st.Phase == v1.PodRunning {
				select {
				case running <- struct{}{}:
				default:
				}
			}
		},
		OnGone: func(Desired) { close(gone) },
		OnSync: func(d time.Duration) {
			mu.Lock()
			took = append(took, d)
			mu.Unlock()
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	select {
	case <-running:
	case <-time.After(waitLimit):
		t.Fatal("pod never ran")
	}
	w.Delete()
	select {
	case <-gone:
	case <-time.After(waitLimit):
		t.Fatal("pod never went")
	}
	<-done // Run returns after the teardown it reported
	mu.Lock()
	defer mu.Unlock()
	syncs := int(w.syncs.Load())
	// The syncs that ran the pod, plus the teardown.
	if syncs < 1 || len(took) != syncs+1 {
		t.Errorf("OnSync called %d times for %d syncs and one teardown", len(took), syncs)
	}
	for i, d := range took {
		if d <= 0 {
			t.Errorf("sync %d reported %v", i, d)
		}
	}
}
