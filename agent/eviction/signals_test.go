package eviction

import (
	"path/filepath"
	"testing"

	"github.com/mqlet/mqlet/hw"
	"golang.org/x/sys/unix"
)

// The observer reads every signal on this machine: memory, nodefs and imagefs (two temp dirs on
// the same file system), pids.
func TestNodeObserverOnThisMachine(t *testing.T) {
	dir := t.TempDir()
	o := &NodeObserver{Root: "/", NodeFsDir: dir, ImageFsDir: filepath.Join(dir, "."), Log: quietLog()}
	obs := o.Observe()
	for _, s := range []Signal{SignalMemoryAvailable, SignalNodeFsAvailable, SignalImageFsAvailable, SignalPIDAvailable} {
		ob, ok := obs.Signals[s]
		if !ok || ob.Available <= 0 || ob.Available > ob.Capacity {
			t.Errorf("%s = %+v (observed %v)", s, ob, ok)
		}
	}
	if obs.DedicatedImageFs {
		t.Errorf("imagefs on the nodefs file system reported as dedicated")
	}
	if obs.Memory.Capacity == 0 || obs.Memory.Available != obs.Signals[SignalMemoryAvailable].Available {
		t.Errorf("memory reading %+v does not back the signal", obs.Memory)
	}
}

// An unreadable signal is left out, the others are still read.
func TestNodeObserverDegrades(t *testing.T) {
	statfs := func(path string, st *unix.Statfs_t) error {
		if path == "/nodefs" {
			*st = unix.Statfs_t{Frsize: 4096, Blocks: 100, Bavail: 7, Files: 0}
			return nil
		}
		return unix.ENOENT
	}
	o := &NodeObserver{Root: filepath.Join("..", "..", "hw", "testdata", "rpi5"), NodeFsDir: "/nodefs", ImageFsDir: "/gone",
		Statfs: statfs, Log: quietLog()}
	obs := o.Observe()
	if got := obs.Signals[SignalNodeFsAvailable]; got.Available != 7*4096 || got.Capacity != 100*4096 {
		t.Errorf("nodefs = %+v", got)
	}
	if _, ok := obs.Signals[SignalNodeFsInodesFree]; ok {
		t.Errorf("inodes observed on a file system that does not count them")
	}
	if _, ok := obs.Signals[SignalImageFsAvailable]; ok {
		t.Errorf("imagefs observed although statfs failed")
	}
	want, _ := hw.NodeMemory(o.Root)
	if obs.Signals[SignalMemoryAvailable].Available != want.Available || obs.Signals[SignalPIDAvailable].Available != 63704-214 {
		t.Errorf("fixture signals: %+v", obs.Signals)
	}
}

// allocatableMemory.available is the pods' cgroup's memory limit minus its working set (the rpi5
// fixture's pod cgroup stands in: 200Mi limit, 150Mi used of which 20Mi inactive file); a cgroup
// without a limit gives no observation.
func TestNodeObserverAllocatableMemory(t *testing.T) {
	root := filepath.Join("..", "..", "hw", "testdata")
	o := &NodeObserver{Root: filepath.Join(root, "rpi5"), NodeFsDir: t.TempDir(),
		AllocatableCgroup: "/mqlet/default/besteffort/pod5e2d8a41-7c3b-4f6e-8a1d-2b9c0e4f7a33", Log: quietLog()}
	got, ok := o.Observe().Signals[SignalAllocatableMemoryAvailable]
	if want := (Observation{Available: 200<<20 - (150<<20 - 20<<20), Capacity: 200 << 20}); !ok || got != want {
		t.Errorf("allocatableMemory.available = %+v (%v), want %+v", got, ok, want)
	}
	o = &NodeObserver{Root: filepath.Join(root, "rpi4"), NodeFsDir: t.TempDir(),
		AllocatableCgroup: "/mqlet/default/pod0b7c5e7e-5d1a-4c0b-9d3e-6f1f0b2a4c11", Log: quietLog()}
	if got, ok := o.Observe().Signals[SignalAllocatableMemoryAvailable]; ok {
		t.Errorf("a cgroup without a memory limit observed as %+v", got)
	}
}

// What one monitoring round costs an idle node (nothing crossed: signals only).
func BenchmarkIdleRound(b *testing.B) {
	dir := b.TempDir()
	f := newFakeNode()
	m := New(Options{Thresholds: mustThresholdsB(b), Observer: &NodeObserver{Root: "/", NodeFsDir: dir, ImageFsDir: dir},
		Usage: f, Pods: f, Log: quietLog()})
	for b.Loop() {
		m.synchronize(b.Context(), false)
	}
}

func mustThresholdsB(b *testing.B) []Threshold {
	ts, err := ParseThresholds(DefaultHard(), nil, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	return ts
}
