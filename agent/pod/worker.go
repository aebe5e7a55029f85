package pod

import (
	"context"
	"errors"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/agent/podspec"
	"github.com/mqlet/mqlet/agent/probe"
	"github.com/mqlet/mqlet/core/event"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/qos"
	"github.com/mqlet/mqlet/core/source"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Runtime is what a worker needs from the container runtime.
type Runtime interface {
	ListContainers(ctx context.Context, podUID string) ([]ctrd.Container, error)
	// EnsureSandbox sets up what the pod's containers share (ctrd.Runtime.EnsureSandbox).
	EnsureSandbox(ctx context.Context, pod *v1.Pod) (*ctrd.Sandbox, error)
	StartContainer(ctx context.Context, pod *v1.Pod, sb *ctrd.Sandbox, c *v1.Container, restarts int) (ctrd.Container, error)
	StopContainer(ctx context.Context, id string, grace time.Duration) error
	RemoveContainer(ctx context.Context, id string) error
	// RemoveSandbox removes the sandbox by UID alone if need be; missing parts are fine.
	RemoveSandbox(ctx context.Context, ref ctrd.PodRef) error
}

// Kubelet's restart back-off: 10 s doubling to 5 min, forgotten after a container ran 10 min.
const (
	backoffInitial = 10 * time.Second
	backoffMax     = 5 * time.Minute
	backoffReset   = 10 * time.Minute
	relistRetry    = time.Second
)

// Env is what the agent hands every worker.
type Env struct {
	Runtime Runtime
	Log     *slog.Logger
	HostIP  func() string // the node's address now (it may change: DHCP after boot)
	// OnStatus receives every status the worker computes that differs from the last one, with the
	// version of the pod it was computed for (an update may have come since); calls come in order.
	OnStatus func(d Desired, st v1.PodStatus)
	// OnGone is called once the pod's containers and files are gone after Delete, with the newest
	// version the worker was handed (it may have come while the pod was terminating).
	OnGone func(d Desired)
	// Emit reports what happened to the pod (an OOM kill, a liveness failure) as an event; nil
	// drops them. It must not block (the agent's Reporter queues).
	Emit func(e event.Event)
	// OnSync, when set, is told how long each sync (or teardown attempt) took: the metrics' sync
	// latency. It must be cheap: it runs on the worker's goroutine.
	OnSync func(took time.Duration)
	// Prober runs probes and lifecycle hooks; the node shares one. nil: the worker makes its own.
	Prober *probe.Prober
}

// Desired is one version of the desired pod as the agent hands it to its worker: the spec, the source
// it came from and the source's generation of it. Its fields are store.DesiredPod's, so the agent
// converts one into the other. The worker holds the newest version it was handed and gives back,
// with each status, the version that status was computed for: what the node reports as observed is
// what it acted on, with no list of versions kept beside the worker.
type Desired struct {
	Pod        *v1.Pod
	Source     source.Ref
	Generation int64
}

// record is what the worker remembers about one container name across attempts: containerd forgets
// an attempt once we delete it, but its exit stays visible as lastState.
type record struct {
	startedAt   time.Time
	startedID   string
	last        *v1.ContainerStateTerminated
	failure     *ctrd.StartError
	crashes     int // consecutive quick exits, for back-off
	retryAt     time.Time
	oomIDs      map[string]bool
	oomChecked  string                       // attempt whose cgroup OOM counters were read (checkOOM)
	oomReported string                       // attempt whose OOM kill was emitted as an event (reportOOM)
	terminated  *v1.ContainerStateTerminated // final state when the policy says no restart
	attempt     int                          // restart count of the latest attempt started or tried
}

// Worker owns one pod: only its goroutine touches containerd for that pod, so one pod's slow pull or
// long grace period never holds up another.
type Worker struct {
	env   Env
	nudge chan struct{}

	mu      sync.Mutex
	desired Desired // the newest version handed to the worker
	life    State   // the lifecycle (lifecycle.go); changed by transition only, in apply
	// stopping is closed when the worker leaves Syncing: it cuts short a postStart hook in progress.
	stopping chan struct{}
	status   v1.PodStatus
	ooms     []string
	objects  bool // a ConfigMap or Secret the pod uses changed (ObjectsChanged); true at first for a restarted agent

	seen string // ctrd.Fingerprint of what the last sync left behind; guarded by mu

	recs      map[string]*record // loop-owned
	mutations int                // loop-owned: containers started or removed, to know when to look again
	syncs     atomic.Int64       // completed syncs, for tests that wait for one

	sb         *ctrd.Sandbox // loop-owned: the pod's sandbox, set up for sbPod
	sbPod      *v1.Pod       // loop-owned: the spec sb was set up for; a new spec sets it up again
	sbFailures int           // loop-owned: consecutive failed set-ups, for back-off
	sbErr      string        // loop-owned: why the last set-up failed, shown while the pod waits

	active Desired // loop-owned: the version the sync under way works on, which its statuses report

	// removeGrace is the grace period the removal under way stops the containers with (0 before
	// it began), and cancelRemove ends that pass, when an update shortens the grace (kubelet
	// cancels the kill in progress and kills again with the shorter one). Guarded by mu.
	removeGrace  time.Duration
	cancelRemove context.CancelFunc

	// done is loop-owned: the pod ran to its end (finished, sidecars.go), so its sidecars stop and
	// are not restarted. Set at the start of each sync.
	done bool

	// alloc is the cpu and memory the node set aside for each container (resize.go): the loop runs
	// the desired pod with these. allocGen counts its changes and pending is the PodResizePending
	// condition of a resize the agent could not allocate. Guarded by mu.
	alloc    allocation
	allocGen int
	pending  *v1.PodCondition
	// eff caches the pod the loop syncs (effective); resizeErrs holds, by container name, why its
	// last in-place resize failed. Loop-owned.
	eff struct {
		src *v1.Pod
		gen int
		pod *v1.Pod
	}
	resizeErrs map[string]string

	exitMsgs map[string]exitMessage // loop-owned: container name -> termination message of its last exit
	probes   *probe.Set             // the pod's probes, for the span of Run (probes.go)
	hooks    []containerHook        // the container hooks, for the span of Run (container_hooks.go)
}

// NewWorker starts nothing; call Run. prev is the status stored before an agent restart, if any,
// so start times and last states survive the restart.
func NewWorker(d Desired, prev *v1.PodStatus, env Env) *Worker {
	pod := d.Pod
	w := &Worker{env: env, nudge: make(chan struct{}, 1), desired: d, active: d, recs: map[string]*record{}, objects: true, stopping: make(chan struct{}),
		alloc: allocationOf(pod)} // the pod was admitted with what it asks for
	if env.Log == nil {
		w.env.Log = slog.Default()
	}
	if env.Prober == nil {
		w.env.Prober = probe.NewProber()
	}
	w.env.Log = w.env.Log.With("pod", pod.Namespace+"/"+pod.Name)
	if pod.DeletionTimestamp != nil {
		// The control plane is deleting the pod (docs/protocol.md section 4.3): nothing of it
		// starts, and what an earlier agent started stops with the API's grace period.
		w.settle(input{op: opDelete})
	}
	if prev != nil {
		if f := restoredFailure(prev); f != nil {
			w.settle(input{op: opFail, failure: f}) // the first sync kills what may still run
		}
		w.restoreAllocation(pod, prev) // resize.go
		w.status = *prev.DeepCopy()
		for _, cs := range podspec.AllStatuses(prev) {
			r := w.rec(cs.Name)
			if cs.State.Running != nil {
				r.startedAt = cs.State.Running.StartedAt.Time
				r.startedID = ctrd.TrimStatusContainerID(cs.ContainerID)
			}
			if cs.State.Terminated != nil {
				r.startedAt = cs.State.Terminated.StartedAt.Time
				r.startedID = ctrd.TrimStatusContainerID(cs.ContainerID)
				// A container that finished for good stays finished across an agent restart or
				// a reboot (a one-shot job must not run again).
				r.terminated = cs.State.Terminated.DeepCopy()
			}
			r.last = cs.LastTerminationState.Terminated
			r.attempt = int(cs.RestartCount)
		}
	}
	return w
}

func (w *Worker) rec(name string) *record {
	r, ok := w.recs[name]
	if !ok {
		r = &record{oomIDs: map[string]bool{}}
		w.recs[name] = r
	}
	return r
}

// startTime is when attempt cur started: the time the worker saw it start, or its creation time
// for an attempt it did not start (an agent restart).
func (r *record) startTime(cur *ctrd.Container) time.Time {
	if r.startedID != cur.ID || r.startedAt.IsZero() {
		return cur.CreatedAt
	}
	return r.startedAt
}

// Update hands the worker a new version of its pod. A worker that is stopping the pod keeps it (its
// grace period applies, its source and generation are what a status reports) but starts nothing of it.
// A version with a deletionTimestamp is the control plane deleting the pod: the worker removes it
// with the grace period that version carries (removalGrace), and a removal under way whose grace it
// shortens is cut short and started again with the shorter one.
func (w *Worker) Update(d Desired) {
	w.mu.Lock()
	if w.applyLocked(input{op: opUpdate}) {
		w.desired = d
		w.objects = true // downwardAPI volumes show labels and annotations, which an update may change
		if d.Pod.DeletionTimestamp != nil {
			if !w.life.Removing {
				w.applyLocked(input{op: opDelete})
			}
			if w.cancelRemove != nil && removalGrace(d.Pod, w.removeGrace) < w.removeGrace {
				w.cancelRemove()
			}
		}
	}
	w.mu.Unlock()
	w.Nudge()
}

// Delete asks the worker to stop the pod gracefully and remove it.
func (w *Worker) Delete() {
	w.apply(input{op: opDelete})
}

// apply feeds in to the lifecycle and nudges the worker to act on the new state. It reports whether
// the state took the input.
func (w *Worker) apply(in input) bool {
	w.mu.Lock()
	ok := w.applyLocked(in)
	w.mu.Unlock()
	w.Nudge()
	return ok
}

// settle feeds the lifecycle an input from the worker itself (the outcome of its own sync, a verdict
// restored at construction): unlike apply, it asks for no sync, since the loop acts on the new
// state when it next runs anyway.
func (w *Worker) settle(in input) {
	w.mu.Lock()
	w.applyLocked(in)
	w.mu.Unlock()
}

// applyLocked is apply with w.mu held, without the nudge. A refused input changes nothing; it is
// logged for the record, since every caller may legitimately race one (a verdict on a pod that is
// being removed).
func (w *Worker) applyLocked(in input) bool {
	next, err := transition(w.life, in, time.Now())
	if err != nil {
		w.env.Log.Debug("lifecycle", "err", err)
		return false
	}
	if w.life.Phase == Syncing && next.Phase != Syncing {
		close(w.stopping)
	}
	if next.Phase != w.life.Phase {
		w.env.Log.Debug("lifecycle", "from", w.life.Phase, "to", next.Phase, "on", in.op)
	}
	w.life = next
	return true
}

// State returns the worker's lifecycle record.
func (w *Worker) State() State {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.life
	if s.Failure != nil {
		f := *s.Failure
		s.Failure = &f
	}
	return s
}

// Nudge asks for a sync soon; nudges while one is pending fold into it.
func (w *Worker) Nudge() {
	select {
	case w.nudge <- struct{}{}:
	default:
	}
}

// OOM records that a container of this pod hit its memory limit, so its exit reads OOMKilled.
func (w *Worker) OOM(containerID string) {
	w.mu.Lock()
	w.ooms = append(w.ooms, containerID)
	w.mu.Unlock()
	w.Nudge()
}

// Seen is the fingerprint (ctrd.Fingerprint) of the containers the last sync left behind. The
// relist compares it with what containerd shows and nudges only workers whose view is stale.
func (w *Worker) Seen() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen
}

