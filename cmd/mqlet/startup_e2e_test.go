package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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

// A corrupt state file is refused with an error naming the file and the way out; the file is left
// exactly as it was.
func TestCorruptStateFileRefused(t *testing.T) {
	h := newHarness(t)
	os.MkdirAll(h.state, 0o700)
	db := filepath.Join(h.state, store.FileName)
	garbage := bytes.Repeat([]byte("not a bolt file "), 4096)
	if err := os.WriteFile(db, garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := h.runAgent()
	if err == nil {
		t.Fatalf("agent started on a corrupt state file:\n%s", out)
	}
	if !strings.Contains(out, db) || !strings.Contains(out, "corrupt") || !strings.Contains(out, "mv ") {
		t.Errorf("error does not name the file, the problem and the recovery:\n%s", out)
	}
	if after, _ := os.ReadFile(db); !bytes.Equal(after, garbage) {
		t.Errorf("the corrupt file was modified")
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
	for _, w := range []string{"ok", "Succeeded", "long", "Running"} {
		if !strings.Contains(out, w) {
			t.Errorf("--once output lacks %q:\n%s", w, out)
		}
	}
	if len(h.tasks()) != 1 {
		t.Errorf("after --once, want the long pod still running, tasks: %v", h.tasks())
	}
	h.writeManifest("bad.yaml", `apiVersion: v1
kind: Pod
metadata: {name: bad}
spec:
  restartPolicy: Never
  containers:
  - {name: main, image: mqlet.test/busybox:1, command: ["sh", "-c", "exit 4"]}
`)
	out, err = h.runAgent("--once", "--once-timeout", "60s")
	if err == nil || !strings.Contains(out, "default/bad") {
		t.Errorf("--once with a failing pod: err=%v\n%s", err, out)
	}
}
