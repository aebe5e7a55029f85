package ctrd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// The sandbox makes namespaces by unshare on a locked thread that the Go runtime then throws away.
// The main thread cannot be thrown away: a goroutine that happened to run there would leave it (and
// /proc/self/ns/* with it) in a pod's namespace. Keeping every importer's main goroutine on the main
// thread keeps that work off it.
func init() { runtime.LockOSThread() }

// A pod's containers share namespaces (network, IPC) that must outlive any one container, so that a
// restarted container keeps the pod's localhost and its shared memory. kubelet keeps them alive with a
// pause container; we pin each with a bind mount instead, which needs no image and no process. The
// mount survives agent restarts (it lives in the host's mount namespace) and disappears at reboot,
// when it must be rebuilt anyway: then the file is still there but is no longer a namespace.

const nsfsMagic = 0x6e736673

// podNS is one kind of namespace a pod shares, pinned under <state>/<dir>/<uid>.
type podNS struct {
	dir  string // directory under the state dir
	flag int    // unshare flag
	proc string // name under /proc/<pid>/ns
}

func netNS() podNS { return podNS{dir: "netns", flag: unix.CLONE_NEWNET, proc: "net"} }
func ipcNS() podNS { return podNS{dir: "ipcns", flag: unix.CLONE_NEWIPC, proc: "ipc"} }

// isNS reports whether path is a live namespace bind mount (after a reboot it is an empty file).
func isNS(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == nsfsMagic
}

// pinTarget makes the empty file a namespace is bind-mounted onto to pin it.
func pinTarget(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o400)
	if err != nil {
		return err
	}
	return f.Close()
}

func enterNewNS(kind podNS, path string) error {
	if err := unix.Unshare(kind.flag); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	self := fmt.Sprintf("/proc/self/task/%d/ns/%s", unix.Gettid(), kind.proc)
	if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount: %w", err)
	}
	if kind.flag == unix.CLONE_NEWNET {
		return loopbackUp()
	}
	return nil
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

// unmount detaches whatever is mounted at path; nothing mounted, or no path, is fine.
func unmount(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	return nil
}

// dirNames lists the entries of dir; a missing dir has none.
func dirNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out, nil
}
