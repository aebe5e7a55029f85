// Package nodes makes mqlet nodes Kubernetes Nodes: the first status a node publishes registers a
// v1.Node, its status follows with kubelet's semantics, and its Lease in kube-node-lease is renewed
// while (and only while) the bridge can vouch that the node is online, so that Kubernetes' own node
// lifecycle controller marks it Unknown when it goes away.
//
// Vouching: a node is online for the bridge when the newest liveness message it has (highest
// session; a late Will of an older session is ignored) says online AND that message arrived on the
// bridge's current MQTT connection. When the bridge loses the broker it vouches for no node, and
// after reconnecting for each node only once the broker has sent that node's retained online
// message again: whatever happened while the bridge was away is then known.
//
// All API writes happen on a few workers fed by a rate-limited delaying work queue (a heap of due
// times), never on the MQTT goroutines and never under the controller's lock; a 1,000-node fleet
// costs ~100 Lease updates a second and no goroutine per node.
package nodes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mqlet/mqlet/bridge/mq"
	"github.com/mqlet/mqlet/core/prom"
	"github.com/mqlet/mqlet/sync/protocol"

	coordv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Defaults for the zero values of Options (kubelet's own values).
const (
	DefaultLeaseDuration         = 40 * time.Second
	DefaultRenewInterval         = 10 * time.Second
	DefaultStatusReportFrequency = 5 * time.Minute
	DefaultWorkers               = 8
	// LeaseNamespace holds the node Leases.
	LeaseNamespace = "kube-node-lease"
)

// Options configure New.
type Options struct {
	Kube      kubernetes.Interface
	Informers informers.SharedInformerFactory
	// Selector picks the Nodes the bridge serves; a node whose would-be labels do not match it is
	// not registered. Default: the RoleLabel exists.
	Selector labels.Selector
	// RoleLabel is added (value "") to every Node the bridge registers; default DefaultRoleLabel.
	// Set NoRoleLabel to add none.
	RoleLabel   string
	NoRoleLabel bool
	// LeaseDuration, RenewInterval: the node Lease's leaseDurationSeconds and how often it is
	// renewed (kubelet: 40s and 10s).
	LeaseDuration, RenewInterval time.Duration
	// StatusReportFrequency: a node's status is posted again (fresh heartbeat) this long after the
	// last post while it is online, even when nothing changed (kubelet's nodeStatusReportFrequency).
	StatusReportFrequency time.Duration
	Workers               int
	MaxPayload            int // default protocol.DefaultMaxPayload
	// Connected is the bridge's current MQTT connection (mq.Conn.Connected): its session, or ok
	// false while the bridge has none.
	Connected func() (session int64, ok bool)
	// OnServed, when set, is called when a node becomes served: its Node appears in the informer
	// cache matching Selector (at bridge start, after a registration) or starts matching it. It runs
	// on the informer's goroutine: it must be quick.
	OnServed func(node string)
	// KubeletEndpoint, when set, gives the address and port of the node's kubelet API (served by
	// the bridge, bridge/kubeletapi), given the port its Node records now (0: none). They are
	// written into every status posted: the Node's first InternalIP and its
	// daemonEndpoints.kubeletEndpoint.Port, which the API server dials for logs, exec and stats.
	KubeletEndpoint func(node string, recorded int32) (ip string, port int32, err error)
	Now             func() time.Time
	Log             *slog.Logger
	Metrics         *prom.Registry
}

type kind uint8

const (
	kindLease kind = iota
	kindStatus
)

type key struct {
	kind kind
	node string
}

// node is what the controller knows about one node. Guarded by Controller.mu.
type node struct {
	status *v1.Node // the agent's latest valid status object; never modified once stored
	seq    uint64   // bumped with each new status

	online     bool  // the newest liveness says online
	session    int64 // the node's highest liveness session seen
	onlineConn int64 // the bridge connection session the deciding liveness message arrived on

	postedSeq uint64    // seq of the last status posted while online
	postedAt  time.Time // when it was posted
	repost    bool      // post even if unchanged (back online; the API's Ready differs)

	lease *coordv1.Lease // the last Lease written or read; nil: read it first
}

// Controller registers Nodes, posts their status and renews their Leases.
type Controller struct {
	o      Options
	lister corelisters.NodeLister
	synced cache.InformerSynced
	queue  workqueue.TypedRateLimitingInterface[key]

	mu    sync.Mutex
	nodes map[string]*node

	m ctlMetrics
	// leaseSkips counts lease checks that wrote nothing because the node was not vouched for.
	leaseSkips atomic.Int64
}

type ctlMetrics struct {
	refused       *prom.CounterVec
	renewals      *prom.Counter
	leaseErrors   *prom.Counter
	statusPosts   *prom.CounterVec
	registrations *prom.Counter
	apiWrite      *prom.HistogramVec
}

// New checks o and registers the Node informer's handlers (call it before the factory starts).
func New(o Options) (*Controller, error) {
	if o.Kube == nil || o.Informers == nil {
		return nil, errors.New("nodes: a kube client and an informer factory are required")
	}
	if o.Connected == nil {
		return nil, errors.New("nodes: Connected (the MQTT connection's state) is required")
	}
	if o.RoleLabel == "" && !o.NoRoleLabel {
		o.RoleLabel = DefaultRoleLabel
	}
	if o.NoRoleLabel {
		o.RoleLabel = ""
	}
	if o.Selector == nil {
		sel, err := labels.Parse(DefaultRoleLabel)
		if err != nil {
			return nil, err
		}
		o.Selector = sel
	}
	if o.LeaseDuration <= 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.RenewInterval <= 0 {
		o.RenewInterval = DefaultRenewInterval
	}
	if o.RenewInterval >= o.LeaseDuration {
		return nil, fmt.Errorf("nodes: lease renew interval %s must be shorter than the lease duration %s", o.RenewInterval, o.LeaseDuration)
	}
	if o.StatusReportFrequency <= 0 {
		o.StatusReportFrequency = DefaultStatusReportFrequency
	}
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	if o.MaxPayload <= 0 {
		o.MaxPayload = protocol.DefaultMaxPayload
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	inf := o.Informers.Core().V1().Nodes()
	c := &Controller{
		o:      o,
		lister: inf.Lister(),
		nodes:  map[string]*node{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[key](200*time.Millisecond, 10*time.Second),
			workqueue.TypedRateLimitingQueueConfig[key]{Name: "mqlet-bridge-nodes"}),
	}
	c.registerMetrics(o.Metrics)
	reg, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.nodeChanged(nil, obj) },
		UpdateFunc: c.nodeChanged,
		DeleteFunc: c.nodeDeleted,
	})
	if err != nil {
		return nil, fmt.Errorf("nodes: node informer: %w", err)
	}
	c.synced = reg.HasSynced
	return c, nil
}

