package ctrd_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/mqlet/mqlet/agent/ctrd"
)

// An exec left by an agent process that is gone (its pid and start time in the exec id: no such
// process, or the pid now another process) is killed by the next agent's SweepExecs, not by any
// Runtime made (a CLI command's); one of a live agent (this process), an older mqlet's id without
// the start time, and a foreign one stay.
func TestStrayExecsOfAKilledAgentAreKilled(t *testing.T) {
	_, env, ns := newRuntime(t)
	logPath := filepath.Join(t.TempDir(), "log")
	const id = "exec-sweep"
	env.RunBusybox(t, ns, id, logPath, "echo ready; while true; do sleep 0.1; done")
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
	start0, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(start0[bytes.LastIndexByte(start0, ')')+1:]))
	self := fmt.Sprintf("%d.%s", os.Getpid(), f[19])
	stray := fmt.Sprintf("exec-%d.12345-0123456789abcdef", dead.Process.Pid)
	reused := fmt.Sprintf("exec-%d.1-0011223344556677", os.Getpid()) // this pid, another start time
	live := "exec-" + self + "-fedcba9876543210"
	old := fmt.Sprintf("exec-%d-aabbccddeeff0011", dead.Process.Pid) // an older mqlet's id: owner unknown
	foreign := "someone-elses-exec"
	for _, x := range []string{stray, reused, live, old, foreign} {
		start(x)
	}

	rt, err := ctrd.New(context.Background(), ctrd.Options{Address: env.ContainerdAddress, Namespace: ns,
		StateDir: t.TempDir(), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if !loadedIn(ctx, task, stray) {
		t.Fatal("a new Runtime swept by itself: only the agent's SweepExecs may")
	}
	rt.SweepExecs(context.Background())
	loaded := func(x string) bool { return loadedIn(ctx, task, x) }
	for _, x := range []string{stray, reused} {
		if loaded(x) {
			t.Errorf("the exec of an agent process no longer running (%s) survived the sweep", x)
		}
	}
	for _, x := range []string{live, old, foreign} {
		if !loaded(x) {
			t.Errorf("%s was killed: a live agent's, an older mqlet's or a foreign exec must stay", x)
		}
	}
}

// loadedIn says whether task still knows exec id (a deleted exec is gone from it: the shim killed
// and reaped it first).
func loadedIn(ctx context.Context, task containerd.Task, id string) bool {
	_, err := task.LoadProcess(ctx, id, nil)
	return err == nil
}
