// Package pods is the bridge's pod controller: it publishes the pods bound to each served node,
// with the configMaps and secrets they reference, as the node's retained desired objects
// (docs/protocol.md sections 4 and 5), finishes deletions the way kubelet does once the node
// confirms them, writes the nodes' pod status to the API's status subresource and turns the
// nodes' events into events.k8s.io/v1 Events.
//
// It is the single writer of every served node's desired state (the bridge runs one leader): it
// keeps each node's generation counter in memory, seeded from the retained index, objects and acks
// it reads at start, writes objects before the index that lists them with their payload digests,
// as protocol section 4.4 asks, and clears an object's retained topic only after an index that
// leaves it out.
package pods

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/mqlet/mqlet/core/prom"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/client-go/util/workqueue"
)

// Broker is what the controller needs of the bridge's MQTT connection (bridge/mq.Conn).
type Broker interface {
	// Publish sends one QoS 1 message and returns once the broker acknowledged it.
	Publish(ctx context.Context, topic string, payload []byte, retained bool) error
	// Snapshot returns the retained messages matching filters, by topic (marker technique).
	Snapshot(ctx context.Context, filters ...string) (map[string][]byte, error)
}

// ReportingController is the reportingController of the Events the bridge writes.
const ReportingController = "mqlet.io/mqlet"

// ReasonNodeRefused is the status reason of a pod its node refused to run.
const ReasonNodeRefused = "NodeRefused"

// Defaults for Options.
const (
	DefaultNodeWorkers   = 8
	DefaultStatusWorkers = 16
	DefaultDebounce      = 200 * time.Millisecond
	DefaultPublishBurst  = 32
	DefaultEventQPS      = 50
	DefaultEventBurst    = 200
	DefaultEventQueue    = 1000
)

// Options configure a Controller.
type Options struct {
	Kube    kubernetes.Interface
	Factory informers.SharedInformerFactory
	Broker  Broker
	Topics  protocol.Topics
	// Served says whether the bridge serves a node (bridge/nodes.Controller.Served). Pods bound to
	// other nodes are left alone.
	Served  func(node string) bool
	Metrics *prom.Registry // nil: a private registry
	Log     *slog.Logger
	// MaxPayload is the largest payload sent or accepted; protocol.DefaultMaxPayload when 0.
	MaxPayload int
	// SigningKey, when set, signs every index the bridge writes (docs/security.md): nodes with
	// trust anchors take only indexes signed by a key they trust.
	SigningKey ed25519.PrivateKey
	// NodeTrust, when set, holds the fleet's CA (and its CRL): a Secret is sealed only to a key
	// the node's client certificate vouches for (sealing.NodeTrust.Attested), never to one a
	// broker put in the node's status.
	NodeTrust *sealing.NodeTrust

	// NodeWorkers sync nodes' desired state in parallel; StatusWorkers write pod status.
	NodeWorkers, StatusWorkers int
	// Debounce batches the changes of one node into one sync (one index write).
	Debounce time.Duration
	// PublishBurst bounds the publishes of one node's sync that wait for their PUBACK at once.
	PublishBurst int
	// EventQPS and EventBurst bound the Events written to the API; EventQueue bounds the node
	// events waiting (more are dropped and counted), so a burst never delays status writes.
	EventQPS   float32
	EventBurst int
	EventQueue int

	// NoServiceAccountTokens leaves pods without API tokens: the kube-api-access-* volume is
	// stripped and a serviceAccountToken projection a user wrote is refused by the node. Without
	// it the bridge asks the TokenRequest API for every projection and sends the token sealed
	// (tokens.go).
	NoServiceAccountTokens bool
	// TokenMaxAge renews a token older than this even before 80 % of its lifetime; default
	// DefaultTokenMaxAge.
	TokenMaxAge time.Duration
}

// Indexer names on the pod informer.
const (
	byNode      = "mqlet.io/nodeName"
	byConfigMap = "mqlet.io/configMap"
	bySecret    = "mqlet.io/secret"
)