func (c *Controller) registerMetrics(r *prom.Registry) {
	if r == nil {
		r = prom.NewRegistry()
	}
	c.m.refused = r.CounterVec("bridge_node_messages_refused_total", "Liveness and node status messages refused, by class and reason (decode: garbled, oversized or invalid; other_node: names another node than its topic).", "class", "reason")
	c.m.renewals = r.Counter("bridge_node_lease_renewals_total", "Node Lease renewals (and creations) written.")
	c.m.leaseErrors = r.Counter("bridge_node_lease_errors_total", "Node Lease writes that failed.")
	c.m.statusPosts = r.CounterVec("bridge_node_status_posts_total", "Node status writes, by result.", "result")
	c.m.registrations = r.Counter("bridge_node_registrations_total", "Nodes registered (created) by the bridge.")
	c.m.apiWrite = r.HistogramVec("bridge_api_write_seconds", "Latency of the bridge's Kubernetes API writes, by operation.",
		[]float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}, "op")
	r.Func("bridge_nodes_online", "Nodes the bridge vouches for as online (their Leases are renewed).", prom.GaugeType, nil, func(emit prom.Emit) {
		emit(float64(c.OnlineCount()))
	})
	r.Func("bridge_nodes_known", "Nodes the bridge has a valid status for.", prom.GaugeType, nil, func(emit prom.Emit) {
		c.mu.Lock()
		n := 0
		for _, s := range c.nodes {
			if s.status != nil {
				n++
			}
		}
		c.mu.Unlock()
		emit(float64(n))
	})
	r.Func("bridge_nodes_served", "Nodes in the API that match the bridge's node selector.", prom.GaugeType, nil, func(emit prom.Emit) {
		ns, err := c.lister.List(c.o.Selector)
		if err == nil {
			emit(float64(len(ns)))
		}
	})
}

