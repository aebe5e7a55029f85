package shutdown

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakePods records what the Manager asks of the pods.
type fakePods struct {
	mu       sync.Mutex
	hold     time.Duration // how long ShutdownPods takes
	calls    [][2]time.Duration
	finished []time.Time
	cancels  int
}

func (p *fakePods) ShutdownPods(_ context.Context, critical, other time.Duration) {
	time.Sleep(p.hold)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, [2]time.Duration{critical, other})
	p.finished = append(p.finished, time.Now())
}

func (p *fakePods) CancelShutdown() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cancels++
}

func (p *fakePods) snapshot() (calls [][2]time.Duration, finished []time.Time, cancels int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append(calls, p.calls...), append(finished, p.finished...), p.cancels
}

// logRecorder keeps every log message with its attributes, for tests that wait for one.
type logRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *logRecorder) WithGroup(string) slog.Handler            { return r }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	line := rec.Level.String() + " " + rec.Message
	rec.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	r.mu.Lock()
	r.lines = append(r.lines, line)
	r.mu.Unlock()
	return nil
}

func (r *logRecorder) has(sub string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.lines {
		if strings.Contains(l, sub) {
			return true
		}
	}
	return false
}

func (r *logRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.lines, "\n")
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 15s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func runManager(t *testing.T, opts Options, pods Pods) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	m := New(opts, pods)
	go func() { m.Run(ctx); close(done) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Errorf("Run did not return within 10s of its context ending")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// Without a system bus the shutdown signal alone starts a shutdown; the manager says once that it
// found no logind, and leaves no goroutine behind when it stops.
func TestSignalWithoutBus(t *testing.T) {
	// os/signal starts its one watcher goroutine, for good, on the first Notify.
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGUSR1)
	signal.Stop(c)
	before := runtime.NumGoroutine()
	logs := &logRecorder{}
	pods := &fakePods{}
	stop := runManager(t, Options{GracePeriod: 6 * time.Second, CriticalGracePeriod: 2 * time.Second,
		Signal: syscall.SIGUSR2, BusAddress: "unix:path=" + filepath.Join(t.TempDir(), "none"), Log: slog.New(logs)}, pods)
	waitUntil(t, "manager running", func() bool { return logs.has("graceful node shutdown on") })
	waitUntil(t, "no logind said", func() bool { return logs.has("INFO no systemd-logind to follow") })
	syscall.Kill(os.Getpid(), syscall.SIGUSR2)
	waitUntil(t, "pods stopped on the signal", func() bool { c, _, _ := pods.snapshot(); return len(c) == 1 })
	if c, _, _ := pods.snapshot(); c[0] != [2]time.Duration{2 * time.Second, 4 * time.Second} {
		t.Errorf("graces %v, want critical 2s, others 4s", c[0])
	}
	stop()
	waitUntil(t, "goroutines end", func() bool { return runtime.NumGoroutine() <= before })
}

// A grace period of 0 is kubelet's "off": nothing is watched, not even the signal. Run returns at
// once although its context is live (a Manager that watched anything would block until it ends),
// and the signal, sent after, reaches only the test's own handler: no pod is stopped.
func TestOff(t *testing.T) {
	logs := &logRecorder{}
	pods := &fakePods{}
	done := make(chan struct{})
	go func() {
		New(Options{Signal: syscall.SIGUSR2, Log: slog.New(logs)}, pods).Run(context.Background())
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run with a grace period of 0 is still running after 10s: it watches something")
	}
	if !logs.has("graceful node shutdown is off") {
		t.Errorf("logs:\n%s", logs)
	}
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGUSR2)
	defer signal.Stop(c)
	syscall.Kill(os.Getpid(), syscall.SIGUSR2)
	<-c
	if calls, _, _ := pods.snapshot(); len(calls) != 0 {
		t.Errorf("pods stopped with the manager off: %v", calls)
	}
}
