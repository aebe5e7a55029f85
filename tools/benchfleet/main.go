// Command benchfleet is `make bench-fleet`: mqlet-bridge holding a simulated fleet on a real
// control plane, all on this machine. It starts a real etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler (internal/kubetest, with Kubernetes' own node
// lifecycle timing), a real mosquitto, mqlet-bridge (as its ServiceAccount with the RBAC of
// configs/bridge, leader election on), then mqlet-fleetsim, and measures:
//
//   - fleet_ready_s: from starting the simulator to every Node Ready in the API;
//   - fleet_pods_running_s: pods bound to the nodes by spec.nodeName, created through the API as
//     fast as it takes them; from the last create's return to every pod Running in the API;
//   - the CPU (utime+stime from /proc/PID/stat) and VmRSS of every process over an idle window
//     once all pods run: bridge_cpu_pct, bridge_rss_mib and the others beside them.
//
// Nodes and pods are followed by informers (watches), never by listing in a loop. Every wait is
// bounded, and every process the run started is stopped by its pid, on success and on failure.
// BENCHMARKS.md ("After issue 13: the fleet") says what each figure means.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/mqlet/mqlet/internal/kubetest"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
)

type config struct {
	fleetsim, bridge, mosquitto, mosquittoConf, rbac string
	nodes, podsPerNode, createWorkers                int
	image                                            string
	readyTimeout, runningTimeout                     time.Duration
	settle, settleMax, idle                          time.Duration
	bridgeFlags, simFlags                            listFlag
	out, keepLogs                                    string
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

const (
	podNamespace    = "fleet-bench"
	bridgeNamespace = "mqlet-system"
	bridgeAccount   = "mqlet-bridge"
)

func main() {
	var c config
	flag.StringVar(&c.fleetsim, "fleetsim", "bin/mqlet-fleetsim", "the fleet simulator's binary (cmd/mqlet-fleetsim)")
	flag.StringVar(&c.bridge, "bridge", "bin/mqlet-bridge", "mqlet-bridge binary")
	flag.StringVar(&c.mosquitto, "mosquitto", "/usr/sbin/mosquitto", "mosquitto binary")
	flag.StringVar(&c.mosquittoConf, "mosquitto-conf", "configs/mosquitto/fleet-sim.conf", "mosquitto config; its `listener 1883 ` line gets a free port")
	flag.StringVar(&c.rbac, "rbac", "configs/bridge/rbac.yaml", "the bridge's ServiceAccount and RBAC, applied before it starts")
	flag.IntVar(&c.nodes, "nodes", 1000, "simulated nodes")
	flag.IntVar(&c.podsPerNode, "pods-per-node", 10, "pods bound to each node")
	flag.IntVar(&c.createWorkers, "create-workers", 32, "concurrent pod creates")
	flag.StringVar(&c.image, "image", "mqlet.test/busybox:1", "the pods' image (the simulated runtime holds every image)")
	flag.DurationVar(&c.readyTimeout, "ready-timeout", 10*time.Minute, "bound on the wait for every Node Ready")
	flag.DurationVar(&c.runningTimeout, "running-timeout", 15*time.Minute, "bound on creating the pods, and again on the wait for every pod Running")
	flag.DurationVar(&c.settle, "settle", 30*time.Second, "least wait after every pod runs before the idle window")
	flag.DurationVar(&c.settleMax, "settle-max", 8*time.Minute, "bound on the wait for the cluster to stop changing Nodes and pods before the idle window")
	flag.DurationVar(&c.idle, "idle", 60*time.Second, "the idle window over which CPU is averaged (at least 60s for the figures)")
	flag.Var(&c.bridgeFlags, "bridge-flag", "extra mqlet-bridge flag, repeatable (e.g. --kube-api-qps=400)")
	flag.Var(&c.simFlags, "sim-flag", "extra mqlet-fleetsim flag, repeatable")
	flag.StringVar(&c.out, "out", "bench/fleet-results.json", "where the figures go")
	flag.StringVar(&c.keepLogs, "keep-logs", "", "keep every log, the cluster's files and the metrics scrapes in this directory (default: a temporary one, removed)")
	flag.Parse()
	if flag.NArg() > 0 {
		fatal(fmt.Errorf("unexpected arguments %q", flag.Args()))
	}
	if c.nodes < 1 || c.podsPerNode < 0 || c.createWorkers < 1 {
		fatal(fmt.Errorf("-nodes %d, -pods-per-node %d, -create-workers %d: want >= 1, >= 0, >= 1", c.nodes, c.podsPerNode, c.createWorkers))
	}
	for _, p := range []*string{&c.fleetsim, &c.bridge, &c.mosquittoConf, &c.rbac, &c.out} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			fatal(err)
		}
		*p = abs
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := os.Remove(c.out); err != nil && !os.IsNotExist(err) {
		fatal(err)
	}
	b := &bench{cfg: c, log: os.Stderr}
	res, runErr := b.run(ctx)
	cleanErr := b.cleanup()
	if runErr != nil {
		fatal(errors.Join(runErr, cleanErr))
	}
	if cleanErr != nil {
		fatal(fmt.Errorf("figures measured, but cleaning up failed: %w", cleanErr))
	}
	if err := writeJSON(c.out, res); err != nil {
		fatal(err)
	}
	res.print(os.Stdout)
	fmt.Printf("\nwrote %s\n", c.out)
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "benchfleet: FAILED: %v\n", err)
	os.Exit(1)
}