// HasSynced reports whether the Node informer has synced.
func (c *Controller) HasSynced() bool { return c.synced() }

// Served reports whether the bridge serves node: its Node is in the informer cache and matches
// the selector.
func (c *Controller) Served(node string) bool {
	n, err := c.lister.Get(node)
	return err == nil && c.o.Selector.Matches(labels.Set(n.Labels))
}

// List returns the served Nodes (informer cache).
func (c *Controller) List() []*v1.Node {
	ns, err := c.lister.List(c.o.Selector)
	if err != nil {
		return nil
	}
	return ns
}

// Online reports whether the bridge vouches for node being online now.
func (c *Controller) Online(node string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.nodes[node]
	return s != nil && c.vouched(s)
}

// OnlineCount is the number of nodes the bridge vouches for.
func (c *Controller) OnlineCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, s := range c.nodes {
		if c.vouched(s) {
			n++
		}
	}
	return n
}

// vouched: online per the newest liveness, learnt on the current connection. c.mu held.
func (c *Controller) vouched(s *node) bool {
	session, ok := c.o.Connected()
	return ok && s.online && s.onlineConn == session
}

// HandleMessage takes an online or status/node message; it decodes and records, and leaves the
// API writes to the workers. It never blocks on I/O.
func (c *Controller) HandleMessage(m mq.Message) {
	if len(m.Payload) == 0 {
		return // a cleared retained topic: no news (docs/protocol.md section 4.3)
	}
	switch m.Topic.Class {
	case protocol.ClassLiveness:
		c.handleLiveness(m)
	case protocol.ClassNodeStatus:
		c.handleStatus(m)
	}
}

func (c *Controller) refuse(m mq.Message, reason string, err error) {
	c.m.refused.With(string(m.Topic.Class), reason).Inc()
	c.o.Log.Warn("node message refused; nothing changes", "topic", m.Name, "node", m.Topic.Node, "reason", reason, "err", err)
}

func (c *Controller) handleLiveness(m mq.Message) {
	l, err := protocol.DecodeLiveness(m.Payload, c.o.MaxPayload)
	if err != nil {
		c.refuse(m, "decode", err)
		return
	}
	if l.Node != m.Topic.Node {
		c.refuse(m, "other_node", fmt.Errorf("payload names node %q but was published on node %q's topic", l.Node, m.Topic.Node))
		return
	}
	c.mu.Lock()
	s := c.state(m.Topic.Node)
	was := c.vouched(s)
	switch {
	case l.Online && l.Session >= s.session:
		s.online, s.session, s.onlineConn = true, l.Session, m.Session
	case !l.Online && l.Session >= s.session:
		s.online, s.session = false, l.Session
	default:
		// An older session's message: a late Will (protocol.IsStaleOffline) or a replay.
		c.mu.Unlock()
		c.o.Log.Debug("stale liveness ignored", "node", m.Topic.Node, "online", l.Online, "session", l.Session)
		return
	}
	now := c.vouched(s)
	if now && !was {
		s.repost = true // e.g. back after the node lifecycle controller set Ready Unknown
	}
	c.mu.Unlock()
	if now != was {
		c.o.Log.Info("node liveness", "node", m.Topic.Node, "online", now, "session", l.Session)
	}
	if now && !was {
		c.queue.Add(key{kindLease, m.Topic.Node})
		c.queue.Add(key{kindStatus, m.Topic.Node})
	}
}

