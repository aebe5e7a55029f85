package imagegc_test

// Image garbage collection against the test environment's real containerd: images are really
// removed (content and unpacked layers with them), and kept ones stay.

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/eviction"
	"github.com/mqlet/mqlet/agent/imagegc"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/internal/testenv"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// layerSize is the random payload of the test's own image: no other image or namespace shares it,
// so removing the image must free at least this much twice (the blob and the unpacked layer).
const layerSize = 256 << 10

type rig struct {
	t     *testing.T
	env   testenv.Env
	ns    string
	rt    *ctrd.Runtime
	cl    *containerd.Client
	state string
}

func newRig(t *testing.T) *rig {
	t.Helper()
	env := testenv.Require(t)
	g := &rig{t: t, env: env, ns: testenv.Namespace(t, env.ContainerdAddress), state: t.TempDir()}
	var err error
	g.rt, err = ctrd.New(context.Background(), ctrd.Options{Address: env.ContainerdAddress, Namespace: g.ns,
		StateDir: g.state, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.rt.Close() })
	if g.cl, err = containerd.New(env.ContainerdAddress); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.cl.Close() })
	return g
}

func (g *rig) ctx() context.Context { return namespaces.WithNamespace(context.Background(), g.ns) }

func (g *rig) importArchive(path string) {
	g.t.Helper()
	if _, err := g.rt.ImportArchiveIfMissing(context.Background(), path); err != nil {
		g.t.Fatalf("import %s: %v", path, err)
	}
}

// present reports whether containerd has the image, asking containerd itself.
func (g *rig) present(name string) bool {
	g.t.Helper()
	_, err := g.cl.ImageService().Get(g.ctx(), name)
	if errdefs.IsNotFound(err) {
		return false
	} else if err != nil {
		g.t.Fatalf("get image %s: %v", name, err)
	}
	return true
}

// uniqueImage imports an image of one layer of random data under ref and returns the digest of
// its layer blob and the chain id its unpacked layer (snapshot) is named by.
func (g *rig) uniqueImage(ref string) (blob, chain string) {
	g.t.Helper()
	path := filepath.Join(g.t.TempDir(), "unique.tar")
	writeImageArchive(g.t, path, ref)
	g.importArchive(path)
	img, err := g.cl.ImageService().Get(g.ctx(), ref)
	if err != nil {
		g.t.Fatal(err)
	}
	m, err := images.Manifest(g.ctx(), g.cl.ContentStore(), img.Target, platforms.Default())
	if err != nil || len(m.Layers) != 1 {
		g.t.Fatalf("manifest of %s: %+v, %v", ref, m, err)
	}
	diffIDs, err := img.RootFS(g.ctx(), g.cl.ContentStore(), platforms.Default())
	if err != nil {
		g.t.Fatal(err)
	}
	chain = identity.ChainID(diffIDs).String()
	if _, err := g.cl.SnapshotService("").Stat(g.ctx(), chain); err != nil {
		g.t.Fatalf("the unpacked layer %s of %s: %v", chain, ref, err)
	}
	return m.Layers[0].Digest.String(), chain
}

// blobGone and layerGone ask containerd whether the image's content and snapshot went with it.
func (g *rig) blobGone(d string) bool {
	_, err := g.cl.ContentStore().Info(g.ctx(), digestOf(g.t, d))
	return errdefs.IsNotFound(err)
}

func (g *rig) layerGone(chain string) bool {
	_, err := g.cl.SnapshotService("").Stat(g.ctx(), chain)
	return errdefs.IsNotFound(err)
}

func newPod(uid string, ctrs ...v1.Container) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p-" + uid[:6], Namespace: "default", UID: types.UID(uid)},
		Spec: v1.PodSpec{Containers: ctrs}}
}

