package eviction

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/core/event"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
)

// Reason is the reason an evicted pod's status and its event carry (kubelet's).
const Reason = "Evicted"

// ReasonThresholdMet is the node event that says the manager starts reclaiming a resource.
const ReasonThresholdMet = "EvictionThresholdMet"

// Pods is what the manager needs from the agent.
type Pods interface {
	// List returns the pods the node runs, each with its latest status and its source.
	List() []Pod
	// Evict stops the pod for good: phase Failed, reason Evicted, with message, not restarted.
	// grace is how long each container gets before SIGKILL; nil means the pod's own.
	Evict(uid types.UID, message string, grace *time.Duration) bool
	// Release frees what an evicted pod still holds on the node once its containers have stopped:
	// its emptyDir volumes and its /dev/shm (kubelet tears a terminated pod's volumes down, and a
	// stopped CRI sandbox loses its shm), and its dead containers with their writable layers and
	// logs (kubelet's container GC removes an evicted pod's containers); the pod and its status
	// stay. Without this the pressure would outlive the pod that caused it, and the next round
	// would evict an innocent one. A failed release is tried again the next round.
	Release(pod *v1.Pod) error
}

// Reclaimer frees node-level resources before pods are evicted: unused images, dead containers.
// amount is how much the signal needs (bytes, or inodes for *.inodesFree signals).
type Reclaimer interface {
	ReclaimDisk(ctx context.Context, signal Signal, amount int64) (freed int64, err error)
}

// MemoryNotifier wakes the manager when memory may have crossed a threshold, so it need not wait
// for the next monitoring period. See NewKernelNotifier.
type MemoryNotifier interface {
	// C receives a value when memory should be looked at now.
	C() <-chan struct{}
	// Arm asks to be woken when the root memory cgroup's usage crosses any of levels (bytes).
	Arm(levels []int64)
	// Close stops the notifier.
	Close() error
}

// Options configure a Manager.
type Options struct {
	NodeName   string
	Thresholds []Threshold
	// MonitoringPeriod is how often signals are read (evictionMonitoringPeriod, default 10s).
	MonitoringPeriod time.Duration
	// PressureTransitionPeriod is how long a condition stays after its threshold was last met.
	PressureTransitionPeriod time.Duration
	// MaxPodGracePeriod caps the grace of a pod evicted by a soft threshold; 0 leaves the pod's own.
	MaxPodGracePeriod time.Duration

	Observer  Observer
	Usage     Usage
	Pods      Pods
	Reclaimer Reclaimer      // nil: no node-level reclaim
	Events    event.Sink     // nil: events are only logged
	Notifier  MemoryNotifier // nil: polling only; Run closes it when it returns
	Log       *slog.Logger
	// OnConditionsChange is called (outside the manager's lock) when a pressure condition turns on
	// or off, so the node status shows it at once rather than at its next period.
	OnConditionsChange func()
	// EmptyDirPath is where a pod's emptyDir volume lives, for the sizeLimit of disk-backed ones
	// (emptydir.go); nil: sizeLimit is not enforced.
	EmptyDirPath func(pod *v1.Pod, volume string) (string, error)
	// ContainerStorage reads what each container of the pod keeps on disk, by name: its writable
	// layer plus its logs (ctrd.ContainerStorage), for ephemeral-storage limits (emptydir.go);
	// nil: those limits are not enforced. It is called only for pods that have such a limit.
	ContainerStorage func(pod *v1.Pod) (map[string]int64, error)

	// CleanupTimeout bounds the wait for an evicted pod's containers to stop before the next round
	// (kubelet's 30 s).
	CleanupTimeout time.Duration
	// Now is the clock; nil means time.Now. Tests move it by hand.
	Now func() time.Time
}

// notifyGap is the least time between two rounds started by kernel notifications: usage hovering
// on a threshold fires one per crossing, and each round reads a dozen files.
const notifyGap = 100 * time.Millisecond