// Controller is the pod controller; see the package doc.
type Controller struct {
	o   Options
	log *slog.Logger
	m   *ctlMetrics

	pods       cache.SharedIndexInformer
	podLister  corelisters.PodLister
	cmLister   corelisters.ConfigMapLister
	nodeLister corelisters.NodeLister // the API's Nodes: labels the node itself does not know
	secLister  corelisters.SecretLister
	svcLister  corelisters.ServiceLister // the pods' service environment variables
	hasSynced  []cache.InformerSynced
	eventLimit flowcontrol.RateLimiter
	events     chan rawEvent

	mu       sync.Mutex
	running  bool
	nodeQ    workqueue.TypedRateLimitingInterface[string]
	statusQ  workqueue.TypedRateLimitingInterface[string]
	known    map[string]bool            // every node queued so far: Run and Reconnected queue them again
	nodes    map[string]*nodeState      // nil entry or absent: read the retained state first
	acks     map[string][]byte          // node -> latest acks payload
	resync   map[string]map[string]bool // node -> keys a resync request named
	pending  map[string]statusMsg       // status topic -> latest status payload not yet written
	summary  map[string]statusSummary   // status topic -> what the latest status said
	refusals map[string]refusal         // status topic -> the node refused the pod's current generation

	// restatus holds nodes whose retained pod statuses are read again at their next sync (their
	// API Node turned Ready again); statusSeq counts each node's status messages, so such a read
	// is known to be no older than what arrived meanwhile. Guarded by mu.
	restatus  map[string]bool
	statusSeq map[string]uint64

	tokens *tokens // nil with NoServiceAccountTokens

	// synced, when set (tests), is called after each sync of a queue's key with its outcome.
	synced func(queue, key string, err error)
}

type statusMsg struct {
	node, namespace, name string
	payload               []byte
}

type statusSummary struct {
	uid     string
	deleted bool
}

type refusal struct {
	uid    string
	gen    int64
	reason string
}

type rawEvent struct {
	node    string
	payload []byte
}

