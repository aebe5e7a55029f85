package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/event"
	"golang.org/x/sys/unix"
)

// fillDisk writes path until the file system it is on has no space left.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, chunk := range []int{1 << 20, 4 << 10, 1} {
		buf := make([]byte, chunk)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("fill %s: %v", path, err)
				}
				break
			}
		}
	}
}

// With the state dir on a file system that is full (a size-limited tmpfs filled to the last byte),
// removing the pod that filled it and adding another is not lost: the agent says in /readyz and in
// a node event that the change is not stored, runs what it ran meanwhile, and acts on the change
// once space is back. Before, the change was logged and dropped, and nothing showed it.
func TestFullStateDiskChangeRetried(t *testing.T) {
	h := newHarness(t)
	if err := os.MkdirAll(h.state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", h.state, "tmpfs", 0, "size=32m,mode=0700"); err != nil {
		t.Fatalf("mount a tmpfs on %s: %v", h.state, err)
	}
	// After the agent stops (cleanups run last first); a lazy unmount also drops the pod
	// namespace mounts inside.
	t.Cleanup(func() { unix.Unmount(h.state, unix.MNT_DETACH) })
	t.Cleanup(h.stopAgent)

	h.writeManifest("spew.yaml", strings.Replace(busyboxSleeper, "name: sleeper", "name: spew", 1))
	h.startAgent()
	h.waitPod("spew", "running", allRunning)

	filler := filepath.Join(h.state, "filler")
	fillDisk(t, filler)
	// The new pod carries a 200 KiB annotation: its record needs pages the file does not have yet.
	h.writeManifest("quiet.yaml", fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: quiet
  annotations: {blob: %q}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: main, image: mqlet.test/busybox:1, imagePullPolicy: Never, command: ["sleep", "3600"]}
`, strings.Repeat("x", 200<<10)))
	if err := os.Remove(filepath.Join(h.manifests, "spew.yaml")); err != nil {
		t.Fatal(err)
	}
	var notReady error
	waitFor(t, "/readyz saying the change is not stored", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		notReady = h.client.Ready(ctx)
		return notReady != nil && strings.Contains(notReady.Error(), "not stored") && strings.Contains(notReady.Error(), "no space left on device")
	})
	t.Logf("readyz: %v", notReady)
	if _, err := h.getPod("quiet"); err == nil {
		t.Errorf("quiet runs although its change is not stored")
	}
	if p, err := h.getPod("spew"); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("spew (err %v) is being removed although the removal is not stored", err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	h.waitPod("quiet", "running once space is back", allRunning)
	waitFor(t, "spew gone", func() bool { _, err := h.getPod("spew"); return err != nil })
	waitFor(t, "ready again", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return h.client.Ready(ctx) == nil
	})
	fams := scrape(t, unixHTTP(h.sock), "http://mqlet/metrics")
	for reason, typ := range map[string]string{event.ReasonStateWriteFailed: "Warning", event.ReasonStateWriteRecovered: "Normal"} {
		if v, _ := sampleOf(fams, "mqlet_events_total", map[string]string{"type": typ, "reason": reason}); v != 1 {
			t.Errorf("%s node events: %v, want 1", reason, v)
		}
	}
}
