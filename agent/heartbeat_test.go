package agent

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/store"
)

// hangingRuntime is the fake runtime whose container listing (the relist's call) blocks, ignoring
// its deadline, while hang is set: a containerd call stuck for good.
type hangingRuntime struct {
	*fakeRuntime
	hang    atomic.Bool
	release chan struct{}
}

func (h *hangingRuntime) ListContainers(ctx context.Context, podUID string) ([]ctrd.Container, error) {
	if h.hang.Load() {
		<-h.release
	}
	return h.fakeRuntime.ListContainers(ctx, podUID)
}

// The heartbeat (systemd's watchdog) comes from the main loop alone: every HeartbeatPeriod while
// the loop waits, and never while it is stuck, so a hung agent is restarted and an idle one is not.
func TestHeartbeatOnlyWhileMainLoopGoesRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &hangingRuntime{fakeRuntime: newFakeRuntime(), release: make(chan struct{})}
		var beats atomic.Int32
		started := make(chan struct{})
		a := New(Options{
			NodeName: "node-1", RelistPeriod: time.Hour, SweepPeriod: time.Hour, Log: slog.New(slog.DiscardHandler),
			Started:   func() { close(started) },
			Heartbeat: func() { beats.Add(1) }, HeartbeatPeriod: 30 * time.Second,
		}, rt, store.NewMemory())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		<-started
		synctest.Wait()
		if n := beats.Load(); n != 1 {
			t.Fatalf("%d heartbeats after the first relist, want 1", n)
		}
		// Idle: no relist for an hour, yet a beat every 30 s.
		time.Sleep(95 * time.Second)
		synctest.Wait()
		if n := beats.Load(); n != 4 {
			t.Fatalf("%d heartbeats 95 s in, want 4 (the relist's and one every 30 s)", n)
		}
		// The next relist hangs: the beats stop, however long it hangs.
		rt.hang.Store(true)
		a.requestRelist()
		synctest.Wait()
		stuck := beats.Load()
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if n := beats.Load(); n != stuck {
			t.Fatalf("%d heartbeats while the main loop was stuck in a relist, want none", n-stuck)
		}
		// Unstuck: the loop beats again.
		rt.hang.Store(false)
		close(rt.release)
		synctest.Wait()
		time.Sleep(31 * time.Second)
		synctest.Wait()
		if n := beats.Load(); n < stuck+2 {
			t.Fatalf("%d heartbeats after the relist returned, want at least 2", n-stuck)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}