// Manager is the eviction manager. Create it with New and call Run once.
type Manager struct {
	o   Options
	log *slog.Logger

	// Touched by the Run goroutine only.
	firstMet     map[int]time.Time                  // threshold index -> when first seen crossed
	met          []int                              // crossed past their grace, until min reclaim is met
	condLastSeen map[v1.NodeConditionType]time.Time // condition -> when last seen
	evicted      map[types.UID]string               // pods this manager evicted -> their config hash then
	released     map[types.UID]bool                 // evicted pods whose storage was freed
	reclaiming   v1.ResourceName                    // resource of the last round, for the node event
	armedAt      time.Time
	// Critical pods whose emptyDir overuse was logged, with the spec and volume (emptydir.go).
	overLimitLogged map[types.UID]string

	mu         sync.Mutex
	conditions map[v1.NodeConditionType]bool
	evictions  map[Signal]int64 // pods evicted since start, by the signal that made them go
}

// New makes a manager; it does nothing until Run.
func New(o Options) *Manager {
	if o.MonitoringPeriod <= 0 {
		o.MonitoringPeriod = 10 * time.Second
	}
	if o.CleanupTimeout <= 0 {
		o.CleanupTimeout = 30 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Manager{o: o, log: o.Log,
		firstMet: map[int]time.Time{}, condLastSeen: map[v1.NodeConditionType]time.Time{},
		evicted: map[types.UID]string{}, released: map[types.UID]bool{},
		conditions: map[v1.NodeConditionType]bool{}, evictions: map[Signal]int64{}}
}

// Evictions counts the pods evicted since the agent started, by signal (for /metrics, as kubelet's
// evictions counter).
func (m *Manager) Evictions() map[Signal]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.evictions)
}

// Conditions reports the node's pressure conditions (MemoryPressure, DiskPressure, PIDPressure),
// each true while its signal is past a threshold or was within the pressure transition period.
func (m *Manager) Conditions() map[v1.NodeConditionType]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return map[v1.NodeConditionType]bool{
		v1.NodeMemoryPressure: m.conditions[v1.NodeMemoryPressure],
		v1.NodeDiskPressure:   m.conditions[v1.NodeDiskPressure],
		v1.NodePIDPressure:    m.conditions[v1.NodePIDPressure],
	}
}

// MemoryPressure reports the MemoryPressure condition (admission refuses BestEffort pods under it).
func (m *Manager) MemoryPressure() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.conditions[v1.NodeMemoryPressure]
}

// Run watches the signals until ctx ends: every monitoring period, and at once when the notifier
// says memory moved. After an eviction it waits for the pod's containers to stop, frees what the pod
// held, and looks again at once, so one pod goes per round and no more than needed.
func (m *Manager) Run(ctx context.Context) error {
	var notify <-chan struct{}
	if m.o.Notifier != nil {
		defer m.o.Notifier.Close()
		notify = m.o.Notifier.C()
	}
	if len(m.o.Thresholds) == 0 && m.o.EmptyDirPath == nil && m.o.ContainerStorage == nil {
		m.log.Info("eviction: no thresholds configured; pods are never evicted")
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(m.o.MonitoringPeriod)
	defer t.Stop()
	var last time.Time
	notified := false
	for {
		last = time.Now()
		if p := m.synchronize(ctx, notified); p != nil {
			m.waitStopped(ctx, p.Pod.UID)
			m.releaseEvicted()
			if ctx.Err() == nil {
				continue
			}
		}
		notified = false
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-notify:
			notified = true
			m.log.Debug("eviction: kernel memory notification")
			if gap := notifyGap - time.Since(last); gap > 0 {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(gap):
				}
			}
		}
	}
}

