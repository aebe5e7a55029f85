package ctrd

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// An evicted pod gives back its shm tmpfs and emptyDir contents; its logs and pod dir stay, and
// should it run again the sandbox set-up makes both anew.
func TestReleasePodStorage(t *testing.T) {
	needRoot(t)
	r := testSandboxRuntime(t)
	ctx := context.Background()
	pod := sandboxPod("6f1c2d3e-0042", "evicted")
	t.Cleanup(func() { r.RemoveSandbox(ctx, RefOf(pod)) })
	sb, err := r.EnsureSandbox(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	shm := filepath.Join(sb.Dir, "shm")
	if !slices.Contains(mountedUnder(t, sb.Dir), shm) {
		t.Fatalf("no shm tmpfs at %s to release", shm)
	}
	os.WriteFile(filepath.Join(sb.Volumes["cache"], "big"), make([]byte, 1<<20), 0o644)
	os.WriteFile(filepath.Join(sb.LogDir, "0.log"), []byte("last words\n"), 0o644)
	dirs, err := r.PodStorageDirs(pod)
	if err != nil || len(dirs) != 2 || dirs[0] != sb.Dir || dirs[1] != sb.LogDir {
		t.Errorf("PodStorageDirs = %v, %v; want [%s %s]", dirs, err, sb.Dir, sb.LogDir)
	}

	if err := r.ReleasePodStorage(pod); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(mountedUnder(t, sb.Dir), shm) {
		t.Errorf("shm tmpfs still mounted after release")
	}
	if _, err := os.Stat(sb.Volumes["cache"]); !os.IsNotExist(err) {
		t.Errorf("emptyDir still there after release: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(sb.LogDir, "0.log")); err != nil || string(b) != "last words\n" {
		t.Errorf("logs lost: %q, %v", b, err)
	}
	if err := r.ReleasePodStorage(pod); err != nil {
		t.Errorf("second release: %v", err)
	}

	sb, err = r.EnsureSandbox(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(mountedUnder(t, sb.Dir), shm) {
		t.Errorf("shm not mounted again when the pod runs again")
	}
	if _, err := os.Stat(sb.Volumes["cache"]); err != nil {
		t.Errorf("emptyDir not made again: %v", err)
	}
}
