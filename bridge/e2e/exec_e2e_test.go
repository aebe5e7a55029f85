package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/loopback"
	"github.com/mqlet/mqlet/internal/testbuf"
	"github.com/mqlet/mqlet/internal/testenv"
	v1 "k8s.io/api/core/v1"
)

// kubectl runs the cluster's kubectl (of its own version) as the admin in testNS with stdin, and
// returns its stdout, stderr and exit code (-1 when it did not exit on its own).
func (w *edgeWorld) kubectl(t *testing.T, stdin string, timeout time.Duration, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, w.cluster.Kubectl(), append([]string{"--kubeconfig", w.cluster.Kubeconfig(), "-n", testNS}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		code = 0
	case ctx.Err() != nil:
		code = -1
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errb.String(), code
}

// TestKubectlExec: kubectl exec through an unmodified API server reaches the container on the
// edge node over MQTT (a sealed session the bridge opens): stdout and stderr apart, the exit code,
// stdin to its end, and 2 MB of output through the session's flow control; kubectl port-forward
// to a port the pod serves on its loopback only, several connections; kubectl run -i and kubectl
// attach; with the node offline, exec fails at once saying so.
func TestKubectlExec(t *testing.T) {
	w := newEdgeWorld(t)
	w.startBridge(t, "bridge-a")
	w.startAgent(t)
	s := &edgeSuite{w: w}
	p := edgePod(uniqueName("exec"), edgeTolerations()...)
	s.createPod(t, p)
	s.waitRunning(t, p.Name)

	out, errOut, code := w.kubectl(t, "", 60*time.Second, "exec", p.Name, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
	if out != "out\n" || !strings.Contains(errOut, "err\n") || code != 3 {
		t.Errorf("exec: stdout %q, stderr %q, exit %d; want out, err, 3", out, errOut, code)
	}
	out, errOut, code = w.kubectl(t, "hello\nworld\n", 60*time.Second, "exec", "-i", p.Name, "--", "sh", "-c", "cat; echo done")
	if out != "hello\nworld\ndone\n" || code != 0 {
		t.Errorf("exec -i: stdout %q, stderr %q, exit %d; want the input back, then done", out, errOut, code)
	}
	const big = 2 << 20
	out, errOut, code = w.kubectl(t, "", 120*time.Second, "exec", p.Name, "--", "sh", "-c", "head -c 2097152 /dev/zero | tr '\\0' a")
	if len(out) != big || strings.Trim(out, "a") != "" || code != 0 {
		t.Errorf("exec of 2 MiB of output: %d bytes (all 'a': %v), stderr %q, exit %d", len(out), strings.Trim(out, "a") == "", errOut, code)
	}
	// port-forward: the container serves a file on its 127.0.0.1:8080 only, which the session
	// reaches from inside the pod's network namespace.
	web := edgePod(uniqueName("web"), edgeTolerations()...)
	web.Spec.Containers[0].Command = []string{"sh", "-c", "mkdir -p /www && echo served-from-the-pod > /www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /www"}
	s.createPod(t, web)
	s.waitRunning(t, web.Name)
	ports, err := loopback.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	pf := exec.Command(w.cluster.Kubectl(), "--kubeconfig", w.cluster.Kubeconfig(), "-n", testNS,
		"port-forward", "--address", "127.0.0.1", "pod/"+web.Name, fmt.Sprintf("%d:8080", ports[0]))
	var pfOut, pfErr testbuf.Buffer
	pf.Stdout, pf.Stderr = &pfOut, &pfErr
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		pf.Process.Kill()
		pf.Wait()
	}()
	url := fmt.Sprintf("http://127.0.0.1:%d/index.html", ports[0])
	within(t, runBound, "a page through kubectl port-forward", func() (bool, string) {
		body, err := httpGet(url)
		return err == nil && body == "served-from-the-pod\n", fmt.Sprintf("%q %v; kubectl: %s %s", body, err, pfOut.String(), pfErr.String())
	})
	for i := range 3 { // each connection is a session of its own
		if body, err := httpGet(url); err != nil || body != "served-from-the-pod\n" {
			t.Errorf("connection %d through port-forward: %q, %v", i+2, body, err)
		}
	}

	// kubelet's /run, through the API server's node proxy: the output as the answer.
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = w.kubectl(t, "", 60*time.Second, "create", "--raw",
		"/api/v1/nodes/"+edgeNode+"/proxy/run/"+testNS+"/"+p.Name+"/main?cmd=echo+ran+in+the+pod", "-f", empty)
	if strings.TrimSpace(out) != "ran in the pod" || code != 0 {
		t.Errorf("/run: %q, stderr %q, exit %d", out, errOut, code)
	}

	// kubectl run -i: a pod with stdin (stdinOnce), attached as soon as it runs; the container
	// reads its stdin through the attach, and kubectl gives its exit code.
	overrides := fmt.Sprintf(`{"apiVersion":"v1","spec":{"nodeName":%q,"terminationGracePeriodSeconds":5}}`, edgeNode)
	out, errOut, code = w.kubectl(t, "from-kubectl\n", 120*time.Second, "run", uniqueName("run-i"), "-i", "--restart=Never",
		"--image="+testenv.BusyboxRef, "--image-pull-policy=IfNotPresent", "--overrides="+overrides, "--",
		"sh", "-c", "read l; echo got:$l; exit 4")
	if !strings.Contains(out, "got:from-kubectl\n") || code != 4 {
		t.Errorf("kubectl run -i: stdout %q, stderr %q, exit %d; want got:from-kubectl and the container's exit 4", out, errOut, code)
	}
	// kubectl attach to a running container: its output from then on, until the container ends.
	// The container waits (saying so) until the test has seen the attach follow it, then ends:
	// nothing here rests on how soon kubectl attaches.
	talker := edgePod(uniqueName("talker"), edgeTolerations()...)
	talker.Spec.Containers[0].Command = []string{"sh", "-c", "until [ -e /tmp/go ]; do echo waiting; sleep 0.2; done; echo finished"}
	talker.Spec.RestartPolicy = v1.RestartPolicyNever
	s.createPod(t, talker)
	s.waitRunning(t, talker.Name)
	at := exec.Command(w.cluster.Kubectl(), "--kubeconfig", w.cluster.Kubeconfig(), "-n", testNS, "attach", talker.Name)
	var atOut, atErr testbuf.Buffer
	at.Stdout, at.Stderr = &atOut, &atErr
	if err := at.Start(); err != nil {
		t.Fatal(err)
	}
	atDone := make(chan error, 1)
	go func() { atDone <- at.Wait() }()
	defer func() {
		at.Process.Kill()
		<-atDone
	}()
	within(t, runBound, "kubectl attach following the container's output", func() (bool, string) {
		return strings.Contains(atOut.String(), "waiting\n"), atOut.String() + atErr.String()
	})
	if _, errOut, code := w.kubectl(t, "", 60*time.Second, "exec", talker.Name, "--", "touch", "/tmp/go"); code != 0 {
		t.Fatalf("touch /tmp/go in the talker: exit %d, %s", code, errOut)
	}
	select {
	case err := <-atDone:
		atDone <- err // for the deferred wait
		if err != nil || !strings.Contains(atOut.String(), "finished\n") {
			t.Errorf("kubectl attach: %v, stdout %q, stderr %q; want it to follow the output to finished and exit 0", err, atOut.String(), atErr.String())
		}
	case <-time.After(runBound):
		t.Errorf("kubectl attach did not end with the container: stdout %q", atOut.String())
	}

	w.stopAgent(t)
	within(t, readyBound, "exec refused as offline", func() (bool, string) {
		// "offline" is the bridge's answer from what it knows, not a timeout's.
		_, errOut, code := w.kubectl(t, "", 60*time.Second, "exec", p.Name, "--", "true")
		return code != 0 && strings.Contains(errOut, "offline"), errOut
	})
}
