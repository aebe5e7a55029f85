package nodestatus

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Store keeps the node's status across restarts (store.State implements it). Only real changes are
// written, so an idle node does not wear its flash.
type Store interface {
	PutNodeStatus(n *v1.Node) error
	GetNodeStatus() (*v1.Node, bool, error)
}

// Defaults of Options.
const (
	// DefaultPeriod is kubelet's nodeStatusUpdateFrequency.
	DefaultPeriod = 10 * time.Second
	// DefaultStartupPeriod is how often the status is computed while the node has not been Ready
	// yet since start (kubelet also updates fast until its node is ready), so `mqlet node` shows
	// Ready soon after the agent is.
	DefaultStartupPeriod = 500 * time.Millisecond
	// DefaultStartupGrace is how long after start a status that is not Ready is kept back from the
	// store and the callback: a restart would otherwise report NotReady and Ready again within a
	// second. After it, a node that is still not Ready reports so.
	DefaultStartupGrace = 30 * time.Second
	// computeTimeout bounds one computation (a hung containerd must not stall the loop).
	computeTimeout = 30 * time.Second
)

// Options configure a Manager.
type Options struct {
	// Name is the node's name; a stored status of another name is not reused.
	Name string
	// Setters run in order on every computation (see DefaultSetters).
	Setters []Setter
	// Period is how often the status is computed (nodeStatusUpdateFrequency); DefaultPeriod if 0.
	Period time.Duration
	// StartupPeriod and StartupGrace: see DefaultStartupPeriod and DefaultStartupGrace.
	StartupPeriod, StartupGrace time.Duration
	// ReportFrequency, when above 0, hands the status to OnChange again when that long passed
	// since the last hand-over even if nothing changed (kubelet's nodeStatusReportFrequency, for a
	// consumer that needs a heartbeat). mqlet's MQTT link leaves it 0: liveness is the MQTT
	// keepalive, and idle traffic is keepalive only.
	ReportFrequency time.Duration
	// Store keeps the status; nil keeps none. The status is read from it at start (so conditions
	// keep their transition times across restarts) and written on a real change only.
	Store Store
	// OnChange receives the first settled status after each start (so a link that repeats it on
	// reconnect has it) and every status that changed for real since. It is called from the
	// Manager's goroutine with no lock held and must not block; the node is the callee's.
	OnChange func(*v1.Node)
	Log      *slog.Logger
	Now      func() time.Time
}

// Manager computes the node's status on a period and on demand (Trigger), keeps the latest for
// readers (Node), and stores and hands on the real changes. Create it with New, then Run it once.
type Manager struct {
	o       Options
	trigger chan struct{}

	mu     sync.Mutex // guards latest only; never held across I/O or setters
	latest *v1.Node

	computed atomic.Uint64
	stored   atomic.Uint64
}

