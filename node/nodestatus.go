package node

import (
	"context"
	"log/slog"
	"time"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/devices"
	"github.com/mqlet/mqlet/agent/nodestatus"
	"github.com/mqlet/mqlet/hw"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/nodesync"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
	v1 "k8s.io/api/core/v1"
)

// nodeInputs are what other parts of the node tell the status: pressure conditions (the eviction
// manager) and device resources (their capacity, also allocatable).
type nodeInputs struct {
	version  string // the build's, in nodeInfo.kubeletVersion as mqlet-<version>
	pressure nodestatus.Pressure
	devices  *devices.Manager
	network  func() error // why pods cannot get a network now, nil when they can (cni.go)
	sealing  *sealing.Key // its public key is published for control planes to seal Secrets to
	// attestation vouches for the sealing key with the node's MQTT certificate ("" without one).
	attestation string
}

// newNodeStatus builds the node status manager from the config: the hw readers on "/", containerd
// for the runtime version and images, the agent for Ready, and the MQTT channel (nil when
// standalone) as the receiver of real changes. Standalone, the status is kept in the store and
// served to `mqlet node` only.
func newNodeStatus(cfg config.Config, rt *ctrd.Runtime, db *store.DB, log *slog.Logger,
	a *agent.Agent, channel *nodesync.Sync, in nodeInputs) *nodestatus.Manager {
	var extra func() v1.ResourceList
	if in.devices != nil {
		extra = in.devices.Capacity
	}
	c := nodeConfig(cfg)
	c.AgentVersion = "mqlet-" + in.version
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
	// After HardwareFacts, which resets the mqlet.io/ annotations: a control plane reads it to
	// carry the API's deletion grace period to this node.
	setters = append(setters, nodestatus.Annotation(protocol.AnnotationPodDeletion, protocol.PodDeletionGraceful))
	if in.sealing != nil {
		// After HardwareFacts, which resets the mqlet.io/ annotations.
		setters = append(setters, nodestatus.Annotation(sealing.AnnotationKey, in.sealing.Public()))
		if in.attestation != "" {
			setters = append(setters, nodestatus.Annotation(sealing.AttestationKey, in.attestation))
		}
	}
	return nodestatus.New(nodestatus.Options{
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
}

// nodeConfig is the node status's settings and its hw readers on "/", without the parts that need
// a running agent or containerd. Its Machine is the one place node capacity and allocatable are
// computed: the node status, admission's interim allocatable and the pods' cgroups all use it.
func nodeConfig(cfg config.Config) nodestatus.Config {
	system, agentReserved := cfg.Reservations()
	return nodestatus.Config{
		NodeName:       cfg.NodeName,
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

// nodeAPI is what the local API serves: the agent, plus the node status.
type nodeAPI struct {
	*agent.Agent
	m *nodestatus.Manager
}

// Node implements api.NodeProvider.
func (p nodeAPI) Node() *v1.Node { return p.m.Node() }

func containerdImages(rt *ctrd.Runtime) func(ctx context.Context) ([]nodestatus.Image, error) {
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
