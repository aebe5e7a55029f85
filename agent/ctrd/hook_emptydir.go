package ctrd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/mqlet/mqlet/agent/cgroup"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// emptyDir volumes live in <pod dir>/volumes/<name>. A disk-backed one is a plain directory on the
// state dir's file system (its sizeLimit is watched by the eviction manager); a memory-backed one
// (medium: Memory) is a tmpfs mounted there, sized as kubelet sizes it. The tmpfs's pages are
// charged to the memory cgroup of the container that writes them, so they count against the pod's
// memory limit as with kubelet.

// emptyDirMode is the mode of an emptyDir whose spec gives none: world-writable like kubelet's,
// whatever the umask, since pods often run as non-root.
const emptyDirMode = 0o777

// EmptyDirPath is where the pod's emptyDir volume called name lives on the node (for the eviction
// manager's sizeLimit check). The name is checked to be one path element.
func (r *Runtime) EmptyDirPath(pod *v1.Pod, name string) (string, error) {
	dir, err := r.dirs().podDir(pod.UID)
	if err != nil {
		return "", err
	}
	return joinUnder(dir, "volumes", name)
}

// setupEmptyDirs makes every emptyDir volume of pod below the sandbox's pod dir and records it in
// sb.Volumes. It is idempotent: a tmpfs already mounted is kept with what it holds (an agent
// restart must not wipe a running pod's volume).
func (h emptyDirHook) setupEmptyDirs(pod *v1.Pod, sb *Sandbox) error {
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir == nil {
			continue
		}
		dir, err := joinUnder(sb.Dir, "volumes", v.Name)
		if err != nil {
			return fmt.Errorf("emptyDir %q: %w", v.Name, err)
		}
		if err := h.setupEmptyDir(pod, v.EmptyDir, dir); err != nil {
			return fmt.Errorf("emptyDir %q: %w", v.Name, err)
		}
		sb.Volumes[v.Name] = dir
	}
	return nil
}

func (h emptyDirHook) setupEmptyDir(pod *v1.Pod, src *v1.EmptyDirVolumeSource, dir string) error {
	mode := os.FileMode(emptyDirMode)
	switch {
	case src.Mode != nil:
		mode = fileMode(*src.Mode)
	case src.Medium == v1.StorageMediumMemory:
		mode |= os.ModeSticky // a fresh tmpfs's root, as kubelet leaves it
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	mounted, err := isMountPoint(dir)
	if err != nil {
		return err
	}
	switch src.Medium {
	case v1.StorageMediumDefault:
		if mounted {
			// The pod's spec turned a memory-backed volume into a disk one (a manifest edit keeps
			// the UID): what was in memory goes, as it would with a new emptyDir.
			if err := unmount(dir); err != nil {
				return err
			}
		}
	case v1.StorageMediumMemory:
		if !mounted {
			// Anything below was written while the volume was disk-backed; it would sit hidden
			// under the tmpfs, using disk no one can see.
			if err := removeContents(dir); err != nil {
				return err
			}
			if err := mountTmpfs(dir, h.emptyDirMemorySize(pod, src)); err != nil {
				return err
			}
		}
	default:
		// Admission refuses other media; a pod stored by an older mqlet may still carry one.
		return fmt.Errorf("medium %q is not supported on this node (only \"\" and \"Memory\")", src.Medium)
	}
	return os.Chmod(dir, mode)
}

// fileMode turns a Kubernetes numeric mode (0000..01777, sticky bit allowed) into os bits.
func fileMode(m int32) os.FileMode {
	out := os.FileMode(m & 0o777)
	if m&0o1000 != 0 {
		out |= os.ModeSticky
	}
	return out
}

// emptyDirMemorySize is kubelet's size for a memory-backed emptyDir: node allocatable memory,
// lowered to the pod's memory limit when every container has one (the same limit its cgroup gets),
// lowered again to the volume's sizeLimit when that is smaller. A tmpfs can never hold more than
// the pod could use anyway, and an unbounded one would default to half the RAM.
func (h emptyDirHook) emptyDirMemorySize(pod *v1.Pod, src *v1.EmptyDirVolumeSource) int64 {
	size := h.memCapacity
	if f := h.nodeAllocatable; f != nil {
		if a := f(); a > 0 {
			size = a
		}
	}
	if lim := cgroup.PodLimits(pod).Memory; lim != nil && *lim > 0 && (size <= 0 || *lim < size) {
		size = *lim
	}
	if q := src.SizeLimit; q != nil && q.Value() > 0 && (size <= 0 || q.Value() < size) {
		size = q.Value()
	}
	return size
}

// mountTmpfs mounts a tmpfs of size bytes (0: the kernel's default) at dir, with noswap where the
// kernel has it (6.4 and later; kubelet asks for it too): a pod's in-memory scratch data must not
// end up on the node's swap.
func mountTmpfs(dir string, size int64) error {
	opts := ""
	if size > 0 {
		opts = "size=" + strconv.FormatInt(size, 10)
	}
	withNoswap := "noswap"
	if opts != "" {
		withNoswap = opts + ",noswap"
	}
	err := unix.Mount("tmpfs", dir, "tmpfs", 0, withNoswap)
	if errors.Is(err, unix.EINVAL) {
		err = unix.Mount("tmpfs", dir, "tmpfs", 0, opts)
	}
	if err != nil {
		return fmt.Errorf("mount tmpfs (%s) at %s: %w", opts, dir, err)
	}
	return nil
}

// isMountPoint reports whether something is mounted at dir: its device differs from its parent's.
// (The state dir itself may be on a tmpfs, so the file system type alone does not tell.)
func isMountPoint(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", dir, err)
	}
	if err := unix.Lstat(filepath.Dir(dir), &parent); err != nil {
		return false, fmt.Errorf("stat %s: %w", filepath.Dir(dir), err)
	}
	return st.Dev != parent.Dev, nil
}

// removeContents empties dir, keeping dir itself.
func removeContents(dir string) error {
	names, err := dirNames(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		errs = append(errs, os.RemoveAll(filepath.Join(dir, n)))
	}
	return errors.Join(errs...)
}

// unmountEmptyDirs unmounts every memory-backed emptyDir of the pod whose dir is podDir, from the
// directory alone (the spec may be gone), so that removing the directories afterwards neither
// descends into a mount nor fails on its mount point.
func unmountEmptyDirs(podDir string) error {
	root := filepath.Join(podDir, "volumes")
	names, err := dirNames(root)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		errs = append(errs, unmount(filepath.Join(root, n)))
	}
	return errors.Join(errs...)
}

// Destroy unmounts the pod's memory-backed emptyDirs before the pod dir is removed (the pod dir
// hook, earlier in the list, runs after this one at teardown).
func (h emptyDirHook) Destroy(_ context.Context, ref PodRef) error {
	dir, err := h.dirs.podDir(ref.UID)
	if err != nil {
		return err
	}
	return unmountEmptyDirs(dir)
}

// emptyDirHook makes the pod's emptyDir volumes below the pod dir (above); they go with it.
type emptyDirHook struct {
	dirs            stateDir
	memCapacity     int64        // bytes of memory on the machine
	nodeAllocatable func() int64 // node allocatable memory in bytes; nil or 0: memCapacity
}

func (emptyDirHook) Name() string { return "emptyDir volumes" }

func (h emptyDirHook) Prerun(_ context.Context, pod *v1.Pod, sb *Sandbox) error {
	return h.setupEmptyDirs(pod, sb)
}
