package e2e

// End-to-end tests of container logs (CRI format, rotation, mqlet logs) and termination messages,
// against the real containerd through the real mqlet binary.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/logs"
	v1 "k8s.io/api/core/v1"
)

// rotationFlags make rotation happen after 64 KiB (the smallest size allowed), keeping 3 files.
var rotationFlags = []string{"--container-log-max-size", "64Ki", "--container-log-max-files", "3"}

// logFiles are the files of attempt n of container c of pod p: rotated ones first, current last.
func (h *harness) logFiles(p *v1.Pod, c string, n int) []string {
	h.t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(h.state, "logs", "default_"+p.Name+"_"+string(p.UID), c))
	if len(dirs) != 1 {
		h.t.Fatalf("log dir of %s/%s: %v", p.Name, c, dirs)
	}
	cur := filepath.Join(dirs[0], strconv.Itoa(n)+".log")
	rotated, err := logs.RotatedFiles(cur)
	if err != nil {
		h.t.Fatal(err)
	}
	return append(rotated, cur)
}

// checkNumbered checks that text is lines "line-N" with N growing by one, and returns the first
// and last N.
func checkNumbered(t *testing.T, what, text string) (int, int) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	first, last := -1, -1
	for i, l := range lines {
		n, err := strconv.Atoi(strings.TrimPrefix(l, "line-"))
		if err != nil || !strings.HasPrefix(l, "line-") {
			t.Fatalf("%s: line %d is %.60q, not line-N", what, i, l)
		}
		if i > 0 && n != last+1 {
			t.Fatalf("%s: line-%d follows line-%d: lines were lost or repeated", what, n, last)
		}
		if i == 0 {
			first = n
		}
		last = n
	}
	return first, last
}

