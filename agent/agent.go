// Package agent is the kubelet core of mqlet: it takes desired pods from its sources, records them
// in the store before acting, and runs one pod worker per pod against containerd. Data flows one
// way: source -> store -> workers -> containerd; containerd events and relists -> status -> store.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/agent/pod"
	"github.com/mqlet/mqlet/agent/runtime"
	"github.com/mqlet/mqlet/hw"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
)

// fileSource prefixes the store's Source of pods that come from the manifest dir.
const fileSource = "file:"

// Options are the parts of the configuration the core needs.
type Options struct {
	NodeName     string
	ManifestDir  string
	PreloadDir   string
	RelistPeriod time.Duration
	Log          *slog.Logger
	// TrimMemory hands freed memory back to the OS once the node goes quiet after activity
	// (see trimAfterQuiet). Off when the operator tunes the Go runtime with GOGC/GOMEMLIMIT.
	TrimMemory bool
}

// quietBeforeTrim is how long nothing must change before the agent returns freed memory to the
// OS. A burst of pod starts allocates several MiB that the Go runtime would otherwise keep for
// minutes; on a device with a few hundred MiB, that matters more than the one extra collection.
const quietBeforeTrim = 2 * time.Second

// Agent runs pods. Create it with New, then Run.
type Agent struct {
	opts Options
	rt   *runtime.Runtime
	db   *store.DB
	log  *slog.Logger
	src  *manifest.Dir

	mu      sync.Mutex
	workers map[types.UID]*pod.Worker
	// byPrefix maps runtime.ContainerIDPrefix of each worker's pod UID to the UID, so a
	// containerd event finds its pod without hashing every UID.
	byPrefix map[string]types.UID
	desired  map[types.UID]store.DesiredPod
	runCtx   context.Context
	stop     context.CancelFunc
	wg       sync.WaitGroup
	// cleaning holds pods whose orphaned containers are being removed, closed when done: relists
	// don't start a second cleanup, and a pod re-added meanwhile (same stable UID, so the same
	// container ids) waits for it instead of having its new containers stopped.
	cleaning map[types.UID]chan struct{}

	synced   atomic.Bool // the manifest dir was read once and workers started
	relistOK atomic.Bool
	hostIP   atomic.Pointer[string] // refreshed by every relist: a node may get its address late

	trimMu sync.Mutex
	trim   *time.Timer
}

// New wires an agent from an open store and a connected runtime; it owns neither.
func New(opts Options, rt *runtime.Runtime, db *store.DB) *Agent {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.RelistPeriod == 0 {
		opts.RelistPeriod = 10 * time.Second
	}
	return &Agent{
		opts: opts, rt: rt, db: db, log: opts.Log,
		src:      manifest.NewDir(opts.ManifestDir, opts.NodeName),
		workers:  map[types.UID]*pod.Worker{},
		byPrefix: map[string]types.UID{},
		desired:  map[types.UID]store.DesiredPod{},
		cleaning: map[types.UID]chan struct{}{},
	}
}

