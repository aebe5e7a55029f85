package ctrd

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func quantity(s string) *resource.Quantity { q := resource.MustParse(s); return &q }

func memoryPod(uid string, sizeLimit *resource.Quantity, memLimits ...string) *v1.Pod {
	pod := sandboxPod(uid, "mem")
	pod.Spec.Volumes = append(pod.Spec.Volumes, v1.Volume{Name: "scratch",
		VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory, SizeLimit: sizeLimit}}})
	for i, l := range memLimits {
		c := v1.Container{Name: "c" + string(rune('a'+i)), Image: "x"}
		if l != "" {
			c.Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse(l)}
			c.Resources.Requests = c.Resources.Limits
		}
		pod.Spec.Containers = append(pod.Spec.Containers, c)
	}
	return pod
}

// kubelet's size: node allocatable, lowered to the pod's memory limit (only when every container
// has one), lowered to sizeLimit.
func TestEmptyDirMemorySize(t *testing.T) {
	const gi = 1 << 30
	r := &Runtime{memCapacity: 8 * gi, opts: Options{NodeAllocatableMemory: func() int64 { return 4 * gi }}}
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
		want int64
	}{
		{"allocatable", memoryPod("u", nil, ""), 4 * gi},
		{"pod limit", memoryPod("u", nil, "1Gi", "512Mi"), 1536 << 20},
		{"one container unlimited", memoryPod("u", nil, "1Gi", ""), 4 * gi},
		{"sizeLimit below pod limit", memoryPod("u", quantity("64Mi"), "1Gi"), 64 << 20},
		{"sizeLimit above pod limit", memoryPod("u", quantity("2Gi"), "1Gi"), 1 * gi},
		{"sizeLimit above allocatable", memoryPod("u", quantity("16Gi")), 4 * gi},
	} {
		vol := tc.pod.Spec.Volumes[len(tc.pod.Spec.Volumes)-1].EmptyDir
		if got := r.emptyDirHook().emptyDirMemorySize(tc.pod, vol); got != tc.want {
			t.Errorf("%s: size %d, want %d", tc.name, got, tc.want)
		}
	}
	r.opts.NodeAllocatableMemory = nil
	if got := r.emptyDirHook().emptyDirMemorySize(memoryPod("u", nil), &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory}); got != 8*gi {
		t.Errorf("no allocatable: size %d, want the machine's %d", got, 8*gi)
	}
}

// A Memory emptyDir is a tmpfs of its size, kept with its content across a second set-up (an agent
// restart), unmounted by release and by the sandbox's removal; the disk one beside it stays a dir.
func TestEmptyDirMemoryTmpfs(t *testing.T) {
	needRoot(t)
	r := testSandboxRuntime(t)
	ctx := context.Background()
	pod := memoryPod("6f1c2d3e-0051", quantity("3Mi"))
	t.Cleanup(func() { r.RemoveSandbox(ctx, RefOf(pod)) })
	sb, err := r.EnsureSandbox(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	dir := sb.Volumes["scratch"]
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) }) // should the code under test leave it
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type != tmpfsMagic || int64(st.Blocks)*st.Bsize != 3<<20 {
		t.Fatalf("scratch: fs type %#x, %d bytes; want a tmpfs of 3Mi", st.Type, int64(st.Blocks)*st.Bsize)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("scratch: %v, %v; want sticky 0777 like a fresh tmpfs", fi, err)
	}
	if mounted, _ := isMountPoint(sb.Volumes["cache"]); mounted {
		t.Errorf("disk emptyDir is a mount point")
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Writing past the size fails: the tmpfs is bounded.
	if err := os.WriteFile(filepath.Join(dir, "big"), make([]byte, 4<<20), 0o644); err == nil {
		t.Errorf("wrote 4Mi into a 3Mi tmpfs")
	}
	os.Remove(filepath.Join(dir, "big"))
	if _, err := r.EnsureSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(b) != "kept" {
		t.Errorf("second set-up lost the tmpfs content: %q, %v", b, err)
	}
	if n := len(slices.DeleteFunc(mountedUnder(t, sb.Dir), func(m string) bool { return m != dir })); n != 1 {
		t.Errorf("tmpfs mounted %d times at %s after a second set-up, want 1", n, dir)
	}

	if err := r.ReleasePodStorage(pod); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(mountedUnder(t, sb.Dir), dir) {
		t.Errorf("tmpfs still mounted after release")
	}
	if _, err := r.EnsureSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(mountedUnder(t, sb.Dir), dir) {
		t.Fatalf("tmpfs not mounted again")
	}
	if err := r.RemoveSandbox(ctx, RefOf(pod)); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(mountedUnder(t, sb.Dir), dir) {
		t.Errorf("tmpfs still mounted after the sandbox was removed")
	}
	if _, err := os.Stat(sb.Dir); !os.IsNotExist(err) {
		t.Errorf("pod dir left: %v", err)
	}
}

// A spec edit that turns the medium from Memory to disk unmounts the tmpfs, and back mounts it over
// an emptied dir; emptyDir.mode sets the dir's mode.
func TestEmptyDirMediumChangeAndMode(t *testing.T) {
	needRoot(t)
	r := testSandboxRuntime(t)
	ctx := context.Background()
	pod := memoryPod("6f1c2d3e-0052", quantity("1Mi"))
	t.Cleanup(func() { r.RemoveSandbox(ctx, RefOf(pod)) })
	sb, err := r.EnsureSandbox(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	dir := sb.Volumes["scratch"]
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) }) // should the code under test leave it
	mode1750 := int32(0o1750)
	pod.Spec.Volumes[1].EmptyDir = &v1.EmptyDirVolumeSource{Mode: &mode1750}
	if _, err := r.EnsureSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(mountedUnder(t, sb.Dir), dir) {
		t.Errorf("tmpfs still mounted after the medium became disk")
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m := fi.Mode(); m.Perm() != 0o750 || m&os.ModeSticky == 0 {
		t.Errorf("mode %v, want sticky 0750", m)
	}
	os.WriteFile(filepath.Join(dir, "on-disk"), []byte("x"), 0o644)
	pod.Spec.Volumes[1].EmptyDir = &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory}
	if _, err := r.EnsureSandbox(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(mountedUnder(t, sb.Dir), dir) {
		t.Errorf("no tmpfs after the medium became Memory again")
	}
	if err := unmount(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "on-disk")); !os.IsNotExist(err) {
		t.Errorf("disk content left hidden under the tmpfs: %v", err)
	}
}
