package imagegc

import (
	"archive/tar"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/hw"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// fakeRuntime is containerd as image GC sees it, with a disk: removing an image or a container
// gives its bytes back to the file system the fake statfs reports.
type fakeRuntime struct {
	mu         sync.Mutex
	images     map[string]ctrd.ImageInfo
	uses       []ctrd.ImageUse
	ctrs       []ctrd.Container
	ctrSize    int64
	capacity   int64
	available  int64
	removed    []string // images, in order
	removedCtr []string
	failRemove map[string]error
	lists      int
}

func newFake(capacity, available int64) *fakeRuntime {
	return &fakeRuntime{images: map[string]ctrd.ImageInfo{}, capacity: capacity, available: available, failRemove: map[string]error{}}
}

func (f *fakeRuntime) addImage(name, digest string, size int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.images[name] = ctrd.ImageInfo{Name: name, Digest: digest, Size: size}
}

func (f *fakeRuntime) use(names ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.uses = nil
	for _, n := range names {
		f.uses = append(f.uses, ctrd.ImageUse{Container: "c-" + n, Name: n})
	}
}

func (f *fakeRuntime) setAvailable(n int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.available = n
}

func (f *fakeRuntime) ListImages(context.Context) ([]ctrd.ImageInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	var out []ctrd.ImageInfo
	for _, i := range f.images {
		out = append(out, i)
	}
	return out, nil
}

func (f *fakeRuntime) ContainerImages(context.Context) ([]ctrd.ImageUse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.uses), nil
}

func (f *fakeRuntime) RemoveImage(_ context.Context, name string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failRemove[name]; err != nil {
		return 0, err
	}
	img, ok := f.images[name]
	if !ok {
		return 0, nil
	}
	delete(f.images, name)
	f.removed = append(f.removed, name)
	f.available += img.Size
	return img.Size, nil
}

func (f *fakeRuntime) ListContainers(_ context.Context, podUID string) ([]ctrd.Container, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []ctrd.Container
	for _, c := range f.ctrs {
		if podUID == "" || c.PodUID == podUID {
			out = append(out, c)
		}
	}
	return out, nil
}

func (f *fakeRuntime) RemoveExitedContainer(_ context.Context, id string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, c := range f.ctrs {
		if c.ID == id {
			if c.State != ctrd.StateExited {
				return 0, ctrd.ErrContainerRunning
			}
			f.ctrs = slices.Delete(f.ctrs, i, i+1)
			f.removedCtr = append(f.removedCtr, id)
			f.available += f.ctrSize
			return f.ctrSize, nil
		}
	}
	return 0, nil
}

func (f *fakeRuntime) statfs(string) (hw.FsStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return hw.FsStats{Capacity: f.capacity, Available: f.available}, nil
}

func (f *fakeRuntime) removedImages() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.removed)
}

// clock is a settable time.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type events struct {
	mu sync.Mutex
	es []event.Event
}

func (e *events) Emit(ev event.Event) { e.mu.Lock(); e.es = append(e.es, ev); e.mu.Unlock() }
func (e *events) reasons() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.es {
		out = append(out, string(ev.Type)+"/"+ev.Reason)
	}
	return out
}

type rig struct {
	f    *fakeRuntime
	clk  *clock
	ev   *events
	pods []v1.Pod
	m    *Manager
}

func newRig(t *testing.T, f *fakeRuntime, edit func(*Options)) *rig {
	t.Helper()
	r := &rig{f: f, clk: &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}, ev: &events{}}
	o := Options{
		NodeName: "edge-1", ImageFSDir: "/var/lib/containerd", NodeFSDir: "/var/lib/mqlet",
		HighThresholdPercent: 85, LowThresholdPercent: 80, MinAge: 2 * time.Minute,
		Pods:   func() []v1.Pod { return r.pods },
		Statfs: f.statfs,
		SameFS: func(a, b string) (bool, error) { return false, nil },
		Events: r.ev, Now: r.clk.now, Log: slog.New(slog.DiscardHandler),
	}
	if edit != nil {
		edit(&o)
	}
	m, err := New(f, o)
	if err != nil {
		t.Fatal(err)
	}
	r.m = m
	return r
}