// Pod returns the desired pod with its latest status.
func (w *Worker) Pod() v1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := *w.desired.Pod.DeepCopy()
	p.Status = *w.status.DeepCopy()
	if w.life.Removing && p.DeletionTimestamp == nil { // removed by its source, not deleted in an API
		at := w.life.RemovalAt
		p.DeletionTimestamp = &at
	}
	return p
}

// Run syncs on every nudge and on its own timers until the pod is deleted or ctx ends. Ending by
// ctx (agent shutdown) leaves containers running, as kubelet does.
func (w *Worker) Run(ctx context.Context) {
	defer w.startProbes(ctx)()
	w.hooks = containerHooks(w.env.Prober, w.probes, w.report)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.nudge:
		case <-timer.C:
		}
		w.mu.Lock()
		d, life, ooms, objects, alloc, allocGen := w.desired, w.life, w.ooms, w.objects, w.alloc, w.allocGen
		w.ooms, w.objects = nil, false
		w.mu.Unlock()
		w.active = d
		pod := w.effective(d.Pod, alloc, allocGen) // with the resources allocated to it (resize.go)
		todo := life.work()
		if objects && todo == syncPod {
			w.objectsChanged(ctx, pod)
		}
		for _, id := range ooms {
			for _, r := range w.recs {
				r.oomIDs[id] = true
			}
		}
		start := time.Now()
		var next time.Duration
		switch todo {
		case noWork:
			return
		case removePod:
			gone := w.terminate(ctx, pod)
			w.synced(start)
			if gone {
				return
			}
			timer.Reset(relistRetry)
			continue
		case killPod:
			var stopped bool
			if next, stopped = w.syncFailed(ctx, pod, life.Failure, true); stopped {
				w.settle(input{op: opStopped})
			}
		case terminatedPod:
			next, _ = w.syncFailed(ctx, pod, life.Failure, false)
		case syncPod:
			next = w.activeDeadline(pod, w.sync(ctx, pod))
		}
		w.synced(start)
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		if next > 0 {
			timer.Reset(next)
		}
	}
}

