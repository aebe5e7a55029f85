package ctrd_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/mqlet/mqlet/agent/ctrd"
)

// An exec left by an agent that was killed (its pid in the exec id, no such process any more) is
// killed by the next Runtime; one of a live agent (this process) and one whose id is not mqlet's
// stay.
func TestStrayExecsOfAKilledAgentAreKilled(t *testing.T) {
	_, env, ns := newRuntime(t)
	logPath := filepath.Join(t.TempDir(), "log")
	const id = "exec-sweep"
	runBusybox(t, env, ns, id, logPath, "echo ready; while true; do sleep 0.1; done")
	waitLog(t, logPath, "ready")

	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	c, err := containerd.New(env.ContainerdAddress)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := namespaces.WithNamespace(context.Background(), ns)
	ctr, err := c.LoadContainer(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := ctr.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := func(execID string) {
		t.Helper()
		ps := *spec.Process
		ps.Args = []string{"sleep", "1000"}
		p, err := task.Exec(ctx, execID, &ps, cio.NullIO)
		if err != nil {
			t.Fatalf("exec %s: %v", execID, err)
		}
		if err := p.Start(ctx); err != nil {
			t.Fatalf("start %s: %v", execID, err)
		}
	}
	stray := fmt.Sprintf("exec-%d-0123456789abcdef", dead.Process.Pid)
	live := fmt.Sprintf("exec-%d-fedcba9876543210", os.Getpid())
	foreign := "someone-elses-exec"
	for _, x := range []string{stray, live, foreign} {
		start(x)
	}

	rt, err := ctrd.New(context.Background(), ctrd.Options{Address: env.ContainerdAddress, Namespace: ns,
		StateDir: t.TempDir(), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	// Deleted, an exec is no longer known to its task (the shim killed and reaped it first).
	loaded := func(x string) bool {
		_, err := task.LoadProcess(ctx, x, nil)
		return err == nil
	}
	if loaded(stray) {
		t.Errorf("the exec of a dead agent (%s) survived a new Runtime", stray)
	}
	if !loaded(live) || !loaded(foreign) {
		t.Errorf("a live agent's exec or a foreign one was killed: live %v, foreign %v", loaded(live), loaded(foreign))
	}
}