// run starts attempt n of the pod's container c and removes the pod's containers and sandbox when
// the test ends.
func (g *rig) run(p *v1.Pod, c *v1.Container, attempt int) ctrd.Container {
	g.t.Helper()
	ctx := context.Background()
	sb, err := g.rt.EnsureSandbox(ctx, p)
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() {
		cs, _ := g.rt.ListContainers(ctx, string(p.UID))
		for _, c := range cs {
			g.rt.RemoveContainer(ctx, c.ID)
		}
		g.rt.RemoveSandbox(ctx, ctrd.RefOf(p))
	})
	ctr, err := g.rt.StartContainer(ctx, p, sb, c, attempt)
	if err != nil {
		g.t.Fatalf("start %s attempt %d: %v", c.Name, attempt, err)
	}
	return ctr
}

type sink struct {
	mu sync.Mutex
	es []event.Event
}

func (s *sink) Emit(e event.Event) { s.mu.Lock(); s.es = append(s.es, e); s.mu.Unlock() }
func (s *sink) has(typ event.Type, reason string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.ContainsFunc(s.es, func(e event.Event) bool { return e.Type == typ && e.Reason == reason })
}

// Above the high threshold (0 here, with the real statfs: the file system is always "full"), image
// GC removes the unused images and keeps the one a container runs from, the one a desired pod
// names before its container exists, and the one in the preload dir.
func TestImageGCRemovesUnusedKeepsUsed(t *testing.T) {
	g := newRig(t)
	for _, a := range []string{testenv.Busybox, testenv.Busybox2, testenv.Echo, testenv.BusyboxOCI} {
		g.importArchive(g.env.Image(a))
	}
	uniqueRef := "mqlet.test/gc-unique:" + randHex(4)
	blob, chain := g.uniqueImage(uniqueRef)

	// busybox:1 runs a container of a pod that is not even desired: in use is enough.
	running := newPod("9c0e0001-running", v1.Container{Name: "main", Image: testenv.BusyboxRef, ImagePullPolicy: v1.PullNever,
		Command: []string{"sleep", "3600"}})
	g.run(running, &running.Spec.Containers[0], 0)
	// busybox:2 is wanted by a desired pod whose container does not exist yet.
	waiting := newPod("9c0e0002-waiting", v1.Container{Name: "main", Image: testenv.Busybox2Ref})
	// echo:1 is in the preload dir.
	preload := filepath.Join(g.state, "preload")
	os.MkdirAll(preload, 0o755)
	copyFile(t, g.env.Image(testenv.Echo), filepath.Join(preload, "echo.tar"))

	events := &sink{}
	m, err := imagegc.New(g.rt, imagegc.Options{NodeName: "edge-1", ImageFSDir: g.state, PreloadDir: preload,
		HighThresholdPercent: 0, LowThresholdPercent: 0, MinAge: 0,
		Pods: func() []v1.Pod { return []v1.Pod{*waiting} }, Events: events, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.GarbageCollect(context.Background())
	// Low 0 asks for the whole file system back: never reached, so the pass reports it failed.
	if err == nil || !events.has(event.Warning, imagegc.ReasonFreeDiskSpaceFailed) || !events.has(event.Normal, imagegc.ReasonFreedDiskSpace) {
		t.Errorf("err %v, events %+v: want FreedDiskSpace and FreeDiskSpaceFailed", err, events.es)
	}
	slices.Sort(res.Removed)
	want := []string{uniqueRef, testenv.BusyboxOCIRef}
	slices.Sort(want)
	if !slices.Equal(res.Removed, want) {
		t.Errorf("removed %v, want %v", res.Removed, want)
	}
	for _, name := range []string{uniqueRef, testenv.BusyboxOCIRef} {
		if g.present(name) {
			t.Errorf("image %s still in containerd", name)
		}
	}
	for _, name := range []string{testenv.BusyboxRef, testenv.Busybox2Ref, testenv.EchoRef} {
		if !g.present(name) {
			t.Errorf("image %s was removed; it is in use, wanted or preloaded", name)
		}
	}
	if !g.blobGone(blob) || !g.layerGone(chain) {
		t.Errorf("after the synchronous delete: layer blob gone %v, unpacked layer gone %v; want both gone", g.blobGone(blob), g.layerGone(chain))
	}
	if res.Freed < 2*layerSize {
		t.Errorf("freed %d bytes, want at least %d: the unique layer's blob and its unpacked copy", res.Freed, 2*layerSize)
	}
	// The running container is untouched.
	cs, err := g.rt.ListContainers(context.Background(), string(running.UID))
	if err != nil || len(cs) != 1 || cs[0].State != ctrd.StateRunning {
		t.Errorf("the running pod's containers after GC: %+v, %v", cs, err)
	}
}

// ReclaimDisk, the eviction manager's reclaim, removes an unused image whatever the thresholds; for
// nodefs on another file system it removes exited older attempts of a desired pod's container and
// keeps the newest, and no image.
func TestReclaimDiskFreesUnusedImageAndDeadContainers(t *testing.T) {
	g := newRig(t)
	g.importArchive(g.env.Image(testenv.Busybox))
	uniqueRef := "mqlet.test/gc-unique:" + randHex(4)
	g.uniqueImage(uniqueRef)

	job := newPod("9c0e0003-job", v1.Container{Name: "job", Image: testenv.BusyboxRef, ImagePullPolicy: v1.PullNever,
		Command: []string{"sh", "-c", "echo done > /tmp/out"}})
	pods := []v1.Pod{*job} // desired from the start: busybox:1 is kept
	m, err := imagegc.New(g.rt, imagegc.Options{NodeName: "edge-1", ImageFSDir: g.state, NodeFSDir: g.state,
		HighThresholdPercent: 85, LowThresholdPercent: 80, MinAge: 0,
		Pods:   func() []v1.Pod { return pods },
		SameFS: func(a, b string) (bool, error) { return false, nil }, // images on their own file system
		Log:    slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	freed, err := m.ReclaimDisk(context.Background(), eviction.SignalImageFsAvailable, 1)
	if err != nil || freed < 2*layerSize {
		t.Fatalf("ReclaimDisk(imagefs.available) = %d, %v; want at least %d", freed, err, 2*layerSize)
	}
	if g.present(uniqueRef) {
		t.Fatalf("image %s still in containerd after ReclaimDisk", uniqueRef)
	}
	if !g.present(testenv.BusyboxRef) {
		t.Fatalf("busybox:1, wanted by a desired pod, was removed")
	}

	// Two attempts of the job ran and exited; its worker would restart the newest, never the older.
	// busybox:2 is unused, but images live on another file system than nodefs.
	g.importArchive(g.env.Image(testenv.Busybox2))
	g.run(job, &job.Spec.Containers[0], 0)
	g.run(job, &job.Spec.Containers[0], 1)
	deadline := time.Now().Add(30 * time.Second)
	for {
		cs, _ := g.rt.ListContainers(context.Background(), string(job.UID))
		if len(cs) == 2 && cs[0].State == ctrd.StateExited && cs[1].State == ctrd.StateExited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job's attempts did not both exit: %+v", cs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := m.ReclaimDisk(context.Background(), eviction.SignalNodeFsAvailable, 1<<40); err != nil {
		t.Fatalf("ReclaimDisk(nodefs.available): %v", err)
	}
	cs, err := g.rt.ListContainers(context.Background(), string(job.UID))
	if err != nil || len(cs) != 1 || cs[0].ID != ctrd.ContainerID(string(job.UID), "job", 1) {
		t.Errorf("the job's containers after reclaim: %+v, %v; want only attempt 1", cs, err)
	}
	if !g.present(testenv.Busybox2Ref) {
		t.Errorf("nodefs reclaim removed an image, though images live on another file system")
	}
}

// RemoveImage counts only what goes: a second name for an image frees nothing (the content stays
// for the first), an image sharing its layers with another frees no layer.
func TestRemoveImageCountsOnlyWhatGoes(t *testing.T) {
	g := newRig(t)
	ref := "mqlet.test/gc-unique:" + randHex(4)
	blob, chain := g.uniqueImage(ref)
	img, err := g.cl.ImageService().Get(g.ctx(), ref)
	if err != nil {
		t.Fatal(err)
	}
	img.Name = ref + "-alias"
	if _, err := g.cl.ImageService().Create(g.ctx(), img); err != nil {
		t.Fatal(err)
	}
	freed, err := g.rt.RemoveImage(context.Background(), img.Name)
	if err != nil || freed != 0 {
		t.Errorf("RemoveImage(alias) = %d, %v; want 0 freed", freed, err)
	}
	if g.present(img.Name) || !g.present(ref) || g.blobGone(blob) || g.layerGone(chain) {
		t.Errorf("after removing the alias: alias present %v, image present %v, blob gone %v, layer gone %v",
			g.present(img.Name), g.present(ref), g.blobGone(blob), g.layerGone(chain))
	}
	if freed, err := g.rt.RemoveImage(context.Background(), "mqlet.test/absent:1"); err != nil || freed != 0 {
		t.Errorf("RemoveImage of an absent image = %d, %v; want 0, nil", freed, err)
	}

	// Two images of one layer no other namespace has, different configs: removing one frees its
	// manifest and config, never the layer the other still uses.
	data := randomBytes(layerSize)
	first, second := "mqlet.test/gc-shared:"+randHex(4), "mqlet.test/gc-shared:"+randHex(4)
	for i, ref := range []string{first, second} {
		path := filepath.Join(t.TempDir(), "shared.tar")
		writeImageArchiveOf(t, path, ref, data, fmt.Sprint("variant-", i))
		g.importArchive(path)
	}
	firstImg, err := g.cl.ImageService().Get(g.ctx(), first)
	if err != nil {
		t.Fatal(err)
	}
	m, err := images.Manifest(g.ctx(), g.cl.ContentStore(), firstImg.Target, platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	layer := m.Layers[0]
	freed, err = g.rt.RemoveImage(context.Background(), second)
	if err != nil || freed <= 0 || freed >= layer.Size {
		t.Errorf("RemoveImage(%s) = %d, %v; want its manifest and config only, not the shared layer (%d bytes)", second, freed, err, layer.Size)
	}
	if g.present(second) || !g.present(first) || g.blobGone(layer.Digest.String()) {
		t.Errorf("after removing %s: still present %v, %s present %v, shared layer gone %v",
			second, g.present(second), first, g.present(first), g.blobGone(layer.Digest.String()))
	}
}

// writeImageArchive writes a docker-archive of ref with one layer holding layerSize random bytes.
func writeImageArchive(t *testing.T, path, ref string) {
	writeImageArchiveOf(t, path, ref, randomBytes(layerSize), "")
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// writeImageArchiveOf writes a docker-archive of ref with one layer holding data; variant makes the
// config, and so the image, differ from another of the same layer.
func writeImageArchiveOf(t *testing.T, path, ref string, data []byte, variant string) {
	t.Helper()
	var layer bytes.Buffer
	lw := tar.NewWriter(&layer)
	lw.WriteHeader(&tar.Header{Name: "gc-data", Mode: 0o644, Size: int64(len(data)), ModTime: time.Unix(0, 0)})
	lw.Write(data)
	lw.Close()
	sum := sha256.Sum256(layer.Bytes())
	diffID := "sha256:" + hex.EncodeToString(sum[:])
	config, _ := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux",
		"config": map[string]any{"Cmd": []string{"/gc-data"}, "Env": []string{"VARIANT=" + variant}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	})
	manifest, _ := json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": []string{ref}, "Layers": []string{"layer.tar"}}})

	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, e := range []struct {
		name string
		body []byte
	}{{"layer.tar", layer.Bytes()}, {"config.json", config}, {"manifest.json", manifest}} {
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body))}); err != nil {
			t.Fatal(err)
		}
		tw.Write(e.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func digestOf(t *testing.T, s string) digest.Digest {
	t.Helper()
	d, err := digest.Parse(s)
	if err != nil {
		t.Fatalf("digest %q: %v", s, err)
	}
	return d
}
