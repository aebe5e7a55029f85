// Package node is the composition root of the edge agent: it builds every part of a node from the
// validated config (containerd runtime, cgroups, pod network, devices, state store, sources, the
// MQTT channel, the agent, node status, eviction, image GC, OOM watcher, node shutdown, the local
// API and metrics), hands each part what it needs explicitly, and runs them together until the
// context ends. `mqlet agent` is New + Run; `mqlet-fleetsim` builds its simulated nodes with the
// same New, over an in-memory store and runtime and a made-up machine (Deps.Simulated).
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/api"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/agent/nodestatus"
	"github.com/mqlet/mqlet/agent/objects"
	"github.com/mqlet/mqlet/agent/podevents"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/hw"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/logserve"
	"github.com/mqlet/mqlet/sync/nodesync"
	"golang.org/x/sync/errgroup"
	v1 "k8s.io/api/core/v1"
)

// Deps is what a node is built from besides its config.
type Deps struct {
	Log *slog.Logger
	// Version and Commit are the build's (node status, metrics, the MQTT liveness message).
	Version, Commit string
	// Executable is mqlet's own binary, which holds shared PID namespaces (`mqlet sandbox-pause`);
	// "" refuses pods with shareProcessNamespace.
	Executable string
	// Simulated, when set, builds a node of the fleet simulator instead of this machine's.
	Simulated *Simulated
	// Ready, when set, is called once the node has started: the stored pods are restored and the
	// local API answers, the moment systemd is told READY=1 (told or not: it is called without
	// $NOTIFY_SOCKET too). `mqlet agent` forgets its failed starts then. Not on a simulated node.
	Ready func()
}

// Simulated is what a simulated node runs on in place of this machine: an in-memory store and
// runtime and a made-up host. Such a node has the agent, its sources, the MQTT channel, pod events
// and the node status; it has none of the machine's parts (cgroups, pod network, devices,
// eviction, image GC, OOM watcher, node shutdown, local API, metrics), and it needs a broker.
type Simulated struct {
	Store store.State
	// Runtime makes the node's in-memory runtime, which reads ConfigMaps and Secrets from objs
	// and calls imagesChanged when its image list changes.
	Runtime func(objs *objects.Store, imagesChanged func()) SimulatedRuntime
	Host    nodestatus.Host
	HostIP  func() string
	// Logs finds containers' logs for `mqlet ctl logs`.
	Logs logserve.LogFinder
}

// SimulatedRuntime is an in-memory runtime: the agent's runtime, its version and its images.
type SimulatedRuntime interface {
	agent.Runtime
	Version() string
	Images(ctx context.Context) ([]nodestatus.Image, error)
}

// Node is one node's parts, built and connected, ready to run.
type Node struct {
	cfg     config.Config
	version string
	// simulated is a node of the fleet simulator: its start and stop are the simulator's to log.
	simulated bool
	log       *slog.Logger
	view      *view
	agent     *agent.Agent
	channel   *nodesync.Sync // nil on a standalone node
	// parts run beside the agent until it stops; built in the order they are listed.
	parts []part
	// events is the pod event recorder's part (RunOnce runs it alone).
	events   part
	recorder *podevents.Recorder
	notify   *serviceNotify // nil on a simulated node
	// life ends when the node stops running (or is closed unrun): calls that parts make outside
	// Run's context (the eviction manager's storage readings) are bound to it.
	life    context.Context
	endLife context.CancelFunc
	// closers release what New opened (the runtime's connection, the state file), last first.
	closers []func() error
}

// part is a long-running component of the node. A part that ends (with or without an error)
// ends the node when ends is set; any part's error ends it too.
type part struct {
	name string
	run  func(ctx context.Context) error
	ends bool
}