// synced reports a sync that began at start to Env.OnSync.
func (w *Worker) synced(start time.Time) {
	if w.env.OnSync != nil {
		w.env.OnSync(time.Since(start))
	}
}

// grace is the pod's termination grace period, raised to kubelet's minimum.
func grace(pod *v1.Pod) time.Duration { return max(ctrd.PodGrace(pod), MinGrace) }

// terminate tears the pod down (Teardown) with the removal's grace period (removalGrace). It
// reports whether the pod's containers are gone; sandbox leftovers are only warned about, as a
// later sweep removes them. An update that shortens the grace cuts the pass short (Update): the
// next pass stops what still runs with the shorter grace.
func (w *Worker) terminate(ctx context.Context, pod *v1.Pod) bool {
	ctrs, err := w.env.Runtime.ListContainers(ctx, string(pod.UID))
	if err != nil {
		w.env.Log.Error("terminate: list containers", "err", err)
		return false
	}
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w.mu.Lock()
	// The newest version, not the one this sync began with: a shorter grace may have come since.
	g := removalGrace(w.desired.Pod, w.removeGrace)
	w.removeGrace, w.cancelRemove = g, cancel
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.cancelRemove = nil
		w.mu.Unlock()
	}()
	w.killing(pod, ctrs...)
	w.probes.Sync(nil) // a pod on its way out is probed no more
	if err := Teardown(tctx, w.withOrderedStop(pod, ctrs...), ctrd.RefOf(pod), ctrs, &g, w.env.Log); err != nil {
		if !errors.Is(err, ErrSandboxLeft) {
			if tctx.Err() != nil && ctx.Err() == nil {
				w.env.Log.Info("grace period shortened; stopping the pod again with the shorter one", "was", g)
				return false
			}
			w.env.Log.Error("terminate", "err", err)
			return false
		}
		w.env.Log.Warn("remove pod sandbox", "err", err)
	}
	w.env.Log.Info("pod removed")
	w.settle(input{op: opRemoved})
	if w.env.OnGone != nil {
		w.mu.Lock()
		newest := w.desired
		w.mu.Unlock()
		w.env.OnGone(newest)
	}
	return true
}