// New makes the controller and registers its informers and handlers with o.Factory; call it
// before the factory starts.
func New(o Options) (*Controller, error) {
	switch {
	case o.Kube == nil:
		return nil, errors.New("pods controller: no Kubernetes client")
	case o.Factory == nil:
		return nil, errors.New("pods controller: no informer factory")
	case o.Broker == nil:
		return nil, errors.New("pods controller: no MQTT broker connection")
	case o.Served == nil:
		return nil, errors.New("pods controller: no Served function")
	case o.Topics.Prefix() == "":
		return nil, errors.New("pods controller: no topics (use protocol.NewTopics)")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = prom.NewRegistry()
	}
	if o.MaxPayload <= 0 {
		o.MaxPayload = protocol.DefaultMaxPayload
	}
	if o.NodeWorkers <= 0 {
		o.NodeWorkers = DefaultNodeWorkers
	}
	if o.StatusWorkers <= 0 {
		o.StatusWorkers = DefaultStatusWorkers
	}
	if o.Debounce <= 0 {
		o.Debounce = DefaultDebounce
	}
	if o.PublishBurst <= 0 {
		o.PublishBurst = DefaultPublishBurst
	}
	if o.EventQPS <= 0 {
		o.EventQPS = DefaultEventQPS
	}
	if o.EventBurst <= 0 {
		o.EventBurst = DefaultEventBurst
	}
	if o.EventQueue <= 0 {
		o.EventQueue = DefaultEventQueue
	}
	c := &Controller{
		o:          o,
		log:        o.Log.With("controller", "pods"),
		eventLimit: flowcontrol.NewTokenBucketRateLimiter(o.EventQPS, o.EventBurst),
		events:     make(chan rawEvent, o.EventQueue),
		nodes:      map[string]*nodeState{},
		acks:       map[string][]byte{},
		resync:     map[string]map[string]bool{},
		pending:    map[string]statusMsg{},
		summary:    map[string]statusSummary{},
		refusals:   map[string]refusal{},
		known:      map[string]bool{},
		restatus:   map[string]bool{},
		statusSeq:  map[string]uint64{},
	}
	if !o.NoServiceAccountTokens {
		c.tokens = newTokens(o.Kube, o.TokenMaxAge)
	}
	// Only pods bound to a node matter; the field selector keeps the scheduler's backlog of
	// pending pods out of the bridge's memory.
	c.pods = o.Factory.InformerFor(&v1.Pod{}, func(k kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredPodInformer(k, metav1.NamespaceAll, resync,
			cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
			func(lo *metav1.ListOptions) { lo.FieldSelector = "spec.nodeName!=" })
	})
	if err := c.pods.AddIndexers(cache.Indexers{
		byNode:      indexByNode,
		byConfigMap: indexByRef("ConfigMap"),
		bySecret:    indexByRef("Secret"),
	}); err != nil {
		return nil, fmt.Errorf("pods controller: pod informer indexers: %w", err)
	}
	c.podLister = corelisters.NewPodLister(c.pods.GetIndexer())
	cms := o.Factory.Core().V1().ConfigMaps()
	secs := o.Factory.Core().V1().Secrets()
	c.cmLister, c.secLister = cms.Lister(), secs.Lister()
	nodes := o.Factory.Core().V1().Nodes()
	c.nodeLister = nodes.Lister()
	if _, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.sealingKeyChanged(nil, obj) },
		UpdateFunc: func(old, obj any) { c.nodeChanged(old, obj); c.sealingKeyChanged(old, obj) },
	}); err != nil {
		return nil, fmt.Errorf("pods controller: node handler: %w", err)
	}
	// kubelet waits for its Services to be listed before it starts a container of an API pod, so
	// that KUBERNETES_SERVICE_HOST is never missing; the bridge sends no pod before it has them.
	svcs := o.Factory.Core().V1().Services()
	c.svcLister = svcs.Lister()
	if _, err := svcs.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.serviceChanged(nil, obj) },
		UpdateFunc: c.serviceChanged,
		DeleteFunc: func(obj any) { c.serviceChanged(nil, obj) },
	}); err != nil {
		return nil, fmt.Errorf("pods controller: service handler: %w", err)
	}
	c.hasSynced = []cache.InformerSynced{c.pods.HasSynced, cms.Informer().HasSynced, secs.Informer().HasSynced,
		nodes.Informer().HasSynced, svcs.Informer().HasSynced}

	if _, err := c.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.podChanged(nil, obj) },
		UpdateFunc: c.podChanged,
		DeleteFunc: func(obj any) { c.podChanged(obj, nil) },
	}); err != nil {
		return nil, fmt.Errorf("pods controller: pod handler: %w", err)
	}
	refHandler := func(index string) cache.ResourceEventHandler {
		return cache.ResourceEventHandlerFuncs{
			AddFunc: func(obj any) { c.refChanged(index, nil, obj) },
			UpdateFunc: func(old, obj any) {
				c.refChanged(index, old, obj)
			},
			DeleteFunc: func(obj any) { c.refChanged(index, nil, obj) },
		}
	}
	if _, err := cms.Informer().AddEventHandler(refHandler(byConfigMap)); err != nil {
		return nil, fmt.Errorf("pods controller: configMap handler: %w", err)
	}
	if _, err := secs.Informer().AddEventHandler(refHandler(bySecret)); err != nil {
		return nil, fmt.Errorf("pods controller: secret handler: %w", err)
	}
	c.m = newMetrics(o.Metrics, c)
	return c, nil
}

func indexByNode(obj any) ([]string, error) {
	p, ok := obj.(*v1.Pod)
	if !ok || p.Spec.NodeName == "" {
		return nil, nil
	}
	return []string{p.Spec.NodeName}, nil
}

func indexByRef(kind string) cache.IndexFunc {
	return func(obj any) ([]string, error) {
		p, ok := obj.(*v1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return nil, nil
		}
		var out []string
		for _, r := range References(&p.Spec) {
			if r.Kind == kind {
				out = append(out, p.Namespace+"/"+r.Name)
			}
		}
		return out, nil
	}
}

func podOf(obj any) *v1.Pod {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, _ := obj.(*v1.Pod)
	return p
}

// podChanged queues the nodes of a pod whose desired form may have changed. A status write
// (the bridge's own, mostly) changes nothing that is sent, so it queues nothing.
func (c *Controller) podChanged(oldObj, newObj any) {
	old, cur := podOf(oldObj), podOf(newObj)
	if old != nil && cur != nil && old.UID == cur.UID && old.Spec.NodeName == cur.Spec.NodeName &&
		old.Generation == cur.Generation &&
		apiequality.Semantic.DeepEqual(old.DeletionTimestamp, cur.DeletionTimestamp) &&
		apiequality.Semantic.DeepEqual(old.DeletionGracePeriodSeconds, cur.DeletionGracePeriodSeconds) &&
		apiequality.Semantic.DeepEqual(old.Labels, cur.Labels) &&
		apiequality.Semantic.DeepEqual(old.Annotations, cur.Annotations) &&
		apiequality.Semantic.DeepEqual(old.Spec, cur.Spec) {
		return
	}
	for _, p := range []*v1.Pod{old, cur} {
		if p != nil && p.Spec.NodeName != "" {
			c.queueNode(p.Spec.NodeName)
		}
	}
	if old != nil && cur == nil && old.Spec.NodeName != "" {
		// The pod left the API: what its node said about it is no longer needed.
		topic := c.o.Topics.PodStatus(old.Spec.NodeName, old.Namespace, old.Name)
		c.mu.Lock()
		delete(c.summary, topic)
		delete(c.refusals, topic)
		c.mu.Unlock()
	}
}

