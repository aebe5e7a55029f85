package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/api"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/event"
	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/agent/runtime"
	"github.com/mqlet/mqlet/agent/source"
	"github.com/mqlet/mqlet/hw"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/nodesync"
	v1 "k8s.io/api/core/v1"
)

// AgentCmd is `mqlet agent`.
type AgentCmd struct {
	config.Flags `embed:""`
}

// Run validates the whole configuration, then runs until SIGTERM/SIGINT. Stopping the agent leaves
// pods running; the next start adopts them.
func (c *AgentCmd) Run() error {
	cfg, err := config.Load(c.Flags, os.Environ())
	if err != nil {
		return err
	}
	log := newLogger(cfg, os.Stderr)
	if err := cfg.CheckStateDir(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	// The agent's own binary holds shared PID namespaces (`mqlet sandbox-pause`). Without it only
	// pods with shareProcessNamespace fail, so a lookup error is a warning.
	exe, err := os.Executable()
	if err != nil {
		log.Warn("cannot find the mqlet executable; pods with shareProcessNamespace will be refused", "err", err)
		exe = ""
	}
	m := newAgentMetrics() // wire_metrics.go
	devs := newDeviceManager(cfg, log)
	cgroups, err := newCgroupManager(cfg, log)
	if err != nil {
		return err
	}
	network := newPodNetwork(cfg, log) // wire_cni.go
	rt, err := runtime.New(ctx, withLogRotation(cfg, runtime.Options{
		Network:              network,
		Devices:              devs,
		Cgroups:              cgroups,
		DNS:                  podDNS(cfg), // wire_dns.go
		SingleProcessOOMKill: cfg.SingleProcessOOMKill,
		Executable:           exe,
		Address:              cfg.ContainerdAddress,
		Namespace:            cfg.ContainerdNamespace,
		DialTimeout:          cfg.ContainerdTimeout.Duration,
		StateDir:             cfg.StateDir,
		Registry:             runtime.RegistryOptions{PlainHTTP: cfg.PlainHTTPRegistries, CAFile: cfg.RegistryCAFile},
		Log:                  log,
		OnPull:               m.ImagePulled,
		// Memory-backed emptyDirs are sized from it (wire_volumes.go).
		NodeAllocatableMemory: allocatableMemory(cfg, log),
	})) // wire_logs.go
	if err != nil {
		return err
	}
	defer rt.Close()
	if err := loadRegistryAuth(cfg, rt); err != nil { // wire_objects.go
		return err
	}
	// Secrets (from the control plane or the manifest dir) are sealed in the state store under
	// the node key (wire_objects.go).
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
	sealKey, err := nodeSealingKey(storeOpts.SecretKey) // wire_objects.go
	if err != nil {
		return err
	}
	attestation, err := sealingAttestation(cfg, sealKey, log) // wire_objects.go
	if err != nil {
		return err
	}
	db, err := store.OpenWith(cfg.StatePath(), storeOpts)
	if err != nil {
		return err
	}
	defer db.Close()
	state := m.Store(db)

	dir := manifest.NewDir(cfg.ManifestDir)
	objs := newObjects(state, rt, dir, log) // wire_objects.go
	sources := []source.Source{dir}
	var channel *nodesync.Sync
	var report agent.Reporter
	var a *agent.Agent
	if cfg.MQTTBroker != "" && !cfg.Once {
		channel, err = newChannel(cfg, objs.Guard(state, source.MQTT), sealKey, log, func() *agent.Agent { return a })
		if err != nil {
			return err
		}
		sources = append(sources, channel.Source())
		report = channel.Reporter()
	}
	events, report, err := startPodEvents(ctx, cfg, state, report, log, func() *agent.Agent { return a }) // wire_events.go
	if err != nil {
		return err
	}
	defer events.stop()
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
	// Admission reads node allocatable and pressure from parts built after the agent (they need it);
	// nothing is admitted before Run, by which time both exist.
	notify := newServiceNotify(cfg, log) // wire_notify.go
	var nodeStatus *nodeStatusWiring
	var evictions *evictions
	interim := interimAllocatable(cfg, devs, log)
	a = agent.New(agent.Options{
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
		Allocatable: func() v1.ResourceList { return nodeStatus.allocatable(interim) },
		Pressure:    func() []v1.NodeConditionType { return evictions.Pressure() },
		Node:        func() *v1.Node { return nodeStatus.nodeOr(cfg) }, // wire_volumes.go
		// The shutdown manager, which calls it, starts after nodeStatus is set.
		OnShutdownChange: func() { nodeStatus.m.Trigger() },
		// systemd's READY waits for the restore; its watchdog is fed by the main loop only.
		Started:         notify.partReady,
		Heartbeat:       notify.heartbeat,
		HeartbeatPeriod: notify.watchdog,
	}, rt, state, sources...)
	connectObjects(objs, a, report)

	if cfg.Once {
		pods, err := a.RunOnce(ctx, cfg.OnceTimeout.Duration)
		printOnce(os.Stdout, pods)
		return err
	}

	gc, err := startImageGC(ctx, cfg, rt, a, report, log)
	if err != nil {
		return err
	}
	defer gc.Stop()

	log.Info("mqlet agent starting", "version", version, "node", cfg.NodeName, "containerd", cfg.ContainerdAddress,
		"namespace", cfg.ContainerdNamespace, "manifests", cfg.ManifestDir, "state", cfg.StatePath())
	// Disk pressure reclaims unused images and dead containers before any pod is evicted.
	// The node status shows the eviction manager's pressure, and is recomputed when it changes.
	pressure := &pressureRef{}
	nodeStatus = newNodeStatus(cfg, rt, db, log, a, channel, nodeInputs{pressure: pressure, devices: devs, network: network.Ready, sealing: sealKey, attestation: attestation})
	evictions = startEviction(ctx, cfg, a, rt, cgroups.Base(), report, gc.Manager, nodeStatus.m.Trigger, log)
	defer evictions.Wait()
	defer startOOMWatch(ctx, cfg, cgroups.Base(), report, log)() // wire_eviction.go
	pressure.p = evictions.Manager
	defer nodeStatus.start(ctx)() // ends with ctx (stop), before the store closes
	// Node allocatable held above its target while pods use more (wire_cgroups.go).
	defer startCgroupConverge(ctx, cgroups, report)()
	// After the node status exists: a shutdown pushes it at once (OnShutdownChange).
	defer startNodeShutdown(ctx, cfg, a, log)()
	// The waits deferred above end only with ctx: an error return from here on must cancel it
	// before they run (deferred calls run last-in first-out), or the agent hangs instead of exiting.
	defer stop()
	srv := api.NewServer(nodeStatus.api(a), log)
	srv.OnListening(notify.partReady)
	events.serve(srv)
	m.usage(a, rt, srv) // wire_metrics.go
	stopMetrics, err := m.serve(ctx, cfg, a, evictions.Manager, channel, db, srv, log)
	if err != nil {
		return err
	}
	defer stopMetrics()
	apiErr := make(chan error, 1)
	go func() { apiErr <- srv.Serve(ctx, cfg.APISocket) }()
	runErr := make(chan error, 1)
	go func() { runErr <- a.Run(ctx) }()
	// The channel stops after the agent, so the last statuses the agent reports reach the outbox;
	// the link then says offline before it disconnects.
	chCtx, chStop := context.WithCancel(context.Background())
	defer chStop()
	chErr := make(chan error, 1)
	if channel != nil {
		go func() { chErr <- channel.Run(chCtx) }()
	}
	select {
	case err = <-apiErr:
		if err != nil {
			err = fmt.Errorf("local API on %s (--api-socket): %w", cfg.APISocket, err)
		}
		stop()
		<-runErr
	case err = <-runErr:
		stop()
		<-apiErr
	case err = <-chErr:
		stop()
		<-runErr
		<-apiErr
		channel = nil
	}
	if channel != nil {
		chStop()
		<-chErr
	}
	notify.stopping()
	log.Info("mqlet agent stopped; pods keep running")
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var lvl slog.Level
	lvl.UnmarshalText([]byte(cfg.LogLevel)) // validated already
	o := &slog.HandlerOptions{Level: lvl}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, o))
	}
	return slog.New(slog.NewTextHandler(w, o))
}

func printOnce(w io.Writer, pods []v1.Pod) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tNAME\tPHASE\tRESULT")
	for i := range pods {
		failed, done := agent.OnceOutcome(&pods[i])
		res := "ok"
		switch {
		case failed:
			res = "failed: " + summarizePod(&pods[i]).status
		case !done:
			res = "not settled: " + summarizePod(&pods[i]).status
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", pods[i].Namespace, pods[i].Name, pods[i].Status.Phase, res)
	}
	tw.Flush()
}

// setAsideEvent is the node's Warning that its state file was damaged and set aside: the file is
// named in it (and, through the store's notice, in the log) so the operator can keep it for a
// look at the storage, or delete it.
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

func setAsideEvent(node string, sa *store.SetAside) event.Event {
	return event.Event{Time: time.Now(), Type: event.Warning, Reason: event.ReasonStateFileSetAside,
		Message: fmt.Sprintf("state file damaged, set aside as %s; started from empty state, pods re-read from their sources "+
			"and running ones adopted: %v", sa.Path, sa.Cause),
		Object: event.NodeObject(node)}
}
