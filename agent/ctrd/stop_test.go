package ctrd_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/internal/testenv"
)

// newRuntime connects a Runtime to the test containerd in a namespace of its own, with the busybox
// test image imported.
func newRuntime(t *testing.T) (*ctrd.Runtime, testenv.Env, string) {
	t.Helper()
	env := testenv.Require(t)
	ns := testenv.Namespace(t, env.ContainerdAddress)
	ctx := context.Background()
	rt, err := ctrd.New(ctx, ctrd.Options{Address: env.ContainerdAddress, Namespace: ns,
		StateDir: t.TempDir(), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	rc, err := ctrd.OpenArchive(env.Image(testenv.Busybox))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := rt.ImportArchive(ctx, rc); err != nil {
		t.Fatalf("import %s: %v", env.Image(testenv.Busybox), err)
	}
	return rt, env, ns
}

// A stop whose status read fails must still go the graceful way: SIGTERM, then the grace period.
// Before, an unreadable status sent the container straight to SIGKILL.
func TestStopWithUnreadableStatusSendsSIGTERM(t *testing.T) {
	rt, env, ns := newRuntime(t)
	logPath := filepath.Join(t.TempDir(), "log")
	const id = "stop-status-fails"
	// The marker is written only once the trap is set, so the test knows SIGTERM can be seen.
	env.RunBusybox(t, ns, id, logPath, "trap 'echo got-term; exit 0' TERM; echo ready; while true; do sleep 0.1; done")
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := readLog(logPath)
		if strings.Contains(string(b), "ready") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s did not print ready within 30s; log: %q", id, b)
		}
		time.Sleep(20 * time.Millisecond)
	}

	statusCalls := 0
	ctrd.SetTaskStatus(rt, func(context.Context, containerd.Task) (containerd.Status, error) {
		statusCalls++
		return containerd.Status{}, errors.New("shim busy (test)")
	})
	// A grace far longer than the trap needs: the test waits for the exit, never for the timer.
	if err := rt.StopContainer(context.Background(), id, 2*time.Minute); err != nil {
		t.Fatalf("StopContainer(%s): %v", id, err)
	}
	if statusCalls == 0 {
		t.Fatalf("StopContainer never read the task status; the test's failing status was not used")
	}
	if b, err := readLog(logPath); err != nil || !strings.Contains(string(b), "got-term") {
		t.Errorf("container %s did not see SIGTERM when its status was unreadable (log %q, %v)", id, b, err)
	}
}