// nodeChanged catches a served Node whose Ready condition turns True again: the node is back. While
// it was away the node lifecycle controller marked its pods not Ready in the API, and the node,
// whose pods kept running unchanged, has no new status to send (statuses go out when they change),
// so the API would keep them not Ready. kubelet's status manager mends such drift by comparing its
// statuses with the API's; the bridge writes the node's retained statuses again, and writeStatus
// writes only those that differ from the API's.
func (c *Controller) nodeChanged(oldObj, newObj any) {
	old, okOld := oldObj.(*v1.Node)
	cur, okCur := newObj.(*v1.Node)
	if !okOld || !okCur || nodeReady(old) || !nodeReady(cur) || !c.o.Served(cur.Name) {
		return
	}
	c.mu.Lock()
	c.restatus[cur.Name] = true
	c.mu.Unlock()
	c.queueNode(cur.Name)
}

// sealingKeyChanged queues a node whose sealing key appeared or changed: its Secrets go out (again)
// sealed to it. A change of how the node takes deletions (an agent upgraded or downgraded) queues
// it too: its pods being deleted go out in the form it takes (gracefulDeletion).
func (c *Controller) sealingKeyChanged(oldObj, newObj any) {
	cur, ok := newObj.(*v1.Node)
	if !ok || !c.o.Served(cur.Name) {
		return
	}
	if old, ok := oldObj.(*v1.Node); ok && old.Annotations[protocol.AnnotationPodDeletion] != cur.Annotations[protocol.AnnotationPodDeletion] {
		c.queueNode(cur.Name)
		return
	}
	key := cur.Annotations[sealing.AnnotationKey]
	if old, ok := oldObj.(*v1.Node); ok && old.Annotations[sealing.AnnotationKey] == key &&
		old.Annotations[sealing.AttestationKey] == cur.Annotations[sealing.AttestationKey] {
		return
	}
	if key != "" {
		c.queueNode(cur.Name)
	}
}

func nodeReady(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// rereadStatuses reads the node's retained pod statuses from the broker and handles them as if
// they had just arrived. When a status of the node arrived while the broker was read, the read may
// be older than it: the node is marked again for its next sync. A read that stays short of the
// node's status summary is handled for what it holds and marked again too (errShortRead): the
// statuses it lacks are read at a later sync, never taken for gone.
func (c *Controller) rereadStatuses(ctx context.Context, node string) error {
	c.mu.Lock()
	seq := c.statusSeq[node]
	c.mu.Unlock()
	msgs, whole, err := c.readStatuses(ctx, node)
	if err != nil {
		c.mu.Lock()
		c.restatus[node] = true
		c.mu.Unlock()
		return err
	}
	c.mu.Lock()
	if c.statusSeq[node] != seq {
		c.restatus[node] = true
		c.mu.Unlock()
		c.queueNode(node)
		return nil
	}
	if !whole {
		c.restatus[node] = true
	}
	c.mu.Unlock()
	for topic, payload := range msgs {
		t, err := c.o.Topics.Parse(topic)
		if err != nil || t.Class != protocol.ClassPodStatus || t.Node != node {
			continue
		}
		c.Handle(t, payload)
	}
	if !whole {
		return fmt.Errorf("node %s: re-read its retained pod statuses: %w", node, errShortRead)
	}
	return nil
}

// refChanged queues the nodes of the pods that reference a changed configMap or secret.
func (c *Controller) refChanged(index string, oldObj, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, err := meta(obj)
	if err != nil {
		return
	}
	if oldObj != nil {
		if om, err := meta(oldObj); err == nil && om.GetResourceVersion() == m.GetResourceVersion() {
			return // a resync of the informer: nothing changed
		}
	}
	pods, err := c.pods.GetIndexer().ByIndex(index, m.GetNamespace()+"/"+m.GetName())
	if err != nil {
		return
	}
	seen := map[string]bool{}
	for _, o := range pods {
		if p := podOf(o); p != nil && !seen[p.Spec.NodeName] {
			seen[p.Spec.NodeName] = true
			c.queueNode(p.Spec.NodeName)
		}
	}
}

func meta(obj any) (metav1.Object, error) {
	switch o := obj.(type) {
	case *v1.ConfigMap:
		return o, nil
	case *v1.Secret:
		return o, nil
	}
	return nil, fmt.Errorf("unexpected %T", obj)
}

// queueNode schedules a sync of node after the debounce delay; changes arriving meanwhile join it.
func (c *Controller) queueNode(node string) {
	c.mu.Lock()
	c.known[node] = true // Run queues it if it is not running yet
	q := c.nodeQ
	c.mu.Unlock()
	if q != nil {
		q.AddAfter(node, c.o.Debounce)
	}
}

func (c *Controller) queueStatus(topic string) {
	c.mu.Lock()
	q := c.statusQ
	c.mu.Unlock()
	if q != nil {
		q.Add(topic)
	}
}

// NodePods returns the pods bound to node, from the informer cache (the kubelet API's /pods).
func (c *Controller) NodePods(node string) []*v1.Pod {
	objs, err := c.pods.GetIndexer().ByIndex(byNode, node)
	if err != nil {
		return nil
	}
	out := make([]*v1.Pod, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*v1.Pod); ok {
			out = append(out, p)
		}
	}
	return out
}

