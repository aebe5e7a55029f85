package eviction

import (
	"errors"
	"io/fs"
	"log/slog"
	"time"

	"github.com/mqlet/mqlet/hw"
	v1 "k8s.io/api/core/v1"
)

// Observation is one signal's reading: how much is left and how much there is in all (the base
// of percentage thresholds).
type Observation struct {
	Available int64
	Capacity  int64
}

// Observations is one reading of every signal the node could measure. A signal that could not be
// read is absent, and its thresholds are not judged that round.
type Observations struct {
	Signals map[Signal]Observation
	// DedicatedImageFs: containerd's root is on another file system than the state dir. Removing
	// images then does nothing for nodefs pressure, so nodefs signals get no node-level reclaim.
	DedicatedImageFs bool
	// Memory is the reading behind memory.available; the kernel notifier is set from it.
	Memory hw.MemoryStats
	Time   time.Time
}

// Observer reads the node's signals.
type Observer interface {
	Observe() Observations
}

// NodeObserver reads the signals of the machine with the hw readers, as kubelet computes them:
// memory.available from the root cgroup's working set, nodefs from the state dir's file system,
// imagefs from containerd's root, pid.available from pid_max and the task count, and
// allocatableMemory.available from the pods' top cgroup.
type NodeObserver struct {
	Root       string // "/" on a node; a fixture tree in tests
	NodeFsDir  string // the agent's state dir (pod dirs, emptyDirs, logs)
	ImageFsDir string // containerd's root dir
	// AllocatableCgroup is the pods' top cgroup (below each hierarchy's root), whose memory limit
	// is node allocatable when it is enforced: allocatableMemory.available is that limit minus its
	// working set. Empty, or a cgroup without a limit: the signal is not observed.
	AllocatableCgroup string
	Statfs            hw.StatfsFunc
	Log               *slog.Logger

	warned map[string]bool // signals whose failure was logged, so a missing file is said once
}

// Observe reads every signal; what cannot be read is left out and logged once.
func (o *NodeObserver) Observe() Observations {
	obs := Observations{Signals: map[Signal]Observation{}, Time: time.Now()}
	root := o.Root
	if root == "" {
		root = "/"
	}
	if m, err := hw.NodeMemory(root); err != nil {
		o.warn("memory", err)
	} else {
		obs.Memory = m
		obs.Signals[SignalMemoryAvailable] = Observation{Available: m.Available, Capacity: m.Capacity}
	}
	if o.AllocatableCgroup != "" {
		if m, err := hw.CgroupMemory(root, o.AllocatableCgroup); err != nil {
			o.warn("allocatable memory", err)
		} else if m.Limit > 0 {
			obs.Signals[SignalAllocatableMemoryAvailable] = Observation{Available: m.Limit - m.WorkingSet, Capacity: m.Limit}
		}
	}
	if st, err := o.filesystem(o.NodeFsDir); err != nil {
		o.warn("nodefs", err)
	} else {
		obs.Signals[SignalNodeFsAvailable] = Observation{Available: st.Available, Capacity: st.Capacity}
		if st.Inodes > 0 {
			obs.Signals[SignalNodeFsInodesFree] = Observation{Available: st.InodesFree, Capacity: st.Inodes}
		}
	}
	if o.ImageFsDir != "" {
		if st, err := o.filesystem(o.ImageFsDir); err != nil {
			o.warn("imagefs", err)
		} else {
			obs.Signals[SignalImageFsAvailable] = Observation{Available: st.Available, Capacity: st.Capacity}
			if st.Inodes > 0 {
				obs.Signals[SignalImageFsInodesFree] = Observation{Available: st.InodesFree, Capacity: st.Inodes}
			}
			same, err := hw.SameFilesystem(o.NodeFsDir, o.ImageFsDir)
			obs.DedicatedImageFs = err == nil && !same
		}
	}
	if p, err := hw.PIDs(root); err != nil {
		o.warn("pids", err)
	} else {
		obs.Signals[SignalPIDAvailable] = Observation{Available: p.Available, Capacity: p.Max}
	}
	return obs
}

func (o *NodeObserver) filesystem(dir string) (hw.FsStats, error) {
	if o.Statfs != nil {
		return hw.FilesystemWith(o.Statfs, dir)
	}
	return hw.Filesystem(dir)
}

func (o *NodeObserver) warn(what string, err error) {
	if o.warned == nil {
		o.warned = map[string]bool{}
	}
	if o.warned[what] {
		return
	}
	o.warned[what] = true
	if o.Log != nil {
		o.Log.Warn("eviction: signal unreadable; its thresholds are not judged", "signal", what, "err", err)
	}
}

// Usage reads what one pod uses, for ranking. Errors mean "no stats" (kubelet then ranks the pod
// first: a pod that has nothing running is the cheapest to evict).
type Usage interface {
	// Memory is the working set of the pod's cgroup in bytes.
	Memory(pod *v1.Pod) (int64, error)
	// Disk is what the pod keeps on the node's file systems (pod dir with emptyDirs, logs, its
	// containers' writable layers).
	Disk(pod *v1.Pod) (bytes, inodes int64, err error)
	// Processes is the number of tasks in the pod's cgroup.
	Processes(pod *v1.Pod) (int64, error)
}

// NodeUsage reads pod usage from the pod's cgroup and directories.
type NodeUsage struct {
	Root string // "/" on a node
	// PodCgroup is the pod's cgroup path below each hierarchy's root.
	PodCgroup func(pod *v1.Pod) (string, error)
	// PodDirs are the directories whose contents count as the pod's ephemeral storage.
	PodDirs func(pod *v1.Pod) ([]string, error)
	// WritableLayers reads what the pod's containers' writable layers hold (bytes, inodes), which
	// count too, as kubelet ranks by rootfs, logs and local volumes; nil leaves them out.
	WritableLayers func(pod *v1.Pod) (bytes, inodes int64, err error)
}

func (u NodeUsage) root() string {
	if u.Root == "" {
		return "/"
	}
	return u.Root
}

func (u NodeUsage) Memory(pod *v1.Pod) (int64, error) {
	rel, err := u.PodCgroup(pod)
	if err != nil {
		return 0, err
	}
	s, err := hw.CgroupMemory(u.root(), rel)
	return s.WorkingSet, err
}

func (u NodeUsage) Processes(pod *v1.Pod) (int64, error) {
	rel, err := u.PodCgroup(pod)
	if err != nil {
		return 0, err
	}
	return hw.CgroupProcesses(u.root(), rel)
}

func (u NodeUsage) Disk(pod *v1.Pod) (int64, int64, error) {
	dirs, err := u.PodDirs(pod)
	if err != nil {
		return 0, 0, err
	}
	var bytes, inodes int64
	var errs []error
	for _, d := range dirs {
		b, n, err := hw.DiskUsage(d)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		bytes += b
		inodes += n
	}
	if u.WritableLayers != nil {
		b, n, err := u.WritableLayers(pod)
		if err != nil {
			errs = append(errs, err)
		}
		bytes += b
		inodes += n
	}
	return bytes, inodes, errors.Join(errs...)
}