// detect runs a detection pass at the current time (GC does one at the start of every pass).
func (r *rig) detect(t *testing.T) {
	t.Helper()
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	if _, err := r.m.detect(context.Background(), r.clk.now()); err != nil {
		t.Fatal(err)
	}
}

func pod(uid string, images ...string) v1.Pod {
	p := v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p-" + uid, UID: types.UID(uid)}}
	for i, img := range images {
		p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: "c" + string(rune('0'+i)), Image: img})
	}
	return p
}

func TestBelowHighThresholdNothingRemoved(t *testing.T) {
	f := newFake(100, 16) // 84% used
	f.addImage("x.test/a:1", "sha256:a", 10)
	r := newRig(t, f, func(o *Options) { o.MinAge = 0 })
	res, err := r.m.GarbageCollect(context.Background())
	if err != nil || res.UsagePercent != 84 || res.Needed != 0 || len(f.removedImages()) != 0 {
		t.Fatalf("at 84%% with high 85: res %+v err %v removed %v", res, err, f.removedImages())
	}
	f.setAvailable(15) // 85%: at the threshold collection starts
	res, err = r.m.GarbageCollect(context.Background())
	if err != nil || res.UsagePercent != 85 || res.Needed != 5 || !slices.Equal(res.Removed, []string{"x.test/a:1"}) {
		t.Fatalf("at 85%%: res %+v err %v", res, err)
	}
}

// Least recently used first; an image never used counts from when it was first seen. Collection
// stops once what it removed brings usage to the low threshold.
func TestOrderAndStopAtLow(t *testing.T) {
	f := newFake(100, 10)
	for _, n := range []string{"x.test/a:1", "x.test/b:1", "x.test/c:1"} { // sha256:a, b, c
		f.addImage(n, "sha256:"+n[7:8], 10)
	}
	delete(f.images, "x.test/c:1") // c comes later
	r := newRig(t, f, nil)
	f.use("x.test/b:1")
	r.detect(t) // t0: a seen unused, b in use
	r.clk.advance(10 * time.Minute)
	f.addImage("x.test/c:1", "sha256:c", 10)
	r.detect(t) // t0+10m: b still in use, c first seen
	r.clk.advance(10 * time.Minute)
	f.use()
	r.detect(t) // t0+20m: b no longer used
	r.clk.advance(10 * time.Minute)

	// 90% used: 10 bytes bring it to 80%. a (seen t0) goes first, alone.
	res, err := r.m.GarbageCollect(context.Background())
	if err != nil || !slices.Equal(res.Removed, []string{"x.test/a:1"}) || res.Freed != 10 || res.Needed != 10 {
		t.Fatalf("first pass: %+v, %v", res, err)
	}
	// b (last used t0+10m) and c (first seen t0+10m) tie; b was known first.
	f.setAvailable(10)
	res, err = r.m.GarbageCollect(context.Background())
	if err != nil || !slices.Equal(res.Removed, []string{"x.test/b:1"}) {
		t.Fatalf("second pass: %+v, %v", res, err)
	}
	if got := f.removedImages(); !slices.Equal(got, []string{"x.test/a:1", "x.test/b:1"}) {
		t.Errorf("removed %v", got)
	}
	if got := r.ev.reasons(); !slices.Equal(got, []string{"Normal/FreedDiskSpace", "Normal/FreedDiskSpace"}) {
		t.Errorf("events %v", got)
	}
}