// NodeServed tells the controller that node became served: its desired set is published (and
// whatever retained state the API no longer wants is deleted).
func (c *Controller) NodeServed(node string) {
	if protocol.ValidateNodeName(node) != nil {
		return
	}
	c.queueNode(node)
}

// Reconnected tells the controller that the broker connection was re-established: every node's
// retained state is read again before the next write, since another writer (a previous leader)
// may have written meanwhile, or the broker may have lost state.
func (c *Controller) Reconnected() {
	c.mu.Lock()
	nodes := make([]string, 0, len(c.known))
	for n := range c.known {
		nodes = append(nodes, n)
	}
	clear(c.nodes)
	c.mu.Unlock()
	for _, n := range nodes {
		c.queueNode(n)
	}
}

// Handle takes one uplink message of a node (pod status, acks, resync request, event), parsed by
// the caller with Topics.Parse. It never blocks: the message is recorded (the latest per topic,
// for the retained classes) and the work is queued. Other classes are ignored.
func (c *Controller) Handle(t protocol.Topic, payload []byte) {
	if len(payload) == 0 {
		return // a cleared retained topic: no news
	}
	if len(payload) > c.o.MaxPayload {
		c.refuse(t, "too-large", fmt.Errorf("%d bytes, the limit is %d", len(payload), c.o.MaxPayload))
		return
	}
	switch t.Class {
	case protocol.ClassPodStatus:
		topic := c.o.Topics.PodStatus(t.Node, t.Namespace, t.Name)
		c.mu.Lock()
		c.pending[topic] = statusMsg{node: t.Node, namespace: t.Namespace, name: t.Name, payload: payload}
		c.statusSeq[t.Node]++
		c.mu.Unlock()
		c.queueStatus(topic)
	case protocol.ClassAcks:
		c.mu.Lock()
		c.acks[t.Node] = payload
		c.mu.Unlock()
		c.queueNode(t.Node)
	case protocol.ClassResync:
		r, err := protocol.DecodeResync(payload, c.o.MaxPayload)
		if err == nil && r.Node != t.Node {
			err = fmt.Errorf("payload is for node %q", r.Node)
		}
		if err != nil {
			c.refuse(t, "invalid", err)
			return
		}
		c.mu.Lock()
		keys := c.resync[t.Node]
		if keys == nil {
			keys = map[string]bool{}
			c.resync[t.Node] = keys
		}
		for _, k := range r.Missing {
			keys[k] = true
		}
		// A resync also means the node's view may differ from this bridge's: read again.
		if _, ok := c.nodes[t.Node]; ok {
			c.nodes[t.Node] = nil
		}
		c.mu.Unlock()
		c.queueNode(t.Node)
	case protocol.ClassEvents:
		select {
		case c.events <- rawEvent{node: t.Node, payload: payload}:
		default:
			c.m.eventsDropped.Inc()
		}
	}
}

