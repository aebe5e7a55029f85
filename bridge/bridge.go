// Package bridge wires mqlet-bridge together: the Kubernetes client and shared informers, leader
// election over a coordination Lease, the MQTT connection (bridge/mq), the nodes controller
// (bridge/nodes), the pods part (plugged in through Options.Pods), and the /metrics, /healthz and
// /readyz endpoint.
//
// Only the leader connects to MQTT, starts informers and writes anything. A replica that loses the
// leader Lease stops everything and Run returns an error, so the process exits non-zero and its
// Deployment starts it again as a fresh standby: one leadership term per process keeps every
// cache and counter honest.
package bridge

import (
	"context"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mqlet/mqlet/bridge/kubeletapi"
	"github.com/mqlet/mqlet/bridge/mq"
	"github.com/mqlet/mqlet/bridge/nodes"
	"github.com/mqlet/mqlet/bridge/streams"
	"github.com/mqlet/mqlet/core/prom"
	"github.com/mqlet/mqlet/sync/logsclient"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Defaults of Options.
const (
	LeaderLeaseName          = "mqlet-bridge"
	DefaultLeaderNamespace   = "kube-system"
	DefaultKubeAPIQPS        = 200
	DefaultKubeAPIBurst      = 400
	DefaultMetricsAddr       = "127.0.0.1:10360"
	DefaultLeaseDuration     = 15 * time.Second // the leader Lease (not the node Leases)
	DefaultRenewDeadline     = 10 * time.Second
	DefaultRetryPeriod       = 2 * time.Second
	serviceAccountNamespace  = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
	defaultNodeSelectorLabel = nodes.DefaultRoleLabel
)

// Options configure New. Zero values take the defaults above (and those of bridge/mq and
// bridge/nodes).
type Options struct {
	// Kubeconfig is a kubeconfig file; empty means the in-cluster config (the pod's service
	// account).
	Kubeconfig string
	// Kube, when set, is the client to use instead of one made from Kubeconfig (tests).
	Kube         kubernetes.Interface
	KubeAPIQPS   float32
	KubeAPIBurst int

	// LeaderElect turns leader election on (two replicas run safely); without it this process acts
	// as the leader at once.
	LeaderElect bool
	// LeaderElectNamespace holds the leader Lease (named LeaderLeaseName); default: the pod's
	// namespace (POD_NAMESPACE, else the service account's), else kube-system.
	LeaderElectNamespace string
	// Identity names this replica in the leader Lease; default hostname_<random>.
	Identity                                  string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	// MQTT is the broker connection; its Handler, Metrics and Log are set by New.
	MQTT mq.Options

	// NodeSelector picks the Nodes the bridge serves (a label selector; default: the role label
	// exists). RoleLabel is added to every Node the bridge registers (default
	// node-role.kubernetes.io/edge); NoRoleLabel adds none.
	NodeSelector string
	RoleLabel    string
	NoRoleLabel  bool
	// Node Lease and status timing (defaults of bridge/nodes: 10s, 40s, 5m).
	NodeLeaseRenewInterval    time.Duration
	NodeLeaseDuration         time.Duration
	NodeStatusReportFrequency time.Duration

	// MetricsAddr serves /metrics, /healthz and /readyz; default DefaultMetricsAddr. "-" serves
	// nothing.
	MetricsAddr string
	Version     string
	Log         *slog.Logger

	// Kubelet, when set, serves the kubelet API of every served node (bridge/kubeletapi).
	Kubelet *KubeletOptions

	// Pods, when set, builds the pods part (bridge/pods) from the bridge's clients. It is called
	// once by New, before any informer starts, so the part can register informer handlers.
	Pods func(Deps) (*Part, error)
}

// KubeletOptions configure the kubelet API the bridge serves for its nodes.
type KubeletOptions struct {
	// Address is the IP the API server reaches the bridge on; Ports the per-node port pool
	// (kubeletapi.ParsePorts).
	Address string
	Ports   []int32
	// CertFile/KeyFile: the serving certificate (empty: self-signed); ClientCAFile: the CA of the
	// client certificates to accept (the API server's kubelet client certificate).
	CertFile, KeyFile, ClientCAFile string
	// SigningKey signs the logs requests sent to the nodes (nil: unsigned).
	SigningKey ed25519.PrivateKey
	// NodeTrust, when set, holds the fleet's CA: exec sessions agree their keys only with a node
	// sealing key the node's certificate vouches for (as Secrets are sealed).
	NodeTrust *sealing.NodeTrust
	// Streamer serves exec, attach and portForward; nil: bridge/streams, sessions over MQTT.
	Streamer kubeletapi.Streamer
}

// Deps is what the pods part gets to work with. Nothing in it is running yet when Options.Pods is
// called; Conn connects and Informers start once this replica leads.
type Deps struct {
	Kube      kubernetes.Interface
	Informers informers.SharedInformerFactory
	Conn      *mq.Conn
	Nodes     *nodes.Controller // Served(node), Online(node)
	Topics    protocol.Topics
	Metrics   *prom.Registry
	Log       *slog.Logger
}

// Part is a piece of the bridge beside the nodes controller (the pods part).
type Part struct {
	// PodHandler takes the status/pods, acks, resync and events messages of every node. It is
	// called on the MQTT connection's shard goroutines (a node's messages in order): it must not
	// block for long.
	PodHandler func(t protocol.Topic, payload []byte)
	// OnServed is called when a node becomes served (see nodes.Options.OnServed), on the Node
	// informer's goroutine: it must be quick.
	OnServed func(node string)
	// NodePods, when set, returns the pods bound to a node (the kubelet API's /pods).
	NodePods func(node string) []*v1.Pod
	// Run runs the part until ctx ends (after the informers synced and while the MQTT connection
	// runs). An error stops the bridge.
	Run func(ctx context.Context) error
}

// Bridge is a configured bridge; Run runs it.
type Bridge struct {
	o         Options
	log       *slog.Logger
	kube      kubernetes.Interface
	informers informers.SharedInformerFactory
	conn      *mq.Conn
	nodes     *nodes.Controller
	part      *Part
	kubelet   *kubeletapi.Server
	reg       *prom.Registry
	identity  string
	namespace string

	leading  atomic.Bool
	leader   atomic.Value // string: the current leader's identity
	informed atomic.Bool  // informers synced
}

// New checks o, builds the clients and controllers and calls o.Pods; nothing connects yet.
func New(o Options) (*Bridge, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.KubeAPIQPS <= 0 {
		o.KubeAPIQPS = DefaultKubeAPIQPS
	}
	if o.KubeAPIBurst <= 0 {
		o.KubeAPIBurst = DefaultKubeAPIBurst
	}
	if o.MetricsAddr == "" {
		o.MetricsAddr = DefaultMetricsAddr
	}
	if o.LeaseDuration <= 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.RenewDeadline <= 0 {
		o.RenewDeadline = DefaultRenewDeadline
	}
	if o.RetryPeriod <= 0 {
		o.RetryPeriod = DefaultRetryPeriod
	}
	if o.NodeSelector == "" {
		o.NodeSelector = defaultNodeSelectorLabel
	}
	sel, err := labels.Parse(o.NodeSelector)
	if err != nil {
		return nil, fmt.Errorf("node selector %q: %w", o.NodeSelector, err)
	}
	b := &Bridge{o: o, log: o.Log, reg: prom.NewRegistry()}
	b.leader.Store("")

	if b.kube = o.Kube; b.kube == nil {
		cfg, err := restConfig(o.Kubeconfig)
		if err != nil {
			return nil, err
		}
		cfg.QPS, cfg.Burst = o.KubeAPIQPS, o.KubeAPIBurst
		cfg.UserAgent = "mqlet-bridge/" + o.Version
		// Protobuf for the built-in types the bridge reads and writes: cheaper to encode and
		// decode than JSON at 100 Lease updates a second.
		cfg.ContentType = "application/vnd.kubernetes.protobuf"
		cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
		if b.kube, err = kubernetes.NewForConfig(cfg); err != nil {
			return nil, fmt.Errorf("kubernetes client: %w", err)
		}
	}
	b.informers = informers.NewSharedInformerFactory(b.kube, 0)

	b.identity = o.Identity
	if b.identity == "" {
		host, _ := os.Hostname()
		b.identity = host + "_" + randomHex(4)
	}
	b.namespace = o.LeaderElectNamespace
	if b.namespace == "" {
		b.namespace = podNamespace()
	}

	var served func(string) // set once the part exists, before anything runs
	var ports *kubeletapi.Ports
	if o.Kubelet != nil {
		// Built before the nodes controller, which writes each node's endpoint; it reads the
		// served Nodes from the informer cache only (the durable record of the ports).
		lister := b.informers.Core().V1().Nodes().Lister()
		if ports, err = kubeletapi.NewPorts(o.Kubelet.Address, o.Kubelet.Ports, func() []*v1.Node {
			ns, _ := lister.List(sel)
			return ns
		}); err != nil {
			return nil, err
		}
		// A port is given back when its Node is deleted or stops matching the selector; not
		// when it is merely missing from the cache, as a Node just created is for a moment.
		release := func(obj any) {
			if n, ok := obj.(*v1.Node); ok {
				ports.Release(n.Name)
			} else if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				if n, ok := d.Obj.(*v1.Node); ok {
					ports.Release(n.Name)
				}
			}
		}
		if _, err := b.informers.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			DeleteFunc: release,
			UpdateFunc: func(_, obj any) {
				if n, ok := obj.(*v1.Node); ok && !sel.Matches(labels.Set(n.Labels)) {
					release(n)
				}
			},
		}); err != nil {
			return nil, fmt.Errorf("kubelet API: node informer: %w", err)
		}
	}
	mo := o.MQTT
	mo.Log = o.Log.With("component", "mqtt")
	mo.Metrics = b.reg
	mo.Handler = b.route
	if b.conn, err = mq.New(mo); err != nil {
		return nil, err
	}
	no := nodes.Options{
		Kube:                  b.kube,
		Informers:             b.informers,
		Selector:              sel,
		RoleLabel:             o.RoleLabel,
		NoRoleLabel:           o.NoRoleLabel,
		LeaseDuration:         o.NodeLeaseDuration,
		RenewInterval:         o.NodeLeaseRenewInterval,
		StatusReportFrequency: o.NodeStatusReportFrequency,
		Connected:             b.conn.Connected,
		OnServed: func(node string) {
			if served != nil {
				served(node)
			}
		},
		Log:     o.Log.With("component", "nodes"),
		Metrics: b.reg,
	}
	if ports != nil {
		no.KubeletEndpoint = ports.Endpoint
	}
	b.nodes, err = nodes.New(no)
	if err != nil {
		return nil, err
	}
	if o.Pods != nil {
		b.part, err = o.Pods(Deps{Kube: b.kube, Informers: b.informers, Conn: b.conn, Nodes: b.nodes,
			Topics: b.conn.Topics(), Metrics: b.reg, Log: o.Log.With("component", "pods")})
		if err != nil {
			return nil, fmt.Errorf("pods: %w", err)
		}
		if b.part != nil {
			served = b.part.OnServed
		}
	}
	if ports != nil {
		var nodePods func(string) []*v1.Pod
		if b.part != nil {
			nodePods = b.part.NodePods
		}
		timeout := o.MQTT.Timeout
		if timeout <= 0 {
			timeout = mq.DefaultTimeout
		}
		requests, topics, key := b.conn.Requests(), b.conn.Topics(), o.Kubelet.SigningKey
		streamer := o.Kubelet.Streamer
		if streamer == nil {
			nodeLister, trust := b.informers.Core().V1().Nodes().Lister(), o.Kubelet.NodeTrust
			streamer = streams.New(streams.Options{Transport: requests, Topics: topics, SigningKey: key,
				NodeKey: func(node string) (*ecdh.PublicKey, error) {
					n, err := nodeLister.Get(node)
					if err != nil {
						return nil, fmt.Errorf("its sealing key is unknown (no API Node: %w)", err)
					}
					return trust.NodeKey(n, time.Now())
				},
				Log: o.Log.With("component", "kubelet-api")})
		}
		b.kubelet, err = kubeletapi.New(kubeletapi.Options{
			Ports: ports, CertFile: o.Kubelet.CertFile, KeyFile: o.Kubelet.KeyFile, ClientCAFile: o.Kubelet.ClientCAFile,
			Kube: b.kube, Nodes: b.nodes, NodePods: nodePods, Streamer: streamer,
			Logs: func(ctx context.Context, node string, req protocol.LogsRequest, w io.Writer) error {
				return logsclient.Stream(ctx, requests, logsclient.Options{Topics: topics, Timeout: timeout,
					SigningKey: key, IDPrefix: "bridge-"}, node, req, w)
			},
			Usage: func(ctx context.Context, node string) (*protocol.Usage, error) {
				return logsclient.Usage(ctx, requests, logsclient.Options{Topics: topics, Timeout: timeout,
					SigningKey: key, IDPrefix: "bridge-"}, node)
			},
			Log: o.Log.With("component", "kubelet-api"),
		})
		if err != nil {
			return nil, err
		}
	}
	b.registerMetrics()
	return b, nil
}