// ensureSandbox sets up the pod's sandbox once per pod instance (and again for a new spec, whose
// volumes or hostname may differ). When the sandbox had to be made anew for a pod that ran before
// (its namespaces went with a reboot), the pod starts over as kubelet's does: what its init
// containers set up went with the old sandbox. It returns the containers left afterwards.
func (w *Worker) ensureSandbox(ctx context.Context, pod *v1.Pod, observed []ctrd.Container) ([]ctrd.Container, error) {
	if w.sb != nil && w.sbPod == pod {
		return observed, nil
	}
	sb, err := w.env.Runtime.EnsureSandbox(ctx, pod)
	if err != nil {
		w.sbFailures++
		return observed, err
	}
	w.sb, w.sbPod, w.sbFailures, w.sbErr = sb, pod, 0, ""
	for _, wn := range sb.Warnings { // kubelet's DNS warnings (MissingClusterDNS...)
		w.emit(pod, event.Warning, wn.Reason, wn.Message)
	}
	if !sb.Created || !w.ranBefore(observed) || !w.restartsWithNewSandbox(pod) {
		return observed, nil
	}
	w.env.Log.Info("pod sandbox was recreated (reboot or lost namespaces); starting its containers again from the first init container")
	// Restart counts keep growing across the new sandbox.
	bumped := map[string]bool{}
	for i := range observed {
		c := &observed[i]
		r := w.rec(c.Name)
		r.attempt, bumped[c.Name] = max(r.attempt, c.RestartCount+1), true
		w.stopAndRemove(ctx, pod, c)
	}
	for name, r := range w.recs {
		if !bumped[name] && (r.startedID != "" || r.terminated != nil) {
			r.attempt++
		}
		if isInit(pod, name) {
			r.terminated, r.crashes, r.retryAt, r.failure = nil, 0, time.Time{}, nil
		}
		if podspec.Ephemeral(&pod.Spec, name) != nil {
			ranOnce(r, time.Now()) // ephemeral.go: it went with the old sandbox and does not run again
		}
	}
	return w.env.Runtime.ListContainers(ctx, string(pod.UID))
}

// ranBefore reports whether any container of the pod ran (or was made) before this sandbox.
func (w *Worker) ranBefore(observed []ctrd.Container) bool {
	if len(observed) > 0 {
		return true
	}
	for _, r := range w.recs {
		if r.startedID != "" || r.terminated != nil {
			return true
		}
	}
	return false
}

// restartsWithNewSandbox is kubelet's rule for a pod that ran before: a Never pod gets no new run
// (what ran is reported as it ended), nor does an OnFailure pod whose app containers all succeeded.
func (w *Worker) restartsWithNewSandbox(pod *v1.Pod) bool {
	switch pod.Spec.RestartPolicy {
	case v1.RestartPolicyNever:
		return false
	case v1.RestartPolicyOnFailure:
		for _, c := range pod.Spec.Containers {
			if t := w.rec(c.Name).terminated; t == nil || t.ExitCode != 0 {
				return true
			}
		}
		return false
	}
	return true
}

// sync moves the pod one step towards its spec and publishes the resulting status. It returns when
// it wants to run again (0: only on a nudge).
func (w *Worker) sync(ctx context.Context, pod *v1.Pod) time.Duration {
	mutationsBefore := w.mutations
	observed, err := w.env.Runtime.ListContainers(ctx, string(pod.UID))
	if err != nil {
		w.env.Log.Error("list containers", "err", err)
		return relistRetry
	}
	if observed, err = w.ensureSandbox(ctx, pod, observed); err != nil {
		w.env.Log.Error("pod sandbox", "err", err)
		return w.sandboxFailed(ctx, pod, observed, err)
	}
	wanted := map[string]bool{}
	for _, c := range podspec.EveryContainer(&pod.Spec) {
		wanted[c.Name] = true
	}
	// Keep only the newest attempt of each container; older ones and containers the spec no longer
	// names are removed (stopped first, with the pod's grace period).
	newest := map[string]*ctrd.Container{}
	stuck := map[string]bool{} // names with an older attempt that may still run: start nothing for them
	sort.Slice(observed, func(i, j int) bool { return observed[i].RestartCount > observed[j].RestartCount })
	for i := range observed {
		c := &observed[i]
		if _, dup := newest[c.Name]; dup || !wanted[c.Name] {
			if !w.stopAndRemove(ctx, pod, c) {
				stuck[c.Name] = true
			}
			continue
		}
		newest[c.Name] = c
	}

	now := time.Now()
	var next time.Duration
	want := func(d time.Duration) {
		if d > 0 && (next == 0 || d < next) {
			next = d
		}
	}
	reconcile := func(c *v1.Container, cur *ctrd.Container) time.Duration {
		if stuck[c.Name] {
			return relistRetry
		}
		return w.reconcile(ctx, pod, c, cur, now)
	}
	w.done = w.finished(pod)
	stoppedSidecars := w.done && w.stopSidecars(ctx, pod, newest) // sidecars.go
	initialized := w.appsRan(pod, newest)
	initDone := true
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		cur := newest[c.Name]
		r := w.rec(c.Name)
		if podspec.IsSidecar(c) {
			if w.done {
				// Stopped for good: record its exit (seen stale as running when it was stopped
				// in this sync) and start nothing.
				if !stoppedSidecars && cur != nil && cur.State != ctrd.StateRunning {
					want(reconcile(c, cur))
				}
				continue
			}
			want(reconcile(c, cur))
			// The next init container waits until this one is started; once the app containers
			// have run, a sidecar that restarts holds nothing up.
			if initialized || w.sidecarStarted(c, cur) {
				continue
			}
			initDone = false
			break
		}
		finished := cur != nil && r.terminatedAt(cur) && r.terminated.ExitCode == 0 // after a reboot
		if cur != nil && (cur.State == ctrd.StateExited && cur.ExitCode == 0 || finished) {
			continue
		}
		initDone = false
		want(reconcile(c, cur))
		break
	}
	if initDone {
		for i := range pod.Spec.Containers {
			c := &pod.Spec.Containers[i]
			want(reconcile(c, newest[c.Name]))
		}
	}
	// Whether or not the init containers are done, as kubelet starts them (ephemeral.go).
	want(w.syncEphemeral(pod, newest, stoppedSidecars, reconcile))
	if !w.done && w.finished(pod) {
		// The app containers finished for good, or a regular init container failed for good:
		// the next sync stops the sidecars.
		w.Nudge()
	}
	// Observe again after acting, so the published status is what containerd now has.
	if w.mutations != mutationsBefore {
		if after, err := w.env.Runtime.ListContainers(ctx, string(pod.UID)); err == nil {
			observed, newest = after, newestAttempts(after)
		}
	}
	w.finishSync(pod, observed, newest, now)
	return next
}

