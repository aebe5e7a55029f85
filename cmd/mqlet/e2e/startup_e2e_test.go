package e2e

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/store"
)

// runAgent runs `mqlet agent` to completion with the harness flags plus extra, and returns its output.
func (h *harness) runAgent(extra ...string) (string, error) {
	cmd := exec.Command(h.bin, append(append([]string{"agent"}, h.flags()...), extra...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// A damaged state file (a power cut truncated it, or a bit flipped on the flash) does not keep the
// node down: the agent sets it aside under a timestamped name, says so in its log and in a node
// event, starts from empty state, and adopts the pods that are running instead of restarting them.
// Before, it refused to start, and a file with a broken page passed Open and crashed the agent later.
func TestDamagedStateFileSetAside(t *testing.T) {
	for name, damage := range map[string]func(t *testing.T, b []byte) []byte{
		"truncated": func(t *testing.T, b []byte) []byte { return b[:len(b)/2] },
		// The top bit of the root page's element count: 32768 more elements than the page holds.
		"one bit flipped": func(t *testing.T, b []byte) []byte {
			ps := os.Getpagesize()
			meta := func(i, off int) uint64 { return binary.NativeEndian.Uint64(b[i*ps+16+off:]) }
			newest := 0
			if meta(1, 48) > meta(0, 48) {
				newest = 1
			}
			root := int(meta(newest, 16))
			b[root*ps+11] ^= 0x80
			return b
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			h.writeManifest("web.yaml", twoContainers)
			h.startAgent()
			h.waitPod("web", "running", allRunning)
			pids := h.tasks()
			h.stopAgent()

			db := filepath.Join(h.state, store.FileName)
			b, err := os.ReadFile(db)
			if err != nil {
				t.Fatal(err)
			}
			bad := damage(t, b)
			if err := os.WriteFile(db, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			h.startAgent()
			h.waitPod("web", "running", allRunning)
			h.undisturbed("web", pids)

			aside, _ := filepath.Glob(db + ".corrupt-*")
			if len(aside) != 1 {
				t.Fatalf("set-aside files %v, want one\nagent log:\n%s", aside, h.agentLog)
			}
			if after, _ := os.ReadFile(aside[0]); !bytes.Equal(after, bad) {
				t.Errorf("%s is not the damaged file as it was", aside[0])
			}
			if log := h.agentLog.String(); !strings.Contains(log, aside[0]) || !strings.Contains(log, "damaged") {
				t.Errorf("agent log does not name the set-aside file %s:\n%s", aside[0], log)
			}
			fams := scrape(t, unixHTTP(h.sock), "http://mqlet/metrics")
			if v, _ := sampleOf(fams, "mqlet_events_total", map[string]string{"type": "Warning", "reason": event.ReasonStateFileSetAside}); v != 1 {
				t.Errorf("%s node events counted: %v, want 1", event.ReasonStateFileSetAside, v)
			}
			// The new state file holds the pod again: a restart finds it without the manifest dir.
			h.stopAgent()
			if n, _ := filepath.Glob(db + ".corrupt-*"); len(n) != 1 {
				t.Errorf("set-aside files after a clean stop: %v", n)
			}
			h.startAgent()
			h.waitPod("web", "running", allRunning)
			if n, _ := filepath.Glob(db + ".corrupt-*"); len(n) != 1 {
				t.Errorf("the new state file was set aside too: %v\nagent log:\n%s", n, h.agentLog)
			}
		})
	}
}

// Start-up validation names the setting and value: an unreachable containerd, an unwritable state
// dir, a bad duration, an unknown config key.
func TestStartupValidationErrors(t *testing.T) {
	h := newHarness(t)
	file := filepath.Join(h.dir, "f")
	os.WriteFile(file, nil, 0o644)
	cfg := filepath.Join(h.dir, "mqlet.yaml")
	os.WriteFile(cfg, []byte("nodeName: a\nmanifestDirr: /x\n"), 0o644)
	for _, tc := range []struct {
		name  string
		extra []string
		want  []string
	}{
		{"containerd", []string{"--containerd-address", filepath.Join(h.dir, "nothing.sock"), "--containerd-timeout", "1s"}, []string{"nothing.sock", "containerd"}},
		{"state dir", []string{"--state-dir", filepath.Join(file, "state")}, []string{"state-dir", filepath.Join(file, "state")}},
		{"duration", []string{"--relist-period", "100ms"}, []string{"relist-period", "100ms"}},
		{"config key", []string{"--config", cfg}, []string{"manifestDirr", cfg}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := h.runAgent(tc.extra...)
			if err == nil {
				t.Fatalf("agent started:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("error lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

// --once starts the pods, waits for them, prints their status and exits; non-zero if one failed.
func TestRunOnce(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("ok.yaml", `apiVersion: v1
kind: Pod
metadata: {name: ok}
spec:
  restartPolicy: Never
  containers:
  - {name: main, image: mqlet.test/busybox:1, command: ["true"]}
---
apiVersion: v1
kind: Pod
metadata: {name: long}
spec:
  containers:
  - {name: main, image: mqlet.test/busybox:1, command: ["sleep", "3600"]}
`)
	out, err := h.runAgent("--once", "--once-timeout", "60s")
	if err != nil {
		t.Fatalf("--once failed: %v\n%s", err, out)
	}
	// The ok pod's container may be seen running before it exits, which --once counts as settled
	// (kubelet's --runonce waits for pods to run, not to end): Running or Succeeded, result ok.
	onceRow := func(out, name string) []string {
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) == 4 && f[0] == "default" && f[1] == name {
				return f
			}
		}
		return nil
	}
	if r := onceRow(out, "ok"); r == nil || (r[2] != "Running" && r[2] != "Succeeded") || r[3] != "ok" {
		t.Errorf("--once row of the ok pod = %q, want Running or Succeeded, result ok:\n%s", r, out)
	}
	if r := onceRow(out, "long"); r == nil || r[2] != "Running" || r[3] != "ok" {
		t.Errorf("--once row of the long pod = %q, want Running, result ok:\n%s", r, out)
	}
	// Once the ok pod's container has exited, a second --once restores both pods and reports the
	// finished one Succeeded (restartPolicy Never: not run again).
	deadline := time.Now().Add(30 * time.Second)
	for len(h.tasks()) != 1 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if len(h.tasks()) != 1 {
		t.Fatalf("after --once, want the long pod alone running, tasks: %v", h.tasks())
	}
	out, err = h.runAgent("--once", "--once-timeout", "60s")
	if err != nil {
		t.Fatalf("second --once failed: %v\n%s", err, out)
	}
	if r := onceRow(out, "ok"); r == nil || r[2] != "Succeeded" || r[3] != "ok" {
		t.Errorf("second --once row of the ok pod = %q, want Succeeded, result ok:\n%s", r, out)
	}
	if len(h.tasks()) != 1 {
		t.Errorf("after the second --once, want the long pod still running, tasks: %v", h.tasks())
	}
	h.writeManifest("bad.yaml", `apiVersion: v1
kind: Pod
metadata: {name: bad}
spec:
  restartPolicy: Never
  containers:
  - {name: main, image: mqlet.test/busybox:1, command: ["/no/such/program"]}
`)
	// A container that cannot start fails the pod whatever the timing; one that starts and then
	// exits non-zero may be seen running first, which --once counts as settled, as kubelet's
	// --runonce does.
	out, err = h.runAgent("--once", "--once-timeout", "60s")
	if err == nil || !strings.Contains(out, "default/bad") {
		t.Errorf("--once with a failing pod: err=%v\n%s", err, out)
	}
}
