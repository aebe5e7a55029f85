package ctrd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"

	v1 "k8s.io/api/core/v1"
)

// What the eviction manager needs from the runtime: where a pod's usage is read, and how an evicted
// pod gives back what it holds.

// PodCgroup is the cgroup path (below each hierarchy's root) that holds the pod's containers.
func (r *Runtime) PodCgroup(pod *v1.Pod) (string, error) {
	if r.opts.Cgroups != nil {
		if err := checkPathElem("pod UID", string(pod.UID)); err != nil {
			return "", err
		}
		return r.opts.Cgroups.PodPath(pod), nil
	}
	return legacyPodCgroup(r.opts.Namespace, string(pod.UID))
}

// PodStorageDirs are the directories whose files are the pod's ephemeral storage on the node's file
// system: its pod dir (emptyDir volumes, hosts file) and its log dir.
func (r *Runtime) PodStorageDirs(pod *v1.Pod) ([]string, error) {
	dir, err := r.dirs().podDir(pod.UID)
	if err != nil {
		return nil, err
	}
	logs, err := r.dirs().podLogDir(pod)
	if err != nil {
		return nil, err
	}
	return []string{dir, logs}, nil
}

// ReleasePodStorage frees what a pod that stays on the node without running (evicted) holds: the
// contents of its emptyDir volumes and its /dev/shm tmpfs, whose pages stay charged to the node
// until unmounted, and its host devices, which another pod may then be given (kubelet's device
// manager hands out again what terminated pods held). kubelet does the same by tearing down a
// terminated pod's volumes and stopping its sandbox. Logs, the pod dir and the namespaces stay;
// should the pod run again, the sandbox's set-up makes the volumes and the tmpfs anew and
// allocates its devices again. Call it only once the pod's containers have stopped.
func (r *Runtime) ReleasePodStorage(pod *v1.Pod) error {
	dir, err := r.dirs().podDir(pod.UID)
	if err != nil {
		return err
	}
	var errs []error
	if err := unmount(filepath.Join(dir, "shm")); err != nil {
		errs = append(errs, err)
	}
	if err := unmountEmptyDirs(dir); err != nil { // memory-backed ones: their pages go with the tmpfs
		errs = append(errs, err)
	}
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir == nil {
			continue
		}
		vol, err := joinUnder(dir, "volumes", v.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("emptyDir %q: %w", v.Name, err))
			continue
		}
		if err := os.RemoveAll(vol); err != nil {
			errs = append(errs, fmt.Errorf("emptyDir %q: %w", v.Name, err))
		}
	}
	// The record goes first, as when the sandbox is destroyed: a record left behind keeps the
	// devices held, so a restarted agent never hands a device out beyond its share.
	if err := r.devicesHook().Destroy(context.Background(), RefOf(pod)); err != nil {
		errs = append(errs, fmt.Errorf("release devices: %w", err))
	}
	return errors.Join(errs...)
}