// route hands each uplink message to its controller: liveness and node status to nodes, the rest
// (pod status, acks, resync, events) to the pods part.
func (b *Bridge) route(m mq.Message) {
	switch m.Topic.Class {
	case protocol.ClassLiveness, protocol.ClassNodeStatus:
		b.nodes.HandleMessage(m)
	default:
		if b.part != nil && b.part.PodHandler != nil {
			b.part.PodHandler(m.Topic, m.Payload)
		}
	}
}

func (b *Bridge) registerMetrics() {
	prom.RegisterProcess(b.reg, "/proc")
	b.reg.GaugeVec("bridge_build_info", "The bridge's version; always 1.", "version").With(b.o.Version).Set(1)
	b.reg.Func("bridge_leader", "1 while this replica is the leader.", prom.GaugeType, nil, func(emit prom.Emit) {
		emit(b2f(b.leading.Load()))
	})
}

func b2f(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// Kube, Informers, Conn and Nodes expose the bridge's parts (tests, tools).
func (b *Bridge) Kube() kubernetes.Interface                 { return b.kube }
func (b *Bridge) Informers() informers.SharedInformerFactory { return b.informers }
func (b *Bridge) Conn() *mq.Conn                             { return b.conn }
func (b *Bridge) Nodes() *nodes.Controller                   { return b.nodes }
func (b *Bridge) Metrics() *prom.Registry                    { return b.reg }
func (b *Bridge) Identity() string                           { return b.identity }

// Run serves the health endpoint and takes part in leader election until ctx ends (nil) or this
// replica loses the leadership or its work fails (an error: the process must exit non-zero).
func (b *Bridge) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel() // stops the endpoint: before the wait for it
		wg.Wait()
	}()
	if b.o.MetricsAddr != "-" {
		ln, err := prom.Listen(b.o.MetricsAddr)
		if err != nil {
			return err
		}
		wg.Go(func() {
			if err := prom.Serve(ctx, ln, prom.Endpoints(b.reg.Handler(), http.HandlerFunc(b.health)), b.log); err != nil {
				b.log.Error("metrics endpoint failed", "err", err)
			}
		})
	}
	if !b.o.LeaderElect {
		b.log.Info("leader election off: acting as the leader")
		b.leader.Store(b.identity)
		return b.lead(ctx)
	}
	return b.elect(ctx)
}