// A container that writes as fast as busybox can: its log rotates at 64 KiB, at most 3 files stay,
// every record is CRI-formatted, and the lines kept run on with no gap from file to file up to the
// last line written. The pod's logs go with the pod.
func TestLogRotationFastWriter(t *testing.T) {
	h := newHarness(t)
	const n = 30000
	h.writeManifest("fast.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: fast}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "i=0; while [ $i -lt %d ]; do echo line-$i; i=$((i+1)); done"]
`, n))
	h.startAgent(rotationFlags...)
	p := h.waitPod("fast", "Succeeded", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })

	files := h.logFiles(p, "main", 0)
	if len(files) != 3 {
		t.Fatalf("%d log files, want 3 (rotated at 64Ki, 3 kept): %v", len(files), files)
	}
	var all strings.Builder
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if i < len(files)-1 && len(b) > 64<<10 {
			t.Errorf("%s is %d bytes, over 64Ki", f, len(b))
		}
		for _, rec := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
			e, err := logs.Parse([]byte(rec))
			if err != nil || e.Stream != logs.Stdout || e.Partial {
				t.Fatalf("%s: record %q: %v", filepath.Base(f), rec, err)
			}
			all.Write(e.Content)
			all.WriteByte('\n')
		}
	}
	first, last := checkNumbered(t, "the kept files", all.String())
	if first == 0 || last != n-1 {
		t.Errorf("kept lines run from line-%d to line-%d; want the end (line-%d) with older files rotated away", first, last, n-1)
	}
	// mqlet logs reads the same lines, rotated files included.
	if out := h.mqlet("logs", "fast"); out != all.String() {
		t.Errorf("mqlet logs differs from the files: %d bytes, want %d", len(out), all.Len())
	}

	logDir := filepath.Dir(files[0])
	os.Remove(filepath.Join(h.manifests, "fast.yaml"))
	waitFor(t, "the pod's log dir removed with it", func() bool {
		_, err := os.Stat(filepath.Dir(logDir))
		return os.IsNotExist(err)
	})
}

// `mqlet logs -f` started before the log rotates goes on across rotations: it shows the lines
// written after them, in order, up to the last.
func TestLogsFollowAcrossRotation(t *testing.T) {
	h := newHarness(t)
	gate := filepath.Join(h.dir, "gate")
	os.MkdirAll(gate, 0o755)
	// Bursts of 250 lines every 0.1 s: about 2 rotations a second, so a follower held up by a
	// busy machine for less than a second still finds the files it has not read.
	h.writeManifest("burst.yaml", `apiVersion: v1
kind: Pod
metadata: {name: burst}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - {name: gate, hostPath: {path: `+gate+`}}
  containers:
  - name: main
    image: mqlet.test/busybox:1
    volumeMounts: [{name: gate, mountPath: /gate}]
    command: ["sh", "-c", "echo line-0; until [ -e /gate/go ]; do sleep 0.1; done; i=1; while [ $i -le 10000 ]; do echo line-$i; i=$((i+1)); if [ $((i % 250)) = 0 ]; then sleep 0.1; fi; done; sleep 3600"]
`)
	h.startAgent(rotationFlags...)
	p := h.waitPod("burst", "running", allRunning)

	out := &syncBuffer{}
	follow := exec.Command(h.bin, "logs", "-f", "burst")
	follow.Env = append(os.Environ(), "MQLET_API_SOCKET="+h.sock)
	follow.Stdout, follow.Stderr = out, out
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		follow.Process.Kill() // by pid: the process this test started
		follow.Wait()
	}()
	waitFor(t, "mqlet logs -f showing the first line", func() bool { return strings.Contains(out.String(), "line-0\n") })
	if n := len(h.logFiles(p, "main", 0)); n != 1 {
		t.Fatalf("the log rotated before the follower started (%d files)", n)
	}
	os.WriteFile(filepath.Join(gate, "go"), nil, 0o644)
	waitFor(t, "mqlet logs -f showing the last line", func() bool { return strings.Contains(out.String(), "line-10000\n") })
	if n := len(h.logFiles(p, "main", 0)); n != 3 {
		t.Errorf("%d log files after the bursts, want 3: the log did not rotate", n)
	}
	// A follower that falls behind by more rotations than files are kept loses what was removed,
	// as kubectl's does; this one keeps up (it looks again at once while the log grows), and
	// shows every line in order.
	first, last := checkNumbered(t, "mqlet logs -f", out.String())
	if first != 0 || last != 10000 {
		t.Errorf("mqlet logs -f showed line-%d to line-%d, want line-0 to line-10000", first, last)
	}
}

// --tail, --since, --timestamps and --previous, on a container that restarted once.
func TestLogsOptions(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("opts.yaml", `apiVersion: v1
kind: Pod
metadata: {name: opts}
spec:
  terminationGracePeriodSeconds: 1
  volumes: [{name: data, emptyDir: {}}]
  containers:
  - name: main
    image: mqlet.test/busybox:1
    volumeMounts: [{name: data, mountPath: /data}]
    command: ["sh", "-c", "n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n; echo attempt-$n; echo one; echo two; if [ $n = 1 ]; then exit 1; fi; sleep 8; echo late; sleep 3600"]
`)
	h.startAgent()
	h.waitPod("opts", "restarted and logging late", func(p *v1.Pod) bool {
		return containerStatus(p, "main").RestartCount == 1 && strings.Contains(h.logOf(p, "main"), "late\n")
	})
	if out := h.mqlet("logs", "opts"); out != "attempt-2\none\ntwo\nlate\n" {
		t.Errorf("mqlet logs = %q", out)
	}
	if out := h.mqlet("logs", "opts", "--previous"); out != "attempt-1\none\ntwo\n" {
		t.Errorf("mqlet logs --previous = %q", out)
	}
	if out := h.mqlet("logs", "opts", "--tail", "2"); out != "two\nlate\n" {
		t.Errorf("mqlet logs --tail 2 = %q", out)
	}
	if out := h.mqlet("logs", "opts", "-c", "main", "--tail", "0"); out != "" {
		t.Errorf("mqlet logs --tail 0 = %q", out)
	}
	stamped := strings.TrimSuffix(h.mqlet("logs", "opts", "--timestamps", "--tail", "1"), "\n")
	ts, line, _ := strings.Cut(stamped, " ")
	at, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil || line != "late" || time.Since(at) > 2*time.Minute || time.Since(at) < 0 {
		t.Fatalf("mqlet logs --timestamps --tail 1 = %q (%v)", stamped, err)
	}
	// "late" came 8 s after the others: from its second on, it is alone, however long this test
	// took to get here (a relative --since depends on when it is asked; this does not).
	if out := h.mqlet("logs", "opts", "--since-time", at.UTC().Truncate(time.Second).Format(time.RFC3339)); out != "late\n" {
		t.Errorf("mqlet logs --since-time <late's second> = %q, want only the late line", out)
	}
	// Every line of this test is less than an hour old.
	if out := h.mqlet("logs", "opts", "--since", "1h"); out != "attempt-2\none\ntwo\nlate\n" {
		t.Errorf("mqlet logs --since 1h = %q, want every line", out)
	}
	if out, err := h.mqletErr("logs", "opts", "--since", "-1s"); err == nil {
		t.Errorf("a negative --since was accepted: %s", out)
	}
}

// What a container writes to /dev/termination-log is its terminated state's message; with
// FallbackToLogsOnError and nothing written, a failed container's message is its log's tail (the
// last 80 lines); a container that succeeds gets no message from its log.
func TestTerminationMessage(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("term.yaml", `apiVersion: v1
kind: Pod
metadata: {name: term}
spec:
  restartPolicy: Never
  containers:
  - name: file
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "printf bye > /dev/termination-log; exit 1"]
  - name: fallback
    image: mqlet.test/busybox:1
    terminationMessagePolicy: FallbackToLogsOnError
    command: ["sh", "-c", "i=1; while [ $i -le 100 ]; do echo log-$i; i=$((i+1)); done; exit 2"]
  - name: fine
    image: mqlet.test/busybox:1
    terminationMessagePolicy: FallbackToLogsOnError
    command: ["sh", "-c", "echo all good"]
  - name: custom
    image: mqlet.test/busybox:1
    terminationMessagePath: /tmp/why
    command: ["sh", "-c", "echo custom path > /tmp/why"]
`)
	h.startAgent()
	p := h.waitPod("term", "Failed", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	msg := func(name string) string {
		term := containerStatus(p, name).State.Terminated
		if term == nil {
			t.Fatalf("%s not terminated: %s", name, podSummaryForTest(p))
		}
		return term.Message
	}
	if m := msg("file"); m != "bye" {
		t.Errorf("file: message %q, want %q", m, "bye")
	}
	var want strings.Builder
	for i := 21; i <= 100; i++ {
		fmt.Fprintf(&want, "log-%d\n", i)
	}
	if m := msg("fallback"); m != want.String() {
		t.Errorf("fallback: message %q, want the last 80 lines of its log", m)
	}
	if m := msg("fine"); m != "" {
		t.Errorf("fine: message %q, want none (it succeeded)", m)
	}
	if m := msg("custom"); m != "custom path\n" {
		t.Errorf("custom: message %q", m)
	}
}

// The agent stopping (SIGTERM) or being killed (-9) and coming back leaves the container running,
// and its log goes on where it stopped: the restarted agent attaches to the output again.
func TestLogsSurviveAgentRestart(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("tick.yaml", `apiVersion: v1
kind: Pod
metadata: {name: tick}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "i=0; while true; do echo line-$i; i=$((i+1)); sleep 0.02; done"]
`)
	h.startAgent()
	p := h.waitPod("tick", "running", allRunning)
	pids := h.tasks()
	lines := func() int { _, last := checkNumbered(t, "log", h.logOf(p, "main")); return last }
	for _, stop := range []func(){h.stopAgent, h.kill9Agent} {
		waitFor(t, "more lines", func() bool { return lines() > 20 })
		stop()
		before := lines()
		time.Sleep(time.Second) // the container goes on writing into the pipe meanwhile
		h.startAgent()
		waitFor(t, "lines written while the agent was away, and after", func() bool { return lines() > before+100 })
	}
	if got := h.tasks(); fmt.Sprint(got) != fmt.Sprint(pids) {
		t.Errorf("tasks changed across agent restarts: %v, then %v", pids, got)
	}
	checkNumbered(t, "the log across two agent restarts", h.logOf(p, "main"))
}
