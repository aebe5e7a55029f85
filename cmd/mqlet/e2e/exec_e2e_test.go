package e2e

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/internal/mqtttest"
)

// `mqlet exec` runs a command in a pod's container through the agent's API: stdin in, stdout and
// stderr apart, the command's exit code as mqlet's; a pod or container that is not there is refused
// with the agent's message.
func TestExecThroughTheAgent(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("web.yaml", twoContainers)
	h.startAgent()
	h.waitPod("web", "running", allRunning)

	run := func(stdin string, args ...string) (string, string, int) {
		cmd := exec.Command(h.bin, args...)
		cmd.Env = append(os.Environ(), "MQLET_API_SOCKET="+h.sock)
		cmd.Stdin = strings.NewReader(stdin)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errOut.String(), code
	}

	out, errOut, code := run("from-stdin\n", "exec", "-i", "-c", "client", "web", "--", "sh", "-c", "cat; echo on-stderr >&2; exit 3")
	if out != "from-stdin\n" || errOut != "on-stderr\n" || code != 3 {
		t.Errorf("stdout %q, stderr %q, exit %d; want from-stdin, on-stderr, 3", out, errOut, code)
	}
	// Without -i the command's stdin is closed: cat ends at once.
	out, _, code = run("ignored\n", "exec", "default/web", "--", "sh", "-c", "cat; echo done")
	if out != "done\n" || code != 0 {
		t.Errorf("without -i: stdout %q, exit %d; want done, 0", out, code)
	}
	// -t with stdin not a terminal goes on without one, as kubectl does.
	out, errOut, code = run("", "exec", "-t", "web", "--", "sh", "-c", "tty || true")
	if !strings.Contains(out, "not a tty") || !strings.Contains(errOut, "Unable to use a TTY") || code != 0 {
		t.Errorf("-t without a terminal: stdout %q, stderr %q, exit %d", out, errOut, code)
	}
	_, errOut, code = run("", "exec", "nope", "--", "true")
	if code != 1 || !strings.Contains(errOut, "pod default/nope not found") {
		t.Errorf("unknown pod: exit %d, stderr %q", code, errOut)
	}
	_, errOut, code = run("", "exec", "-c", "nosuch", "web", "--", "true")
	if code != 1 || !strings.Contains(errOut, "container nosuch is not valid") {
		t.Errorf("unknown container: exit %d, stderr %q", code, errOut)
	}
}

// stdinReader reads one line from its stdin (given through an attach) and ends.
const stdinReader = `apiVersion: v1
kind: Pod
metadata:
  name: reader
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 2
  containers:
  - name: reader
    image: mqlet.test/busybox:1
    stdin: true
    stdinOnce: true
    command: ["sh", "-c", "read l; echo got:$l; exit 7"]
`

// `mqlet ctl exec` runs a command in a pod's container through the broker, sealed end to end:
// stdin in, stdout and stderr apart, the exit code as mqlet's; `ctl attach` joins a container's
// process; an offline node fails at once.
func TestCtlExecOverMQTT(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	h.writeManifest("web.yaml", twoContainers)
	h.startMQTTAgent(b.Plain)
	h.waitPod("web", "running", allRunning)
	// The node's status carries its sealing key, which the session's keys are agreed with: wait
	// until the broker holds it (the node publishes it once its status settled).
	waitFor(t, "the node's status with its sealing key", func() bool {
		out, _ := h.mqletErr("ctl", "--broker", b.Plain, "exec", e2eNode+"/web", "--", "true")
		return !strings.Contains(out, "has not reported its status")
	})
	run := func(stdin string, args ...string) (string, string, int) {
		cmd := exec.Command(h.bin, append([]string{"ctl", "--broker", b.Plain}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errOut.String(), code
	}
	out, errOut, code := run("from-stdin\n", "exec", "-i", "-c", "client", e2eNode+"/web", "--", "sh", "-c", "cat; echo on-stderr >&2; exit 3")
	if out != "from-stdin\n" || errOut != "on-stderr\n" || code != 3 {
		t.Errorf("stdout %q, stderr %q, exit %d; want from-stdin, on-stderr, 3", out, errOut, code)
	}
	_, errOut, code = run("", "exec", "--node", e2eNode, "nope", "--", "true")
	if code != 1 || !strings.Contains(errOut, "pod default/nope not found") {
		t.Errorf("unknown pod: exit %d, stderr %q", code, errOut)
	}

	// attach: a container with stdin (stdinOnce) reads a line through the attach, and ctl attach
	// exits with the container's exit code once it ended.
	h.writeManifest("reader.yaml", stdinReader)
	waitFor(t, "the reader pod running", func() bool {
		_, errOut, _ := run("", "exec", e2eNode+"/reader", "--", "true")
		return errOut == ""
	})
	out, errOut, code = run("through-attach\n", "attach", "-i", e2eNode+"/reader")
	if out != "got:through-attach\n" || code != 7 {
		t.Errorf("ctl attach -i: stdout %q, stderr %q, exit %d; want got:through-attach and 7", out, errOut, code)
	}

	// port-forward: an HTTP request through the local port reaches the server container, which
	// listens on the pod's 127.0.0.1 only.
	pf := exec.Command(h.bin, "ctl", "--broker", b.Plain, "port-forward", e2eNode+"/web", "0:8080")
	pfOut := &syncBuffer{}
	pf.Stdout, pf.Stderr = pfOut, pfOut
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { pf.Process.Kill(); pf.Wait() }()
	var local string
	waitFor(t, "port-forward listening", func() bool {
		_, after, ok := strings.Cut(pfOut.String(), "Forwarding from ")
		local, _, _ = strings.Cut(after, " ")
		return ok && strings.Contains(after, " -> 8080")
	})
	for i := 0; i < 2; i++ { // two connections: each is a session of its own
		resp, err := http.Get("http://" + local + "/hosts")
		if err != nil {
			t.Fatalf("GET through port-forward: %v (port-forward said %q)", err, pfOut.String())
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), "localhost") {
			t.Errorf("GET /hosts through port-forward: %s %q", resp.Status, body)
		}
	}

	h.stopAgent()
	waitFor(t, "the node offline", func() bool {
		out, err := h.mqletErr("ctl", "--broker", b.Plain, "get", "nodes")
		return err == nil && strings.Contains(out, "offline")
	})
	_, errOut, code = run("", "exec", e2eNode+"/web", "--", "true")
	if code != 1 || !strings.Contains(errOut, "the node is offline") {
		t.Errorf("offline node: exit %d, stderr %q", code, errOut)
	}
}