// New builds a node; nothing runs before Run (or RunOnce). Close releases what it opened, also
// when New fails part-way (New closes it then). ctx bounds the calls New makes to containerd.
func New(ctx context.Context, cfg config.Config, d Deps) (n *Node, err error) {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	n = &Node{cfg: cfg, version: d.Version, log: d.Log, view: &view{cfg: cfg}}
	n.life, n.endLife = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			n.Close()
			n = nil
		}
	}()
	if d.Simulated != nil {
		n.simulated = true
		err = n.buildSimulated(cfg, d)
	} else {
		err = n.buildMachine(ctx, cfg, d)
	}
	return n, err
}

// buildMachine builds the node of this machine (`mqlet agent`).
func (n *Node) buildMachine(ctx context.Context, cfg config.Config, d Deps) error {
	log := d.Log
	m := newAgentMetrics(d.Version, d.Commit)
	devs := newDeviceManager(cfg, log)
	cgroups, keepScope, err := newCgroupManager(ctx, cfg, d.Executable, log)
	if err != nil {
		return err
	}
	network := newPodNetwork(cfg, log)
	alloc := allocatable(cfg, log)
	rt, err := ctrd.New(ctx, withLogRotation(cfg, ctrd.Options{
		Network:              network,
		Devices:              devs,
		Cgroups:              cgroups,
		DNS:                  podDNS(cfg),
		SingleProcessOOMKill: cfg.SingleProcessOOMKill,
		Executable:           d.Executable,
		Address:              cfg.ContainerdAddress,
		Namespace:            cfg.ContainerdNamespace,
		DialTimeout:          cfg.ContainerdTimeout.Duration,
		StateDir:             cfg.StateDir,
		Registry:             ctrd.RegistryOptions{PlainHTTP: cfg.PlainHTTPRegistries, CAFile: cfg.RegistryCAFile},
		Log:                  log,
		OnPull:               m.ImagePulled,
		// Memory-backed emptyDirs are sized from it, the downward API's default limits are it
		// (volumes.go).
		NodeAllocatableMemory: func() int64 { a := alloc(); return a.Memory().Value() },
		NodeAllocatable:       alloc,
	}))
	if err != nil {
		return err
	}
	n.closers = append(n.closers, rt.Close)
	// The commands a killed agent's execs (probes, exec sessions) left running in containers go
	// now: nobody reads or waits for them any more.
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	rt.SweepExecs(sctx)
	cancel()
	if err := loadRegistryAuth(cfg, rt); err != nil {
		return err
	}
	// Secrets (from the control plane or the manifest dir) are sealed in the state store under
	// the node key (objects.go).
	// A damaged state file is set aside and the agent starts from empty state rather than stay
	// down: sources deliver the desired pods again and running pods are adopted (see
	// setAsideEvent for what tells the operator).
	// A file from a newer mqlet that this binary cannot use (an A/B OTA rollback) is replaced by
	// the newest backup this binary can read, or set aside too (see rolledBackEvent).
	storeOpts := store.Options{SetAsideDamaged: true, RollBackNewer: true}
	if storeOpts.SecretKey, err = nodeKey(cfg, log); err != nil {
		return err
	}
	// Secrets from the control plane arrive sealed to a key derived from the node key; its
	// public half goes out in the node status (sync/sealing).
	sealKey, err := nodeSealingKey(storeOpts.SecretKey)
	if err != nil {
		return err
	}
	attestation, err := sealingAttestation(cfg, sealKey, log)
	if err != nil {
		return err
	}
	db, err := store.OpenWith(cfg.StatePath(), storeOpts)
	if err != nil {
		return err
	}
	n.closers = append(n.closers, db.Close)
	state := m.Store(db)

	dir := manifest.NewDir(cfg.ManifestDir)
	objs := newObjects(state, rt, dir, log)
	sources := []source.Source{dir}
	var report agent.Reporter
	if cfg.MQTTBroker != "" && !cfg.Once {
		o, err := channelOptions(cfg, objs.Guard(state, source.MQTT), log, n.view, d.Version)
		if err != nil {
			return err
		}
		o.Sealing = sealKey
		o.Exec = n.view // `mqlet ctl exec`, with the sealing key
		o.Usage = n.view.Usage
		if n.channel, err = nodesync.New(o); err != nil {
			return err
		}
		sources = append(sources, n.channel.Source())
		report = n.channel.Reporter()
	}
	report, err = n.podEvents(cfg, state, report, log)
	if err != nil {
		return err
	}
	report = m.reporter(report)
	if sa := db.SetAside(); sa != nil {
		report.Emit(setAsideEvent(cfg.NodeName, sa))
	}
	if rb := db.RolledBack(); rb != nil {
		report.Emit(rolledBackEvent(cfg.NodeName, rb))
	}
	if ev, on, err := swapWarning("/", cfg.NodeName); on {
		log.Warn(ev.Message)
		report.Emit(ev)
	} else if err != nil {
		log.Warn("cannot tell whether swap is on", "err", err)
	}
	n.notify = newServiceNotify(cfg, log, d.Ready)
	n.view.interim = interimAllocatable(cfg, devs, log)
	n.view.fallback = func() *v1.Node { return configNode(cfg) }
	n.agent = agent.New(agent.Options{
		NodeName:     cfg.NodeName,
		PreloadDir:   cfg.ImagePreloadDir,
		RelistPeriod: cfg.RelistPeriod.Duration,
		HostIP:       hw.HostIP,
		Log:          log,
		// An operator who tunes the Go runtime keeps control of it.
		TrimMemory: os.Getenv("GOMEMLIMIT") == "" && os.Getenv("GOGC") == "",
		Report:     report,
		MQTTPolicy: cfg.AdmissionPolicy(),
		Sysctls:    cfg.SysctlAllowlist(),
		OnSync:     m.ObserveSync,
		// What the node status publishes, once computed; until then the same figures read once.
		Allocatable: n.view.Allocatable,
		Pressure:    n.view.Pressure,
		Node:        n.view.Node,
		// The shutdown manager, which calls it, runs once the node status exists.
		OnShutdownChange: n.view.Trigger,
		// systemd's READY waits for the restore; its watchdog is fed by the main loop only.
		Started:         n.notify.partReady,
		Heartbeat:       n.notify.heartbeat,
		HeartbeatPeriod: n.notify.watchdog,
	}, rt, state, sources...)
	n.view.agent = n.agent
	connectObjects(objs, n.agent, report)
	if cfg.Once {
		return nil
	}

	gc, err := newImageGC(cfg, rt, n.agent, report, log)
	if err != nil {
		return err
	}
	n.add(part{name: "image garbage collection", run: gc.Run})
	// Disk pressure reclaims unused images and dead containers before any pod is evicted. The
	// node status shows the eviction manager's pressure, and is recomputed when it changes.
	n.view.status = newNodeStatus(cfg, rt, db, log, n.agent, n.channel, nodeInputs{
		version: d.Version, pressure: n.view, devices: devs, network: network.Ready,
		sealing: sealKey, attestation: attestation})
	n.add(part{name: "node status", run: n.view.status.Run})
	var releaseNotifier func() error
	n.view.evictions, releaseNotifier = newEviction(n.life, cfg, n.agent, rt, cgroups.Base(), report, gc, n.view.Trigger, log)
	n.closers = append(n.closers, releaseNotifier)
	n.add(part{name: "eviction", run: n.view.evictions.Run})
	n.add(part{name: "oom watcher", run: newOOMWatch(cfg, cgroups.Base(), report, log).Run})
	// Node allocatable held above its target while pods use more (cgroups.go).
	n.add(part{name: "cgroup limits", run: cgroupConverge(cgroups, report, keepScope)})
	n.add(part{name: "node shutdown", run: newNodeShutdown(cfg, n.agent, log).Run})

	srv := api.NewServer(nodeAPI{Agent: n.agent, m: n.view.status}, log)
	srv.OnListening(n.notify.partReady)
	n.serveEvents(srv)
	m.usage(n.agent, rt, srv, n.view)
	serveMetrics, releaseMetrics, err := m.serve(cfg, n.agent, n.view.evictions, n.channel, db, srv, log)
	if err != nil {
		return err
	}
	n.closers = append(n.closers, releaseMetrics)
	n.add(part{name: "metrics endpoint", run: serveMetrics})
	n.add(part{name: "local API", ends: true, run: func(ctx context.Context) error {
		if err := srv.Serve(ctx, cfg.APISocket); err != nil {
			return fmt.Errorf("local API on %s (--api-socket): %w", cfg.APISocket, err)
		}
		return nil
	}})
	return nil
}