// New makes a Manager; nothing runs before Run.
func New(o Options) *Manager {
	if o.Period <= 0 {
		o.Period = DefaultPeriod
	}
	if o.StartupPeriod <= 0 {
		o.StartupPeriod = DefaultStartupPeriod
	}
	if o.StartupPeriod > o.Period {
		o.StartupPeriod = o.Period
	}
	if o.StartupGrace <= 0 {
		o.StartupGrace = DefaultStartupGrace
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Manager{o: o, trigger: make(chan struct{}, 1)}
}

// Trigger asks for a computation now (a device appeared, pressure changed, shutdown began)
// without waiting for it. Requests made while one runs fold into one more.
func (m *Manager) Trigger() {
	select {
	case m.trigger <- struct{}{}:
	default:
	}
}

// Allocatable is the latest status's allocatable (nil before the first computation), copied
// without the rest of the node: admission reads it for every new pod.
func (m *Manager) Allocatable() v1.ResourceList {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.latest == nil {
		return nil
	}
	return m.latest.Status.Allocatable.DeepCopy()
}

// Node returns a copy of the latest computed status (heartbeats fresh, whether or not it was a
// real change), or nil before the first computation.
func (m *Manager) Node() *v1.Node {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.latest == nil {
		return nil
	}
	return m.latest.DeepCopy()
}

// Computations is how many computations have completed; Stored how many of them were written to
// the store (tests and metrics read these).
func (m *Manager) Computations() uint64 { return m.computed.Load() }

// Stored counts the store writes.
func (m *Manager) Stored() uint64 { return m.stored.Load() }

// Run computes the status until ctx ends.
func (m *Manager) Run(ctx context.Context) error {
	start := m.o.Now()
	prev := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: m.o.Name}}
	var storedSum, handedSum [32]byte
	if m.o.Store != nil {
		switch n, ok, err := m.o.Store.GetNodeStatus(); {
		case err != nil:
			m.o.Log.Warn("node status: reading the stored status; starting afresh", "err", err)
		case ok && n.Name == m.o.Name:
			prev, storedSum = n, Significant(n)
		}
	}
	handed := false
	everReady := false
	var lastHanded time.Time
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-m.trigger:
			timer.Stop() // Go 1.23+: no stale tick is delivered after Stop
		}
		n := m.compute(ctx, prev)
		if ctx.Err() != nil {
			return nil
		}
		m.mu.Lock()
		m.latest = n
		m.mu.Unlock()

		now := m.o.Now()
		ready := isReady(n)
		everReady = everReady || ready
		settling := !handed && !ready && now.Sub(start) < m.o.StartupGrace
		stored, changed := false, false
		if !settling {
			// A status kept back while settling is not built on: Ready must not pass through a
			// NotReady nobody saw, or a restart would lose the transition time it restored.
			prev = n
			sum := Significant(n)
			if m.o.Store != nil && sum != storedSum {
				if err := m.o.Store.PutNodeStatus(n); err != nil {
					m.o.Log.Error("node status: store", "err", err) // tried again on the next computation
				} else {
					storedSum, stored = sum, true
					m.stored.Add(1)
				}
			}
			changed = sum != handedSum
			due := m.o.ReportFrequency > 0 && now.Sub(lastHanded) >= m.o.ReportFrequency
			if changed || !handed || due {
				if m.o.OnChange != nil {
					m.o.OnChange(n.DeepCopy())
				}
				handedSum, handed, lastHanded = sum, true, now
			}
		}
		seq := m.computed.Add(1)
		m.o.Log.Debug("node status computed", "seq", seq, "ready", ready, "settling", settling, "changed", changed, "stored", stored)

		wait := m.o.Period
		if !everReady && now.Sub(start) < m.o.StartupGrace {
			wait = m.o.StartupPeriod
		}
		timer.Reset(wait)
	}
}

// compute runs every setter on a copy of prev.
func (m *Manager) compute(ctx context.Context, prev *v1.Node) *v1.Node {
	ctx, cancel := context.WithTimeout(ctx, computeTimeout)
	defer cancel()
	n := prev.DeepCopy()
	n.TypeMeta = metav1.TypeMeta{Kind: "Node", APIVersion: "v1"}
	n.Name = m.o.Name
	if n.CreationTimestamp.IsZero() {
		// When this node first reported a status; kept across restarts with the stored status,
		// so AGE in `mqlet node` is the node's, not the agent process's.
		n.CreationTimestamp = metav1.NewTime(m.o.Now())
	}
	for _, set := range m.o.Setters {
		if err := set(ctx, n); err != nil {
			m.o.Log.Warn("node status", "err", err)
		}
	}
	return n
}

func isReady(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// Significant digests what makes a status worth storing and reporting: name, labels, annotations
// (whose hardware facts are already banded, see HardwareFacts), taints, addresses, capacity,
// allocatable, nodeInfo, the images' names, and each condition's type, status, reason and
// message. Heartbeat and transition times and image sizes are left out (a transition comes with a
// status change, which is in).
func Significant(n *v1.Node) [32]byte {
	type cond struct{ Type, Status, Reason, Message string }
	conds := make([]cond, 0, len(n.Status.Conditions))
	for _, c := range n.Status.Conditions {
		conds = append(conds, cond{string(c.Type), string(c.Status), c.Reason, c.Message})
	}
	slices.SortFunc(conds, func(a, b cond) int {
		switch {
		case a.Type < b.Type:
			return -1
		case a.Type > b.Type:
			return 1
		}
		return 0
	})
	images := make([][]string, 0, len(n.Status.Images))
	for _, img := range n.Status.Images {
		images = append(images, img.Names)
	}
	b, err := json.Marshal(struct {
		Name        string
		Labels      map[string]string
		Annotations map[string]string
		Taints      []v1.Taint
		Addresses   []v1.NodeAddress
		Capacity    v1.ResourceList
		Allocatable v1.ResourceList
		Info        v1.NodeSystemInfo
		Images      [][]string
		Conditions  []cond
	}{n.Name, n.Labels, n.Annotations, n.Spec.Taints, n.Status.Addresses, n.Status.Capacity, n.Status.Allocatable,
		n.Status.NodeInfo, images, conds})
	if err != nil {
		panic(err) // plain strings, maps and quantities always encode
	}
	return sha256.Sum256(b)
}