type bench struct {
	cfg config
	log io.Writer
	dir string // logs, cluster files, scrapes
	own bool   // dir is temporary: removed at the end

	cluster    *kubetest.Cluster
	admin      kubernetes.Interface
	mosq       *proc
	bridge     *proc
	sim        *proc
	bridgeAddr string
	broker     string // the broker's URL
	stopInf    context.CancelFunc
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "benchfleet %s: "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func (b *bench) path(name string) string { return filepath.Join(b.dir, name) }

// results holds exactly the keys of the results file. Percentages are of one core.
type results struct {
	FleetNodes       int     `json:"fleet_nodes"`
	FleetReadyS      float64 `json:"fleet_ready_s"`
	FleetRegisteredS float64 `json:"fleet_registered_s"` // start -> every Node exists (not yet all Ready)
	// FleetSchedulableS: start -> every Node Ready and without the not-ready taint (the node
	// lifecycle controller's work; -1: not within the run).
	FleetSchedulableS float64 `json:"fleet_schedulable_s"`
	FleetPods         int     `json:"fleet_pods"`
	FleetPodsCreateS  float64 `json:"fleet_pods_create_s"`  // first create sent -> last create returned
	FleetPodsRunningS float64 `json:"fleet_pods_running_s"` // last create returned -> all Running
	PodCreateRetries  int64   `json:"pod_create_retries"`
	SettleS           float64 `json:"settle_s"` // all Running -> the idle window's start
	IdleWindowS       float64 `json:"idle_window_s"`
	BridgeCPUPct      float64 `json:"bridge_cpu_pct"`
	BridgeRSSMiB      float64 `json:"bridge_rss_mib"`
	MosquittoCPUPct   float64 `json:"mosquitto_cpu_pct"`
	MosquittoRSSMiB   float64 `json:"mosquitto_rss_mib"`
	APIServerCPUPct   float64 `json:"kube_apiserver_cpu_pct"`
	APIServerRSSMiB   float64 `json:"kube_apiserver_rss_mib"`
	EtcdCPUPct        float64 `json:"etcd_cpu_pct"`
	EtcdRSSMiB        float64 `json:"etcd_rss_mib"`
	CMCPUPct          float64 `json:"kube_controller_manager_cpu_pct"`
	SchedulerCPUPct   float64 `json:"kube_scheduler_cpu_pct"`
	FleetSimCPUPct    float64 `json:"fleetsim_cpu_pct"`
	FleetSimRSSMiB    float64 `json:"fleetsim_rss_mib"`
	LoadAvg           struct {
		Start, Ready, Running, End string
	} `json:"load_avg"`
	// NodeWriters: the managedFields of one Node at the end (who writes Nodes), and the Node
	// and pod updates the watches saw during the idle window.
	NodeWriters     []string `json:"node_writers"`
	IdleNodeUpdates int64    `json:"idle_node_updates"`
	IdlePodUpdates  int64    `json:"idle_pod_updates"`
	// IdleNodeChanges counts the idle window's Node updates by the parts they changed.
	IdleNodeChanges map[string]int `json:"idle_node_changes"`
	// IdleEvents counts the Events written in the idle window by source and reason.
	IdleEvents map[string]int `json:"idle_events"`
	// Where the time went, per phase: CPU seconds of each process, the bridge's API writes and
	// the apiserver's costliest requests.
	Phases []phase `json:"phases"`
}

type phase struct {
	Name       string             `json:"name"`
	WallS      float64            `json:"wall_s"`
	CPUS       map[string]float64 `json:"cpu_s"` // process -> CPU seconds
	BridgeAPI  []string           `json:"bridge_api_writes,omitempty"`
	APIServer  []string           `json:"apiserver_top_requests,omitempty"`
	Bridge     map[string]float64 `json:"bridge_counters,omitempty"`
	QueueMax   map[string]float64 `json:"bridge_queue_max,omitempty"`
	Throttled  int                `json:"bridge_client_throttle_lines"`
	APIServer4 float64            `json:"apiserver_429s"`
}

func writeJSON(path string, r *results) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func (b *bench) run(ctx context.Context) (*results, error) {
	c := b.cfg
	r := &results{FleetNodes: c.nodes, FleetPods: c.nodes * c.podsPerNode}
	r.LoadAvg.Start = loadAvg()
	if err := raiseFileLimit(2*c.nodes + 4096); err != nil {
		return nil, err
	}
	if c.keepLogs != "" {
		b.dir = c.keepLogs
		if err := os.MkdirAll(b.dir, 0o755); err != nil {
			return nil, err
		}
	} else {
		d, err := os.MkdirTemp("", "benchfleet-")
		if err != nil {
			return nil, err
		}
		b.dir, b.own = d, true
	}
	b.logf("files and logs in %s; load average %s", b.dir, r.LoadAvg.Start)

	// The control plane, with Kubernetes' default node lifecycle timing (5s period, 50s grace).
	if err := os.MkdirAll(b.path("cluster"), 0o700); err != nil {
		return nil, err
	}
	var err error
	b.cluster, err = kubetest.StartCluster(ctx, kubetest.Options{
		Dir: b.path("cluster"), KeepDir: true, KubeNodeTiming: true,
		Logf: func(f string, a ...any) { b.logf(f, a...) },
	})
	if err != nil {
		return nil, err
	}
	cfg := b.cluster.RESTConfig()
	cfg.QPS, cfg.Burst = -1, 0 // the harness's own client: no client-side limit, the apiserver decides
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	b.admin = admin
	if err := applyRBAC(ctx, admin, c.rbac, bridgeNamespace); err != nil {
		return nil, err
	}
	bridgeKubeconfig := b.cluster.ServiceAccountKubeconfig(bridgeNamespace, bridgeAccount)
	if err := b.podNamespace(ctx); err != nil {
		return nil, err
	}

	if b.broker, err = b.startMosquitto(ctx); err != nil {
		return nil, err
	}
	if err := b.startBridge(ctx, bridgeKubeconfig, b.broker); err != nil {
		return nil, err
	}

	// Watches on Nodes and on the bench's pods, synced before the fleet starts.
	registered := newTracker(func(any) bool { return true })
	ready := newTracker(nodeReady)
	schedulable := newTracker(nodeSchedulable)
	running := newTracker(podRunning)
	infCtx, cancel := context.WithCancel(ctx)
	b.stopInf = cancel
	nf := informers.NewSharedInformerFactory(admin, 0)
	pf := informers.NewSharedInformerFactoryWithOptions(admin, 0, informers.WithNamespace(podNamespace))
	ni := nf.Core().V1().Nodes().Informer()
	// Events too: the controller-manager writes its backlog of Node events (RegisteredNode) at
	// its client's rate for minutes after the fleet arrived.
	events := newTracker(func(any) bool { return true })
	if _, err := nf.Core().V1().Events().Informer().AddEventHandler(events.handlers()); err != nil {
		return nil, err
	}
	pi := pf.Core().V1().Pods().Informer()
	if _, err := ni.AddEventHandler(registered.handlers()); err != nil {
		return nil, err
	}
	if _, err := ni.AddEventHandler(ready.handlers()); err != nil {
		return nil, err
	}
	if _, err := ni.AddEventHandler(schedulable.handlers()); err != nil {
		return nil, err
	}
	if _, err := pi.AddEventHandler(running.handlers()); err != nil {
		return nil, err
	}
	nf.Start(infCtx.Done())
	pf.Start(infCtx.Done())
	syncCtx, syncCancel := context.WithTimeout(ctx, time.Minute)
	for typ, ok := range nf.WaitForCacheSync(syncCtx.Done()) {
		if !ok {
			syncCancel()
			return nil, fmt.Errorf("informer for %v did not sync", typ)
		}
	}
	for typ, ok := range pf.WaitForCacheSync(syncCtx.Done()) {
		if !ok {
			syncCancel()
			return nil, fmt.Errorf("informer for %v did not sync", typ)
		}
	}
	syncCancel()

	alive := func() error {
		for _, p := range []*proc{b.mosq, b.bridge, b.sim} {
			if p != nil {
				if err := p.exited(); err != nil {
					return err
				}
			}
		}
		return nil
	}
	queueMax := map[string]float64{}
	progress := func(what string, target int) func(int) {
		return func(n int) {
			s, err := scrapeBridge(ctx, b.bridgeAddr, "")
			q := ""
			if err == nil {
				for _, name := range []string{"nodes", "status", "events"} {
					v := s.sum("mqlet_bridge_queue_depth", "queue", name)
					queueMax[name] = max(queueMax[name], v)
					q += fmt.Sprintf(" %s=%.0f", name, v)
				}
			}
			b.logf("%s: %d of %d; bridge queues:%s; load %s", what, n, target, q, loadAvg())
		}
	}

	// Phase 1: the fleet comes up.
	ph := b.beginPhase(ctx, "fleet start -> all Nodes Ready")
	schedulable.expect(c.nodes)
	t0 := time.Now()
	if err := b.startSim(); err != nil {
		return nil, err
	}
	regAt, err := registered.waitFor(ctx, c.nodes, c.readyTimeout, "every Node registered", progress("nodes registered", c.nodes), alive)
	if err != nil {
		return nil, err
	}
	readyAt, err := ready.waitFor(ctx, c.nodes, c.readyTimeout-time.Since(t0), "every Node Ready", progress("nodes Ready", c.nodes), alive)
	if err != nil {
		return nil, err
	}
	r.FleetRegisteredS = round1(regAt.Sub(t0).Seconds())
	r.FleetReadyS = round1(readyAt.Sub(t0).Seconds())
	r.LoadAvg.Ready = loadAvg()
	b.logf("all %d Nodes Ready %.1f s after the simulator started (all registered at %.1f s); load %s", c.nodes, r.FleetReadyS, r.FleetRegisteredS, r.LoadAvg.Ready)
	r.Phases = append(r.Phases, b.endPhase(ctx, ph, queueMax))
	clear(queueMax)

	// Phase 2: the pods.
	var nodeNames []string
	for _, k := range ready.okNames() {
		nodeNames = append(nodeNames, strings.TrimPrefix(k, "/"))
	}
	pods := make([]*corev1.Pod, 0, r.FleetPods)
	width := len(strconv.Itoa(r.FleetPods - 1))
	for i := range r.FleetPods {
		// Round-robin over the nodes, so the creates spread over the fleet as a Deployment's would.
		pods = append(pods, benchPod(podNamespace, fmt.Sprintf("p-%0*d", width, i), nodeNames[i%len(nodeNames)], c.image))
	}
	ph = b.beginPhase(ctx, "pods: first create -> all Running")
	b.logf("creating %d pods with %d concurrent clients", len(pods), c.createWorkers)
	createStart := time.Now()
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				progress("pods Running (creating)", r.FleetPods)(running.count())
			}
		}
	}()
	lastCreate, retries, err := createPods(ctx, admin, pods, c.createWorkers, c.runningTimeout)
	close(done)
	if err != nil {
		return nil, err
	}
	r.FleetPodsCreateS = round1(lastCreate.Sub(createStart).Seconds())
	r.PodCreateRetries = retries
	b.logf("%d pods created in %.1f s (%.0f/s, %d retries); %d Running so far", len(pods), r.FleetPodsCreateS,
		float64(len(pods))/r.FleetPodsCreateS, retries, running.count())
	runAt, err := running.waitFor(ctx, r.FleetPods, c.runningTimeout, "every pod Running", progress("pods Running", r.FleetPods), alive)
	if err != nil {
		return nil, err
	}
	r.FleetPodsRunningS = round1(max(0, runAt.Sub(lastCreate).Seconds()))
	r.LoadAvg.Running = loadAvg()
	b.logf("all %d pods Running %.1f s after the last create; load %s", r.FleetPods, r.FleetPodsRunningS, r.LoadAvg.Running)
	r.Phases = append(r.Phases, b.endPhase(ctx, ph, queueMax))
	clear(queueMax)

	// Phase 3: idle and online. First the cluster settles: the node lifecycle controller works
	// through the new Nodes at its client's rate (kube-controller-manager's default 20 QPS), so
	// for minutes after a fleet arrives it writes Nodes; that is not the idle fleet's cost.
	b.logf("settling: at least %s, then until no Node, pod or Event changes for %s (at most %s)", c.settle, quietFor, c.settleMax)
	settleStart := time.Now()
	if err := sleep(ctx, c.settle); err != nil {
		return nil, err
	}
	if err := b.quiet(ctx, c.settleMax-c.settle, []*tracker{ready, running, events}, alive); err != nil {
		return nil, err
	}
	r.SettleS = round1(time.Since(settleStart).Seconds())
	if at := schedulable.reachedAt(); !at.IsZero() {
		r.FleetSchedulableS = round1(at.Sub(t0).Seconds())
	} else {
		r.FleetSchedulableS = -1
	}
	b.logf("settled after %.1f s; every Node schedulable %.1f s after the simulator started", r.SettleS, r.FleetSchedulableS)
	ph = b.beginPhase(ctx, "idle window")
	nodeUpd, podUpd := ready.updates.Load(), running.updates.Load()
	// What the Node updates of the idle window change, by part (the first 20 in full in the log dir).
	var diffMu sync.Mutex
	nodeDiffs := map[string]int{}
	var diffLines []string
	record := func(old, obj any) {
		d := changedParts(old, obj)
		_, parts, _ := strings.Cut(d, ": ")
		diffMu.Lock()
		nodeDiffs[parts]++
		if len(diffLines) < 20 {
			diffLines = append(diffLines, d)
		}
		diffMu.Unlock()
	}
	ready.onUpdate.Store(&record)
	if err := sleep(ctx, c.idle); err != nil {
		return nil, err
	}
	if err := alive(); err != nil {
		return nil, err
	}
	if n := ready.count(); n != c.nodes {
		return nil, fmt.Errorf("idle window: %d of %d Nodes Ready at its end (the fleet must stay online)", n, c.nodes)
	}
	if n := running.count(); n != r.FleetPods {
		return nil, fmt.Errorf("idle window: %d of %d pods Running at its end", n, r.FleetPods)
	}
	r.IdleNodeUpdates, r.IdlePodUpdates = ready.updates.Load()-nodeUpd, running.updates.Load()-podUpd
	ready.onUpdate.Store(nil)
	diffMu.Lock()
	r.IdleNodeChanges = maps.Clone(nodeDiffs)
	_ = os.WriteFile(b.path("idle-node-updates.txt"), []byte(strings.Join(diffLines, "\n")+"\n"), 0o644)
	diffMu.Unlock()
	idle := b.endPhase(ctx, ph, queueMax)
	r.IdleEvents = b.eventsSince(ctx, ph.at)
	if n, err := admin.CoreV1().Nodes().Get(ctx, nodeNames[0], metav1.GetOptions{}); err == nil {
		if data, err := json.MarshalIndent(n, "", "  "); err == nil {
			_ = os.WriteFile(b.path("node-"+n.Name+".json"), data, 0o644)
		}
		for _, m := range n.ManagedFields {
			w := m.Manager + " " + string(m.Operation)
			if m.Subresource != "" {
				w += " " + m.Subresource
			}
			if m.Time != nil {
				w += " at " + m.Time.UTC().Format("15:04:05")
			}
			r.NodeWriters = append(r.NodeWriters, w)
		}
	}
	r.Phases = append(r.Phases, idle)
	r.IdleWindowS = round1(idle.WallS)
	pct := func(name string) float64 { return round2(100 * idle.CPUS[name] / idle.WallS) }
	r.BridgeCPUPct, r.MosquittoCPUPct, r.APIServerCPUPct = pct("mqlet-bridge"), pct("mosquitto"), pct(kubetest.APIServer)
	r.EtcdCPUPct, r.CMCPUPct, r.SchedulerCPUPct, r.FleetSimCPUPct = pct(kubetest.Etcd), pct(kubetest.ControllerManager), pct(kubetest.Scheduler), pct("fleet-sim")
	rss := func(pid int) (float64, error) { v, err := rssMiB(pid); return round1(v), err }
	pids := b.pids()
	for _, x := range []struct {
		name string
		dst  *float64
	}{{"mqlet-bridge", &r.BridgeRSSMiB}, {"mosquitto", &r.MosquittoRSSMiB}, {kubetest.APIServer, &r.APIServerRSSMiB},
		{kubetest.Etcd, &r.EtcdRSSMiB}, {"fleet-sim", &r.FleetSimRSSMiB}} {
		if *x.dst, err = rss(pids[x.name]); err != nil {
			return nil, fmt.Errorf("rss of %s: %w", x.name, err)
		}
	}
	r.LoadAvg.End = loadAvg()
	return r, nil
}

