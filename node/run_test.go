package node

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/api"
)

// logBuffer is a slog destination the test reads while the node writes.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// nodeGoroutines are the stacks of the goroutines running mqlet code other than the test's own.
func nodeGoroutines() []string {
	var b strings.Builder
	pprof.Lookup("goroutine").WriteTo(&b, 2)
	var out []string
	for _, g := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(g, "github.com/mqlet/mqlet/") && !strings.Contains(g, "_test.go") {
			out = append(out, g)
		}
	}
	return out
}

// A part that ends at once without an error (node shutdown with shutdownGracePeriod 0) does not
// stop the node; canceling Run's context does, with no error, the stop logged, and no goroutine of
// the node left once Run has returned and Close has released what New opened.
func TestRunEndsWithItsContextOnly(t *testing.T) {
	cfg := machineConfig(t)
	cfg.ShutdownGracePeriod.Duration = 0
	logs := &logBuffer{}
	before := nodeGoroutines()
	n, err := New(context.Background(), cfg, Deps{Log: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- n.Run(ctx) }()

	c := api.NewClient(cfg.APISocket)
	for {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		err := c.Ready(rctx)
		rcancel()
		if err == nil && strings.Contains(logs.String(), "graceful node shutdown is off") {
			break
		}
		select {
		case err := <-runErr:
			t.Fatalf("node stopped on its own: %v\n%s", err, logs.String())
		case <-time.After(100 * time.Millisecond): // polling interval, not an assertion
		}
	}
	if _, err := c.ListPods(ctx, ""); err != nil {
		t.Fatalf("local API after the node shutdown part ended: %v", err)
	}
	select {
	case err := <-runErr:
		t.Fatalf("node stopped when its shutdown part ended: %v", err)
	default:
	}
	cancel()
	if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Run after cancel: %v", err)
	}
	if !strings.Contains(logs.String(), "mqlet agent stopped; pods keep running") {
		t.Errorf("stop not logged:\n%s", logs.String())
	}
	if err := n.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if left := nodeGoroutines(); len(left) > len(before) {
		t.Errorf("%d goroutines running mqlet code after Run and Close (%d before):\n%s", len(left), len(before), strings.Join(left, "\n\n"))
	}
}

// A local API socket that cannot be listened on ends the node with an error naming --api-socket.
func TestRunAPISocketUnusable(t *testing.T) {
	cfg := machineConfig(t)
	file := filepath.Join(filepath.Dir(cfg.APISocket), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.APISocket = filepath.Join(file, "api.sock") // under a regular file: cannot be listened on
	n, err := New(context.Background(), cfg, Deps{Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang fails, not blocks
	defer cancel()
	err = n.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "--api-socket") {
		t.Errorf("Run with an unusable socket: %v, want an error naming --api-socket", err)
	}
}