// synchronize is one round: observe, judge thresholds, update conditions, and when a threshold is
// met past its grace period, reclaim at node level or evict one pod. It returns the evicted pod.
// notified says the kernel notifier started the round.
func (m *Manager) synchronize(ctx context.Context, notified bool) *Pod {
	if !notified { // a memory notification is no reason to walk the disk
		if p := m.emptyDirsOverLimit(); p != nil {
			return p
		}
	}
	obs := m.o.Observer.Observe()
	now := m.o.Now()
	m.arm(obs, now, notified)

	met := m.crossed(obs, false, nil)
	if len(m.met) > 0 {
		for _, i := range m.crossed(obs, true, m.met) {
			if !slices.Contains(met, i) {
				met = append(met, i) // not relieved by the minimum reclaim yet
			}
		}
	}
	first := map[int]time.Time{}
	for _, i := range met {
		if at, ok := m.firstMet[i]; ok {
			first[i] = at
		} else {
			first[i] = now
		}
	}
	m.firstMet = first
	for _, i := range met {
		m.condLastSeen[m.o.Thresholds[i].Signal.Condition()] = now
	}
	conds := map[v1.NodeConditionType]bool{}
	for c, at := range m.condLastSeen {
		if now.Sub(at) < m.o.PressureTransitionPeriod || at.Equal(now) {
			conds[c] = true
		} else {
			delete(m.condLastSeen, c)
		}
	}
	var ready []int
	for _, i := range met {
		if now.Sub(first[i]) >= m.o.Thresholds[i].GracePeriod {
			ready = append(ready, i)
		}
	}
	m.met = ready
	m.setConditions(conds)
	if len(ready) == 0 {
		m.reclaiming = ""
		return nil
	}

	// Memory first, then the others in the order Signals lists them (kubelet's order).
	slices.SortStableFunc(ready, func(a, b int) int {
		return slices.Index(order, m.o.Thresholds[a].Signal) - slices.Index(order, m.o.Thresholds[b].Signal)
	})
	t := m.o.Thresholds[ready[0]]
	res := t.Signal.Resource()
	ob := obs.Signals[t.Signal]
	if res != m.reclaiming {
		m.reclaiming = res
		m.log.Warn("eviction: threshold met; reclaiming", "signal", t.Signal, "threshold", t.Value.String(),
			"available", ob.Available, "capacity", ob.Capacity, "hard", t.Hard())
		m.emit(event.Event{Time: time.Now(), Type: event.Warning, Reason: ReasonThresholdMet,
			Message: fmt.Sprintf("Attempting to reclaim %s", res), Object: event.NodeObject(m.o.NodeName)})
	}
	if m.releaseEvicted() > 0 && len(m.crossed(m.o.Observer.Observe(), true, nil)) == 0 {
		m.log.Info("eviction: freeing evicted pods' storage relieved the pressure", "signal", t.Signal)
		return nil
	}
	if m.reclaimNodeLevel(ctx, t, obs) {
		return nil
	}
	return m.evictOne(t, obs)
}

// crossed returns the thresholds (indexes into Options.Thresholds, or only those in only) whose
// signal is below the threshold, or with minReclaim below threshold plus minimum reclaim.
func (m *Manager) crossed(obs Observations, minReclaim bool, only []int) []int {
	var out []int
	for i, t := range m.o.Thresholds {
		if only != nil && !slices.Contains(only, i) {
			continue
		}
		ob, ok := obs.Signals[t.Signal]
		if !ok {
			continue
		}
		level := t.Value.Of(ob.Capacity)
		if minReclaim {
			level += t.MinReclaim.Of(ob.Capacity)
		}
		if ob.Available < level {
			out = append(out, i)
		}
	}
	return out
}

func (m *Manager) setConditions(c map[v1.NodeConditionType]bool) {
	m.mu.Lock()
	changed := false
	for _, cond := range []v1.NodeConditionType{v1.NodeMemoryPressure, v1.NodeDiskPressure, v1.NodePIDPressure} {
		if c[cond] != m.conditions[cond] {
			m.log.Info("eviction: node condition changed", "condition", cond, "status", c[cond])
			changed = true
		}
	}
	m.conditions = c
	m.mu.Unlock()
	if changed && m.o.OnConditionsChange != nil {
		m.o.OnConditionsChange()
	}
}

// arm points the kernel notifier at the root cgroup usage where memory.available reaches each
// memory threshold: capacity - threshold + inactive file (the usage the kernel watches includes
// inactive file pages, the working set does not). Like kubelet, at most every 10 s; but at once
// after a notification: the inactive file pages may have grown since the level was set, so usage
// reached it with memory.available still above the threshold, and a level only fires when crossed
// (kubelet's notifier misses such a pod until its next period).
func (m *Manager) arm(obs Observations, now time.Time, notified bool) {
	if m.o.Notifier == nil || obs.Memory.Capacity == 0 || (!notified && now.Sub(m.armedAt) < 10*time.Second) {
		return
	}
	m.armedAt = now
	var levels []int64
	for _, t := range m.o.Thresholds {
		if t.Signal == SignalMemoryAvailable {
			levels = append(levels, obs.Memory.Capacity-t.Value.Of(obs.Memory.Capacity)+obs.Memory.InactiveFile)
		}
	}
	m.o.Notifier.Arm(levels)
}