// quietFor is how long no Node and no pod may change before the idle window starts.
const quietFor = 10 * time.Second

// quiet waits until the watches have seen no Node or pod update and no new Event for quietFor,
// and the bridge's pod queues are empty.
func (b *bench) quiet(ctx context.Context, timeout time.Duration, ts []*tracker, alive func() error) error {
	deadline := time.Now().Add(timeout)
	changes := func() int64 {
		var n int64
		for _, t := range ts {
			n += t.updates.Load() + int64(t.count())
		}
		return n
	}
	last := changes()
	since := time.Now()
	for {
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
		if err := alive(); err != nil {
			return err
		}
		if n := changes(); n != last {
			last, since = n, time.Now()
		}
		if time.Since(since) >= quietFor {
			s, err := scrapeBridge(ctx, b.bridgeAddr, "")
			if err == nil && s.sum("mqlet_bridge_queue_depth") == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("settling: Nodes, pods or Events still changing after %s (last change %s ago)", timeout, time.Since(since).Round(time.Second))
		}
	}
}

// podNamespace creates the pods' namespace and waits for its default ServiceAccount (made by the
// controller-manager): pods cannot be created before it exists.
func (b *bench) podNamespace(ctx context.Context) error {
	if _, err := b.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: podNamespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", podNamespace, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := b.admin.CoreV1().ServiceAccounts(podNamespace).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the default ServiceAccount of namespace %s did not appear within 1m: %w", podNamespace, err)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

