// Package imagegc is the node's image garbage collection, with kubelet's policy: once the image
// file system (containerd's root) is fuller than the high threshold, unused images are removed,
// least recently used first, until it is down to the low threshold. It also does the node-level
// disk reclaim the eviction manager asks for before it evicts any pod (ReclaimDisk).
//
// An image is never removed while a container in the namespace was made from it, while a desired
// pod names it (whether or not its container exists yet), while an archive in the preload dir holds
// it, or before it has been known for the minimum age (it may have just been pulled for a pod).
package imagegc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/eviction"
	"github.com/mqlet/mqlet/agent/podspec"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/hw"
	v1 "k8s.io/api/core/v1"
)

// DefaultPeriod is how often the policy is applied: kubelet's ImageGCPeriod.
const DefaultPeriod = 5 * time.Minute

// readyRetry is how soon a pass that had to wait for the desired pods to be known is tried again.
const readyRetry = time.Second

// Event reasons. The warnings are kubelet's; kubelet reports a successful collection only in its
// log, mqlet also as a Normal event, because on an edge node the event stream is often all an
// operator sees of it.
const (
	ReasonImageGCFailed       = "ImageGCFailed"
	ReasonFreeDiskSpaceFailed = "FreeDiskSpaceFailed"
	ReasonInvalidDiskCapacity = "InvalidDiskCapacity"
	ReasonFreedDiskSpace      = "FreedDiskSpace"
)

// ErrNotReady says a pass was skipped because the agent does not know every desired pod yet (a
// source not read): an image one of them needs could otherwise be taken for unused.
var ErrNotReady = errors.New("desired pods not known yet")

// Runtime is what garbage collection needs from containerd; *ctrd.Runtime implements it.
type Runtime interface {
	ListImages(ctx context.Context) ([]ctrd.ImageInfo, error)
	ContainerImages(ctx context.Context) ([]ctrd.ImageUse, error)
	RemoveImage(ctx context.Context, name string) (freed int64, err error)
	ListContainers(ctx context.Context, podUID string) ([]ctrd.Container, error)
	RemoveExitedContainer(ctx context.Context, id string) (freed int64, err error)
}

