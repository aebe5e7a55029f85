package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"

	"golang.org/x/sys/unix"
)

// A pod's containers share one network namespace that must outlive any one container, so that a
// restarted container keeps the pod's localhost. kubelet keeps it alive with a pause container; we pin
// it with a bind mount instead, which needs no image and no process. The mount survives agent restarts
// (it lives in the host's mount namespace) and disappears at reboot, when it must be rebuilt anyway.

const nsfsMagic = 0x6e736673

func (r *Runtime) netnsPath(podUID string) string {
	return filepath.Join(r.opts.StateDir, "netns", podUID)
}

// isNetNS reports whether path is a live namespace bind mount (after a reboot it is an empty file).
func isNetNS(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == nsfsMagic
}

// EnsurePodNetNS returns the path of the pod's network namespace, creating it with loopback up.
func (r *Runtime) EnsurePodNetNS(podUID string) (string, error) {
	path := r.netnsPath(podUID)
	if isNetNS(path) {
		return path, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", fmt.Errorf("pod %s network namespace: %w", podUID, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o400)
	if err != nil {
		return "", fmt.Errorf("pod %s network namespace: %w", podUID, err)
	}
	f.Close()

	errc := make(chan error, 1)
	go func() {
		// unshare(CLONE_NEWNET) changes only this OS thread. The goroutine ends still locked, which
		// makes the Go runtime throw the thread away instead of reusing it in the wrong namespace.
		goruntime.LockOSThread()
		errc <- enterNewNetNS(path)
	}()
	if err := <-errc; err != nil {
		unix.Unmount(path, unix.MNT_DETACH)
		os.Remove(path)
		return "", fmt.Errorf("pod %s network namespace at %s: %w", podUID, path, err)
	}
	return path, nil
}

func enterNewNetNS(path string) error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
	if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount: %w", err)
	}
	return loopbackUp()
}

// loopbackUp sets lo up in the calling thread's network namespace. runc does this only for
// namespaces it creates itself, not for one it joins by path.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}

// RemovePodNetNS releases the pod's network namespace; missing is fine.
func (r *Runtime) RemovePodNetNS(podUID string) error {
	path := r.netnsPath(podUID)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("pod %s network namespace: unmount %s: %w", podUID, path, err)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("pod %s network namespace: %w", podUID, err)
	}
	return nil
}