// RemoveEvictedContainers is kubelet's container garbage collection for an evicted pod: the pod
// stays on the node (its Failed/Evicted status is kept until the pod is deleted) but nothing will
// run its containers again, so they go with their writable layers, and its log dir with them.
// A container whose task still runs is left alone (ErrContainerRunning, and then the logs stay
// too): garbage collection never stops anything. Call it once the pod's containers have stopped.
// It returns the bytes the writable layers held.
func (r *Runtime) RemoveEvictedContainers(ctx context.Context, pod *v1.Pod) (int64, error) {
	logs, err := r.dirs().podLogDir(pod)
	if err != nil {
		return 0, err
	}
	ctrs, err := r.ListContainers(ctx, string(pod.UID))
	if err != nil {
		return 0, fmt.Errorf("containers of evicted pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	var freed int64
	var errs []error
	for _, c := range ctrs {
		n, err := r.RemoveExitedContainer(ctx, c.ID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		freed += n
	}
	if len(errs) > 0 {
		return freed, fmt.Errorf("evicted pod %s/%s: %w", pod.Namespace, pod.Name, errors.Join(errs...))
	}
	if err := os.RemoveAll(logs); err != nil {
		return freed, fmt.Errorf("evicted pod %s/%s: logs: %w", pod.Namespace, pod.Name, err)
	}
	return freed, nil
}

// StorageUsage is what something keeps on a file system: bytes in blocks, and inodes.
type StorageUsage struct {
	Bytes, Inodes int64
}

// ContainerStorage is what each container of pod keeps on the node's disks, kubelet's measure for
// a container's ephemeral-storage limit: its writable layer (the snapshot's usage, as the
// snapshotter reports it) plus its log files (the current one and its rotated ones), by container
// name, for the newest attempt of each; an older attempt's layer and log are garbage collection's,
// as for kubelet, which counts the running container only. Walking a writable layer costs a
// directory walk: call it for pods with an ephemeral-storage limit, or to rank under disk pressure.
func (r *Runtime) ContainerStorage(ctx context.Context, pod *v1.Pod) (map[string]StorageUsage, error) {
	ctx = r.ctx(ctx)
	logs, err := r.dirs().podLogDir(pod)
	if err != nil {
		return nil, err
	}
	recs, err := r.client.ContainerService().List(ctx, fmt.Sprintf("labels.%q==%q", LabelPodUID, string(pod.UID)))
	if err != nil {
		return nil, fmt.Errorf("storage of pod %s/%s: list containers: %w", pod.Namespace, pod.Name, err)
	}
	newest := map[string]int{}
	for i, c := range recs {
		name := c.Labels[LabelContainerName]
		rc, _ := strconv.Atoi(c.Labels[LabelRestartCount])
		if j, ok := newest[name]; !ok || rc > atoiOr(recs[j].Labels[LabelRestartCount]) {
			newest[name] = i
		}
	}
	out := map[string]StorageUsage{}
	var errs []error
	for name, i := range newest {
		c := recs[i]
		u, err := r.writableLayer(ctx, c.Snapshotter, c.SnapshotKey)
		if err != nil {
			errs = append(errs, fmt.Errorf("container %s: %w", name, err))
		}
		dir, err := joinUnder(logs, name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		current := c.Labels[LabelRestartCount] + ".log"
		if c.Labels[LabelRestartCount] == "" {
			current = "0.log"
		}
		entries, err := os.ReadDir(dir)
		if err != nil && !os.IsNotExist(err) {
			errs = append(errs, fmt.Errorf("container %s: logs: %w", name, err))
		}
		for _, e := range entries {
			if e.Name() != current && !strings.HasPrefix(e.Name(), current+".") {
				continue
			}
			if fi, err := e.Info(); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					u.Bytes += st.Blocks * 512 // blocks, as the snapshotter and du count
				} else {
					u.Bytes += fi.Size()
				}
				u.Inodes++
			}
		}
		out[name] = u
	}
	return out, errors.Join(errs...)
}

// WritableLayers is what the writable layers of all the pod's containers hold, dead attempts
// included (they hold disk until garbage collection), for ranking pods under disk pressure.
func (r *Runtime) WritableLayers(ctx context.Context, pod *v1.Pod) (StorageUsage, error) {
	ctx = r.ctx(ctx)
	recs, err := r.client.ContainerService().List(ctx, fmt.Sprintf("labels.%q==%q", LabelPodUID, string(pod.UID)))
	if err != nil {
		return StorageUsage{}, fmt.Errorf("writable layers of pod %s/%s: list containers: %w", pod.Namespace, pod.Name, err)
	}
	var sum StorageUsage
	var errs []error
	for _, c := range recs {
		u, err := r.writableLayer(ctx, c.Snapshotter, c.SnapshotKey)
		if err != nil {
			errs = append(errs, fmt.Errorf("container %s: %w", c.ID, err))
		}
		sum.Bytes += u.Bytes
		sum.Inodes += u.Inodes
	}
	return sum, errors.Join(errs...)
}

// writableLayer is the usage of a container's snapshot (its writable layer) as its snapshotter
// reports it (overlayfs walks the upper dir); none when the container has none or it is gone.
func (r *Runtime) writableLayer(ctx context.Context, snapshotter, key string) (StorageUsage, error) {
	if key == "" {
		return StorageUsage{}, nil
	}
	u, err := r.client.SnapshotService(snapshotter).Usage(ctx, key)
	if err != nil && !errdefs.IsNotFound(err) {
		return StorageUsage{}, fmt.Errorf("writable layer %s: %w", key, err)
	}
	return StorageUsage{Bytes: u.Size, Inodes: u.Inodes}, nil
}

func atoiOr(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
