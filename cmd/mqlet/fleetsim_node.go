package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"time"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/nodestatus"
	"github.com/mqlet/mqlet/agent/objects"
	"github.com/mqlet/mqlet/agent/simruntime"
	"github.com/mqlet/mqlet/agent/source"
	"github.com/mqlet/mqlet/hw"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/nodesync"
	v1 "k8s.io/api/core/v1"
)

// LabelSimulated marks every node of the fleet simulator, so nobody mistakes one for a device.
const LabelSimulated = "mqlet.io/simulated"

// simNode is one simulated node: the agent's parts as `mqlet agent` wires them (AgentCmd.Run),
// with an in-memory store, the in-memory runtime and made-up hardware.
type simNode struct {
	name    string
	log     *slog.Logger
	a       *agent.Agent
	channel *nodesync.Sync
	status  *nodestatus.Manager
	events  *podEvents
}

// simPodCIDR is where every simulated node's pod addresses come from (each node has the whole
// range, as each real node has its own pod network): RFC 2544's benchmarking range, which no real
// host uses, so an httpGet or tcpSocket probe of a simulated pod reaches no real pod of this machine.
var simPodCIDR = netip.MustParsePrefix("198.18.0.0/15")

// simStore is the in-memory state with session numbers that start at the fleet's start time: a
// restarted simulator's nodes must not reuse their previous run's sessions.
type simStore struct {
	*store.Memory
	base int64
}

func (s simStore) NextSession() (int64, error) {
	n, err := s.Memory.NextSession()
	return s.base + n, err
}

// simLogs answers `mqlet ctl logs` for a simulated node: its containers write nothing.
type simLogs struct{}

func (simLogs) LogPath(namespace, name, container string, _ bool) (string, error) {
	return "", fmt.Errorf("pod %s/%s container %q: simulated containers write no logs", namespace, name, container)
}

// newSimNode builds node i; nothing runs or connects before run. The pod event recorder starts on
// ctx (and stops in run).
func newSimNode(ctx context.Context, f *fleet, i int) (*simNode, error) {
	cfg := f.cfg
	cfg.NodeName = f.name(i)
	log := f.nodeLog.With("node", cfg.NodeName)
	st := simStore{Memory: store.NewMemory(), base: f.sessionBase}
	n := &simNode{name: cfg.NodeName, log: log}

	objs := objects.New(st, log)
	var status *nodestatus.Manager // set below; the runtime's callback only runs once pods start
	rt := simruntime.New(simruntime.Options{Objects: objs, PodCIDR: simPodCIDR, OnNewImage: func() { status.Trigger() }})

	var a *agent.Agent
	agentOf := func() *agent.Agent { return a }
	o, err := channelOptions(cfg, objs.Guard(st, source.MQTT), log, simLogs{}) // channel.go
	if err != nil {
		return nil, err
	}
	channel, err := nodesync.New(o)
	if err != nil {
		return nil, err
	}
	events, report, err := startPodEvents(ctx, cfg, st, channel.Reporter(), log, agentOf) // wire_events.go
	if err != nil {
		return nil, err
	}

	machine := f.machine(cfg)
	capacity, err := machine.Capacity()
	if err != nil {
		events.stop()
		return nil, err // made-up figures: cannot fail
	}
	interim := machine.Allocatable(capacity)
	labels := map[string]string{LabelSimulated: "true"}
	maps.Copy(labels, cfg.NodeLabels)
	a = agent.New(agent.Options{
		NodeName:     cfg.NodeName,
		RelistPeriod: cfg.RelistPeriod.Duration,
		SweepPeriod:  2 * cfg.RelistPeriod.Duration,
		HostIP:       func() string { return nodeIP(i) },
		Log:          log,
		// One process for the whole fleet: a thousand agents each handing memory back to the OS
		// after every burst would cost more than it returns.
		TrimMemory: false,
		Report:     report,
		MQTTPolicy: cfg.AdmissionPolicy(),
		Sysctls:    cfg.SysctlAllowlist(),
		Allocatable: func() v1.ResourceList {
			if alloc := status.Allocatable(); len(alloc) > 0 {
				return alloc
			}
			return interim.DeepCopy()
		},
		Node: func() *v1.Node {
			if n := status.Node(); n != nil {
				return n
			}
			n := &v1.Node{}
			nodestatus.Labels(cfg.NodeName, "linux", f.arch, labels)(context.Background(), n)
			nodestatus.Taints(cfg.Taints())(context.Background(), n)
			return n
		},
	}, rt, st, channel.Source())
	connectObjects(objs, a, report) // wire_objects.go

	info := nodestatus.Info{
		OSImage: "mqlet fleet simulator", KernelVersion: "simulated", BootID: randomID(), MachineID: hashID(cfg.NodeName),
		OperatingSystem: "linux", Architecture: f.arch,
	}
	hwFacts := nodestatus.Hardware{CPUModel: "simulated", Board: hw.Board{Model: "mqlet simulated node"}, Machine: unameMachine(f.arch)}
	now := time.Now
	status = nodestatus.New(nodestatus.Options{
		Name: cfg.NodeName,
		// DefaultSetters' order, with made-up readers in place of the machine's.
		Setters: []nodestatus.Setter{
			nodestatus.NodeAddress(cfg.NodeName, func() string { return nodeIP(i) }),
			nodestatus.MachineInfo(machine),
			nodestatus.NodeInfo("mqlet-"+version, rt.Version, func() nodestatus.Info { return info }),
			nodestatus.Images(int(cfg.NodeStatusMaxImages), simImages(rt)),
			nodestatus.Labels(cfg.NodeName, "linux", f.arch, labels),
			nodestatus.HardwareFacts(func() (nodestatus.Hardware, error) { return hwFacts, nil }),
			nodestatus.Taints(cfg.Taints()),
			nodestatus.PressureCondition(v1.NodeMemoryPressure, nil, now),
			nodestatus.PressureCondition(v1.NodeDiskPressure, nil, now),
			nodestatus.PressureCondition(v1.NodePIDPressure, nil, now),
			nodestatus.ReadyCondition(a.Ready, nil, now),
		},
		Period:   cfg.NodeStatusUpdateFrequency.Duration,
		Store:    st,
		OnChange: channel.NodeStatus,
		Log:      log,
	})
	n.a, n.channel, n.status, n.events = a, channel, status, events
	return n, nil
}