// newestAttempts maps each container name to its attempt with the highest restart count.
func newestAttempts(observed []ctrd.Container) map[string]*ctrd.Container {
	newest := map[string]*ctrd.Container{}
	for i := range observed {
		c := &observed[i]
		if o := newest[c.Name]; o == nil || c.RestartCount > o.RestartCount {
			newest[c.Name] = c
		}
	}
	return newest
}

// finishSync records what the sync left behind (for the relist's staleness check) and publishes
// the resulting status.
func (w *Worker) finishSync(pod *v1.Pod, observed []ctrd.Container, newest map[string]*ctrd.Container, now time.Time) {
	w.mu.Lock()
	w.seen = ctrd.Fingerprint(observed)
	w.mu.Unlock()
	w.syncProbes(pod, newest)
	w.publish(pod, newest, now)
	w.syncs.Add(1)
}

// stopAndRemove stops and removes one attempt. It reports whether the attempt is known to be no
// longer running; when it is not, nothing may replace it yet, or two instances would run at once.
// A failed remove leaves a stopped record, which the next sync removes as an older attempt.
func (w *Worker) stopAndRemove(ctx context.Context, pod *v1.Pod, c *ctrd.Container) bool {
	w.killing(pod, *c)
	w.mutations++
	if err := w.withPreStop(pod, *c).StopContainer(ctx, c.ID, grace(pod)); err != nil {
		w.env.Log.Error("stop container; not starting its replacement until it is stopped", "container", c.ID, "err", err)
		return false
	}
	if err := w.env.Runtime.RemoveContainer(ctx, c.ID); err != nil {
		w.env.Log.Error("remove container", "container", c.ID, "err", err)
	}
	return true
}

// noteExit remembers how an attempt ended, in Kubernetes' terms.
func (w *Worker) noteExit(name string, cur *ctrd.Container) *v1.ContainerStateTerminated {
	r := w.rec(name)
	reason := "Completed"
	if cur.ExitCode != 0 {
		reason = "Error"
	}
	if r.oomIDs[cur.ID] {
		reason = ReasonOOMKilled
	}
	started := r.startTime(cur)
	t := &v1.ContainerStateTerminated{
		ExitCode: cur.ExitCode, Reason: reason, ContainerID: ctrd.StatusContainerID(cur.ID),
		StartedAt: metav1.NewTime(started), FinishedAt: metav1.NewTime(cur.ExitedAt),
	}
	if cur.ExitCode > 128 && cur.ExitCode < 160 {
		t.Signal = cur.ExitCode - 128
	}
	w.addExitMessage(t, name, cur) // termination.go
	return t
}

func shouldRestart(policy v1.RestartPolicy, exit int32) bool {
	switch policy {
	case v1.RestartPolicyNever:
		return false
	case v1.RestartPolicyOnFailure:
		return exit != 0
	}
	return true
}

// leftState reports whether a start that failed with this reason got as far as creating something
// in containerd under the attempt's id (ctrd.StartError's reasons).
func leftState(reason string) bool {
	return reason == "CreateContainerError" || reason == "RunContainerError"
}