// buildSimulated builds a node of the fleet simulator.
func (n *Node) buildSimulated(cfg config.Config, d Deps) error {
	sim, log := d.Simulated, d.Log
	if cfg.MQTTBroker == "" {
		return errors.New("a simulated node needs a broker")
	}
	objs := objects.New(sim.Store, log)
	rt := sim.Runtime(objs, n.view.Trigger)
	o, err := channelOptions(cfg, objs.Guard(sim.Store, source.MQTT), log, sim.Logs, d.Version)
	if err != nil {
		return err
	}
	if n.channel, err = nodesync.New(o); err != nil {
		return err
	}
	report, err := n.podEvents(cfg, sim.Store, n.channel.Reporter(), log)
	if err != nil {
		return err
	}
	nc := nodeConfig(cfg)
	nc.Host = &sim.Host
	machine := nc.Machine()
	capacity, err := machine.Capacity()
	if err != nil {
		return err
	}
	interim := machine.Allocatable(capacity)
	n.view.interim = interim.DeepCopy
	n.view.fallback = func() *v1.Node {
		node := &v1.Node{}
		nodestatus.Labels(cfg.NodeName, sim.Host.Info.OperatingSystem, sim.Host.Info.Architecture, cfg.NodeLabels)(context.Background(), node)
		nodestatus.Taints(cfg.Taints())(context.Background(), node)
		return node
	}
	n.agent = agent.New(agent.Options{
		NodeName:     cfg.NodeName,
		RelistPeriod: cfg.RelistPeriod.Duration,
		SweepPeriod:  2 * cfg.RelistPeriod.Duration,
		HostIP:       sim.HostIP,
		Log:          log,
		// One process for the whole fleet: a thousand agents each handing memory back to the OS
		// after every burst would cost more than it returns.
		TrimMemory:  false,
		Report:      report,
		MQTTPolicy:  cfg.AdmissionPolicy(),
		Sysctls:     cfg.SysctlAllowlist(),
		Allocatable: n.view.Allocatable,
		Node:        n.view.Node,
	}, rt, sim.Store, n.channel.Source())
	n.view.agent = n.agent
	connectObjects(objs, n.agent, report)

	nc.AgentVersion = "mqlet-" + d.Version
	nc.HostIP = sim.HostIP
	nc.RuntimeVersion = rt.Version
	nc.ListImages = rt.Images
	nc.Ready = n.agent.Ready
	n.view.status = nodestatus.New(nodestatus.Options{
		Name:     cfg.NodeName,
		Setters:  nodestatus.DefaultSetters(nc),
		Period:   cfg.NodeStatusUpdateFrequency.Duration,
		Store:    sim.Store,
		OnChange: n.channel.NodeStatus,
		Log:      log,
	})
	n.add(part{name: "node status", run: n.view.status.Run})
	return nil
}