// Run restores pods from the store, then follows the manifest dir and containerd until ctx ends.
// On return pods keep running, as with kubelet: stopping the agent is not stopping the workload.
func (a *Agent) Run(ctx context.Context) error {
	if err := a.start(ctx); err != nil {
		return err
	}
	a.wg.Add(2)
	go func() { defer a.wg.Done(); a.followEvents(a.runCtx) }()
	go func() { defer a.wg.Done(); a.relistLoop(a.runCtx) }()
	err := a.src.Watch(ctx, 30*time.Second, func(s manifest.Snapshot) { a.applySnapshot(s) })
	if err != nil && ctx.Err() == nil {
		// Without its source the agent would silently ignore manifest changes; exit so that the
		// service manager restarts it. Pods keep running meanwhile.
		err = fmt.Errorf("manifest dir %s: %w", a.opts.ManifestDir, err)
	}
	a.stop()
	a.wg.Wait()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// start restores workers for every desired pod in the store before any source is read, so a node
// that boots with no network and an unreadable manifest dir still runs what it ran before.
func (a *Agent) start(ctx context.Context) error {
	a.runCtx, a.stop = context.WithCancel(ctx)
	ctx = a.runCtx
	a.preload(ctx)
	pods, err := a.db.ListDesired()
	if err != nil {
		return err
	}
	statuses, err := a.db.ListStatus()
	if err != nil {
		return err
	}
	a.mu.Lock()
	for _, d := range pods {
		a.desired[d.Pod.UID] = d
		a.startWorker(d.Pod, statuses[d.Pod.UID])
	}
	a.mu.Unlock()
	a.log.Info("restored pods from the store", "pods", len(pods))
	return a.relist(ctx)
}

// preload imports image archives dropped in the preload dir (OTA images, offline factory nodes)
// that containerd does not have yet. A bad archive is logged and skipped: it must not stop the node.
func (a *Agent) preload(ctx context.Context) {
	if a.opts.PreloadDir == "" {
		return
	}
	entries, err := os.ReadDir(a.opts.PreloadDir)
	if err != nil {
		if !os.IsNotExist(err) {
			a.log.Warn("image preload dir unreadable", "dir", a.opts.PreloadDir, "err", err)
		}
		return
	}
	for _, e := range entries {
		if e.IsDir() || !(strings.HasSuffix(e.Name(), ".tar") || strings.HasSuffix(e.Name(), ".tar.gz")) {
			continue
		}
		path := filepath.Join(a.opts.PreloadDir, e.Name())
		names, err := a.rt.ImportArchiveIfMissing(ctx, path)
		if err != nil {
			a.log.Error("image preload failed", "archive", path, "err", err)
			continue
		}
		if len(names) > 0 {
			a.log.Info("preloaded images", "archive", path, "images", names)
		}
	}
}

// startWorker must be called with a.mu held.
func (a *Agent) startWorker(p *v1.Pod, prev *v1.PodStatus) {
	w := pod.NewWorker(p, prev, pod.Env{
		Runtime:  a.rt,
		Log:      a.log,
		HostIP:   a.currentHostIP,
		OnStatus: a.onStatus,
		OnGone:   a.onGone,
	})
	a.workers[p.UID] = w
	a.byPrefix[runtime.ContainerIDPrefix(string(p.UID))] = p.UID
	cleaned := a.cleaning[p.UID]
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if cleaned != nil {
			select {
			case <-cleaned:
			case <-a.runCtx.Done():
				return
			}
		}
		w.Run(a.runCtx)
	}()
}

func (a *Agent) onStatus(p *v1.Pod, st v1.PodStatus) {
	a.activity()
	if err := a.db.PutStatus(p.UID, &st); err != nil {
		a.log.Error("store pod status", "pod", p.Namespace+"/"+p.Name, "err", err)
	}
}

func (a *Agent) onGone(p *v1.Pod) {
	if err := a.db.DeleteStatus(p.UID); err != nil {
		a.log.Error("delete pod status", "pod", p.Namespace+"/"+p.Name, "err", err)
	}
	a.mu.Lock()
	// A pod re-added while it was terminating gets a fresh worker from its desired entry.
	delete(a.workers, p.UID)
	delete(a.byPrefix, runtime.ContainerIDPrefix(string(p.UID)))
	d, again := a.desired[p.UID]
	if again && a.runCtx.Err() == nil {
		a.startWorker(d.Pod, nil)
	}
	a.mu.Unlock()
}