var listenerLine = regexp.MustCompile(`(?m)^listener 1883 `)

func (b *bench) startMosquitto(ctx context.Context) (string, error) {
	conf, err := os.ReadFile(b.cfg.mosquittoConf)
	if err != nil {
		return "", err
	}
	if !listenerLine.Match(conf) {
		return "", fmt.Errorf("%s has no `listener 1883 ` line to move to a free port", b.cfg.mosquittoConf)
	}
	port, err := freePort()
	if err != nil {
		return "", err
	}
	conf = listenerLine.ReplaceAll(conf, []byte("listener "+strconv.Itoa(port)+" "))
	if err := os.WriteFile(b.path("mosquitto.conf"), conf, 0o644); err != nil {
		return "", err
	}
	if b.mosq, err = startProc("mosquitto", b.path("mosquitto.log"), b.cfg.mosquitto, "-c", b.path("mosquitto.conf")); err != nil {
		return "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if err := poll(ctx, 20*time.Second, "mosquitto to accept on "+addr, b.mosq, func() error {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
		}
		return err
	}); err != nil {
		return "", err
	}
	b.logf("mosquitto (pid %d) on %s", b.mosq.pid(), addr)
	return "tcp://" + addr, nil
}

func (b *bench) startBridge(ctx context.Context, kubeconfig, broker string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	b.bridgeAddr = "127.0.0.1:" + strconv.Itoa(port)
	args := append([]string{b.cfg.bridge,
		"--kubeconfig=" + kubeconfig,
		"--mqtt-broker=" + broker,
		"--metrics-addr=" + b.bridgeAddr,
		"--leader-elect-namespace=" + bridgeNamespace,
	}, b.cfg.bridgeFlags...)
	if b.bridge, err = startProc("mqlet-bridge", b.path("mqlet-bridge.log"), args...); err != nil {
		return err
	}
	if err := poll(ctx, time.Minute, "mqlet-bridge /readyz", b.bridge, func() error {
		resp, err := http.Get("http://" + b.bridgeAddr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	}); err != nil {
		return err
	}
	b.logf("mqlet-bridge (pid %d) ready, metrics on %s, flags %q", b.bridge.pid(), b.bridgeAddr, args[1:])
	return nil
}

func (b *bench) startSim() error {
	args := append([]string{b.cfg.fleetsim,
		"--nodes=" + strconv.Itoa(b.cfg.nodes),
		"--pods-per-node=" + strconv.Itoa(b.cfg.podsPerNode),
		"--broker=" + b.broker,
	}, b.cfg.simFlags...)
	var errStart error
	if b.sim, errStart = startProc("fleet-sim", b.path("fleet-sim.log"), args...); errStart != nil {
		return errStart
	}
	b.logf("mqlet fleet-sim (pid %d) started: %q", b.sim.pid(), args[1:])
	return nil
}

// pids of every process measured, by name.
func (b *bench) pids() map[string]int {
	m := b.cluster.PIDs()
	for _, p := range []*proc{b.mosq, b.bridge, b.sim} {
		if p != nil && p.exited() == nil {
			m[p.name] = p.pid()
		}
	}
	return m
}

type phaseStart struct {
	name      string
	at        time.Time
	ticks     map[string]int64
	bridge    series
	apiserver series
	throttled int
}

func (b *bench) beginPhase(ctx context.Context, name string) phaseStart {
	s := phaseStart{name: name, ticks: map[string]int64{}}
	s.bridge, _ = scrapeBridge(ctx, b.bridgeAddr, "")
	s.apiserver, _ = scrapeAPIServer(ctx, b.admin, "")
	s.throttled = countLines(b.path("mqlet-bridge.log"), "client-side throttling")
	for name, pid := range b.pids() {
		if t, err := cpuTicks(pid); err == nil {
			s.ticks[name] = t
		}
	}
	s.at = time.Now()
	return s
}

func (b *bench) endPhase(ctx context.Context, s phaseStart, queueMax map[string]float64) phase {
	p := phase{Name: s.name, CPUS: map[string]float64{}, QueueMax: map[string]float64{}}
	for name, pid := range b.pids() {
		t, err := cpuTicks(pid)
		if err != nil {
			continue
		}
		before, ok := s.ticks[name]
		if !ok {
			before = 0 // started inside the phase (fleet-sim): all its CPU is the phase's
		}
		p.CPUS[name] = round2(float64(t-before) / clockTick)
	}
	p.WallS = time.Since(s.at).Seconds()
	slug := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(s.name))
	if bs, err := scrapeBridge(ctx, b.bridgeAddr, b.path("bridge-metrics-"+slug+".txt")); err == nil && s.bridge != nil {
		d := bs.minus(s.bridge)
		p.BridgeAPI = bridgeWrites(d)
		p.Bridge = map[string]float64{}
		for _, n := range []string{"bridge_node_lease_renewals_total", "bridge_node_lease_errors_total", "bridge_node_registrations_total",
			"bridge_node_status_posts_total", "mqlet_bridge_pod_status_writes_total", "mqlet_bridge_pod_status_conflicts_total",
			"mqlet_bridge_desired_published_total", "mqlet_bridge_index_writes_total", "mqlet_bridge_events_written_total",
			"mqlet_bridge_events_dropped_total", "bridge_mqtt_queue_overflows_total", "bridge_mqtt_resyncs_total"} {
			p.Bridge[n] = d.sum(n)
		}
	}
	if as, err := scrapeAPIServer(ctx, b.admin, b.path("apiserver-metrics-"+slug+".txt")); err == nil && s.apiserver != nil {
		d := as.minus(s.apiserver)
		for i, c := range apiserverCosts(d) {
			if i == 8 {
				break
			}
			p.APIServer = append(p.APIServer, c.String())
		}
		p.APIServer4 = d.sum("apiserver_request_total", "code", "429")
	}
	for k, v := range queueMax {
		p.QueueMax[k] = v
	}
	p.Throttled = countLines(b.path("mqlet-bridge.log"), "client-side throttling") - s.throttled
	p.WallS = round1(p.WallS)
	b.logf("phase %q: %.1f s; CPU s %v; bridge writes %v; apiserver %v; bridge throttle lines %d",
		p.Name, p.WallS, p.CPUS, p.BridgeAPI, p.APIServer, p.Throttled)
	return p
}