// Nothing in use, wanted by a desired pod (normalized, init containers too), preloaded or too
// young is removed, however full the disk; not freeing enough is a FreeDiskSpaceFailed warning.
func TestNeverRemoveRules(t *testing.T) {
	preload := t.TempDir()
	writeDockerArchive(t, filepath.Join(preload, "app.tar"), "x.test/preloaded:1")
	f := newFake(1000, 0)
	for _, n := range []string{"x.test/running:1", "x.test/exited:1", "x.test/samedigest:1", "docker.io/library/busybox:latest",
		"x.test/init:1", "x.test/preloaded:1", "x.test/free:1", "x.test/young:1"} {
		f.addImage(n, "sha256:"+n, 100)
	}
	f.addImage("x.test/samedigest:1", "sha256:shared", 100)
	f.uses = []ctrd.ImageUse{
		{Container: "c1", Name: "x.test/running:1"},
		{Container: "c2", Name: "x.test/exited:1"},
		{Container: "c3", Name: "x.test/other-name:1", Digest: "sha256:shared"},
	}
	r := newRig(t, f, func(o *Options) { o.PreloadDir = preload })
	init := pod("u1", "busybox")
	init.Spec.InitContainers = []v1.Container{{Name: "init", Image: "x.test/init:1"}}
	r.pods = []v1.Pod{init}
	young := f.images["x.test/young:1"]
	delete(f.images, "x.test/young:1")
	r.detect(t)
	r.clk.advance(time.Hour)
	f.addImage(young.Name, young.Digest, young.Size)
	r.detect(t)
	r.clk.advance(time.Minute) // young is a minute old at the pass, below the 2m minimum

	res, err := r.m.GarbageCollect(context.Background())
	if !slices.Equal(res.Removed, []string{"x.test/free:1"}) {
		t.Errorf("removed %v, want only x.test/free:1", res.Removed)
	}
	if err == nil || !strings.Contains(err.Error(), "freed 100 B of the") {
		t.Errorf("err = %v, want not enough freed", err)
	}
	if got := r.ev.reasons(); !slices.Equal(got, []string{"Normal/FreedDiskSpace", "Warning/FreeDiskSpaceFailed"}) {
		t.Errorf("events %v", got)
	}
	for _, e := range r.ev.es {
		if e.Object.Kind != event.KindNode || e.Object.Name != "edge-1" {
			t.Errorf("event about %+v, want the node", e.Object)
		}
	}
	// Once old enough, the young one goes too.
	r.clk.advance(time.Minute)
	if res, _ := r.m.GarbageCollect(context.Background()); !slices.Equal(res.Removed, []string{"x.test/young:1"}) {
		t.Errorf("after the minimum age: removed %v", res.Removed)
	}
}

// A name pulled anew (other digest) is a new image: its age starts again.
func TestRepulledTagIsYoungAgain(t *testing.T) {
	f := newFake(100, 0)
	f.addImage("x.test/a:1", "sha256:old", 10)
	r := newRig(t, f, nil)
	r.detect(t)
	r.clk.advance(time.Hour)
	f.addImage("x.test/a:1", "sha256:new", 10)
	if res, _ := r.m.GarbageCollect(context.Background()); len(res.Removed) != 0 {
		t.Fatalf("a re-pulled tag removed at once: %v", res.Removed)
	}
	r.clk.advance(2 * time.Minute)
	if res, _ := r.m.GarbageCollect(context.Background()); len(res.Removed) != 1 {
		t.Fatalf("re-pulled tag kept after the minimum age: %v", res.Removed)
	}
}