// elect runs leader election and leads while it holds the Lease.
func (b *Bridge) elect(ctx context.Context) error {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: LeaderLeaseName, Namespace: b.namespace},
		Client:     b.kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: b.identity},
	}
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		leadErr  error
		led      = make(chan struct{})
		started  atomic.Bool
		leadOnce sync.Once
	)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   b.o.LeaseDuration,
		RenewDeadline:   b.o.RenewDeadline,
		RetryPeriod:     b.o.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            LeaderLeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				started.Store(true)
				err := b.lead(lctx)
				leadOnce.Do(func() { leadErr = err; close(led) })
				cancel() // work over (failed, or the Lease lost): give the Lease up and stop
			},
			OnStoppedLeading: func() {
				if started.Load() {
					b.log.Warn("leadership ended", "lease", b.namespace+"/"+LeaderLeaseName, "identity", b.identity)
				}
			},
			OnNewLeader: func(id string) {
				b.leader.Store(id)
				if id != b.identity {
					b.log.Info("standing by", "leader", id, "lease", b.namespace+"/"+LeaderLeaseName)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	b.log.Info("leader election", "lease", b.namespace+"/"+LeaderLeaseName, "identity", b.identity)
	le.Run(ectx)
	if !started.Load() {
		return nil // ctx ended before this replica led
	}
	<-led // the leader's work has stopped: no writes from this process from here on
	switch {
	case leadErr != nil:
		return leadErr
	case ctx.Err() == nil:
		return fmt.Errorf("lost the leader lease %s/%s: stopping (the Deployment restarts this replica as a standby)", b.namespace, LeaderLeaseName)
	}
	return nil
}

// lead runs the leader's work: informers, MQTT, the nodes controller and the pods part, until
// ctx ends or one of them fails.
func (b *Bridge) lead(ctx context.Context) error {
	b.log.Info("leading", "identity", b.identity)
	b.leading.Store(true)
	defer b.leading.Store(false)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	b.informers.Start(ctx.Done())
	defer b.informers.Shutdown()
	for typ, ok := range b.informers.WaitForCacheSync(ctx.Done()) {
		if !ok {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("informer for %v did not sync", typ)
		}
	}
	b.informed.Store(true)
	defer b.informed.Store(false)

	var wg sync.WaitGroup
	run := func(name string, f func(context.Context) error) {
		wg.Go(func() {
			if err := f(ctx); err != nil && ctx.Err() == nil {
				b.log.Error("bridge part failed; stopping", "part", name, "err", err)
				cancel(fmt.Errorf("%s: %w", name, err))
			}
		})
	}
	run("nodes", b.nodes.Run)
	if b.part != nil && b.part.Run != nil {
		run("pods", b.part.Run)
	}
	run("mqtt", b.conn.Run)
	if b.kubelet != nil {
		run("kubelet-api", b.kubelet.Run)
	}
	<-ctx.Done()
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// health answers /healthz (the process serves) and /readyz (a leader is ready when its informers
// synced and MQTT is connected; a standby is ready as a standby, and says so).
func (b *Bridge) health(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if r.URL.Path == "/healthz" {
		fmt.Fprintln(w, "ok")
		return
	}
	if !b.leading.Load() {
		leader := b.leader.Load().(string)
		if leader == "" {
			leader = "not known yet"
		}
		fmt.Fprintf(w, "ready: standby (%s); leader: %s\n", b.identity, leader)
		return
	}
	var missing []string
	if !b.informed.Load() {
		missing = append(missing, "informers not synced")
	}
	if _, ok := b.conn.Connected(); !ok {
		missing = append(missing, "MQTT not connected")
	}
	if len(missing) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: leader (%s): %s\n", b.identity, strings.Join(missing, ", "))
		return
	}
	fmt.Fprintf(w, "ready: leader (%s): informers synced, MQTT connected\n", b.identity)
}

// restConfig loads kubeconfig, or the in-cluster config when it is empty.
func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("no --kubeconfig given and not running in a cluster: %w", err)
	}
	return cfg, nil
}

// podNamespace is the namespace this pod runs in, or DefaultLeaderNamespace outside a pod.
func podNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile(serviceAccountNamespace); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return DefaultLeaderNamespace
}

func randomHex(n int) string {
	p := make([]byte, n)
	rand.Read(p)
	return hex.EncodeToString(p)
}