// machine is every simulated node's hardware: the fleet's CPUs and memory, a 32 GiB disk, the
// fleet's max pods, and the reservations and eviction thresholds of the agent's config.
func (f *fleet) machine(cfg config.Config) nodestatus.Machine {
	system, agentReserved := cfg.Reservations()
	cpus, mem := f.cpus, f.memory
	return nodestatus.Machine{
		CPUs:           func() (int, error) { return cpus, nil },
		Memory:         func() (int64, error) { return mem, nil },
		DiskCapacity:   func(string) (int64, error) { return 32 << 30, nil },
		Path:           cfg.StateDir,
		MaxPods:        cfg.MaxPods,
		SystemReserved: system,
		AgentReserved:  agentReserved,
		Thresholds:     cfg.Thresholds(),
	}
}

func simImages(rt *simruntime.Runtime) func(ctx context.Context) ([]nodestatus.Image, error) {
	return func(ctx context.Context) ([]nodestatus.Image, error) {
		list, err := rt.ListImages(ctx)
		out := make([]nodestatus.Image, 0, len(list))
		for _, i := range list {
			out = append(out, nodestatus.Image{Name: i.Name, Digest: i.Digest, Size: i.Size})
		}
		return out, err
	}
}

// unameMachine is what `uname -m` says on a machine of Go architecture arch.
func unameMachine(arch string) string {
	switch arch {
	case "arm64":
		return "aarch64"
	case "amd64":
		return "x86_64"
	case "arm":
		return "armv7l"
	}
	return arch
}

func hashID(name string) string {
	sum := sha256.Sum256([]byte("mqlet-fleet-sim/" + name))
	return hex.EncodeToString(sum[:16])
}

// randomID is a boot id: new at every start of the simulator, as a real node's is at every boot.
func randomID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// run runs the node until ctx ends, as AgentCmd.Run does: the channel stops after the agent, so
// the last statuses reach the outbox and the link then publishes offline before it disconnects.
// Every goroutine of the node has ended when it returns.
func (n *simNode) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer n.events.stop()
	statusDone := make(chan struct{})
	go func() { defer close(statusDone); n.status.Run(ctx) }()
	defer func() { cancel(); <-statusDone }()

	chCtx, chStop := context.WithCancel(context.Background())
	defer chStop()
	chErr := make(chan error, 1)
	go func() { chErr <- n.channel.Run(chCtx) }()
	runErr := make(chan error, 1)
	go func() { runErr <- n.a.Run(ctx) }()
	var err error
	select {
	case err = <-runErr:
		if err != nil {
			err = fmt.Errorf("agent: %w", err)
		}
		chStop()
		if cerr := <-chErr; cerr != nil {
			err = errors.Join(err, fmt.Errorf("mqtt channel: %w", cerr))
		}
	case cerr := <-chErr:
		// The channel runs until chCtx ends, so it only ends first with an error.
		cancel()
		<-runErr
		if cerr == nil {
			cerr = errors.New("ended on its own")
		}
		err = fmt.Errorf("mqtt channel: %w", cerr)
	}
	return err
}
