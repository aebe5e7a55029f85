// Package agent is the kubelet core of mqlet: it takes desired pods from its sources, admits them,
// records them in the store before acting, and runs one pod worker per pod against containerd.
// Data flows one way: sources -> admission -> store -> workers -> containerd; containerd events
// and relists -> status -> store.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/pod"
	"github.com/mqlet/mqlet/agent/podspec"
	"github.com/mqlet/mqlet/agent/probe"
	"github.com/mqlet/mqlet/agent/sysctl"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/core/execio"
	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
)

// Runtime is what the agent needs from the container runtime: the workers' part plus events,
// image preload and the leftovers sweep. *ctrd.Runtime implements it; unit tests fake it.
type Runtime interface {
	pod.Runtime
	Events(ctx context.Context, fn func(ctrd.Event)) error
	ImportArchiveIfMissing(ctx context.Context, path string) ([]string, error)
	LogPath(pod *v1.Pod, name string, restarts int) string
	ListSandboxes() ([]ctrd.PodRef, error)
}

// Reporter receives what the node reports to a control plane. Calls must not block (the MQTT uplink
// queues them): they come from pod workers and from the path that applies desired state, which a
// link that is down must not stall. The agent never calls it with a lock held.
type Reporter interface {
	// PodStatus is the latest status of a desired pod (called on every status change the worker
	// reports). d is the version of the pod the status was computed for, so d.Generation is the
	// generation the node has observed; calls for one pod come in order.
	PodStatus(d store.DesiredPod, st v1.PodStatus)
	// PodGone says the pod and its containers are gone from the node (deleted and torn down). d is
	// the last version the node had. A pod deleted and re-added while it was terminating is not
	// gone: its new worker reports its status instead. A pod whose containers are found and removed
	// with no record of it (deleted while the agent was down and the store lost) is reported with
	// a zero d.Source and a d.Pod that carries only namespace, name and UID.
	PodGone(d store.DesiredPod)
	event.Sink
}

// nopReporter is the standalone node's Reporter: there is no one to report to.
type nopReporter struct{}

func (nopReporter) PodStatus(store.DesiredPod, v1.PodStatus) {}
func (nopReporter) PodGone(store.DesiredPod)                 {}
func (nopReporter) Emit(event.Event)                         {}

// OneShot is a source that can also be read once, for --once.
type OneShot interface {
	Once() (source.Change, error)
}

// Options are the parts of the configuration the core needs.
type Options struct {
	NodeName     string
	PreloadDir   string
	RelistPeriod time.Duration
	// SweepPeriod is how often leftovers (pod dirs, mounts, logs, cgroups, status records of pods
	// nobody wants and no container belongs to) are looked for. Default 1 minute.
	SweepPeriod time.Duration
	// HostIP reads the node's address; nil means no address (unit tests).
	HostIP func() string
	Log    *slog.Logger
	// TrimMemory hands freed memory back to the OS once the node goes quiet after activity
	// (see trimAfterQuiet). Off when the operator tunes the Go runtime with GOGC/GOMEMLIMIT.
	TrimMemory bool
	// Report receives pod statuses, deletions and events for a control plane; nil for a standalone
	// node (nothing is reported).
	Report Reporter
	// MQTTPolicy limits what pods from the MQTT source may ask of the node (admission.Policy).
	MQTTPolicy admission.Policy
	// Sysctls pods may set (admission.Admitter.Sysctls); nil: kubelet's safe set alone.
	Sysctls *sysctl.Allowlist
	// OnSync, when set, is told how long each pod worker sync took (pod.Env.OnSync): metrics.
	OnSync func(took time.Duration)
	// Allocatable is what the node offers pods (capacity minus reservations and hard eviction
	// thresholds, devices included), read when new pods are admitted; nil: no fit check.
	Allocatable func() v1.ResourceList
	// Pressure returns the node's pressure conditions that are true now (MemoryPressure,
	// DiskPressure, PIDPressure), read when new pods are admitted; nil: never under pressure.
	Pressure func() []v1.NodeConditionType
	// Node is the node as last computed (its labels and taints), read when new pods are admitted
	// for nodeSelector, required node affinity and NoExecute taints; nil: not checked.
	Node func() *v1.Node
	// OnShutdownChange is called when a node shutdown begins or is called off, once ShuttingDown
	// says so, without waiting for the pods: the node status pushes its Ready=False "node is
	// shutting down" at once rather than at its next period, which may come after the power is
	// gone (kubelet's shutdown manager also updates the node status first). nil: nothing.
	OnShutdownChange func()
	// Started, when set, is called once Run has restored the stored pods and started their
	// workers (before any source is read): the service manager's READY.
	Started func()
	// Heartbeat, when set, is called by the agent's main loop (the relist loop) each time it goes
	// round: after every relist, and every HeartbeatPeriod while it waits for the next, each time
	// after taking and releasing the lock that event routing and the API need. A loop stuck in a
	// relist or on that lock stops calling it, so a service manager's watchdog fed from it
	// (systemd's WatchdogSec) restarts a hung agent, not one that is merely idle.
	Heartbeat       func()
	HeartbeatPeriod time.Duration
}

// quietBeforeTrim is how long nothing must change before the agent returns freed memory to the
// OS. A burst of pod starts allocates several MiB that the Go runtime would otherwise keep for
// minutes; on a device with a few hundred MiB, that matters more than the one extra collection.
const quietBeforeTrim = 2 * time.Second