// Options configure a Manager. Pods and ImageFSDir are required.
type Options struct {
	NodeName string // the Node object events are about
	// ImageFSDir is containerd's root directory: its file system is the imagefs.
	ImageFSDir string
	// NodeFSDir is the state dir: a nodefs signal reclaims images only when it shares imagefs's
	// file system.
	NodeFSDir string
	// PreloadDir holds image archives (*.tar, *.tar.gz) whose images are never removed.
	PreloadDir string
	// HighThresholdPercent of imagefs usage starts a collection (100 turns periodic collection
	// off, as in kubelet); LowThresholdPercent is what it brings usage down to.
	HighThresholdPercent int
	LowThresholdPercent  int
	// MinAge keeps an image this long after it was first seen.
	MinAge time.Duration
	// Period between passes; 0 means DefaultPeriod.
	Period time.Duration

	// Pods returns the desired pods with their status (agent.Agent.Pods): their images are kept,
	// and their exited containers are what ReclaimDisk may remove.
	Pods func() []v1.Pod
	// Ready is nil once every desired pod is known (agent.Agent.Ready); until then no image is
	// removed. nil means always ready.
	Ready func() error
	// Statfs reads a file system's size; nil means hw.Filesystem. SameFS compares two dirs' file
	// systems; nil means hw.SameFilesystem. Tests replace them.
	Statfs func(dir string) (hw.FsStats, error)
	SameFS func(a, b string) (bool, error)
	// Events receives what collection did; nil drops events (they are logged anyway).
	Events event.Sink
	Log    *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Manager applies the image garbage collection policy. Create it with New; run Run once.
type Manager struct {
	rt      Runtime
	o       Options
	log     *slog.Logger
	trigger chan struct{}

	// mu serialises passes (the periodic one, on-demand ones and ReclaimDisk) and guards what
	// follows. It is held across containerd calls, but nothing outside garbage collection takes it.
	mu       sync.Mutex
	records  map[string]*record       // image name -> what is known of its use
	archives map[string]archiveRecord // preload archive path -> the names it declares
	warned   string                   // reason of the warning the last failing pass sent
}

// record is what the manager knows of one image. Times are in memory only: after an agent restart
// every image counts as first seen then, so the minimum age starts again (kubelet's behaviour).
type record struct {
	digest        string
	size          int64
	firstDetected time.Time
	lastUsed      time.Time // zero if never seen in use
}

// recency is when the image was last used, or first seen if it never was.
func (r *record) recency() time.Time {
	if r.lastUsed.IsZero() {
		return r.firstDetected
	}
	return r.lastUsed
}

type archiveRecord struct {
	size  int64
	mtime time.Time
	names []string
}

// New checks the options and returns a manager; nothing runs until Run.
func New(rt Runtime, o Options) (*Manager, error) {
	switch {
	case o.HighThresholdPercent < 0 || o.HighThresholdPercent > 100:
		return nil, fmt.Errorf("image GC high threshold %d%%: must be from 0 to 100", o.HighThresholdPercent)
	case o.LowThresholdPercent < 0 || o.LowThresholdPercent > 100:
		return nil, fmt.Errorf("image GC low threshold %d%%: must be from 0 to 100", o.LowThresholdPercent)
	case o.LowThresholdPercent > o.HighThresholdPercent:
		return nil, fmt.Errorf("image GC low threshold %d%% is above the high threshold %d%%", o.LowThresholdPercent, o.HighThresholdPercent)
	case o.MinAge < 0:
		return nil, fmt.Errorf("image minimum GC age %s: must not be negative", o.MinAge)
	case o.ImageFSDir == "":
		return nil, errors.New("image GC: no image file system dir (imageFSDir)")
	case o.Pods == nil:
		return nil, errors.New("image GC: no desired pods function: without it an image a pod needs could be removed")
	}
	if o.Period <= 0 {
		o.Period = DefaultPeriod
	}
	if o.Statfs == nil {
		o.Statfs = hw.Filesystem
	}
	if o.SameFS == nil {
		o.SameFS = hw.SameFilesystem
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Manager{rt: rt, o: o, log: o.Log.With("component", "image-gc"), trigger: make(chan struct{}, 1),
		records: map[string]*record{}, archives: map[string]archiveRecord{}}, nil
}

// Run applies the policy at once and then every period, and whenever Trigger asks, until ctx ends.
func (m *Manager) Run(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-m.trigger:
		}
		next := m.o.Period
		if _, err := m.GarbageCollect(ctx); errors.Is(err, ErrNotReady) {
			next = readyRetry
		} else if err != nil && ctx.Err() == nil {
			reason := ReasonImageGCFailed
			if f, ok := errors.AsType[*Failure](err); ok {
				reason = f.Reason
			}
			m.log.Warn("image garbage collection failed", "reason", reason, "err", err)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
	}
}

// Trigger asks Run for a pass now; triggers while one is pending fold into it.
func (m *Manager) Trigger() {
	select {
	case m.trigger <- struct{}{}:
	default:
	}
}

// Result is what one pass found and did.
type Result struct {
	UsagePercent int      // imagefs usage when the pass began
	Needed       int64    // bytes to free to reach the low threshold; 0 when below the high one
	Freed        int64    // bytes the removed images held
	Removed      []string // images removed, in order
}

// GarbageCollect applies the threshold policy once: above the high threshold it removes unused
// images, least recently used first, until what they held brings usage down to the low threshold.
// It fails when it could not free that much (with a FreeDiskSpaceFailed warning), and with
// ErrNotReady while the desired pods are not all known.
func (m *Manager) GarbageCollect(ctx context.Context) (Result, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.o.Now()
	inUse, err := m.detect(ctx, now)
	if err != nil {
		return Result{}, m.fail(ReasonImageGCFailed, fmt.Errorf("image garbage collection: %w", err))
	}
	if m.o.HighThresholdPercent >= 100 {
		return Result{}, nil
	}
	fs, err := m.o.Statfs(m.o.ImageFSDir)
	if err != nil {
		return Result{}, m.fail(ReasonImageGCFailed, fmt.Errorf("image garbage collection: image file system (imageFSDir): %w", err))
	}
	if fs.Capacity <= 0 {
		return Result{}, m.fail(ReasonInvalidDiskCapacity, fmt.Errorf("image file system at %s (imageFSDir) reports capacity %d", m.o.ImageFSDir, fs.Capacity))
	}
	avail := min(max(fs.Available, 0), fs.Capacity)
	res := Result{UsagePercent: 100 - int(avail*100/fs.Capacity)}
	if res.UsagePercent < m.o.HighThresholdPercent {
		m.settled()
		return res, nil
	}
	res.Needed = fs.Capacity*int64(100-m.o.LowThresholdPercent)/100 - avail
	if m.o.Ready != nil {
		if err := m.o.Ready(); err != nil {
			m.log.Debug("image file system over the high threshold; waiting for every desired pod to be known before removing images",
				"usage", res.UsagePercent, "high", m.o.HighThresholdPercent, "waiting", err)
			return res, fmt.Errorf("%w: %v", ErrNotReady, err)
		}
	}
	m.log.Info("image file system over the high threshold; removing unused images", "usage", res.UsagePercent,
		"high", m.o.HighThresholdPercent, "low", m.o.LowThresholdPercent, "toFree", res.Needed)
	keep, err := m.protected()
	if err != nil {
		return res, m.fail(ReasonImageGCFailed, fmt.Errorf("image garbage collection: %w", err))
	}
	res.Freed, res.Removed, err = m.freeImages(ctx, res.Needed, now, inUse, keep)
	if len(res.Removed) > 0 {
		m.emit(event.Normal, ReasonFreedDiskSpace, fmt.Sprintf("image file system at %d%% (high threshold %d%%): removed %d unused image(s), %s, freeing %s",
			res.UsagePercent, m.o.HighThresholdPercent, len(res.Removed), names(res.Removed), bytes(res.Freed)))
	}
	if err != nil {
		return res, m.fail(ReasonImageGCFailed, fmt.Errorf("image garbage collection: %w", err))
	}
	if res.Freed < res.Needed {
		return res, m.fail(ReasonFreeDiskSpaceFailed, fmt.Errorf(
			"image file system at %d%%: freed %s of the %s needed to bring it down to %d%%; the other images are in use, wanted by a pod, preloaded or younger than %s",
			res.UsagePercent, bytes(res.Freed), bytes(res.Needed), m.o.LowThresholdPercent, m.o.MinAge))
	}
	m.settled()
	return res, nil
}

// ReclaimDisk is the eviction manager's node-level reclaim for a disk signal, tried before any pod
// is evicted: exited containers nothing will restart, then unused images regardless of the
// thresholds (still never an image in use, wanted by a pod or preloaded, nor one younger than
// the minimum age). A nodefs signal reclaims images only when the image file system is the same
// file system. It stops once bytesNeeded is freed; for the inode signals, or bytesNeeded <= 0, it
// removes everything it may. Memory and PID signals have nothing to reclaim here (0, nil).
func (m *Manager) ReclaimDisk(ctx context.Context, signal eviction.Signal, bytesNeeded int64) (int64, error) {
	var withImages bool
	switch signal {
	case eviction.SignalImageFsAvailable, eviction.SignalImageFsInodesFree:
		withImages = true
	case eviction.SignalNodeFsAvailable, eviction.SignalNodeFsInodesFree:
		if m.o.NodeFSDir != "" {
			same, err := m.o.SameFS(m.o.ImageFSDir, m.o.NodeFSDir)
			if err != nil {
				// The periodic pass warns about an imageFSDir it cannot read; under pressure this runs
				// every monitoring period.
				m.log.Debug("cannot tell whether images live on the node file system; not removing images for it", "signal", signal, "err", err)
			}
			withImages = same
		}
	default:
		return 0, nil
	}
	needed := bytesNeeded
	if needed <= 0 || strings.HasSuffix(string(signal), ".inodesFree") {
		needed = math.MaxInt64 // an inode count, or no amount: all that may go
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	pods := m.o.Pods()
	freed, ctrs, cerr := m.reclaimContainers(ctx, pods)
	var removed []string
	var ierr error
	if withImages && freed < needed {
		now := m.o.Now()
		var inUse map[string]bool
		var keep map[string]bool
		if inUse, ierr = m.detect(ctx, now); ierr == nil {
			if m.o.Ready != nil {
				if err := m.o.Ready(); err != nil {
					ierr = fmt.Errorf("%w: %v; no image removed", ErrNotReady, err)
				}
			}
		}
		if ierr == nil {
			keep, ierr = m.protected()
		}
		if ierr == nil {
			var n int64
			n, removed, ierr = m.freeImages(ctx, needed-freed, now, inUse, keep)
			freed += n
		}
	}
	if len(removed) > 0 || ctrs > 0 {
		what := []string{}
		if ctrs > 0 {
			what = append(what, fmt.Sprintf("%d exited container(s)", ctrs))
		}
		if len(removed) > 0 {
			what = append(what, fmt.Sprintf("%d unused image(s), %s", len(removed), names(removed)))
		}
		m.emit(event.Normal, ReasonFreedDiskSpace, fmt.Sprintf("reclaiming disk for %s: removed %s, freeing %s", signal, strings.Join(what, " and "), bytes(freed)))
	}
	if err := errors.Join(cerr, ierr); err != nil {
		return freed, fmt.Errorf("reclaim disk for %s: %w", signal, err)
	}
	return freed, nil
}

// detect lists images and containers, records new images, notes which are in use now and forgets
// images that are gone. It returns the names of the images in use. m.mu held.
func (m *Manager) detect(ctx context.Context, now time.Time) (map[string]bool, error) {
	imgs, err := m.rt.ListImages(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	uses, err := m.rt.ContainerImages(ctx)
	if err != nil {
		return nil, err
	}
	usedNames, usedDigests := map[string]bool{}, map[string]bool{}
	for _, u := range uses {
		usedNames[u.Name] = true
		if u.Digest != "" {
			usedDigests[u.Digest] = true
		}
	}
	inUse := map[string]bool{}
	seen := make(map[string]bool, len(imgs))
	for _, img := range imgs {
		seen[img.Name] = true
		r := m.records[img.Name]
		if r == nil || r.digest != img.Digest {
			// New, or the name now holds other content (a new pull of the tag): a new image.
			r = &record{digest: img.Digest, firstDetected: now}
			m.records[img.Name] = r
		}
		r.size = img.Size
		if usedNames[img.Name] || usedDigests[img.Digest] {
			r.lastUsed = now
			inUse[img.Name] = true
		}
	}
	for name := range m.records {
		if !seen[name] {
			delete(m.records, name)
		}
	}
	return inUse, nil
}

// protected returns the images no collection may remove whatever their use: those the desired
// pods name and those the preload dir's archives hold. m.mu held.
func (m *Manager) protected() (map[string]bool, error) {
	keep := map[string]bool{}
	for _, p := range m.o.Pods() {
		for _, c := range podspec.EveryContainer(&p.Spec) {
			if n, err := ctrd.NormalizeImage(c.Image); err == nil {
				keep[n] = true
			}
		}
	}
	names, err := m.preloadNames()
	for _, n := range names {
		keep[n] = true
	}
	return keep, err
}

// preloadNames reads the image names the preload dir's archives declare, re-reading an archive only
// when its size or modification time changed: a gzipped archive must be decompressed to the end to
// be read, which on an SD card is slow. An archive that cannot be read keeps the names it had; one
// never read is an error, because its images cannot be told from unused ones. m.mu held.
func (m *Manager) preloadNames() ([]string, error) {
	if m.o.PreloadDir == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(m.o.PreloadDir)
	if errors.Is(err, os.ErrNotExist) {
		m.archives = map[string]archiveRecord{}
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("image preload dir (imagePreloadDir) %s: %w", m.o.PreloadDir, err)
	}
	var names []string
	var errs []error
	present := map[string]bool{}
	for _, e := range entries {
		if e.IsDir() || !(strings.HasSuffix(e.Name(), ".tar") || strings.HasSuffix(e.Name(), ".tar.gz")) {
			continue
		}
		path := filepath.Join(m.o.PreloadDir, e.Name())
		present[path] = true
		old, known := m.archives[path]
		fi, err := e.Info()
		if err == nil && known && fi.Size() == old.size && fi.ModTime().Equal(old.mtime) {
			names = append(names, old.names...)
			continue
		}
		var got []string
		if err == nil {
			got, err = ctrd.ArchiveImageNames(path)
		}
		switch {
		case err == nil:
			m.archives[path] = archiveRecord{size: fi.Size(), mtime: fi.ModTime(), names: got}
			names = append(names, got...)
		case known:
			m.log.Warn("preload archive unreadable; keeping the images it held before", "archive", path, "err", err)
			names = append(names, old.names...)
		default:
			errs = append(errs, fmt.Errorf("preload archive %s: %w", path, err))
		}
	}
	for path := range m.archives {
		if !present[path] {
			delete(m.archives, path)
		}
	}
	if len(errs) > 0 {
		return names, fmt.Errorf("cannot tell which images the preload dir holds, so none is removed: %w", errors.Join(errs...))
	}
	return names, nil
}

// freeImages removes images that may go, least recently used first, until the bytes they held reach
// needed. An image never used counts as used when it was first seen: kubelet puts every never-used
// image first, but on an edge node an image is often imported ahead of the pod that will use it
// (an update staged for a maintenance window), and it should not go before one that last ran a
// month ago. m.mu held.
func (m *Manager) freeImages(ctx context.Context, needed int64, now time.Time, inUse, keep map[string]bool) (int64, []string, error) {
	type candidate struct {
		name string
		rec  *record
	}
	var order []candidate
	for name, r := range m.records {
		order = append(order, candidate{name, r})
	}
	slices.SortFunc(order, func(a, b candidate) int {
		return cmp.Or(a.rec.recency().Compare(b.rec.recency()), a.rec.firstDetected.Compare(b.rec.firstDetected), strings.Compare(a.name, b.name))
	})
	var freed int64
	var removed []string
	var errs []error
	for _, c := range order {
		if freed >= needed || ctx.Err() != nil {
			break
		}
		switch {
		case inUse[c.name], keep[c.name]:
			continue
		case now.Sub(c.rec.firstDetected) < m.o.MinAge:
			continue
		}
		n, err := m.rt.RemoveImage(ctx, c.name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		delete(m.records, c.name)
		freed += n
		removed = append(removed, c.name)
		m.log.Info("removed unused image", "image", c.name, "freed", n, "lastUsed", c.rec.lastUsed, "firstSeen", c.rec.firstDetected)
	}
	return freed, removed, errors.Join(errs...)
}

// reclaimContainers removes exited containers of desired pods that nothing will start again: older
// attempts of a container and containers the pod's spec no longer names. The newest attempt of
// each container stays, as kubelet keeps one dead container per container by default: its worker
// reads from it how the container ended (an init container that succeeded is not run again).
// The pod worker removes such leftovers itself whenever it syncs a running pod; a pod held Failed
// by the node is not synced that way, and a removal that failed leaves one behind. Containers of
// pods nobody wants are the agent's relist's to remove (with their sandbox). m.mu held.
func (m *Manager) reclaimContainers(ctx context.Context, pods []v1.Pod) (int64, int, error) {
	if len(pods) == 0 {
		return 0, 0, nil
	}
	ctrs, err := m.rt.ListContainers(ctx, "")
	if err != nil {
		return 0, 0, fmt.Errorf("list containers: %w", err)
	}
	byPod := map[string][]ctrd.Container{}
	for _, c := range ctrs {
		byPod[c.PodUID] = append(byPod[c.PodUID], c)
	}
	var freed int64
	var n int
	var errs []error
	for i := range pods {
		p := &pods[i]
		cs := byPod[string(p.UID)]
		if len(cs) == 0 {
			continue
		}
		named := map[string]bool{}
		for _, c := range podspec.EveryContainer(&p.Spec) {
			named[c.Name] = true
		}
		newest := map[string]ctrd.Container{}
		for _, c := range cs {
			if o, ok := newest[c.Name]; !ok || c.RestartCount > o.RestartCount {
				newest[c.Name] = c
			}
		}
		for _, c := range cs {
			if c.State != ctrd.StateExited || (named[c.Name] && newest[c.Name].ID == c.ID) {
				continue
			}
			b, err := m.rt.RemoveExitedContainer(ctx, c.ID)
			if err != nil {
				errs = append(errs, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err))
				continue
			}
			freed += b
			n++
			m.log.Info("removed exited container", "pod", p.Namespace+"/"+p.Name, "container", c.Name, "id", c.ID, "freed", b)
		}
	}
	return freed, n, errors.Join(errs...)
}

// Failure is the error of a failed pass, with the reason of the Warning event it was reported as.
type Failure struct {
	Reason string // ReasonImageGCFailed, ReasonFreeDiskSpaceFailed or ReasonInvalidDiskCapacity
	Err    error
}

func (f *Failure) Error() string { return f.Err.Error() }
func (f *Failure) Unwrap() error { return f.Err }

// fail reports a failed pass: a Warning event the first time this reason comes up in a row (a full
// disk that stays full must not send the same warning every period over a metered link), and the
// error, which Run logs every time. m.mu held.
func (m *Manager) fail(reason string, err error) error {
	if m.warned != reason {
		m.warned = reason
		m.emit(event.Warning, reason, err.Error())
	}
	return &Failure{Reason: reason, Err: err}
}

// settled notes a pass that ended well, so the next failure is reported again. m.mu held.
func (m *Manager) settled() { m.warned = "" }

func (m *Manager) emit(typ event.Type, reason, msg string) {
	if m.o.Events == nil {
		return
	}
	m.o.Events.Emit(event.Event{Time: m.o.Now(), Type: typ, Reason: reason, Message: msg,
		Object: event.NodeObject(m.o.NodeName)})
}

// names lists images for an event message, the first few by name.
func names(ns []string) string {
	const shown = 5
	if len(ns) <= shown {
		return strings.Join(ns, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(ns[:shown], ", "), len(ns)-shown)
}

// bytes prints a byte count for people.
func bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for v := n / unit; v >= unit && exp < 5; v /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