func (c *Controller) handleStatus(m mq.Message) {
	x, err := protocol.DecodeNodeStatus(m.Payload, c.o.MaxPayload)
	if err != nil {
		c.refuse(m, "decode", err)
		return
	}
	if err := checkStatus(m.Topic, x); err != nil {
		c.refuse(m, "other_node", err)
		return
	}
	c.mu.Lock()
	s := c.state(m.Topic.Node)
	s.status = x.Object
	s.seq++
	c.mu.Unlock()
	c.queue.Add(key{kindStatus, m.Topic.Node})
}

// state returns node's record, making it. c.mu held.
func (c *Controller) state(name string) *node {
	s := c.nodes[name]
	if s == nil {
		s = &node{}
		c.nodes[name] = s
	}
	return s
}

// nodeChanged is the informer's add and update handler.
func (c *Controller) nodeChanged(oldObj, newObj any) {
	n, ok := newObj.(*v1.Node)
	if !ok {
		return
	}
	served := c.o.Selector.Matches(labels.Set(n.Labels))
	wasServed := false
	if old, ok := oldObj.(*v1.Node); ok {
		wasServed = c.o.Selector.Matches(labels.Set(old.Labels))
	}
	if !served {
		return
	}
	if !wasServed {
		if c.o.OnServed != nil {
			c.o.OnServed(n.Name)
		}
		c.queue.Add(key{kindLease, n.Name})
		c.queue.Add(key{kindStatus, n.Name})
		return
	}
	// The API says the node is not Ready as the agent reports it (the node lifecycle controller
	// set it Unknown, e.g. because the bridge was away) while the bridge vouches for it: post again.
	c.mu.Lock()
	s := c.nodes[n.Name]
	// An agent status without a Ready condition would never match: no post for it (a loop).
	mismatch := s != nil && s.status != nil && c.vouched(s) && readyStatus(s.status) != "" && readyStatus(n) != readyStatus(s.status)
	if mismatch {
		s.repost = true
	}
	c.mu.Unlock()
	if mismatch {
		c.queue.Add(key{kindStatus, n.Name})
	}
}

func (c *Controller) nodeDeleted(obj any) {
	n, ok := obj.(*v1.Node)
	if !ok {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			n, _ = t.Obj.(*v1.Node)
		}
	}
	if n == nil {
		return
	}
	c.mu.Lock()
	if s := c.nodes[n.Name]; s != nil {
		s.lease = nil // its owner reference makes the garbage collector delete it
		s.postedSeq, s.postedAt = 0, time.Time{}
	}
	c.mu.Unlock()
}

// Run runs the workers until ctx ends, then waits for them.
func (c *Controller) Run(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), c.synced) {
		return fmt.Errorf("nodes: the node informer did not sync: %w", context.Cause(ctx))
	}
	var wg sync.WaitGroup
	for range c.o.Workers {
		wg.Go(func() {
			for c.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

func (c *Controller) processNext(ctx context.Context) bool {
	k, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(k)
	var again time.Duration
	var err error
	switch k.kind {
	case kindLease:
		again, err = c.renewLease(ctx, k.node)
	case kindStatus:
		again, err = c.syncStatus(ctx, k.node)
	}
	switch {
	case err != nil && ctx.Err() == nil:
		c.o.Log.Warn("node sync failed; retrying", "node", k.node, "what", map[kind]string{kindLease: "lease", kindStatus: "status"}[k.kind], "err", err)
		c.queue.AddRateLimited(k)
	case err == nil:
		c.queue.Forget(k)
		if again > 0 {
			c.queue.AddAfter(k, again)
		}
	}
	return true
}

// observe records an API write's latency.
func (c *Controller) observe(op string, start time.Time) {
	c.m.apiWrite.With(op).Observe(time.Since(start).Seconds())
}

// isGone reports errors that mean the cached object is out of date.
func isGone(err error) bool { return apierrors.IsConflict(err) || apierrors.IsNotFound(err) }
