package e2e

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/mqlet/mqlet/internal/testenv"
)

// hasImage asks containerd itself whether the harness's namespace holds the image.
func (h *harness) hasImage(name string) bool {
	h.t.Helper()
	c, err := containerd.New(h.env.ContainerdAddress)
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	_, err = c.ImageService().Get(namespaces.WithNamespace(context.Background(), h.ns), name)
	if errdefs.IsNotFound(err) {
		return false
	} else if err != nil {
		h.t.Fatalf("get image %s: %v", name, err)
	}
	return true
}

const busyboxSleeper = `apiVersion: v1
kind: Pod
metadata: {name: sleeper}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: mqlet.test/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "echo started; sleep 3600"]
`

// The agent runs image GC: with thresholds at 0 it removes the unused images at start, and keeps
// the one its pod runs from and the one in the preload dir.
func TestImageGCThroughAgent(t *testing.T) {
	h := newHarness(t)
	h.mqlet("image", "import", h.env.Image(testenv.Busybox2), h.env.Image(testenv.BusyboxOCI))
	preload := filepath.Join(h.dir, "preload")
	if err := os.MkdirAll(preload, 0o755); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(h.env.Image(testenv.Echo))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(filepath.Join(preload, "echo.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil || out.Close() != nil {
		t.Fatalf("copy the echo archive: %v", err)
	}
	h.writeManifest("sleeper.yaml", busyboxSleeper)
	h.startAgent("--image-gc-high-threshold", "0", "--image-gc-low-threshold", "0", "--image-minimum-gc-age", "0s")
	h.waitPod("sleeper", "running", allRunning)
	waitFor(t, "unused images removed by the agent's image GC", func() bool {
		return !h.hasImage(testenv.Busybox2Ref) && !h.hasImage(testenv.BusyboxOCIRef)
	})
	for _, name := range []string{testenv.BusyboxRef, testenv.EchoRef} {
		if !h.hasImage(name) {
			t.Errorf("image %s removed; it is in use or preloaded", name)
		}
	}
	// Low 0 cannot be reached: the warning says so (standalone, it is only logged).
	if log := h.agentLog.String(); !strings.Contains(log, "reason=FreeDiskSpaceFailed") {
		t.Errorf("agent log lacks the FreeDiskSpaceFailed warning:\n%s", log)
	}
}

// A deleted pod's log dir goes with it.
func TestLogDirRemovedWithPod(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("sleeper.yaml", busyboxSleeper)
	h.startAgent()
	p := h.waitPod("sleeper", "running", allRunning)
	waitFor(t, "the pod's log written", func() bool { return strings.Contains(h.logOf(p, "main"), "started") })
	if err := os.Remove(filepath.Join(h.manifests, "sleeper.yaml")); err != nil {
		t.Fatal(err)
	}
	// The pod leaves the API only once its teardown, sandbox included, is done.
	waitFor(t, "the pod gone from the API", func() bool {
		_, err := h.getPod("sleeper")
		return err != nil
	})
	if dirs, _ := filepath.Glob(filepath.Join(h.state, "logs", "*_sleeper_*")); len(dirs) != 0 {
		t.Errorf("log dirs left after the pod was deleted: %v", dirs)
	}
}

// A pod deleted while the agent was down loses its logs when the agent comes back, and so do the
// logs of a pod whose containers are already gone (a crash between its container removal and its
// sandbox removal left them).
func TestLogDirRemovedForPodDeletedWhileAgentDown(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("sleeper.yaml", busyboxSleeper)
	h.startAgent()
	p := h.waitPod("sleeper", "running", allRunning)
	waitFor(t, "the pod's log written", func() bool { return strings.Contains(h.logOf(p, "main"), "started") })
	h.stopAgent() // pods keep running
	if err := os.Remove(filepath.Join(h.manifests, "sleeper.yaml")); err != nil {
		t.Fatal(err)
	}
	ghost := filepath.Join(h.state, "logs", "default_ghost_0b5e55ed-ghost")
	if err := os.MkdirAll(filepath.Join(ghost, "main"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ghost, "main", "0.log"), []byte("old\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	h.startAgent()
	waitFor(t, "the deleted pod's containers and both log dirs removed", func() bool {
		dirs, _ := filepath.Glob(filepath.Join(h.state, "logs", "*_sleeper_*"))
		_, err := os.Stat(ghost)
		return len(h.containerIDs()) == 0 && len(dirs) == 0 && os.IsNotExist(err)
	})
}