// reconcile brings one container towards its spec and returns when to look again.
func (w *Worker) reconcile(ctx context.Context, pod *v1.Pod, c *v1.Container, cur *ctrd.Container, now time.Time) time.Duration {
	r := w.rec(c.Name)
	var next time.Duration
	attempt := r.attempt // nothing in containerd: retry the attempt that failed to start, if any
	if r.failure != nil && leftState(r.failure.Reason) {
		// The failed try got as far as containerd, which may keep state under its container id
		// that the clean-up could not remove (a shim's bundle dir after containerd was killed
		// mid-start: "failed to start shim: ... file exists" on every retry). The next try is a
		// new attempt, with a new id, as kubelet counts a container that failed to start.
		attempt = r.attempt + 1
	}
	if cur != nil {
		attempt = cur.RestartCount + 1
		// An ephemeral container is never replaced: the API lets no field of it change, and one
		// from another source that changed still ran once (ephemeral.go).
		changed := podspec.Ephemeral(&pod.Spec, c.Name) == nil && !ctrspec.SpecHashMatches(cur.Hash, pod, c)
		switch {
		case changed && w.tookResize(ctx, pod, c, cur, &next): // resize.go
			return next
		case changed:
			w.env.Log.Info("container spec changed; recreating", "container", c.Name)
			if !w.stopAndRemove(ctx, pod, cur) {
				return relistRetry
			}
			r.crashes, r.retryAt, r.failure = 0, time.Time{}, nil
		case cur.State == ctrd.StateRunning:
			delete(w.resizeErrs, c.Name) // it runs with its allocation
			if killed, next := w.killUnhealthy(ctx, pod, c, cur); killed {
				return next
			}
			w.reportOOM(pod, c, cur)
			r.failure, r.terminated = nil, nil
			if r.startedID != cur.ID {
				r.startedID, r.startedAt = cur.ID, cur.CreatedAt // adopted from an earlier agent
			}
			return 0
		case cur.State == ctrd.StateExited:
			w.checkOOM(ctx, c.Name, cur)
			w.reportOOM(pod, c, cur)
			t := w.noteExit(c.Name, cur)
			if !shouldRestart(w.policyFor(pod, c), cur.ExitCode) {
				r.terminated = t
				return 0
			}
			if !r.terminatedAt(cur) {
				// First look at this exit: decide the back-off.
				ran := t.FinishedAt.Sub(t.StartedAt.Time)
				if ran >= backoffReset {
					r.crashes = 0
				}
				r.retryAt = cur.ExitedAt.Add(backoffDelay(r.crashes))
				r.crashes++
				r.terminated = t
			}
			if wait := r.retryAt.Sub(now); wait > 0 {
				r.last = t
				w.waitingToRetry(pod, c, r)
				return wait
			}
			r.last = t
			if !w.stopAndRemove(ctx, pod, cur) {
				return relistRetry
			}
		default: // created but never started, or its task vanished (containerd restart, reboot)
			if r.startedID == cur.ID {
				if r.terminatedAt(cur) && !shouldRestart(w.policyFor(pod, c), r.terminated.ExitCode) {
					return 0 // it had finished for good before the restart
				}
				if w.policyFor(pod, c) == v1.RestartPolicyNever {
					// It ran, and its end went unseen: kubelet reports such a container as
					// terminated with an unknown status rather than running it again.
					r.terminated = &v1.ContainerStateTerminated{ExitCode: 137, Reason: "ContainerStatusUnknown",
						Message:     "The container could not be located when the pod was restarted",
						ContainerID: ctrd.StatusContainerID(cur.ID), StartedAt: metav1.NewTime(r.startedAt), FinishedAt: metav1.NewTime(now)}
					return 0
				}
			}
			if !w.stopAndRemove(ctx, pod, cur) {
				return relistRetry
			}
		}
	} else if r.failure != nil && now.Before(r.retryAt) {
		w.waitingToRetry(pod, c, r)
		return r.retryAt.Sub(now)
	} else if r.terminated != nil && !shouldRestart(w.policyFor(pod, c), r.terminated.ExitCode) {
		return 0 // finished for good, and its container record is gone: nothing to run again
	}

	if !w.syncing() {
		return 0 // the pod is being stopped: don't start what the next sync would stop at once
	}
	r.attempt = attempt
	started, err := w.env.Runtime.StartContainer(w.notifying(ctx, pod, c), withNodeStatus(pod, w.hostIP(), w.podIPs()), w.sb, c, attempt)
	if err != nil {
		var se *ctrd.StartError
		if !errors.As(err, &se) {
			se = &ctrd.StartError{Reason: "RunContainerError", Err: err}
		}
		r.crashes++
		r.failure = se
		r.retryAt = now.Add(backoffDelay(r.crashes))
		w.startFailed(pod, c, se)
		w.env.Log.Warn("container failed to start", "container", c.Name, "reason", se.Reason, "err", se.Err)
		w.reportMountFailure(pod, se)
		if se.Reason == "ErrImagePull" {
			// Look again shortly so the status turns to ImagePullBackOff while it waits, as kubelet's does.
			return min(r.retryAt.Sub(now), time.Second+10*time.Millisecond)
		}
		return r.retryAt.Sub(now)
	}
	w.mutations++
	r.failure, r.terminated, r.retryAt = nil, nil, time.Time{}
	// The start time is the container record's creation time, which containerd keeps: an agent
	// killed before this status was stored finds the same time when it adopts the container.
	r.startedID, r.startedAt = started.ID, started.CreatedAt
	w.env.Log.Info("container started", "container", c.Name, "id", started.ID, "restarts", attempt)
	w.postStart(ctx, pod, c, started)
	if podspec.IsSidecar(c) {
		w.Nudge() // the next sync sees it running: started, or waiting for its startup probe
	}
	return 0
}