// eventsSince counts the Events (all namespaces) by source and reason; those last seen before t
// are marked (before).
func (b *bench) eventsSince(ctx context.Context, t time.Time) map[string]int {
	out := map[string]int{}
	evs, err := b.admin.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		out["list error: "+err.Error()]++
		return out
	}
	for _, e := range evs.Items {
		last := e.LastTimestamp.Time
		if e.EventTime.After(last) {
			last = e.EventTime.Time
		}
		src := e.Source.Component
		if src == "" {
			src = e.ReportingController
		}
		key := src + " " + e.InvolvedObject.Kind + " " + e.Reason
		if last.Before(t.Truncate(time.Second)) {
			key = "(before) " + key
		}
		out[key] += int(max(e.Count, 1))
	}
	return out
}

// cleanup stops every process the run started, by pid, in reverse order, and removes the
// temporary directory.
func (b *bench) cleanup() error {
	var errs []error
	if b.stopInf != nil {
		b.stopInf()
	}
	if b.sim != nil {
		// 1,000 nodes each publish their offline message on the way out.
		errs = append(errs, b.sim.stop(90*time.Second))
	}
	if b.bridge != nil {
		errs = append(errs, b.bridge.stop(30*time.Second))
	}
	if b.mosq != nil {
		errs = append(errs, b.mosq.stop(10*time.Second))
	}
	if b.cluster != nil {
		errs = append(errs, b.cluster.Stop())
	}
	if b.own && b.dir != "" {
		errs = append(errs, os.RemoveAll(b.dir))
	}
	return errors.Join(errs...)
}