func (n *Node) add(p part) { n.parts = append(n.parts, p) }

// Run runs the node until ctx ends, the agent stops, or a part fails; pods keep running after it
// returns (the next start adopts them). Every goroutine of the node has ended when it returns. The
// MQTT channel stops last, so the last statuses reach the outbox and the link says offline before
// it disconnects. A context canceled is not an error.
func (n *Node) Run(ctx context.Context) error {
	if n.simulated {
		return n.run(ctx)
	}
	n.log.Info("mqlet agent starting", "version", n.version, "node", n.cfg.NodeName, "containerd", n.cfg.ContainerdAddress,
		"namespace", n.cfg.ContainerdNamespace, "manifests", n.cfg.ManifestDir, "state", n.cfg.StatePath())
	err := n.run(ctx)
	n.log.Info("mqlet agent stopped; pods keep running")
	return err
}

// run runs the parts until ctx ends, the agent stops or a part fails (Run's contract).
func (n *Node) run(ctx context.Context) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	// The pod event recorder and the MQTT channel run on a context of their own, ended only once
	// every other part has stopped: the agent's last statuses and events pass through them.
	lateCtx, lateStop := context.WithCancel(context.Background())
	defer lateStop()
	var late errgroup.Group
	late.Go(func() error { return n.events.run(lateCtx) })
	if n.channel != nil {
		late.Go(func() error {
			err := n.channel.Run(lateCtx)
			if lateCtx.Err() != nil {
				return nil
			}
			// It only ends first with an error; the node stops with it.
			if err == nil {
				err = errors.New("ended on its own")
			}
			stop()
			return fmt.Errorf("mqtt channel: %w", err)
		})
	}

	g, gctx := errgroup.WithContext(ctx)
	defer context.AfterFunc(gctx, n.endLife)()
	parts := append([]part{{name: "agent", run: n.agent.Run, ends: true}}, n.parts...)
	for _, p := range parts {
		g.Go(func() error {
			err := p.run(gctx)
			if p.ends {
				stop()
			}
			if err != nil && !errors.Is(err, context.Canceled) {
				return fmt.Errorf("%s: %w", p.name, err)
			}
			return nil
		})
	}
	err := g.Wait()
	lateStop()
	err = errors.Join(err, late.Wait())
	if n.notify != nil {
		n.notify.stopping()
	}
	return err
}

