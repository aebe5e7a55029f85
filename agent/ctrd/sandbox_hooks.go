package ctrd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/mqlet/mqlet/internal/atomicfile"
)

// Pod dirs and log dirs are private: they hold what the pod's containers share (emptyDirs, hosts)
// and its output, readable by root (and the group, for log shippers) only.
const privateDirMode = 0o750

// podDir holds the files the sandbox makes for a pod (hosts file, emptyDir volumes, shm).
func (r *Runtime) podDir(uid types.UID) (string, error) {
	return joinUnder(r.opts.StateDir, "pods", string(uid))
}

// mkPrivateDir makes dir (and missing parents) 0750, and tightens a dir an older mqlet made 0755.
func mkPrivateDir(dir string) error {
	if err := os.MkdirAll(dir, privateDirMode); err != nil {
		return err
	}
	return os.Chmod(dir, privateDirMode)
}

// podDirHook owns <state>/pods/<uid>; everything else the pod keeps on disk lives below it.
type podDirHook struct{ r *Runtime }

func (podDirHook) Name() string { return "pod dir" }

func (h podDirHook) Prerun(_ context.Context, pod *v1.Pod, sb *Sandbox) error {
	dir, err := h.r.podDir(pod.UID)
	if err != nil {
		return err
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		sb.Created = true
	}
	if err := mkPrivateDir(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := mkPrivateDir(dir); err != nil {
		return err
	}
	sb.Dir = dir
	return nil
}

func (h podDirHook) Destroy(_ context.Context, ref PodRef) error {
	dir, err := h.r.podDir(ref.UID)
	if err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

func (h podDirHook) List() ([]PodRef, error) {
	names, err := dirNames(filepath.Join(h.r.opts.StateDir, "pods"))
	return uidRefs(names), err
}

// logDirHook owns <state>/logs/<ns>_<name>_<uid>, kubelet's /var/log/pods naming.
type logDirHook struct{ r *Runtime }

func (logDirHook) Name() string { return "log dir" }

func (h logDirHook) Prerun(_ context.Context, pod *v1.Pod, sb *Sandbox) error {
	dir, err := h.r.podLogDir(pod)
	if err != nil {
		return err
	}
	if err := mkPrivateDir(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := mkPrivateDir(dir); err != nil {
		return err
	}
	sb.LogDir = dir
	return nil
}

// Destroy finds the log dir by UID, so an orphan whose name is unknown loses its logs too.
func (h logDirHook) Destroy(_ context.Context, ref PodRef) error {
	root := filepath.Join(h.r.opts.StateDir, "logs")
	names, err := dirNames(root)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		if got, ok := parseLogDirName(n); ok && got.UID == ref.UID {
			errs = append(errs, os.RemoveAll(filepath.Join(root, n)))
		}
	}
	return errors.Join(errs...)
}

func (h logDirHook) List() ([]PodRef, error) {
	names, err := dirNames(filepath.Join(h.r.opts.StateDir, "logs"))
	var out []PodRef
	for _, n := range names {
		if ref, ok := parseLogDirName(n); ok {
			out = append(out, ref)
		}
	}
	return out, err
}

// parseLogDirName reads "<ns>_<name>_<uid>"; Kubernetes namespaces and names hold no '_'.
func parseLogDirName(n string) (PodRef, bool) {
	parts := strings.SplitN(n, "_", 3)
	if len(parts) != 3 || parts[2] == "" {
		return PodRef{}, false
	}
	return PodRef{Namespace: parts[0], Name: parts[1], UID: types.UID(parts[2])}, true
}

// netnsHook owns the pod's pinned network namespace (none with hostNetwork).
type netnsHook struct{ r *Runtime }

func (netnsHook) Name() string { return "network namespace" }

func (h netnsHook) Prerun(_ context.Context, pod *v1.Pod, sb *Sandbox) error {
	if pod.Spec.HostNetwork {
		return nil
	}
	path, created, err := h.r.ensurePodNS(netNS(), string(pod.UID))
	if err != nil {
		return err
	}
	sb.NetNS, sb.Created, sb.netnsNew = path, sb.Created || created, created
	return nil
}

func (h netnsHook) Destroy(_ context.Context, ref PodRef) error {
	return h.r.removePodNS(netNS(), string(ref.UID))
}

func (h netnsHook) List() ([]PodRef, error) {
	names, err := h.r.podNSUIDs(netNS())
	return uidRefs(names), err
}

// ipcHook owns the pod's IPC namespace and the tmpfs its containers share at /dev/shm, as a CRI
// sandbox does: System V IPC and POSIX shared memory work between the pod's containers. hostIPC
// pods use the host's namespace and /dev/shm.
type ipcHook struct{ r *Runtime }

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
	path, _, err := h.r.ensurePodNS(ipcNS(), string(pod.UID))
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
	dir, err := h.r.podDir(ref.UID)
	if err != nil {
		return err
	}
	return errors.Join(unmount(filepath.Join(dir, "shm")), h.r.removePodNS(ipcNS(), string(ref.UID)))
}

func (h ipcHook) List() ([]PodRef, error) {
	names, err := h.r.podNSUIDs(ipcNS())
	return uidRefs(names), err
}

// cgroupHook owns the cgroup the pod's containers go below: with a cgroup manager, the pod's
// cgroup in its QoS tier, sized from its containers; without, /mqlet/<ns>/pod<uid>, which runc
// makes with the first container. runc removes each container's own cgroup, never this parent.
type cgroupHook struct{ r *Runtime }

func (cgroupHook) Name() string { return "cgroup" }

// Prerun runs again after a spec change: a pod whose QoS class changed gets its cgroup in the new
// tier, where its new containers go.
func (h cgroupHook) Prerun(_ context.Context, pod *v1.Pod, sb *Sandbox) error {
	if cg := h.r.opts.Cgroups; cg != nil {
		dir, err := cg.EnsurePod(pod)
		sb.CgroupParent = dir
		return err
	}
	cg, err := h.r.legacyPodCgroup(string(pod.UID))
	sb.CgroupParent = cg
	return err
}

func (h cgroupHook) Destroy(_ context.Context, ref PodRef) error {
	cg, err := h.r.legacyPodCgroup(string(ref.UID))
	if err != nil {
		return err
	}
	// The whole tree: the pod cgroup and what was left below it (a container's cgroup runc did not
	// remove, the PID namespace holder's leaf).
	err = RemoveCgroupTree(cg)
	if m := h.r.opts.Cgroups; m != nil {
		err = errors.Join(m.RemovePod(string(ref.UID)), err)
	}
	return err
}

func (h cgroupHook) List() ([]PodRef, error) {
	uids, err := h.r.podCgroupUIDs()
	if m := h.r.opts.Cgroups; m != nil {
		more, merr := m.PodUIDs()
		uids, err = append(uids, more...), errors.Join(err, merr)
	}
	return uidRefs(uids), err
}

// emptyDirHook makes the pod's emptyDir volumes below the pod dir (emptydir.go); they go with it.
type emptyDirHook struct{ r *Runtime }

func (emptyDirHook) Name() string { return "emptyDir volumes" }

func (h emptyDirHook) Prerun(_ context.Context, pod *v1.Pod, sb *Sandbox) error {
	return h.r.setupEmptyDirs(pod, sb)
}

// bootMarkerHook records in the pod dir the boot the sandbox was set up in. A different boot means
// the sandbox is new even when no namespace says so (hostNetwork pods). A missing marker (a pod dir
// made by an older mqlet) is trusted as intact: otherwise an upgrade would restart every pod.
type bootMarkerHook struct{ r *Runtime }

func (bootMarkerHook) Name() string { return "boot marker" }

const bootIDFile = "/proc/sys/kernel/random/boot_id"

func (bootMarkerHook) Prerun(_ context.Context, _ *v1.Pod, sb *Sandbox) error {
	boot := bootID() // "-" on an odd kernel without one: then the namespaces alone tell a new sandbox
	marker := filepath.Join(sb.Dir, "boot_id")
	old, err := os.ReadFile(marker)
	if err == nil && strings.TrimSpace(string(old)) == boot {
		return nil
	}
	if err == nil {
		sb.Created = true
	}
	return atomicfile.Write(marker, []byte(boot+"\n"), 0o640)
}