// refuse counts and logs a message that is not acted on. Payloads are never logged: a status
// could quote a secret-derived env value.
func (c *Controller) refuse(t protocol.Topic, reason string, err error) {
	c.m.refused.With(string(t.Class), reason).Inc()
	level := slog.LevelWarn
	if reason == "uid" {
		// The retained status of an earlier pod of the same name (a recreated pod): expected
		// until the node reports the new one.
		level = slog.LevelDebug
	}
	c.log.Log(context.Background(), level, "refused a message from a node", "node", t.Node, "class", t.Class,
		"namespace", t.Namespace, "name", t.Name, "reason", reason, "err", err)
}

// Run works until ctx ends: it starts the factory's informers, waits for them to sync, and only
// then reads the nodes' retained state and writes; a restarted bridge therefore never writes an
// index that omits a pod the API still wants. Run may be called again after it returned (a
// regained leadership): the retained state is read afresh.
func (c *Controller) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.running {
		c.mu.Unlock()
		return errors.New("pods controller: already running")
	}
	c.running = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.running = false
		c.mu.Unlock()
	}()

	c.o.Factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), c.hasSynced...) {
		return fmt.Errorf("pods controller: informers did not sync: %w", ctx.Err())
	}
	// Per-item back-off only: client-go's default limiter adds one bucket shared by every key
	// (10/s after a burst of 100), so a fleet whose first syncs failed together (the broker not
	// yet connected) would be retried at 10 nodes a second, one node's failures delaying all.
	nodeQ := workqueue.NewTypedRateLimitingQueueWithConfig(retryLimiter(),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "bridge-pods-nodes"})
	statusQ := workqueue.NewTypedRateLimitingQueueWithConfig(retryLimiter(),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "bridge-pods-status"})
	c.mu.Lock()
	c.nodeQ, c.statusQ = nodeQ, statusQ
	clear(c.nodes) // what an earlier leadership knew may be stale
	nodes := map[string]bool{}
	for n := range c.known {
		nodes[n] = true
	}
	var topics []string
	for t := range c.pending {
		topics = append(topics, t)
	}
	c.mu.Unlock()
	bound := c.pods.GetIndexer().ListIndexFuncValues(byNode)
	c.mu.Lock()
	for _, n := range bound {
		nodes[n] = true
		c.known[n] = true // so that Reconnected queues it again too
	}
	c.mu.Unlock()
	for n := range nodes {
		nodeQ.Add(n)
	}
	for _, t := range topics {
		statusQ.Add(t)
	}

	var wg sync.WaitGroup
	for range c.o.NodeWorkers {
		wg.Go(func() { c.work(ctx, nodeQ, c.syncNode, "node") })
	}
	for range c.o.StatusWorkers {
		wg.Go(func() { c.work(ctx, statusQ, c.syncStatus, "status") })
	}
	wg.Go(func() { c.runEvents(ctx) })
	if c.tokens != nil {
		wg.Go(func() { c.renewTokens(ctx) })
	}
	<-ctx.Done()
	nodeQ.ShutDown()
	statusQ.ShutDown()
	wg.Wait()
	c.mu.Lock()
	c.nodeQ, c.statusQ = nil, nil
	c.mu.Unlock()
	return nil
}

// renewTokens syncs again every node holding a token due for renewal, until ctx ends.
func (c *Controller) renewTokens(ctx context.Context) {
	t := time.NewTicker(c.tokens.checkEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, node := range c.tokens.due(now) {
				c.queueNode(node)
			}
		}
	}
}

// work takes keys from q until it shuts down; a failed key is retried with back-off.
func (c *Controller) work(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], sync func(context.Context, string) error, what string) {
	for {
		key, quit := q.Get()
		if quit {
			return
		}
		err := sync(ctx, key)
		if c.synced != nil {
			c.synced(what, key, err)
		}
		switch {
		case err == nil:
			q.Forget(key)
		case ctx.Err() != nil:
			q.Forget(key)
		default:
			c.log.Warn("sync failed; retrying", "what", what, "key", key, "retries", q.NumRequeues(key), "err", err)
			q.AddRateLimited(key)
		}
		q.Done(key)
	}
}

// retryLimiter backs a failing key off on its own: 100 ms doubling to 30 s.
func retryLimiter() workqueue.TypedRateLimiter[string] {
	return workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 30*time.Second)
}