// Agent runs pods. Create it with New, then Run (or RunOnce), once.
type Agent struct {
	opts    Options
	rt      Runtime
	st      store.State
	sources []source.Source
	admit   admission.Admitter
	log     *slog.Logger
	report  Reporter

	// applyMu serialises changes to the desired set, store writes included. Event routing, the
	// API and the workers never take it, so a slow fsync delays only the next source change.
	applyMu sync.Mutex

	// mu guards the maps below. It is never held across I/O (store, containerd, files).
	mu      sync.Mutex
	workers map[types.UID]*pod.Worker
	// byPrefix maps ctrd.ContainerIDPrefix of each worker's pod UID to the UID, so a
	// containerd event finds its pod without hashing every UID.
	byPrefix map[string]types.UID
	desired  map[types.UID]store.DesiredPod
	// rejected holds, per source, what it or admission refused, keyed by where it came from. It is
	// also what tells a new rejection (an event) from one a resync repeats (silence).
	rejected map[source.Kind]map[string]rejection
	synced   map[source.Kind]bool // the source delivered its first full set
	// cleaning holds pods whose leftovers are being torn down, closed when done: relists don't
	// start a second teardown, and a pod re-added meanwhile (same stable UID, so the same
	// container ids) waits for it instead of having its new containers stopped.
	cleaning map[types.UID]chan struct{}
	// refusedNext holds admission's verdict for a pod re-added while its worker was being deleted,
	// for the worker that replaces it (nil: admitted). Made on first use.
	refusedNext map[types.UID]*pod.Failure

	runCtx context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup
	relist chan struct{} // asks the relist loop for a relist now

	// relisted: a relist has completed, either way; runtimeErr is the last one's failure (nil
	// after a good one). Ready reads both: they are the runtime's health, as kubelet's runtime
	// state is.
	relisted   atomic.Bool
	runtimeErr atomic.Pointer[error]
	hostIP     atomic.Pointer[string]

	shuttingDown atomic.Bool // see ShutdownPods

	trimMu sync.Mutex
	trim   *time.Timer

	prober *probe.Prober // shared by every pod's probes and hooks (one HTTP transport)

	// unstored is why the last change of a source could not be written to the store, per source
	// kind, until a later change of that source is stored; guarded by mu. The source retries
	// (see source.Result.Err); meanwhile Ready reports it.
	unstored map[source.Kind]error
}

// New wires an agent from an open store, a connected runtime and its sources; it owns none of them.
func New(opts Options, rt Runtime, st store.State, sources ...source.Source) *Agent {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.RelistPeriod == 0 {
		opts.RelistPeriod = 10 * time.Second
	}
	if opts.SweepPeriod == 0 {
		opts.SweepPeriod = time.Minute
	}
	report := opts.Report
	if report == nil {
		report = nopReporter{}
	}
	return &Agent{
		opts: opts, rt: rt, st: st, sources: sources, log: opts.Log, report: report,
		admit:    admission.Admitter{NodeName: opts.NodeName, MQTTPolicy: opts.MQTTPolicy, Sysctls: opts.Sysctls},
		workers:  map[types.UID]*pod.Worker{},
		byPrefix: map[string]types.UID{},
		desired:  map[types.UID]store.DesiredPod{},
		rejected: map[source.Kind]map[string]rejection{},
		synced:   map[source.Kind]bool{},
		cleaning: map[types.UID]chan struct{}{},
		unstored: map[source.Kind]error{},
		relist:   make(chan struct{}, 1),
		prober:   probe.NewProber(),
	}
}