func raiseFileLimit(n int) error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return err
	}
	if l.Cur >= uint64(n) {
		return nil
	}
	l.Cur = min(max(uint64(n), l.Cur), l.Max)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return fmt.Errorf("raise the open-files limit to %d: %w", l.Cur, err)
	}
	if l.Cur < uint64(n) {
		return fmt.Errorf("open-files limit: hard limit %d is below the %d the fleet needs (ulimit -Hn)", l.Max, n)
	}
	return nil
}

func poll(ctx context.Context, timeout time.Duration, what string, p *proc, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if perr := p.exited(); perr != nil {
			return fmt.Errorf("waiting for %s: %w", what, perr)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: not within %s (last: %v); log tail (%s):\n%s", what, timeout, err, p.logPath, tail(p.logPath, 20))
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

func round1(f float64) float64 { return float64(int64(f*10+0.5)) / 10 }
func round2(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }

// print writes the figures as name=value lines, then a markdown table for BENCHMARKS.md.
func (r *results) print(w io.Writer) {
	kv := []struct {
		k string
		v any
	}{
		{"fleet_nodes", r.FleetNodes}, {"fleet_ready_s", r.FleetReadyS}, {"fleet_registered_s", r.FleetRegisteredS},
		{"fleet_schedulable_s", r.FleetSchedulableS}, {"fleet_pods", r.FleetPods}, {"fleet_pods_create_s", r.FleetPodsCreateS}, {"fleet_pods_running_s", r.FleetPodsRunningS},
		{"pod_create_retries", r.PodCreateRetries}, {"settle_s", r.SettleS}, {"idle_window_s", r.IdleWindowS},
		{"bridge_cpu_pct", r.BridgeCPUPct}, {"bridge_rss_mib", r.BridgeRSSMiB},
		{"mosquitto_cpu_pct", r.MosquittoCPUPct}, {"mosquitto_rss_mib", r.MosquittoRSSMiB},
		{"kube_apiserver_cpu_pct", r.APIServerCPUPct}, {"kube_apiserver_rss_mib", r.APIServerRSSMiB},
		{"etcd_cpu_pct", r.EtcdCPUPct}, {"etcd_rss_mib", r.EtcdRSSMiB},
		{"kube_controller_manager_cpu_pct", r.CMCPUPct}, {"kube_scheduler_cpu_pct", r.SchedulerCPUPct},
		{"fleetsim_cpu_pct", r.FleetSimCPUPct}, {"fleetsim_rss_mib", r.FleetSimRSSMiB},
		{"load_avg_start", strconv.Quote(r.LoadAvg.Start)}, {"load_avg_ready", strconv.Quote(r.LoadAvg.Ready)},
		{"load_avg_running", strconv.Quote(r.LoadAvg.Running)}, {"load_avg_end", strconv.Quote(r.LoadAvg.End)},
	}
	for _, x := range kv {
		fmt.Fprintf(w, "%s=%v\n", x.k, x.v)
	}
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**missed**"
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 8, 1, ' ', 0)
	fmt.Fprintln(tw, "| figure\t| value\t| target\t|")
	fmt.Fprintln(tw, "|---\t|---\t|---\t|")
	fmt.Fprintf(tw, "| `fleet_nodes`\t| %d\t| 1,000\t|\n", r.FleetNodes)
	fmt.Fprintf(tw, "| `fleet_ready_s`\t| %.1f\t| <= 60: %s\t|\n", r.FleetReadyS, met(r.FleetReadyS <= 60))
	fmt.Fprintf(tw, "| `fleet_schedulable_s`\t| %.1f (no not-ready taint left)\t|\t|\n", r.FleetSchedulableS)
	fmt.Fprintf(tw, "| `fleet_pods_running_s`\t| %.1f (%d pods; created in %.1f s)\t| <= 60: %s\t|\n", r.FleetPodsRunningS, r.FleetPods, r.FleetPodsCreateS, met(r.FleetPodsRunningS <= 60))
	fmt.Fprintf(tw, "| `bridge_cpu_pct`\t| %.2f (over %.0f s idle)\t| < 25: %s\t|\n", r.BridgeCPUPct, r.IdleWindowS, met(r.BridgeCPUPct < 25))
	fmt.Fprintf(tw, "| `bridge_rss_mib`\t| %.1f\t|\t|\n", r.BridgeRSSMiB)
	fmt.Fprintf(tw, "| `mosquitto_cpu_pct`, `_rss_mib`\t| %.2f, %.1f\t|\t|\n", r.MosquittoCPUPct, r.MosquittoRSSMiB)
	fmt.Fprintf(tw, "| `kube_apiserver_cpu_pct`, `_rss_mib`\t| %.2f, %.1f\t|\t|\n", r.APIServerCPUPct, r.APIServerRSSMiB)
	fmt.Fprintf(tw, "| `etcd_cpu_pct`, `_rss_mib`\t| %.2f, %.1f\t|\t|\n", r.EtcdCPUPct, r.EtcdRSSMiB)
	fmt.Fprintf(tw, "| `kube_controller_manager_cpu_pct`\t| %.2f\t|\t|\n", r.CMCPUPct)
	fmt.Fprintf(tw, "| `kube_scheduler_cpu_pct`\t| %.2f\t|\t|\n", r.SchedulerCPUPct)
	fmt.Fprintf(tw, "| `fleetsim_cpu_pct`, `_rss_mib`\t| %.2f, %.1f\t|\t|\n", r.FleetSimCPUPct, r.FleetSimRSSMiB)
	tw.Flush()
	fmt.Fprintf(w, "\nin the idle window the watches saw %d Node updates and %d pod updates; writers of one Node: %s\n",
		r.IdleNodeUpdates, r.IdlePodUpdates, strings.Join(r.NodeWriters, "; "))
	fmt.Fprintf(w, "what those Node updates changed: %v\n", r.IdleNodeChanges)
	fmt.Fprintf(w, "Events written in the idle window, by source and reason: %v\n", r.IdleEvents)
	fmt.Fprintf(w, "\nload average (1, 5, 15 min): start %s, all Ready %s, all Running %s, end %s\n", r.LoadAvg.Start, r.LoadAvg.Ready, r.LoadAvg.Running, r.LoadAvg.End)
	for _, p := range r.Phases {
		fmt.Fprintf(w, "\nphase %s (%.1f s): CPU seconds %v\n", p.Name, p.WallS, p.CPUS)
		fmt.Fprintf(w, "  bridge API writes: %s\n", strings.Join(p.BridgeAPI, "; "))
		fmt.Fprintf(w, "  bridge counters: %v; queue max %v; client-side throttling lines %d\n", p.Bridge, p.QueueMax, p.Throttled)
		fmt.Fprintf(w, "  apiserver (by total time; 429s %.0f): %s\n", p.APIServer4, strings.Join(p.APIServer, "; "))
	}
}