// A failure that persists is warned about once, and again after a pass that went well.
func TestWarningsNotRepeated(t *testing.T) {
	f := newFake(100, 0)
	f.addImage("x.test/used:1", "sha256:u", 10)
	f.use("x.test/used:1")
	r := newRig(t, f, nil)
	for range 3 {
		if _, err := r.m.GarbageCollect(context.Background()); err == nil {
			t.Fatal("a full disk with only used images: no error")
		}
	}
	f.setAvailable(50)
	if _, err := r.m.GarbageCollect(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.setAvailable(0)
	r.m.GarbageCollect(context.Background())
	want := []string{"Warning/FreeDiskSpaceFailed", "Warning/FreeDiskSpaceFailed"}
	if got := r.ev.reasons(); !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
}

func TestCapacityZeroAndStatfsError(t *testing.T) {
	f := newFake(0, 0)
	r := newRig(t, f, nil)
	_, err := r.m.GarbageCollect(context.Background())
	if f, ok := errors.AsType[*Failure](err); !ok || f.Reason != ReasonInvalidDiskCapacity || !strings.Contains(err.Error(), "capacity 0") {
		t.Errorf("capacity 0: %v, want a Failure with reason %s", err, ReasonInvalidDiskCapacity)
	}
	r2 := newRig(t, newFake(100, 0), func(o *Options) {
		o.Statfs = func(dir string) (hw.FsStats, error) {
			return hw.FsStats{}, errors.New("statfs " + dir + ": no such file")
		}
	})
	if _, err := r2.m.GarbageCollect(context.Background()); err == nil || !strings.Contains(err.Error(), "imageFSDir") {
		t.Errorf("statfs error: %v", err)
	}
	if got := append(r.ev.reasons(), r2.ev.reasons()...); !slices.Equal(got, []string{"Warning/InvalidDiskCapacity", "Warning/ImageGCFailed"}) {
		t.Errorf("events %v", got)
	}
}

func TestNotReadyRemovesNothing(t *testing.T) {
	f := newFake(100, 10)
	f.addImage("x.test/a:1", "sha256:a", 10)
	ready := errors.New("sources not read yet: file")
	r := newRig(t, f, func(o *Options) {
		o.MinAge = 0
		o.Ready = func() error { return ready }
	})
	if _, err := r.m.GarbageCollect(context.Background()); !errors.Is(err, ErrNotReady) {
		t.Fatalf("err = %v, want ErrNotReady", err)
	}
	if n, err := r.m.ReclaimDisk(context.Background(), "imagefs.available", 10); n != 0 || !errors.Is(err, ErrNotReady) {
		t.Fatalf("ReclaimDisk while not ready = %d, %v", n, err)
	}
	if got := f.removedImages(); len(got) != 0 {
		t.Fatalf("removed %v before the desired pods were known", got)
	}
	ready = nil
	if res, err := r.m.GarbageCollect(context.Background()); err != nil || len(res.Removed) != 1 {
		t.Fatalf("once ready: %+v %v", res, err)
	}
}

func TestHighThreshold100Disables(t *testing.T) {
	f := newFake(100, 0)
	f.addImage("x.test/a:1", "sha256:a", 10)
	r := newRig(t, f, func(o *Options) { o.HighThresholdPercent, o.LowThresholdPercent, o.MinAge = 100, 100, 0 })
	if res, err := r.m.GarbageCollect(context.Background()); err != nil || len(res.Removed) != 0 {
		t.Fatalf("high 100: %+v %v", res, err)
	}
	// The eviction manager's reclaim still works.
	if n, err := r.m.ReclaimDisk(context.Background(), "imagefs.available", 1); err != nil || n != 10 {
		t.Fatalf("ReclaimDisk with high 100 = %d, %v", n, err)
	}
}

// An archive in the preload dir that cannot be read protects what it held when it last could; one
// never read stops image removal, as its images cannot be told from unused ones.
func TestPreloadArchiveUnreadable(t *testing.T) {
	preload := t.TempDir()
	path := filepath.Join(preload, "app.tar")
	writeDockerArchive(t, path, "x.test/preloaded:1")
	f := newFake(100, 0)
	f.addImage("x.test/preloaded:1", "sha256:p", 10)
	f.addImage("x.test/free:1", "sha256:f", 10)
	r := newRig(t, f, func(o *Options) { o.PreloadDir = preload; o.MinAge = 0 })
	if res, _ := r.m.GarbageCollect(context.Background()); !slices.Equal(res.Removed, []string{"x.test/free:1"}) {
		t.Fatalf("removed %v", res.Removed)
	}
	f.addImage("x.test/free:2", "sha256:f2", 10)
	if err := os.WriteFile(path, []byte("not a tar archive, but longer than a tar header block is not"), 0o644); err != nil {
		t.Fatal(err)
	}
	if res, _ := r.m.GarbageCollect(context.Background()); !slices.Equal(res.Removed, []string{"x.test/free:2"}) {
		t.Fatalf("with the archive corrupted: removed %v, want the preloaded image kept", res.Removed)
	}

	broken := t.TempDir()
	os.WriteFile(filepath.Join(broken, "bad.tar.gz"), []byte("no gzip"), 0o644)
	f2 := newFake(100, 0)
	f2.addImage("x.test/free:1", "sha256:f", 10)
	r2 := newRig(t, f2, func(o *Options) { o.PreloadDir = broken; o.MinAge = 0 })
	res, err := r2.m.GarbageCollect(context.Background())
	if len(res.Removed) != 0 || err == nil || !strings.Contains(err.Error(), "bad.tar.gz") {
		t.Fatalf("archive never readable: removed %v, err %v", res.Removed, err)
	}
}

// ReclaimDisk removes exited containers nothing restarts (older attempts, names the spec dropped)
// and then unused images, whatever the thresholds, until enough is freed.
func TestReclaimDisk(t *testing.T) {
	f := newFake(1000, 900) // 10%: far below the high threshold
	f.ctrSize = 5
	f.addImage("x.test/old:1", "sha256:o", 100)
	f.addImage("x.test/older:1", "sha256:oo", 100)
	f.addImage("x.test/app:1", "sha256:a", 100)
	ctr := func(pod, name string, attempt int, st ctrd.State) ctrd.Container {
		return ctrd.Container{ID: ctrd.ContainerID(pod, name, attempt), PodUID: pod, Name: name, RestartCount: attempt, State: st, Image: "x.test/app:1"}
	}
	f.ctrs = []ctrd.Container{
		ctr("u1", "app", 0, ctrd.StateExited),  // older attempt: goes
		ctr("u1", "app", 1, ctrd.StateExited),  // newest: stays (its worker may restart it)
		ctr("u1", "gone", 0, ctrd.StateExited), // the spec no longer names it: goes
		ctr("u1", "side", 0, ctrd.StateRunning),
		ctr("u1", "side", 1, ctrd.StateRunning), // an older attempt that runs: never touched
		ctr("u2", "orphan", 0, ctrd.StateExited),
		ctr("u2", "orphan", 1, ctrd.StateExited), // pod u2 is not desired: the relist's to remove
	}
	for _, c := range f.ctrs {
		f.uses = append(f.uses, ctrd.ImageUse{Container: c.ID, Name: c.Image})
	}
	r := newRig(t, f, func(o *Options) { o.MinAge = time.Minute })
	p := pod("u1", "x.test/app:1", "x.test/app:1")
	p.Spec.Containers[0].Name, p.Spec.Containers[1].Name = "app", "side"
	r.pods = []v1.Pod{p}
	r.detect(t)
	r.clk.advance(time.Hour)
	f.addImage("x.test/new:1", "sha256:n", 100) // too young

	ctx := context.Background()
	if n, err := r.m.ReclaimDisk(ctx, "memory.available", 1<<30); n != 0 || err != nil || len(f.removedCtr) != 0 {
		t.Fatalf("memory signal: %d %v", n, err)
	}
	// 10 bytes needed: the two dead containers free them; no image goes.
	n, err := r.m.ReclaimDisk(ctx, "imagefs.available", 10)
	if err != nil || n != 10 || len(f.removedImages()) != 0 {
		t.Fatalf("imagefs 10 bytes: freed %d err %v images removed %v", n, err, f.removedImages())
	}
	want := []string{ctrd.ContainerID("u1", "app", 0), ctrd.ContainerID("u1", "gone", 0)}
	if !slices.Equal(f.removedCtr, want) {
		t.Errorf("containers removed %v, want %v", f.removedCtr, want)
	}
	// nodefs on another file system than the images: nothing more to free there.
	if n, err := r.m.ReclaimDisk(ctx, "nodefs.available", 100); n != 0 || err != nil {
		t.Fatalf("nodefs on its own file system: %d %v", n, err)
	}
	// 150 bytes: two images, the one known longest first; never the used or the young one.
	n, err = r.m.ReclaimDisk(ctx, "imagefs.available", 150)
	if err != nil || n != 200 || !slices.Equal(f.removedImages(), []string{"x.test/old:1", "x.test/older:1"}) {
		t.Fatalf("imagefs 150 bytes: freed %d err %v removed %v", n, err, f.removedImages())
	}
	if got := r.ev.reasons(); !slices.Equal(got, []string{"Normal/FreedDiskSpace", "Normal/FreedDiskSpace"}) {
		t.Errorf("events %v", got)
	}
}

func TestReclaimNodeFSSharedWithImages(t *testing.T) {
	f := newFake(1000, 900)
	for _, n := range []string{"x.test/a:1", "x.test/b:1"} {
		f.addImage(n, "sha256:"+n, 10)
	}
	r := newRig(t, f, func(o *Options) {
		o.MinAge = 0
		o.SameFS = func(a, b string) (bool, error) { return a == "/var/lib/containerd" && b == "/var/lib/mqlet", nil }
	})
	// Inodes cannot be counted per image: everything that may go goes.
	if n, err := r.m.ReclaimDisk(context.Background(), "nodefs.inodesFree", 1); err != nil || n != 20 || len(f.removedImages()) != 2 {
		t.Fatalf("nodefs.inodesFree on the image file system: %d %v %v", n, err, f.removedImages())
	}
}

func TestRemovalErrorsReported(t *testing.T) {
	f := newFake(100, 0)
	f.addImage("x.test/a:1", "sha256:a", 10)
	f.addImage("x.test/b:1", "sha256:b", 10)
	f.failRemove["x.test/a:1"] = errors.New("remove image x.test/a:1: rpc error")
	r := newRig(t, f, func(o *Options) { o.MinAge = 0; o.LowThresholdPercent = 85 })
	res, err := r.m.GarbageCollect(context.Background())
	if !slices.Equal(res.Removed, []string{"x.test/b:1"}) || err == nil || !strings.Contains(err.Error(), "x.test/a:1") {
		t.Fatalf("removed %v err %v: want b removed and a's failure reported", res.Removed, err)
	}
	if got := r.ev.reasons(); !slices.Contains(got, "Warning/ImageGCFailed") {
		t.Errorf("events %v lack ImageGCFailed", got)
	}
}

func TestNewValidates(t *testing.T) {
	pods := func() []v1.Pod { return nil }
	for _, tt := range []struct {
		o    Options
		want string
	}{
		{Options{HighThresholdPercent: 101, ImageFSDir: "/x", Pods: pods}, "high threshold 101%"},
		{Options{HighThresholdPercent: 80, LowThresholdPercent: 85, ImageFSDir: "/x", Pods: pods}, "low threshold 85% is above"},
		{Options{HighThresholdPercent: 85, LowThresholdPercent: -1, ImageFSDir: "/x", Pods: pods}, "low threshold -1%"},
		{Options{HighThresholdPercent: 85, MinAge: -time.Second, ImageFSDir: "/x", Pods: pods}, "minimum GC age"},
		{Options{HighThresholdPercent: 85, Pods: pods}, "imageFSDir"},
		{Options{HighThresholdPercent: 85, ImageFSDir: "/x"}, "desired pods"},
	} {
		if _, err := New(newFake(1, 1), tt.o); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v, want an error with %q", tt.o, err, tt.want)
		}
	}
}

// Run passes at once, on Trigger, and ends with its context.
func TestRunTriggerAndStop(t *testing.T) {
	f := newFake(100, 90)
	r := newRig(t, f, func(o *Options) { o.Period = time.Hour })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.m.Run(ctx); close(done) }()
	lists := func() int { f.mu.Lock(); defer f.mu.Unlock(); return f.lists }
	waitUntil(t, "first pass", func() bool { return lists() == 1 })
	r.m.Trigger()
	waitUntil(t, "triggered pass", func() bool { return lists() == 2 })
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not end with its context")
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// writeDockerArchive writes the metadata part of a docker-archive naming ref: what
// ctrd.ArchiveImageNames reads.
func writeDockerArchive(t *testing.T, path, ref string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	body := []byte(`[{"Config":"c.json","RepoTags":["` + ref + `"],"Layers":[]}]`)
	if err := tw.WriteHeader(&tar.Header{Name: "manifest.json", Mode: 0o644, Size: int64(len(body))}); err != nil {
		t.Fatal(err)
	}
	tw.Write(body)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}