// Run restores pods from the store, then follows the sources and containerd until ctx ends or a
// source fails. On return every goroutine the agent started has ended; pods keep running, as with
// kubelet: stopping the agent is not stopping the workload.
func (a *Agent) Run(ctx context.Context) error {
	defer a.shutdown()
	if err := a.start(ctx); err != nil {
		return err
	}
	if a.opts.Started != nil {
		a.opts.Started()
	}
	a.wg.Add(2)
	go func() { defer a.wg.Done(); a.followEvents(a.runCtx) }()
	go func() { defer a.wg.Done(); a.relistLoop(a.runCtx) }()

	errc := make(chan error, len(a.sources))
	for _, s := range a.sources {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			err := s.Run(a.runCtx, func(c source.Change) source.Result { return a.Apply(s.Kind(), c) })
			if err != nil && a.runCtx.Err() == nil {
				// Without its source the agent would silently ignore changes; exit so that
				// the service manager restarts it. Pods keep running meanwhile.
				errc <- fmt.Errorf("source %s: %w", s.Kind(), err)
			}
		}()
	}
	select {
	case <-a.runCtx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

// shutdown stops and waits for every goroutine the agent started, and the trim timer.
func (a *Agent) shutdown() {
	if a.stop != nil {
		a.stop()
	}
	a.wg.Wait()
	a.trimMu.Lock()
	if a.trim != nil {
		a.trim.Stop()
	}
	a.trimMu.Unlock()
}

// start restores workers for every desired pod in the store before any source is read, so a node
// that boots with no network and an unreadable manifest dir still runs what it ran before. It
// removes nothing: orphans are only judged once every source has delivered its full set.
func (a *Agent) start(ctx context.Context) error {
	a.runCtx, a.stop = context.WithCancel(ctx)
	for _, n := range a.st.Notices() {
		a.log.Warn("state store", "notice", n)
	}
	a.preload(a.runCtx)
	pods, bad, err := a.st.ListDesired()
	if err != nil {
		return err
	}
	for _, e := range bad {
		a.log.Error("state store: skipping an unreadable desired pod; its source will deliver it again", "err", e)
	}
	statuses, bad, err := a.st.ListStatus()
	if err != nil {
		return err
	}
	for _, e := range bad {
		a.log.Warn("state store: skipping an unreadable pod status", "err", e)
	}
	a.restoreWorkers(pods, statuses)
	a.log.Info("restored pods from the store", "pods", len(pods))
	return nil
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

// startWorker must be called with a.mu held. A pod refused at admission gets its verdict before its
// worker runs, so nothing of it starts.
func (a *Agent) startWorker(d store.DesiredPod, prev *v1.PodStatus, refused *pod.Failure) {
	p := d.Pod
	w := pod.NewWorker(pod.Desired(d), prev, pod.Env{
		Runtime:  a.rt,
		Log:      a.log,
		HostIP:   a.currentHostIP,
		OnStatus: a.onStatus,
		OnGone:   a.onGone,
		Emit:     a.report.Emit,
		OnSync:   a.opts.OnSync,
		Prober:   a.prober,
	})
	if refused != nil {
		w.Refuse(*refused)
	}
	a.workers[p.UID] = w
	a.byPrefix[ctrd.ContainerIDPrefix(string(p.UID))] = p.UID
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

// updateWorkerLocked hands a new version of a desired pod to its running worker (a.mu held). The
// worker holds the version (its source and generation) and hands it back with the statuses computed
// for it: the agent keeps no list of the versions a worker may still report on.
func (a *Agent) updateWorkerLocked(w *pod.Worker, d store.DesiredPod) {
	w.Update(pod.Desired(d))
}

// onStatus stores and reports a status with the version of the pod the worker computed it for, so
// the generation reported as observed is one the node acted on.
func (a *Agent) onStatus(d pod.Desired, st v1.PodStatus) {
	a.activity()
	p := d.Pod
	if err := a.st.PutStatus(p.UID, &st); err != nil {
		a.log.Error("store pod status", "pod", p.Namespace+"/"+p.Name, "err", err)
	}
	a.report.PodStatus(store.DesiredPod(d), st)
}

// onGone forgets a removed pod's worker; last is the newest version the worker had (it may have
// come while the pod was terminating).
func (a *Agent) onGone(last pod.Desired) {
	p := last.Pod
	if err := a.st.DeleteStatus(p.UID); err != nil {
		a.log.Error("delete pod status", "pod", p.Namespace+"/"+p.Name, "err", err)
	}
	a.mu.Lock()
	delete(a.workers, p.UID)
	delete(a.byPrefix, ctrd.ContainerIDPrefix(string(p.UID)))
	// A pod re-added while it was terminating gets a fresh worker from its desired entry, and is
	// not gone: reporting it gone, then running, would make a control plane's view flicker. A
	// desired entry that is itself a deletion (a deletionTimestamp: the control plane waits for
	// this very report to finish it) is not re-added.
	d, again := a.desired[p.UID]
	again = again && d.Pod.DeletionTimestamp == nil
	refused := a.refusedNext[p.UID]
	delete(a.refusedNext, p.UID)
	if again && a.runCtx.Err() == nil {
		a.startWorker(d, nil, refused)
	}
	a.mu.Unlock()
	if !again {
		a.report.PodGone(store.DesiredPod(last))
	}
	if a.resizesPending() {
		a.requestRelist() // the pod's resources are free: the relist retries deferred resizes
	}
}

// resizesPending reports whether a pod's resize is Deferred.
func (a *Agent) resizesPending() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, w := range a.workers {
		if w.ResizePending() == v1.PodReasonDeferred {
			return true
		}
	}
	return false
}

// rejection is a source.Rejection with what its event says.
type rejection struct {
	source.Rejection
	reason string    // the event's reason: event.ReasonRejected, ReasonNameClash, ...
	uid    types.UID // the pod's UID when known
}

// plan is what one source change does to the desired set.
type plan struct {
	put      []store.DesiredPod
	del      []types.UID
	rejected map[string]rejection // replaces the source's list when replace is set
	replace  bool
}

// Apply takes one change from the source of kind k: admits its pods, refuses clashes, writes the
// store, then tells the workers. The store is written first so that what runs is always what the
// store says; no lock that routing or the API needs is held during the write. Rejections that are
// new, or whose reason changed, become events, emitted once the locks are released: a resync that
// repeats the same rejections reports nothing, so an idle link stays idle. The result names the
// pods of the change that were refused, or says the change could not be stored.
func (a *Agent) Apply(k source.Kind, c source.Change) source.Result {
	events, res := a.apply(k, c)
	for _, e := range events {
		a.report.Emit(e)
	}
	return res
}

func (a *Agent) apply(k source.Kind, c source.Change) ([]event.Event, source.Result) {
	a.applyMu.Lock()
	defer a.applyMu.Unlock()

	a.mu.Lock()
	desired := make(map[types.UID]store.DesiredPod, len(a.desired))
	for uid, d := range a.desired {
		desired[uid] = d
	}
	a.mu.Unlock()

	p := a.plan(k, c, desired)
	var res source.Result
	for _, r := range p.rejected {
		a.log.Error("pod rejected", "source", k, "problem", r.Error())
		if r.Key != "" {
			if res.Rejected == nil {
				res.Rejected = map[string]string{}
			}
			res.Rejected[r.Key] = r.Reason
		}
	}
	if len(p.put) > 0 || len(p.del) > 0 {
		if err := a.st.UpdateDesired(p.put, p.del); err != nil {
			// Acting on pods the store does not hold would break restore-after-reboot. The
			// rejections are not recorded either, so the retry reports them as new. The source
			// delivers the change again until it is stored (source.Result.Err).
			a.log.Error("store desired pods; not acting on the change until it is stored", "source", k, "op", c.Op, "err", err)
			return a.unstoredEvents(k, err), source.Result{Err: fmt.Errorf("store desired pods: %w", err)}
		}
	}
	events := a.unstoredEvents(k, nil)
	// Admission reads the node and probes host ports: I/O, so before a.mu is taken.
	verdicts := a.admitNew(p.put, p.del)
	a.judgeResizes(p.put, p.del, verdicts) // resize.go: before the workers get the new versions

	a.mu.Lock()
	defer a.mu.Unlock()
	events = append(events, a.recordRejectionsLocked(k, c, p)...)
	now := time.Now()
	for _, d := range p.put {
		a.desired[d.Pod.UID] = d
		f, judged := verdicts[d.Pod.UID]
		if f != nil {
			events = append(events, refusalEvent(d, f, now))
		}
		events = append(events, fieldWarnings(d, now)...) // admit_fields.go
		if w, ok := a.workers[d.Pod.UID]; ok {
			if judged {
				a.applyVerdictLocked(w, d, f)
			} else {
				a.updateWorkerLocked(w, d)
			}
		} else {
			a.startWorker(d, nil, f)
		}
	}
	for _, uid := range p.del {
		delete(a.desired, uid)
		if w, ok := a.workers[uid]; ok {
			w.Delete()
		}
	}
	if c.Op == source.Resync && !a.synced[k] {
		a.synced[k] = true
		if a.allSynced() {
			a.requestRelist() // orphans can be judged now
		}
	}
	a.activity()
	return events, res
}

// unstoredEvents records whether source k's latest change was stored (err nil) or not, and returns
// the node event for a change of that: a Warning when its changes start failing to be stored, a
// Normal event when one is stored again. Failures in a row (the source's retries) say nothing new.
func (a *Agent) unstoredEvents(k source.Kind, err error) []event.Event {
	a.mu.Lock()
	prev := a.unstored[k]
	if err != nil {
		a.unstored[k] = err
	} else {
		delete(a.unstored, k)
	}
	a.mu.Unlock()
	node := event.NodeObject(a.opts.NodeName)
	switch {
	case err != nil && prev == nil:
		return []event.Event{{Time: time.Now(), Type: event.Warning, Reason: event.ReasonStateWriteFailed, Object: node,
			Message: fmt.Sprintf("a change of the %s pods could not be stored, so it is not acted on yet; "+
				"it is retried until stored, and pods run as before meanwhile: %v", k, err)}}
	case err == nil && prev != nil:
		return []event.Event{{Time: time.Now(), Type: event.Normal, Reason: event.ReasonStateWriteRecovered, Object: node,
			Message: fmt.Sprintf("the changes of the %s pods are stored again and acted on", k)}}
	}
	return nil
}

// recordRejectionsLocked makes the plan's rejections the source's current ones and returns an
// event for each that is new or whose reason changed (a.mu held). A resync replaces the source's
// list; an upsert or delete settles the pods it names, so their old rejections go (a fixed pod
// stops being listed as rejected) before its own are added.
func (a *Agent) recordRejectionsLocked(k source.Kind, c source.Change, p plan) []event.Event {
	prev := a.rejected[k]
	next := map[string]rejection{}
	if !p.replace {
		named := map[string]bool{}
		for _, it := range c.Items {
			if it.Pod != nil {
				named[source.Key(it.Pod)] = true
			}
		}
		for _, key := range c.Keys {
			named[key] = true
		}
		for id, r := range prev {
			if r.Key == "" || !named[r.Key] {
				next[id] = r
			}
		}
	}
	var events []event.Event
	now := time.Now()
	for _, id := range slices.Sorted(maps.Keys(p.rejected)) {
		r := p.rejected[id]
		next[id] = r
		if old, ok := prev[id]; ok && old.Reason == r.Reason && old.reason == r.reason {
			continue
		}
		events = append(events, a.rejectionEvent(r, now))
	}
	a.rejected[k] = next
	return events
}

// rejectionEvent is the Warning a rejection becomes: about the pod when its name is known, else
// about the node (a file that is not a pod at all).
func (a *Agent) rejectionEvent(r rejection, now time.Time) event.Event {
	obj := event.NodeObject(a.opts.NodeName)
	if ns, name, ok := strings.Cut(r.Key, "/"); ok {
		obj = event.Object{Kind: event.KindPod, Namespace: ns, Name: name, UID: r.uid}
	}
	return event.Event{Time: now, Type: event.Warning, Reason: r.reason, Message: r.Reason, Object: obj, Source: r.Ref.String()}
}

// plan computes a change against a copy of the desired set. Pure apart from logging.
func (a *Agent) plan(k source.Kind, c source.Change, desired map[types.UID]store.DesiredPod) plan {
	p := plan{rejected: map[string]rejection{}, replace: c.Op == source.Resync}
	byKey := map[string]types.UID{}
	for uid, d := range desired {
		byKey[source.Key(d.Pod)] = uid
	}
	reject := func(r source.Rejection, reason string, uid types.UID) {
		id := r.Ref.String()
		if r.Key != "" {
			id += " " + r.Key
		}
		p.rejected[id] = rejection{Rejection: r, reason: reason, uid: uid}
	}
	for _, r := range c.Rejections {
		reject(r, event.ReasonRejected, byKey[r.Key])
	}

	if c.Op == source.Delete {
		for _, key := range c.Keys {
			if uid, ok := byKey[key]; ok && desired[uid].Source.Kind == k {
				p.del = append(p.del, uid)
			}
		}
		return p
	}

	// Items that already run as they are go first, so a newcomer that clashes with a running
	// pod is the one refused, whatever the order the source lists them in.
	items := slices.Clone(c.Items)
	incumbent := func(it source.Item) bool {
		if it.Pod == nil {
			return false
		}
		uid, ok := byKey[source.Key(it.Pod)]
		return ok && desired[uid].Source.Kind == k && (it.Pod.UID == "" || it.Pod.UID == uid)
	}
	slices.SortStableFunc(items, func(x, y source.Item) int {
		switch ix, iy := incumbent(x), incumbent(y); {
		case ix && !iy:
			return -1
		case iy && !ix:
			return 1
		}
		return 0
	})

	seen := map[string]bool{}       // keys this change declares (admitted or kept)
	taken := map[types.UID]string{} // UIDs claimed by this change -> key
	for _, it := range items {
		key := ""
		if it.Pod != nil {
			key = source.Key(it.Pod)
		}
		pod, err := a.admit.Admit(it)
		if err != nil {
			reason := event.ReasonRejected
			if _, denied := errors.AsType[*admission.PolicyError](err); denied {
				reason = event.ReasonPolicyDenied
			}
			reject(source.Rejection{Ref: it.Ref, Key: key, Reason: err.Error()}, reason, byKey[key])
			seen[key] = true // what runs under this name stays until the manifest is fixed or removed
			if d, ok := a.deletionOfRunning(it, byKey[key], desired, k); ok {
				p.put = append(p.put, d)
			}
			continue
		}
		uid := pod.UID
		if oldUID, ok := byKey[key]; ok && desired[oldUID].Source.Kind != k {
			reject(source.Rejection{Ref: it.Ref, Key: key,
				Reason: fmt.Sprintf("pod %s is already defined by %s; this one is ignored", key, desired[oldUID].Source)},
				event.ReasonNameClash, uid)
			continue
		}
		if other, ok := taken[uid]; ok {
			reject(source.Rejection{Ref: it.Ref, Key: key,
				Reason: fmt.Sprintf("metadata.uid %s is already used by pod %s; this one is ignored", uid, other)},
				event.ReasonDuplicateUID, uid)
			continue
		}
		if d, ok := desired[uid]; ok && source.Key(d.Pod) != key {
			reject(source.Rejection{Ref: it.Ref, Key: key,
				Reason: fmt.Sprintf("metadata.uid %s is already used by pod %s (%s); this one is ignored", uid, source.Key(d.Pod), d.Source)},
				event.ReasonDuplicateUID, uid)
			continue
		}
		if oldUID, ok := byKey[key]; ok && oldUID != uid {
			// Same name, new UID (an explicit uid was added or changed): the old pod goes, the
			// new one starts, as with a delete and create in Kubernetes.
			p.del = append(p.del, oldUID)
		}
		seen[key] = true
		taken[uid] = key
		d := store.DesiredPod{Pod: pod, Source: it.Ref, Generation: it.Generation}
		if old, ok := desired[uid]; ok {
			if old.Source.Kind == k && old.Generation > it.Generation {
				continue // an older generation replayed: what is stored is newer
			}
			if old.Source == d.Source && old.Generation == d.Generation && sameConfig(old.Pod, pod) {
				continue
			}
		}
		p.put = append(p.put, d)
	}
	if c.Op != source.Resync {
		return p
	}

	// Pods of this source the new set does not name go away, unless their origin cannot be
	// read right now: a half-written file or a flaky SD card must not take a running pod down.
	var keep []string
	for _, r := range c.Rejections {
		if r.Keep {
			keep = append(keep, r.Ref.Origin)
		}
	}
	kept := func(origin string) bool {
		for _, o := range keep {
			if origin == o || strings.HasPrefix(origin, o+string(filepath.Separator)) {
				return true
			}
		}
		return false
	}
	for uid, d := range desired {
		if d.Source.Kind != k || seen[source.Key(d.Pod)] || kept(d.Source.Origin) || slices.Contains(p.del, uid) {
			continue
		}
		p.del = append(p.del, uid)
	}
	slices.Sort(p.del)
	return p
}

// deletionOfRunning is, for an item admission refused that deletes the pod this source runs under
// uid (the API's deletionTimestamp, docs/protocol.md section 4.3), the running version with that
// deletion: the delete applies though the rest of the version does not, or a pod whose last update
// was refused could never be deleted.
func (a *Agent) deletionOfRunning(it source.Item, uid types.UID, desired map[types.UID]store.DesiredPod, k source.Kind) (store.DesiredPod, bool) {
	old, ok := desired[uid]
	if it.Pod == nil || it.Pod.DeletionTimestamp == nil || !ok || old.Source.Kind != k || it.Pod.UID != "" && it.Pod.UID != uid ||
		old.Generation > it.Generation || old.Pod.DeletionTimestamp != nil && removalGraceOf(old.Pod) <= removalGraceOf(it.Pod) {
		return store.DesiredPod{}, false
	}
	p, err := admission.WithDeletion(old.Pod, it.Pod)
	if err != nil {
		a.log.Error("deletion of a pod whose version was refused", "pod", source.Key(it.Pod), "err", err)
		return store.DesiredPod{}, false
	}
	return store.DesiredPod{Pod: p, Source: it.Ref, Generation: it.Generation}, true
}

// removalGraceOf is a deleting pod's deletionGracePeriodSeconds, or its spec's grace; -1 unset.
func removalGraceOf(p *v1.Pod) int64 {
	if g := p.DeletionGracePeriodSeconds; g != nil {
		return *g
	}
	if g := p.Spec.TerminationGracePeriodSeconds; g != nil {
		return *g
	}
	return -1
}

// sameConfig reports whether two versions of a desired pod are the same: by admission's config
// hash when both carry one, else by value (printing the spec would compare pointer addresses).
func sameConfig(a, b *v1.Pod) bool {
	ha, hb := a.Annotations[admission.AnnotationConfigHash], b.Annotations[admission.AnnotationConfigHash]
	if ha != "" && hb != "" {
		return ha == hb
	}
	return equality.Semantic.DeepEqual(a.Spec, b.Spec) && equality.Semantic.DeepEqual(a.ObjectMeta, b.ObjectMeta)
}

// allSynced reports whether every source has delivered its full set; a.mu held.
func (a *Agent) allSynced() bool {
	for _, s := range a.sources {
		if !a.synced[s.Kind()] {
			return false
		}
	}
	return true
}

func (a *Agent) requestRelist() {
	select {
	case a.relist <- struct{}{}:
	default:
	}
}

// activity notes that something changed; freed memory is returned once things have been quiet.
func (a *Agent) activity() {
	if !a.opts.TrimMemory {
		return
	}
	a.trimMu.Lock()
	defer a.trimMu.Unlock()
	if a.runCtx != nil && a.runCtx.Err() != nil {
		return
	}
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
		err := a.rt.Events(ctx, func(e ctrd.Event) {
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

// workerForContainer finds the pod by the container id's UID prefix (see ctrd.ContainerID), so an
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

// relistLoop is the safety net for missed events: every period it nudges stale workers and removes
// containers of pods nobody wants (deleted while the agent was down); every sweep period it also
// removes leftovers that have no container any more.
func (a *Agent) relistLoop(ctx context.Context) {
	t := time.NewTicker(a.opts.RelistPeriod)
	defer t.Stop()
	var beat <-chan time.Time
	if a.opts.Heartbeat != nil && a.opts.HeartbeatPeriod > 0 {
		hb := time.NewTicker(a.opts.HeartbeatPeriod)
		defer hb.Stop()
		beat = hb.C
	}
	lastSweep := time.Time{}
	for {
		// Leftovers are only looked for once every source has spoken: before that nothing may
		// be removed, so reading them would be wasted I/O.
		sweep := time.Since(lastSweep) >= a.opts.SweepPeriod && a.orphansJudged()
		if err := a.Relist(ctx, sweep); err != nil {
			// A failed relist (containerd down) is still a loop that goes round: restarting the
			// agent would not bring containerd back.
			a.log.Warn("relist failed", "err", err)
		} else if sweep {
			lastSweep = time.Now()
		}
		// Deferred resizes are retried here (resize.go); when a source change holds the desired
		// set, again a second later rather than at the next period.
		var retry <-chan time.Time
		if !a.retryResizes() {
			retry = time.After(resizeRetryWait)
		}
		a.heartbeat()
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				break wait
			case <-a.relist:
				break wait
			case <-beat:
				a.heartbeat()
			case <-retry:
				retry = nil
				if !a.retryResizes() {
					retry = time.After(resizeRetryWait)
				}
			}
		}
	}
}

// heartbeat tells Options.Heartbeat that the main loop goes round and that the agent's lock is
// free; it is called from the relist loop only (see Options.Heartbeat).
func (a *Agent) heartbeat() {
	if a.opts.Heartbeat == nil {
		return
	}
	a.mu.Lock()
	//lint:ignore SA2001 an empty critical section on purpose: it proves the lock can be taken
	a.mu.Unlock()
	a.opts.Heartbeat()
}

// shimReaper is the part of *ctrd.Runtime that kills shims left without a container record.
type shimReaper interface {
	ReapStaleShims(ctx context.Context) ([]ctrd.StaleShim, error)
}

// reapStaleShims kills the shims of the agent's namespace whose container has no record (a
// containerd killed mid-start leaves them, ~13 MB each), when the runtime can.
func (a *Agent) reapStaleShims(ctx context.Context) {
	r, ok := a.rt.(shimReaper)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, relistTimeout)
	defer cancel()
	reaped, err := r.ReapStaleShims(ctx)
	for _, s := range reaped {
		a.log.Warn("sweep: killed a containerd shim whose container has no record (containerd stopped in the middle of a start?)",
			"pid", s.Pid, "container", s.ContainerID, "children", s.Children)
	}
	if err != nil {
		a.log.Warn("sweep: reap stale shims", "err", err)
	}
}

func (a *Agent) orphansJudged() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.allSynced()
}

func (a *Agent) currentHostIP() string {
	if ip := a.hostIP.Load(); ip != nil {
		return *ip
	}
	ip := a.readHostIP()
	a.hostIP.Store(&ip)
	return ip
}

func (a *Agent) readHostIP() string {
	if a.opts.HostIP == nil {
		return ""
	}
	return a.opts.HostIP()
}

// The runtime health messages of the Ready condition (kubelet's words).
const (
	MessageRuntimeUnchecked = "container runtime status check may not have completed yet"
	MessageRuntimeDown      = "container runtime is down"
)

// relistTimeout bounds one relist, so a hung containerd shows as "not ready" instead of a stall.
const relistTimeout = 30 * time.Second

// Relist lists every container once, nudges the workers whose last view differs from what
// containerd shows (an event was missed), and, once every source has delivered its full set,
// tears down containers of pods nobody wants; with sweep it also tears down leftovers with no
// container (pod dirs, mounts, logs, cgroups, status records). Listing and teardown happen
// outside a.mu, so a slow containerd never blocks the API or the sources.
func (a *Agent) Relist(ctx context.Context, sweep bool) error {
	lctx, cancel := context.WithTimeout(ctx, relistTimeout)
	ctrs, err := a.rt.ListContainers(lctx, "")
	cancel()
	a.relisted.Store(true)
	if err != nil {
		a.runtimeErr.Store(&err)
		return err
	}
	a.runtimeErr.Store(nil)
	ipChanged := false
	// Keep the last address through a brief link loss rather than publish an empty one.
	if ip := a.readHostIP(); ip != "" && ip != a.currentHostIP() {
		a.hostIP.Store(&ip)
		ipChanged = true
	}
	byPod := map[types.UID][]ctrd.Container{}
	for _, c := range ctrs {
		byPod[types.UID(c.PodUID)] = append(byPod[types.UID(c.PodUID)], c)
	}

	// Leftovers outside containerd are read before taking the lock: files and the store are I/O.
	var leftovers []ctrd.PodRef
	var statusOnly []types.UID
	if sweep {
		a.reapStaleShims(ctx)
		if leftovers, err = a.rt.ListSandboxes(); err != nil {
			a.log.Warn("sweep: list pod leftovers", "err", err)
		}
		statuses, _, err := a.st.ListStatus()
		if err != nil {
			a.log.Warn("sweep: list pod status records", "err", err)
		}
		for uid := range statuses {
			statusOnly = append(statusOnly, uid)
		}
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	for uid, w := range a.workers {
		if ipChanged || ctrd.Fingerprint(byPod[uid]) != w.Seen() {
			w.Nudge()
		}
	}
	if !a.allSynced() {
		// Before every source has spoken, a pod missing from the desired set may just not have
		// been read yet (an empty store after state.db was moved aside): remove nothing.
		return nil
	}
	unwanted := func(uid types.UID) bool {
		_, w := a.workers[uid]
		_, d := a.desired[uid]
		return !w && !d && a.cleaning[uid] == nil
	}
	for uid, cs := range byPod {
		if unwanted(uid) {
			c := cs[0]
			a.teardownLocked(ctrd.PodRef{UID: uid, Namespace: c.PodNamespace, Name: c.PodName}, cs)
		}
	}
	for _, ref := range leftovers {
		if _, running := byPod[ref.UID]; !running && unwanted(ref.UID) {
			a.teardownLocked(ref, nil)
		}
	}
	for _, uid := range statusOnly {
		if _, running := byPod[uid]; !running && unwanted(uid) {
			a.teardownLocked(ctrd.PodRef{UID: uid}, nil)
		}
	}
	return nil
}

// teardownLocked starts the removal of a pod nobody wants (a.mu held): its containers, each with
// the grace period recorded on it, its sandbox and its status record. The work runs outside the lock.
func (a *Agent) teardownLocked(ref ctrd.PodRef, cs []ctrd.Container) {
	done := make(chan struct{})
	a.cleaning[ref.UID] = done
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		name := ref.Namespace + "/" + ref.Name
		if len(cs) > 0 {
			a.log.Info("removing containers of a pod that is no longer desired", "pod", name, "uid", ref.UID, "containers", len(cs))
		} else {
			a.log.Info("removing leftovers of a pod that is no longer desired", "pod", name, "uid", ref.UID)
		}
		err := pod.Teardown(a.runCtx, a.rt, ref, cs, nil, a.log)
		if err != nil {
			a.log.Warn("teardown of an unwanted pod; retrying at the next relist", "pod", name, "uid", ref.UID, "err", err)
		} else {
			if err := a.st.DeleteStatus(ref.UID); err != nil {
				a.log.Warn("delete status of an unwanted pod", "pod", name, "uid", ref.UID, "err", err)
			}
			// Containers of a pod nobody knows were deleted while the agent was down: a
			// control plane may still show it. Leftovers without containers were reported
			// gone by their worker already (or never ran), so they are not reported again.
			if len(cs) > 0 && ref.Name != "" {
				gone := &v1.Pod{}
				gone.Namespace, gone.Name, gone.UID = ref.Namespace, ref.Name, ref.UID
				a.report.PodGone(store.DesiredPod{Pod: gone})
			}
		}
		a.mu.Lock()
		delete(a.cleaning, ref.UID)
		a.mu.Unlock()
		close(done)
	}()
}

// Fail stops the pod uid for good with the node's verdict (eviction, node shutdown; see
// pod.Failure). It reports whether the pod has a worker to fail.
func (a *Agent) Fail(uid types.UID, f pod.Failure) bool {
	a.mu.Lock()
	w := a.workers[uid]
	a.mu.Unlock()
	if w == nil {
		return false
	}
	w.Fail(f)
	return true
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

// Desired returns the desired pods with their sources, sorted by UID (the eviction manager tells
// manifest-dir pods from the others by it). The pods are shared: callers must not change them.
func (a *Agent) Desired() []store.DesiredPod {
	a.mu.Lock()
	out := slices.Collect(maps.Values(a.desired))
	a.mu.Unlock()
	slices.SortFunc(out, func(x, y store.DesiredPod) int { return strings.Compare(string(x.Pod.UID), string(y.Pod.UID)) })
	return out
}

// Rejected returns what the sources or admission refused, with the reason (api.Provider).
func (a *Agent) Rejected() []source.Rejection {
	a.mu.Lock()
	var out []source.Rejection
	for _, rs := range a.rejected {
		for _, r := range rs {
			out = append(out, r.Rejection)
		}
	}
	a.mu.Unlock()
	slices.SortFunc(out, func(x, y source.Rejection) int {
		if c := strings.Compare(x.Ref.String(), y.Ref.String()); c != 0 {
			return c
		}
		return strings.Compare(x.Key, y.Key)
	})
	return out
}

// Ready is nil once every source has been read, the latest change of each is stored, and
// containerd answers (api.Provider); otherwise it says which of these is wrong.
//
// The runtime's health is the last relist's: before the first one Ready says so, and while
// containerd fails to list containers Ready is false with kubelet's "container runtime is down"
// and containerd's error.
func (a *Agent) Ready() error {
	a.mu.Lock()
	var waiting []string
	for _, s := range a.sources {
		if !a.synced[s.Kind()] {
			waiting = append(waiting, string(s.Kind()))
		}
	}
	var unstored []string
	for _, k := range slices.Sorted(maps.Keys(a.unstored)) {
		unstored = append(unstored, fmt.Sprintf("%s: %v", k, a.unstored[k]))
	}
	a.mu.Unlock()
	switch {
	case len(waiting) > 0:
		return fmt.Errorf("sources not read yet: %s", strings.Join(waiting, ", "))
	case len(unstored) > 0:
		// A change the node cannot store is not acted on: what runs is not what the sources say.
		return fmt.Errorf("source changes not stored, retrying (%s)", strings.Join(unstored, "; "))
	case !a.relisted.Load():
		return errors.New(MessageRuntimeUnchecked)
	}
	if err := a.runtimeErr.Load(); err != nil {
		// kubelet's "container runtime is down", with what containerd answered (the socket it
		// dialled, a timeout), so the operator sees which runtime and why.
		return fmt.Errorf("%s: containerd: %v", MessageRuntimeDown, *err)
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
	for _, c := range podspec.EveryContainer(&p.Spec) {
		names = append(names, c.Name)
	}
	if container == "" {
		if len(p.Spec.Containers) != 1 || len(p.Spec.InitContainers) != 0 {
			return "", fmt.Errorf("a container name must be specified for pod %s, choose one of: %v", name, names)
		}
		container = p.Spec.Containers[0].Name
	}
	for _, cs := range podspec.AllStatuses(&p.Status) {
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

// execRuntime is the part of the runtime an interactive exec needs; *ctrd.Runtime has it (an
// optional interface, so the unit tests' fake runtimes need not).
type execRuntime interface {
	ExecStream(ctx context.Context, id string, cmd []string, s execio.Streams) (int, error)
}

// ExecTarget finds the containerd id of a running container of a pod, for an exec (api.ExecProvider),
// with kubectl's rules: an omitted container is the pod's first.
func (a *Agent) ExecTarget(namespace, name, container string) (string, error) {
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
	if container == "" {
		if len(p.Spec.Containers) == 0 {
			return "", fmt.Errorf("pod %s/%s has no containers", namespace, name)
		}
		container = p.Spec.Containers[0].Name
	}
	var names []string
	for _, c := range podspec.EveryContainer(&p.Spec) {
		names = append(names, c.Name)
	}
	if !slices.Contains(names, container) {
		return "", fmt.Errorf("container %s is not valid for pod %s/%s, choose one of: %v", container, namespace, name, names)
	}
	for _, cs := range podspec.AllStatuses(&p.Status) {
		if cs.Name != container {
			continue
		}
		id, ok := strings.CutPrefix(cs.ContainerID, "containerd://")
		if cs.State.Running == nil || !ok || id == "" {
			return "", fmt.Errorf("container %q in pod %s/%s is not running", container, namespace, name)
		}
		return id, nil
	}
	return "", fmt.Errorf("container %q in pod %s/%s has not started yet", container, namespace, name)
}

// ExecStream runs cmd in the container with id (from ExecTarget) with its stdio on s, until it
// ends or ctx does (api.ExecProvider).
func (a *Agent) ExecStream(ctx context.Context, id string, cmd []string, s execio.Streams) (int, error) {
	rt, ok := a.rt.(execRuntime)
	if !ok {
		return -1, errors.New("this agent's runtime cannot exec")
	}
	return rt.ExecStream(ctx, id, cmd, s)
}

// AttachStream joins the process of container id (ExecTarget's) with s: kubectl attach over MQTT.
func (a *Agent) AttachStream(ctx context.Context, id string, s execio.Streams) (int, error) {
	rt, ok := a.rt.(interface {
		AttachStream(ctx context.Context, id string, s execio.Streams) (int, error)
	})
	if !ok {
		return -1, errors.New("this agent's runtime cannot attach")
	}
	return rt.AttachStream(ctx, id, s)
}

// DialPod connects to port on the pod's 127.0.0.1, from inside its network namespace (the one of
// its running container; the host's for a hostNetwork pod), for `mqlet ctl port-forward`.
func (a *Agent) DialPod(ctx context.Context, namespace, name string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d is not a TCP port", port)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var p *v1.Pod
	for _, q := range a.Pods() {
		if q.Namespace == namespace && q.Name == name {
			p = &q
			break
		}
	}
	if p == nil {
		return nil, fmt.Errorf("pod %s/%s not found", namespace, name)
	}
	if p.Spec.HostNetwork {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	rt, ok := a.rt.(interface {
		TaskPid(ctx context.Context, id string) (uint32, error)
	})
	if !ok {
		return nil, errors.New("this agent's runtime cannot reach a pod's network")
	}
	for _, cs := range podspec.AllStatuses(&p.Status) {
		id, ok := strings.CutPrefix(cs.ContainerID, "containerd://")
		if cs.State.Running == nil || !ok {
			continue
		}
		pid, err := rt.TaskPid(ctx, id)
		if err != nil || pid == 0 {
			continue
		}
		c, err := a.prober.DialInPod(ctx, fmt.Sprintf("/proc/%d/ns/net", pid), addr)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", namespace, name, err)
		}
		return c, nil
	}
	return nil, fmt.Errorf("pod %s/%s has no running container, so no network to forward into", namespace, name)
}