// emit sends an event about this pod, if anyone listens.
func (w *Worker) emit(pod *v1.Pod, typ event.Type, reason, message string) {
	if w.env.Emit == nil {
		return
	}
	w.env.Emit(event.Event{Time: time.Now(), Type: typ, Reason: reason, Message: message,
		Object: event.PodObject(pod)})
}

func (w *Worker) hostIP() string {
	if w.env.HostIP == nil {
		return ""
	}
	return w.env.HostIP()
}

// syncing reports whether the worker is still in Syncing: once the node stops the pod, nothing of
// it starts.
func (w *Worker) syncing() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.life.Phase == Syncing
}

// withNodeStatus fills the status fields that env fieldRefs (status.hostIP, status.podIP) read,
// on a copy: the desired pod carries no status.
func withNodeStatus(pod *v1.Pod, hostIP string, podIPs []string) *v1.Pod {
	p := *pod
	p.Status.HostIP = hostIP
	p.Status.HostIPs = nil
	if hostIP != "" {
		p.Status.HostIPs = []v1.HostIP{{IP: hostIP}}
	}
	if pod.Spec.HostNetwork {
		podIPs = []string{hostIP}
	}
	p.Status.PodIPs = nil
	for _, ip := range podIPs {
		p.Status.PodIPs = append(p.Status.PodIPs, v1.PodIP{IP: ip})
	}
	if len(podIPs) > 0 {
		p.Status.PodIP = podIPs[0]
	}
	return &p
}

// terminatedAt reports whether the recorded terminal state already describes this attempt.
func (r *record) terminatedAt(cur *ctrd.Container) bool {
	return r.terminated != nil && r.terminated.ContainerID == ctrd.StatusContainerID(cur.ID)
}

func backoffDelay(crashes int) time.Duration {
	if crashes <= 0 {
		return 0
	}
	d := backoffInitial
	for i := 1; i < crashes && d < backoffMax; i++ {
		d *= 2
	}
	return min(d, backoffMax)
}

// publish computes the pod status from what containerd shows and hands it on when it changed.
func (w *Worker) publish(pod *v1.Pod, newest map[string]*ctrd.Container, now time.Time) {
	init := make([]v1.ContainerStatus, 0, len(pod.Spec.InitContainers))
	for i := range pod.Spec.InitContainers {
		cs := w.containerStatus(pod, &pod.Spec.InitContainers[i], newest[pod.Spec.InitContainers[i].Name], now)
		// An init container that succeeded is ready, as kubelet reports it (and the conformance
		// suite checks). A sidecar is ready by its readiness probe, like an app container.
		if t := cs.State.Terminated; t != nil && t.ExitCode == 0 && !podspec.IsSidecar(&pod.Spec.InitContainers[i]) {
			cs.Ready = true
		}
		init = append(init, cs)
	}
	ctrs := make([]v1.ContainerStatus, 0, len(pod.Spec.Containers))
	for i := range pod.Spec.Containers {
		ctrs = append(ctrs, w.containerStatus(pod, &pod.Spec.Containers[i], newest[pod.Spec.Containers[i].Name], now))
	}
	eph := w.ephemeralStatuses(pod, newest, now) // ephemeral.go: in neither the phase nor the conditions

	w.mu.Lock()
	prev, failure := w.status, w.life.Failure
	w.mu.Unlock()
	if failure != nil {
		// Containers that never ran have nothing to report in a pod the node failed (kubelet
		// reports a pod rejected at admission with no container statuses at all).
		init, ctrs, eph = withoutWaiting(init), withoutWaiting(ctrs), withoutWaiting(eph)
	}
	st := v1.PodStatus{
		Phase:                 Phase(&pod.Spec, init, ctrs),
		HostIP:                w.hostIP(),
		InitContainerStatuses: init,
		ContainerStatuses:     ctrs,
		QOSClass:              qos.Class(&pod.Spec),
		StartTime:             prev.StartTime,
	}
	if st.HostIP != "" {
		st.HostIPs = []v1.HostIP{{IP: st.HostIP}}
	}
	if pod.Spec.HostNetwork && st.HostIP != "" {
		st.PodIP, st.PodIPs = st.HostIP, []v1.PodIP{{IP: st.HostIP}}
	}
	w.setPodIPs(&st)
	if st.StartTime == nil {
		t := metav1.NewTime(now)
		st.StartTime = &t
	}
	if failure != nil {
		st.Phase, st.Reason, st.Message = v1.PodFailed, failure.Reason, failure.Message
	}
	st.Conditions = Conditions(&pod.Spec, st.Phase, init, ctrs, prev.Conditions, metav1.NewTime(now))
	if failure == nil && st.Phase != v1.PodSucceeded && st.Phase != v1.PodFailed {
		st.Conditions = append(st.Conditions, w.resizeConditions(pod, newest, prev.Conditions, metav1.NewTime(now))...)
	}
	if len(init) == 0 {
		st.InitContainerStatuses = nil
	}
	if len(eph) > 0 {
		st.EphemeralContainerStatuses = eph
	}
	// The generation the worker runs: a spec update that changes nothing else (tolerations, an
	// active deadline) is news too, as kubelet's status.observedGeneration.
	st.ObservedGeneration = pod.Generation
	if equalStatus(&prev, &st) {
		return
	}
	w.mu.Lock()
	w.status = st
	w.mu.Unlock()
	if w.env.OnStatus != nil {
		w.env.OnStatus(w.active, st)
	}
}