// reclaimNodeLevel frees images and dead containers for a disk signal and reports whether that was
// enough: every threshold, minimum reclaim included, is then satisfied and no pod need go.
func (m *Manager) reclaimNodeLevel(ctx context.Context, t Threshold, obs Observations) bool {
	if m.o.Reclaimer == nil || !t.Signal.disk() {
		return false
	}
	if obs.DedicatedImageFs && (t.Signal == SignalNodeFsAvailable || t.Signal == SignalNodeFsInodesFree) {
		return false // images live elsewhere: removing them frees nothing here
	}
	ob := obs.Signals[t.Signal]
	need := t.Value.Of(ob.Capacity) + t.MinReclaim.Of(ob.Capacity) - ob.Available
	freed, err := m.o.Reclaimer.ReclaimDisk(ctx, t.Signal, need)
	if err != nil {
		m.log.Warn("eviction: node-level reclaim failed", "signal", t.Signal, "needed", need, "freed", freed, "err", err)
	}
	after := m.o.Observer.Observe()
	if len(m.crossed(after, true, nil)) == 0 {
		m.log.Info("eviction: node-level reclaim relieved the pressure; no pod evicted", "signal", t.Signal, "freed", freed)
		return true
	}
	return false
}

// evictOne ranks the pods that may go and evicts the first.
func (m *Manager) evictOne(t Threshold, obs Observations) *Pod {
	res := t.Signal.Resource()
	var cs []candidate
	for _, p := range m.o.Pods.List() {
		if !active(p.Pod) {
			continue
		}
		if hash, ok := m.evicted[p.Pod.UID]; ok && hash == configHash(p.Pod) {
			// Evicted already and not stopped yet (a stuck stop): the next pod goes instead. A pod
			// that runs again with a new spec is a candidate again.
			continue
		}
		if why := admission.CriticalReason(p.Pod, p.Source); why != "" {
			m.log.Debug("eviction: pod never evicted", "pod", p.Pod.Namespace+"/"+p.Pod.Name, "why", why)
			continue
		}
		cs = append(cs, m.measure(p, res))
	}
	if len(cs) == 0 {
		m.log.Warn("eviction: threshold met but no pod may be evicted", "signal", t.Signal)
		return nil
	}
	rank(res, cs)
	victim := cs[0]
	p := victim.Pod.Pod
	msg := m.message(t, obs, victim)
	var grace *time.Duration
	if t.Hard() {
		// kubelet gives 1 s; mqlet none. On a device that is out of memory, every second spent
		// waiting for a graceful exit is a second in which the kernel's OOM killer may pick a
		// victim itself, ignoring the ranking (and possibly taking a manifest-dir pod or mqlet).
		zero := time.Duration(0)
		grace = &zero
	} else if m.o.MaxPodGracePeriod > 0 {
		g := min(podGrace(p), m.o.MaxPodGracePeriod)
		grace = &g
	}
	m.log.Warn("eviction: evicting pod", "pod", p.Namespace+"/"+p.Name, "uid", p.UID, "signal", t.Signal,
		"usage", victim.usage, "request", victim.request, "message", msg)
	m.emit(event.Event{Time: time.Now(), Type: event.Warning, Reason: Reason, Message: msg,
		Object: event.PodObject(p), Source: victim.Source.String()})
	if !m.o.Pods.Evict(p.UID, msg, grace) {
		m.log.Warn("eviction: pod vanished before it could be evicted", "pod", p.Namespace+"/"+p.Name)
		return nil
	}
	m.evicted[p.UID] = configHash(p)
	m.mu.Lock()
	m.evictions[t.Signal]++
	m.mu.Unlock()
	return &victim.Pod
}