// RunOnce runs the agent in --once mode: it starts the pods, waits until each has settled or
// timeout passes, and returns their final state (agent.RunOnce).
func (n *Node) RunOnce(ctx context.Context, timeout time.Duration) ([]v1.Pod, error) {
	ectx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); n.events.run(ectx) }()
	defer func() { cancel(); <-done }() // the recorder's last flush, before the store closes
	return n.agent.RunOnce(ctx, timeout)
}

// Close releases what New opened: the state file, the runtime's connection, and for a node that
// never ran, the kernel memory notifier and the --metrics-address listener (Run's parts release
// them otherwise). Call it after Run.
func (n *Node) Close() error {
	n.endLife()
	var errs []error
	for i := len(n.closers) - 1; i >= 0; i-- {
		errs = append(errs, n.closers[i]())
	}
	n.closers = nil
	return errors.Join(errs...)
}

// rolledBackEvent is the node's Warning that its state file came from a newer mqlet this binary
// cannot read (a rollback after an update) and was replaced by an older backup or empty state.
func rolledBackEvent(node string, rb *store.RolledBack) event.Event {
	what := fmt.Sprintf("restored the backup %s (schema %d); changes made since that backup are read again from the pod sources", rb.Backup, rb.BackupSchema)
	if rb.Backup == "" {
		what = "no older backup: started from empty state, pods re-read from their sources and running ones adopted"
	}
	return event.Event{Time: time.Now(), Type: event.Warning, Reason: event.ReasonStateFileRolledBack,
		Message: fmt.Sprintf("state file written by a newer mqlet (schema %d) kept as %s; %s", rb.Schema, rb.SetAside, what),
		Object:  event.NodeObject(node)}
}

// setAsideEvent is the node's Warning that its state file was damaged and set aside: the file is
// named in it (and, through the store's notice, in the log) so the operator can keep it for a
// look at the storage, or delete it.
func setAsideEvent(node string, sa *store.SetAside) event.Event {
	return event.Event{Time: time.Now(), Type: event.Warning, Reason: event.ReasonStateFileSetAside,
		Message: fmt.Sprintf("state file damaged, set aside as %s; started from empty state, pods re-read from their sources "+
			"and running ones adopted: %v", sa.Path, sa.Cause),
		Object: event.NodeObject(node)}
}

// Connected reports whether the node's MQTT link is up (false on a standalone node).
func (n *Node) Connected() bool { return n.channel != nil && n.channel.Connected() }
