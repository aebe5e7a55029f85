package ctrd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// ipcHook owns the pod's IPC namespace and the tmpfs its containers share at /dev/shm, as a CRI
// sandbox does: System V IPC and POSIX shared memory work between the pod's containers. hostIPC
// pods use the host's namespace and /dev/shm.
type ipcHook struct{ dirs stateDir }

func (ipcHook) Name() string { return "ipc namespace" }

const (
	tmpfsMagic = 0x01021994
	shmSize    = "65536k" // docker's and containerd CRI's default /dev/shm size
)

func (h ipcHook) Prerun(_ context.Context, pod *v1.Pod, sb *Sandbox) error {
	if pod.Spec.HostIPC {
		sb.Shm = "/dev/shm"
		return nil
	}
	// A new IPC namespace alone does not make the sandbox new: pods an older mqlet started have
	// none, and restarting them all for it at upgrade would be worse than their containers joining
	// it as they restart. A reboot loses the network namespace or the boot marker too.
	path, _, err := h.dirs.ensurePodNS(ipcNS(), string(pod.UID))
	if err != nil {
		return err
	}
	sb.IPCNS = path
	shm := filepath.Join(sb.Dir, "shm")
	if err := os.MkdirAll(shm, 0o700); err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(shm, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", shm, err)
	}
	if st.Type != tmpfsMagic {
		if err := unix.Mount("shm", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size="+shmSize); err != nil {
			return fmt.Errorf("mount tmpfs at %s: %w", shm, err)
		}
	}
	sb.Shm = shm
	return nil
}

// Destroy unmounts the shm tmpfs before the pod dir is removed: RemoveAll would otherwise descend
// into it and then fail on the mount point.
func (h ipcHook) Destroy(_ context.Context, ref PodRef) error {
	dir, err := h.dirs.podDir(ref.UID)
	if err != nil {
		return err
	}
	return errors.Join(unmount(filepath.Join(dir, "shm")), h.dirs.removePodNS(ipcNS(), string(ref.UID)))
}

func (h ipcHook) List() ([]PodRef, error) {
	names, err := h.dirs.podNSUIDs(ipcNS())
	return uidRefs(names), err
}