// measure reads the pod's use of res (outside any lock: cgroup files, directory walks).
func (m *Manager) measure(p Pod, res v1.ResourceName) candidate {
	c := candidate{Pod: p, request: requestOf(p.Pod, res)}
	var err error
	switch res {
	case v1.ResourceMemory:
		c.usage, err = m.o.Usage.Memory(p.Pod)
	case v1.ResourceEphemeralStorage:
		c.usage, _, err = m.o.Usage.Disk(p.Pod)
	case resourceInodes:
		_, c.usage, err = m.o.Usage.Disk(p.Pod)
	default:
		c.usage, err = m.o.Usage.Processes(p.Pod)
	}
	c.found = err == nil
	if err != nil {
		m.log.Debug("eviction: pod usage unreadable; ranked first", "pod", p.Pod.Namespace+"/"+p.Pod.Name, "resource", res, "err", err)
	}
	return c
}

// message is kubelet's eviction message: "The node was low on resource: memory. Threshold quantity:
// 100Mi, available: 80Mi. ", and for a pod using more than it requests, what it used.
func (m *Manager) message(t Threshold, obs Observations, c candidate) string {
	res := t.Signal.Resource()
	ob := obs.Signals[t.Signal]
	msg := fmt.Sprintf("The node was low on resource: %s. ", res)
	msg += fmt.Sprintf("Threshold quantity: %s, available: %s. ", quantity(res, t.Value, ob.Capacity), amount(res, ob.Available))
	if c.found && c.exceeds() && (res == v1.ResourceMemory || res == v1.ResourceEphemeralStorage) {
		msg += fmt.Sprintf("Pod %s was using %s, request is %s, has larger consumption of %s. ",
			c.Pod.Pod.Name, amount(res, c.usage), amount(res, c.request), res)
	}
	return msg
}

// quantity prints a threshold as kubelet does: as configured, or a percentage worked out.
func quantity(res v1.ResourceName, v Value, capacity int64) string {
	if v.Quantity != nil {
		return v.Quantity.String()
	}
	return amount(res, v.Of(capacity))
}

func amount(res v1.ResourceName, n int64) string {
	if res == resourceInodes || res == resourcePIDs {
		return resource.NewQuantity(n, resource.DecimalSI).String()
	}
	return resource.NewQuantity(n, resource.BinarySI).String()
}

// configHash tells one version of a pod's spec from another (admission's hash of it).
func configHash(p *v1.Pod) string { return p.Annotations[admission.AnnotationConfigHash] }

func podGrace(p *v1.Pod) time.Duration {
	if s := p.Spec.TerminationGracePeriodSeconds; s != nil {
		return time.Duration(*s) * time.Second
	}
	return 30 * time.Second // the API server's default
}

// waitStopped waits until the evicted pod is no longer active (its worker stopped its containers and
// published Failed) or gone, bounded by CleanupTimeout.
func (m *Manager) waitStopped(ctx context.Context, uid types.UID) {
	deadline := time.Now().Add(m.o.CleanupTimeout)
	for {
		stopped := true
		for _, p := range m.o.Pods.List() {
			if p.Pod.UID == uid {
				stopped = !active(p.Pod)
			}
		}
		if stopped {
			return
		}
		if time.Now().After(deadline) {
			m.log.Warn("eviction: evicted pod has not stopped yet; going on", "uid", uid, "waited", m.o.CleanupTimeout)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// releaseEvicted frees the storage of evicted pods whose containers have stopped: those this
// manager evicted, and those restored from the store as evicted (an agent restart between the
// eviction and the release). It returns how many it freed.
func (m *Manager) releaseEvicted() int {
	n := 0
	seen := map[types.UID]bool{}
	for _, p := range m.o.Pods.List() {
		uid := p.Pod.UID
		seen[uid] = true
		if m.released[uid] || p.Pod.Status.Phase != v1.PodFailed || p.Pod.Status.Reason != Reason {
			continue
		}
		if err := m.o.Pods.Release(p.Pod); err != nil {
			m.log.Warn("eviction: free an evicted pod's storage", "pod", p.Pod.Namespace+"/"+p.Pod.Name, "err", err)
			continue
		}
		m.released[uid] = true
		n++
	}
	for uid := range m.released {
		if !seen[uid] {
			delete(m.released, uid)
		}
	}
	for uid := range m.evicted {
		if !seen[uid] {
			delete(m.evicted, uid)
		}
	}
	return n
}

func (m *Manager) emit(e event.Event) {
	if m.o.Events != nil {
		m.o.Events.Emit(e)
	}
}