// applySnapshot makes the store's file-sourced desired pods equal to the manifest dir, then tells
// workers. The store is written first so that what runs is always what the store says.
func (a *Agent) applySnapshot(s manifest.Snapshot) {
	for _, p := range s.Problems {
		a.log.Error("manifest rejected", "problem", p.Error())
	}
	want := make([]store.DesiredPod, 0, len(s.Pods))
	for _, p := range s.Pods {
		want = append(want, store.DesiredPod{Pod: p.Pod, Source: p.Source()})
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	// A pod whose file (or the whole directory) cannot be read or parsed right now stays as
	// stored: after a reboot the source has no memory of the file's last good content, and a
	// half-written file or a flaky SD card must not take a running pod down.
	troubled := map[string]bool{}
	for _, p := range s.Problems {
		if !p.Duplicate { // a file that parses but repeats a name is not unreadable
			troubled[p.File] = true
		}
	}
	dir := a.src.Path()
	for uid, d := range a.desired {
		file, _, _ := strings.Cut(strings.TrimPrefix(d.Source, fileSource), "#")
		if !strings.HasPrefix(d.Source, fileSource) || !(troubled[file] || troubled[dir]) {
			continue
		}
		if !slices.ContainsFunc(want, func(w store.DesiredPod) bool { return w.Pod.UID == uid }) {
			want = append(want, d)
		}
	}
	var changed []store.DesiredPod
	keep := map[types.UID]bool{}
	for _, d := range want {
		keep[d.Pod.UID] = true
		if old, ok := a.desired[d.Pod.UID]; !ok || old.Source != d.Source || !sameConfig(old.Pod, d.Pod) {
			changed = append(changed, d)
		}
	}
	var gone []types.UID
	for uid, d := range a.desired {
		if strings.HasPrefix(d.Source, fileSource) && !keep[uid] {
			gone = append(gone, uid)
		}
	}
	if len(changed) > 0 || len(gone) > 0 {
		if _, err := a.db.ReplaceDesired(fileSource, want); err != nil {
			// Acting on pods the store does not hold would break restore-after-reboot.
			a.log.Error("store desired pods; not acting on the manifest change", "err", err)
			return
		}
	}
	for _, d := range changed {
		a.desired[d.Pod.UID] = d
		if w, ok := a.workers[d.Pod.UID]; ok {
			w.Update(d.Pod)
		} else {
			a.startWorker(d.Pod, nil)
		}
	}
	for _, uid := range gone {
		delete(a.desired, uid)
		if w, ok := a.workers[uid]; ok {
			w.Delete()
		}
	}
	a.activity()
	a.synced.Store(true)
}

// sameConfig reports whether two versions of a desired pod are the same: by the source's config
// hash when both carry one, else by value (printing the spec would compare pointer addresses).
func sameConfig(a, b *v1.Pod) bool {
	ha, hb := a.Annotations[manifest.AnnotationConfigHash], b.Annotations[manifest.AnnotationConfigHash]
	if ha != "" && hb != "" {
		return ha == hb
	}
	return equality.Semantic.DeepEqual(a.Spec, b.Spec) && equality.Semantic.DeepEqual(a.ObjectMeta, b.ObjectMeta)
}

// activity notes that something changed; trimAfterQuiet runs once things have been quiet.
func (a *Agent) activity() {
	if !a.opts.TrimMemory {
		return
	}
	a.trimMu.Lock()
	defer a.trimMu.Unlock()
	if a.trim == nil {
		a.trim = time.AfterFunc(quietBeforeTrim, debug.FreeOSMemory)
		return
	}
	a.trim.Reset(quietBeforeTrim)
}

// followEvents nudges the worker of a pod whose container exited or hit OOM, resubscribing when
// containerd restarts.
func (a *Agent) followEvents(ctx context.Context) {
	for ctx.Err() == nil {
		err := a.rt.Events(ctx, func(e runtime.Event) {
			w := a.workerForContainer(e.ContainerID)
			if w == nil {
				return
			}
			if e.OOM {
				w.OOM(e.ContainerID)
				return
			}
			w.Nudge()
		})
		if ctx.Err() != nil {
			return
		}
		a.log.Warn("containerd events lost; resubscribing", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// workerForContainer finds the pod by the container id's UID prefix (see runtime.ContainerID), so an
// exit costs no containerd round trip.
func (a *Agent) workerForContainer(id string) *pod.Worker {
	a.mu.Lock()
	defer a.mu.Unlock()
	prefix, _, ok := strings.Cut(id, "-")
	if !ok {
		return nil
	}
	return a.workers[a.byPrefix[prefix+"-"]]
}

// relistLoop is the safety net for missed events: every period it nudges all workers and removes
// containers of pods nobody wants (deleted while the agent was down).
func (a *Agent) relistLoop(ctx context.Context) {
	t := time.NewTicker(a.opts.RelistPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := a.relist(ctx); err != nil {
			a.log.Warn("relist failed", "err", err)
		}
	}
}

func (a *Agent) currentHostIP() string {
	if ip := a.hostIP.Load(); ip != nil {
		return *ip
	}
	ip := hw.HostIP()
	a.hostIP.Store(&ip)
	return ip
}

// relistTimeout bounds one relist, so a hung containerd shows as "not ready" instead of a stall.
const relistTimeout = 30 * time.Second

// relist lists every container once, nudges the workers whose last view differs from what
// containerd shows (an event was missed), and removes containers of pods nobody wants. The
// listing happens outside a.mu so a slow containerd never blocks the API or the sources.
func (a *Agent) relist(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, relistTimeout)
	ctrs, err := a.rt.ListContainers(lctx, "")
	cancel()
	if err != nil {
		a.relistOK.Store(false)
		return err
	}
	a.relistOK.Store(true)
	ipChanged := false
	// Keep the last address through a brief link loss rather than publish an empty one.
	if ip := hw.HostIP(); ip != "" && ip != a.currentHostIP() {
		a.hostIP.Store(&ip)
		ipChanged = true
	}
	byPod := map[types.UID][]runtime.Container{}
	for _, c := range ctrs {
		byPod[types.UID(c.PodUID)] = append(byPod[types.UID(c.PodUID)], c)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for uid, w := range a.workers {
		if ipChanged || runtime.Fingerprint(byPod[uid]) != w.Seen() {
			w.Nudge()
		}
	}
	for uid, cs := range byPod {
		if _, ok := a.workers[uid]; ok || a.cleaning[uid] != nil {
			continue
		}
		a.cleaning[uid] = make(chan struct{})
		a.wg.Add(1)
		go a.removeOrphan(uid, cs)
	}
	return nil
}

// removeOrphan stops and removes the containers of a pod nobody wants any more (deleted while the
// agent was down, or while it was terminating), then its files and stored status.
func (a *Agent) removeOrphan(uid types.UID, cs []runtime.Container) {
	defer a.wg.Done()
	ctx := a.runCtx
	p := &v1.Pod{}
	p.UID, p.Name, p.Namespace = uid, cs[0].PodName, cs[0].PodNamespace
	a.log.Info("removing containers of a pod that is no longer desired", "pod", p.Namespace+"/"+p.Name, "containers", len(cs))
	var wg sync.WaitGroup
	var failed atomic.Bool
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The pod's own grace period, recorded on its containers when they were made.
			if err := a.rt.StopContainer(ctx, c.ID, max(c.Grace, pod.MinGrace)); err != nil {
				a.log.Warn("stop orphan", "container", c.ID, "err", err)
				failed.Store(true)
			}
			if err := a.rt.RemoveContainer(ctx, c.ID); err != nil {
				a.log.Warn("remove orphan", "container", c.ID, "err", err)
				failed.Store(true)
			}
		}()
	}
	wg.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	close(a.cleaning[uid])
	delete(a.cleaning, uid)
	if _, back := a.workers[uid]; back || failed.Load() {
		// Re-added meanwhile (its network namespace and files are in use again), or not all
		// gone yet (the next relist tries again).
		return
	}
	if err := a.rt.RemoveSandbox(ctx, runtime.RefOf(p)); err != nil {
		a.log.Warn("remove orphan pod files", "pod", p.Namespace+"/"+p.Name, "err", err)
	}
	if err := a.db.DeleteStatus(uid); err != nil {
		a.log.Warn("delete orphan pod status", "pod", p.Namespace+"/"+p.Name, "err", err)
	}
}

// Pods returns every pod the agent manages with its latest status (api.Provider).
func (a *Agent) Pods() []v1.Pod {
	a.mu.Lock()
	ws := make([]*pod.Worker, 0, len(a.workers))
	for _, w := range a.workers {
		ws = append(ws, w)
	}
	a.mu.Unlock()
	out := make([]v1.Pod, 0, len(ws))
	for _, w := range ws {
		out = append(out, w.Pod())
	}
	slices.SortFunc(out, func(x, y v1.Pod) int {
		return strings.Compare(x.Namespace+"/"+x.Name, y.Namespace+"/"+y.Name)
	})
	return out
}

// Ready is nil once the manifest dir has been read and containerd answers (api.Provider).
func (a *Agent) Ready() error {
	switch {
	case !a.synced.Load():
		return errors.New("manifest dir not read yet")
	case !a.relistOK.Load():
		return errors.New("containerd is not answering")
	}
	return nil
}

// LogPath finds the log file of a container (api.LogProvider), with kubectl's rules: the container
// may be omitted when the pod has one; previous is the attempt before the current one.
func (a *Agent) LogPath(namespace, name, container string, previous bool) (string, error) {
	var p *v1.Pod
	for _, q := range a.Pods() {
		if q.Namespace == namespace && q.Name == name {
			p = &q
			break
		}
	}
	if p == nil {
		return "", fmt.Errorf("pod %s/%s not found", namespace, name)
	}
	var names []string
	for _, c := range append(append([]v1.Container(nil), p.Spec.InitContainers...), p.Spec.Containers...) {
		names = append(names, c.Name)
	}
	if container == "" {
		if len(p.Spec.Containers) != 1 || len(p.Spec.InitContainers) != 0 {
			return "", fmt.Errorf("a container name must be specified for pod %s, choose one of: %v", name, names)
		}
		container = p.Spec.Containers[0].Name
	}
	for _, cs := range append(append([]v1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if cs.Name != container {
			continue
		}
		n := int(cs.RestartCount)
		if previous {
			if n == 0 {
				return "", fmt.Errorf("previous terminated container %q in pod %q not found", container, name)
			}
			n--
		}
		return a.rt.LogPath(p, container, n), nil
	}
	if slices.Contains(names, container) {
		return "", fmt.Errorf("container %q in pod %q has not started yet", container, name)
	}
	return "", fmt.Errorf("container %s is not valid for pod %s, choose one of: %v", container, name, names)
}
