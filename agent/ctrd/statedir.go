package ctrd

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// stateDir is the agent's state dir and its layout: a pod dir, a log dir and pinned namespaces per
// pod. The sandbox hooks are given it rather than the whole Runtime.
type stateDir string

// dirs is the layout of r's state dir.
func (r *Runtime) dirs() stateDir { return stateDir(r.opts.StateDir) }

// podDir holds the files the sandbox makes for a pod (hosts file, emptyDir volumes, shm).
func (d stateDir) podDir(uid types.UID) (string, error) {
	return joinUnder(string(d), "pods", string(uid))
}

// podLogDir follows kubelet's /var/log/pods naming so log tooling finds its way around.
func (d stateDir) podLogDir(pod *v1.Pod) (string, error) {
	for what, v := range map[string]string{"pod namespace": pod.Namespace, "pod name": pod.Name, "pod UID": string(pod.UID)} {
		if err := checkPathElem(what, v); err != nil {
			return "", err
		}
	}
	return joinUnder(string(d), "logs", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID))
}

func (d stateDir) nsPath(kind podNS, podUID string) (string, error) {
	return joinUnder(string(d), kind.dir, podUID)
}

// ensurePodNS returns the path of the pod's namespace of this kind, and whether it had to be made
// now (a new pod, or the old one gone with a reboot). A new network namespace gets loopback up.
func (d stateDir) ensurePodNS(kind podNS, podUID string) (path string, created bool, err error) {
	path, err = d.nsPath(kind, podUID)
	if err != nil {
		return "", false, err
	}
	if isNS(path) {
		return path, false, nil
	}
	if err := pinTarget(path); err != nil {
		return "", false, fmt.Errorf("pod %s %s namespace: %w", podUID, kind.proc, err)
	}

	errc := make(chan error, 1)
	go func() {
		// unshare changes only this OS thread. The goroutine ends still locked, which makes the Go
		// runtime throw the thread away instead of reusing it in the wrong namespace.
		runtime.LockOSThread()
		errc <- enterNewNS(kind, path)
	}()
	if err := <-errc; err != nil {
		unix.Unmount(path, unix.MNT_DETACH)
		os.Remove(path)
		return "", false, fmt.Errorf("pod %s %s namespace at %s: %w", podUID, kind.proc, path, err)
	}
	return path, true, nil
}

// removePodNS releases the pod's namespace of this kind; missing is fine.
func (d stateDir) removePodNS(kind podNS, podUID string) error {
	path, err := d.nsPath(kind, podUID)
	if err != nil {
		return err
	}
	if err := unmount(path); err != nil {
		return fmt.Errorf("pod %s %s namespace: %w", podUID, kind.proc, err)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("pod %s %s namespace: %w", podUID, kind.proc, err)
	}
	return nil
}

// podNSUIDs lists the pod UIDs that have a pinned namespace file of this kind.
func (d stateDir) podNSUIDs(kind podNS) ([]string, error) {
	return dirNames(filepath.Join(string(d), kind.dir))
}