// equalStatus compares by value: container states are pointers, so printing them would compare
// addresses and every sync would look like a change.
func equalStatus(a, b *v1.PodStatus) bool {
	return a.Phase == b.Phase && a.Reason == b.Reason && a.Message == b.Message && a.PodIP == b.PodIP && a.HostIP == b.HostIP &&
		a.ObservedGeneration == b.ObservedGeneration &&
		condStates(a.Conditions) == condStates(b.Conditions) &&
		equality.Semantic.DeepEqual(a.ContainerStatuses, b.ContainerStatuses) &&
		equality.Semantic.DeepEqual(a.InitContainerStatuses, b.InitContainerStatuses) &&
		equality.Semantic.DeepEqual(a.EphemeralContainerStatuses, b.EphemeralContainerStatuses)
}

func condStates(cs []v1.PodCondition) string {
	s := ""
	for _, c := range cs {
		s += string(c.Type) + "=" + string(c.Status) + c.Reason + "/" + c.Message + ";"
	}
	return s
}

func (w *Worker) containerStatus(pod *v1.Pod, c *v1.Container, cur *ctrd.Container, now time.Time) v1.ContainerStatus {
	r := w.rec(c.Name)
	cs := v1.ContainerStatus{Name: c.Name, Image: c.Image}
	if r.last != nil {
		cs.LastTerminationState.Terminated = r.last
	}
	f := false
	cs.Started = &f
	cs.RestartCount = int32(r.attempt)
	if cur != nil {
		cs.ContainerID = ctrd.StatusContainerID(cur.ID)
		cs.RestartCount = int32(cur.RestartCount)
		cs.ImageID = cur.ImageID
		cs.Resources, cs.AllocatedResources = appliedResources(c, cur)
		switch cur.State {
		case ctrd.StateRunning:
			started := r.startTime(cur)
			cs.Started, cs.Ready = w.probeStatus(c, cur.ID)
			cs.State.Running = &v1.ContainerStateRunning{StartedAt: metav1.NewTime(started)}
			return cs
		case ctrd.StateExited:
			t := w.noteExit(c.Name, cur)
			if shouldRestart(w.policyFor(pod, c), cur.ExitCode) && now.Before(r.retryAt) {
				cs.LastTerminationState.Terminated = t
				cs.State.Waiting = &v1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
					Message: backoffMessage(r.retryAt.Sub(cur.ExitedAt).Round(time.Second), pod, c.Name)}
				return cs
			}
			cs.State.Terminated = t
			return cs
		}
	}
	if r.failure != nil {
		reason := r.failure.Reason
		// kubelet shows ErrImagePull when a pull fails and ImagePullBackOff while it waits to retry.
		if reason == "ErrImagePull" && now.After(r.retryAt.Add(-backoffDelay(r.crashes)+time.Second)) {
			reason = "ImagePullBackOff"
		}
		cs.State.Waiting = &v1.ContainerStateWaiting{Reason: reason, Message: r.failure.Err.Error()}
		return cs
	}
	if r.terminated != nil && (cur == nil || r.terminatedAt(cur)) {
		cs.State.Terminated = r.terminated
		return cs
	}
	// kubelet's default waiting reason: PodInitializing for every container (init ones included)
	// of a pod that has init containers, ContainerCreating otherwise.
	reason := "ContainerCreating"
	if len(pod.Spec.InitContainers) > 0 {
		reason = "PodInitializing"
	}
	cs.State.Waiting = &v1.ContainerStateWaiting{Reason: reason, Message: w.sbErr}
	return cs
}

// appliedResources is a container's status.resources and allocatedResources, as kubelet reports
// them: the requests and limits the container runs with (what its labels record it was made or
// last resized with: ctrd.LabelResources), and the requests the node set aside for it (c is the
// container of the pod with its allocated resources). A container without the label (made by an
// older mqlet) was made from a spec with c's resources: the spec hash covers them.
func appliedResources(c *v1.Container, cur *ctrd.Container) (*v1.ResourceRequirements, v1.ResourceList) {
	var alloc v1.ResourceList
	if len(c.Resources.Requests) > 0 {
		alloc = c.Resources.Requests.DeepCopy()
	}
	actual := c.Resources
	if cur != nil {
		if rec, ok := cur.RecordedResources(); ok {
			actual = rec
		}
	}
	// Never nil, as kubelet reports a container the runtime has (a BestEffort one: {}); the
	// conformance suite's resize specs dereference it.
	r := &v1.ResourceRequirements{}
	if len(actual.Limits) > 0 {
		r.Limits = actual.Limits.DeepCopy()
	}
	if len(actual.Requests) > 0 {
		r.Requests = actual.Requests.DeepCopy()
	}
	return r, alloc
}

// withoutWaiting drops the statuses of containers that are waiting and never ran.
func withoutWaiting(in []v1.ContainerStatus) []v1.ContainerStatus {
	out := in[:0:0]
	for _, cs := range in {
		if cs.State.Waiting != nil && cs.LastTerminationState.Terminated == nil {
			continue
		}
		out = append(out, cs)
	}
	return out
}

func isInit(pod *v1.Pod, name string) bool {
	for _, c := range pod.Spec.InitContainers {
		if c.Name == name {
			return true
		}
	}
	return false
}
