package e2e

import (
	"context"
	"fmt"
	"github.com/mqlet/mqlet/internal/testbuf"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
)

// cutBound is how long a kubectl exec whose stream was cut may take to end, and the command it
// ran to be gone: the node's session lease (30 s) and the client's answer timeouts, with room.
const cutBound = 150 * time.Second

// TestKubectlExecCut: a kubectl exec through the bridge whose stream is cut — the agent killed
// and started again, the broker killed and started again, the leading bridge killed — ends (kubectl
// exits, with an error for the first two, instead of hanging), and the command it ran in the
// container does not linger: the node kills it when its session lease runs out, or the restarted
// agent sweeps it.
func TestKubectlExecCut(t *testing.T) {
	w := newEdgeWorld(t)
	w.startBridge(t, "bridge-a")
	w.startAgent(t)
	s := &edgeSuite{w: w}
	p := edgePod(uniqueName("cut"), edgeTolerations()...)
	s.createPod(t, p)
	s.waitRunning(t, p.Name)

	// execSleep starts `kubectl exec` of a sleep whose length marks it, and waits until it runs.
	execSleep := func(secs int) (*exec.Cmd, chan error) {
		t.Helper()
		cmd := exec.Command(w.cluster.Kubectl(), "--kubeconfig", w.cluster.Kubeconfig(), "-n", testNS,
			"exec", p.Name, "--", "sh", "-c", fmt.Sprintf("echo started; exec sleep %d", secs))
		var out, errb testbuf.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-done
		})
		within(t, runBound, fmt.Sprintf("kubectl exec of sleep %d started", secs), func() (bool, string) {
			return strings.Contains(out.String(), "started"), out.String() + errb.String()
		})
		within(t, runBound, fmt.Sprintf("sleep %d running in the container", secs), func() (bool, string) {
			return w.containerRuns(t, fmt.Sprintf("sleep %d", secs)), ""
		})
		return cmd, done
	}
	// cut checks that kubectl ends (with an error when wantErr) and the command goes.
	cut := func(what string, secs int, done chan error, wantErr bool) {
		t.Helper()
		select {
		case err := <-done:
			done <- err // for the cleanup
			if wantErr && err == nil {
				t.Errorf("%s: kubectl exec ended without an error", what)
			}
		case <-time.After(cutBound):
			t.Errorf("%s: kubectl exec still running %s after the cut", what, cutBound)
		}
		within(t, cutBound, fmt.Sprintf("%s: sleep %d gone from the container", what, secs), func() (bool, string) {
			return !w.containerRuns(t, fmt.Sprintf("sleep %d", secs)), ""
		})
	}

	// The agent killed (the exec's process is the shim's: it outlives the agent) and started again.
	_, done := execSleep(601)
	w.mu.Lock()
	agent := w.agent
	w.mu.Unlock()
	if err := agent.stop(syscall.SIGKILL, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	w.agent = nil
	w.mu.Unlock()
	w.startAgent(t)
	cut("agent killed and restarted", 601, done, true)

	// The broker killed and started again: every frame in flight is lost.
	s.waitRunning(t, p.Name)
	_, done = execSleep(602)
	w.broker.Kill(t)
	w.broker.Start(t)
	cut("broker killed and restarted", 602, done, true)

	// The leading bridge killed, a standby takes over: the API server's stream to it is gone.
	w.startBridge(t, "bridge-b")
	lead := w.leader(t)
	_, done = execSleep(603)
	if err := lead.stop(syscall.SIGKILL, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	delete(w.bridges, lead.identity) // its exit is wanted
	w.mu.Unlock()
	// kubectl exits 0 here: the API server closes its stream to kubectl without a status when
	// the upstream it proxies to (the bridge) dies. What matters is that it ends, and the command.
	cut("leading bridge killed", 603, done, false)
}

// containerRuns says whether a process of a task in the agent's namespace has args containing
// what (read from the host's /proc: the test runs beside the shims).
func (w *edgeWorld) containerRuns(t *testing.T, what string) bool {
	t.Helper()
	found := false
	w.eachTask(t, func(ctx context.Context, _ containerd.Container, task containerd.Task) bool {
		ps, err := task.Pids(ctx)
		if err != nil {
			return true
		}
		for _, p := range ps {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.Pid))
			if err == nil && strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), what) {
				found = true
				return false
			}
		}
		return true
	})
	return found
}
