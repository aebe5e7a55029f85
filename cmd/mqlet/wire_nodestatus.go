package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/devices"
	"github.com/mqlet/mqlet/agent/nodestatus"
	"github.com/mqlet/mqlet/agent/runtime"
	"github.com/mqlet/mqlet/hw"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/nodesync"
	"github.com/mqlet/mqlet/sync/sealing"
	v1 "k8s.io/api/core/v1"
)

// nodeInputs are what other parts of the node tell the status: pressure conditions (the eviction
// manager) and device resources (their capacity, also allocatable).
type nodeInputs struct {
	pressure nodestatus.Pressure
	devices  *devices.Manager
	network  func() error // why pods cannot get a network now, nil when they can (wire_cni.go)
	sealing  *sealing.Key // its public key is published for control planes to seal Secrets to
	// attestation vouches for the sealing key with the node's MQTT certificate ("" without one).
	attestation string
}

// pressureRef hands the node status the eviction manager's conditions; p is set before the status
// manager runs (the eviction manager needs the status manager's Trigger first).
type pressureRef struct{ p nodestatus.Pressure }

func (r *pressureRef) Conditions() map[v1.NodeConditionType]bool {
	if r.p == nil {
		return nil
	}
	return r.p.Conditions()
}

// allocatable is what admission checks pods against: the published allocatable once the status
// has been computed, else fallback (the same figures read once at start). Nil-safe: --once admits
// before any status exists.
func (w *nodeStatusWiring) allocatable(fallback func() v1.ResourceList) v1.ResourceList {
	if w != nil {
		if alloc := w.m.Allocatable(); len(alloc) > 0 {
			return alloc
		}
	}
	return fallback()
}

// nodeStatusWiring is the node status manager, built once the agent and the channel exist.
type nodeStatusWiring struct {
	m *nodestatus.Manager
}

// newNodeStatus builds the node status manager from the config: the hw readers on "/", containerd
// for the runtime version and images, the agent for Ready, and the MQTT channel (nil when
// standalone) as the receiver of real changes. Standalone, the status is kept in the store and
// served to `mqlet node` only.
func newNodeStatus(cfg config.Config, rt *runtime.Runtime, db *store.DB, log *slog.Logger,
	a *agent.Agent, channel *nodesync.Sync, in nodeInputs) *nodeStatusWiring {
	var extra func() v1.ResourceList
	if in.devices != nil {
		extra = in.devices.Capacity
	}
	c := nodeConfig(cfg)
	c.RuntimeVersion = rt.Version
	c.ListImages = containerdImages(rt)
	c.Ready = a.Ready
	c.Pressure = in.pressure
	c.Extra = extra
	c.ShuttingDown = a.ShuttingDown
	if in.network != nil {
		c.Conditions = append(c.Conditions, nodestatus.NetworkCondition(in.network, time.Now))
		c.Ready = nodestatus.NetworkReady(c.Ready, in.network)
	}
	setters := nodestatus.DefaultSetters(c)
	if in.sealing != nil {
		// After HardwareFacts, which resets the mqlet.io/ annotations.
		setters = append(setters, nodestatus.Annotation(sealing.AnnotationKey, in.sealing.Public()))
		if in.attestation != "" {
			setters = append(setters, nodestatus.Annotation(sealing.AttestationKey, in.attestation))
		}
	}
	m := nodestatus.New(nodestatus.Options{
		Name:    cfg.NodeName,
		Setters: setters,
		Period:  cfg.NodeStatusUpdateFrequency.Duration,
		Store:   db,
		OnChange: func(n *v1.Node) {
			if channel != nil {
				channel.NodeStatus(n)
			}
		},
		Log: log,
	})
	return &nodeStatusWiring{m: m}
}

// nodeConfig is the node status's settings and its hw readers on "/", without the parts that need
// a running agent or containerd. Its Machine is the one place node capacity and allocatable are
// computed: the node status, admission's interim allocatable and the pods' cgroups all use it.
func nodeConfig(cfg config.Config) nodestatus.Config {
	system, agentReserved := cfg.Reservations()
	return nodestatus.Config{
		NodeName:       cfg.NodeName,
		AgentVersion:   "mqlet-" + version,
		Root:           "/",
		StateDir:       cfg.StateDir,
		MaxPods:        cfg.MaxPods,
		MaxImages:      int(cfg.NodeStatusMaxImages),
		NodeLabels:     cfg.NodeLabels,
		Taints:         cfg.Taints(),
		SystemReserved: system,
		AgentReserved:  agentReserved,
		Thresholds:     cfg.Thresholds(),
		DiskCapacity:   filesystemSize,
	}
}

// start runs the manager until ctx ends; wait returns once it has.
func (w *nodeStatusWiring) start(ctx context.Context) (wait func()) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.m.Run(ctx)
	}()
	return wg.Wait
}

// api is what the local API serves: the agent, plus the node status.
func (w *nodeStatusWiring) api(a *agent.Agent) nodeAPI { return nodeAPI{Agent: a, m: w.m} }

type nodeAPI struct {
	*agent.Agent
	m *nodestatus.Manager
}

// Node implements api.NodeProvider.
func (p nodeAPI) Node() *v1.Node { return p.m.Node() }

func containerdImages(rt *runtime.Runtime) func(ctx context.Context) ([]nodestatus.Image, error) {
	return func(ctx context.Context) ([]nodestatus.Image, error) {
		list, err := rt.ListImages(ctx)
		if err != nil {
			return nil, err
		}
		out := make([]nodestatus.Image, 0, len(list))
		for _, i := range list {
			out = append(out, nodestatus.Image{Name: i.Name, Digest: i.Digest, Size: i.Size})
		}
		return out, nil
	}
}

// filesystemSize is the size in bytes of the filesystem holding path (its ephemeral-storage
// capacity, as kubelet reports its root dir's).
func filesystemSize(path string) (int64, error) {
	fs, err := hw.Filesystem(path)
	return fs.Capacity, err
}
