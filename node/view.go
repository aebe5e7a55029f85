package node

import (
	"context"
	"fmt"
	"net"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/eviction"
	"github.com/mqlet/mqlet/agent/nodestatus"
	"github.com/mqlet/mqlet/agent/usage"
	"github.com/mqlet/mqlet/core/execio"
	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// view is the node as its parts see each other. The agent admits pods against the allocatable
// and the pressure the node status and the eviction manager compute, and those two read the
// agent's pods: a cycle no constructor order can break. Each part is built with the view and
// New fills the view in as the parts exist; nothing reads it before Run (or RunOnce), by which
// time every part that will exist does. A part that does not exist on this node (no eviction
// manager in --once mode or in the simulator) answers as "none": no pressure, figures read once.
type view struct {
	cfg config.Config

	agent     *agent.Agent
	status    *nodestatus.Manager
	evictions *eviction.Manager
	// interim is node allocatable until the node status has computed it (and in --once mode):
	// the same figures, read once at start.
	interim func() v1.ResourceList
	// fallback is the node's labels and taints until the node status has computed them.
	fallback func() *v1.Node
	// usage reads the node's and its containers' CPU and memory use (usage.Reader.Recent).
	usage func(ctx context.Context) (usage.Snapshot, error)
}

// Allocatable is what admission checks pods against: the published allocatable once the node
// status has computed it, else the interim figures.
func (v *view) Allocatable() v1.ResourceList {
	if v.status != nil {
		if alloc := v.status.Allocatable(); len(alloc) > 0 {
			return alloc
		}
	}
	return v.interim()
}

// Pressure lists the pressure conditions that hold now, for admission.
func (v *view) Pressure() []v1.NodeConditionType {
	if v.evictions == nil {
		return nil
	}
	var out []v1.NodeConditionType
	for c, on := range v.evictions.Conditions() {
		if on {
			out = append(out, c)
		}
	}
	return out
}

// Conditions are the eviction manager's pressure conditions, for the node status.
func (v *view) Conditions() map[v1.NodeConditionType]bool {
	if v.evictions == nil {
		return nil
	}
	return v.evictions.Conditions()
}

// Node is the node as the node status last computed it, for admission's nodeSelector, node
// affinity and taint checks; until then, the labels and taints the config gives.
func (v *view) Node() *v1.Node {
	if v.status != nil {
		if n := v.status.Node(); n != nil {
			return n
		}
	}
	return v.fallback()
}

// Trigger asks for the node status to be computed now (a new image, a shutdown, a pressure change).
func (v *view) Trigger() {
	if v.status != nil {
		v.status.Trigger()
	}
}

// alivePods are the UIDs of the pods the agent has, for the pod event recorder to drop the events
// of pods deleted while the agent was down; ok is false until the sources were read (a missing
// pod may just not be back yet).
func (v *view) alivePods() (map[types.UID]bool, bool) {
	if v.agent == nil || v.agent.Ready() != nil {
		return nil, false
	}
	keep := map[types.UID]bool{}
	for _, p := range v.agent.Pods() {
		keep[p.UID] = true
	}
	return keep, true
}

// LogPath finds a container's log for the MQTT log server (`mqlet ctl logs`).
func (v *view) LogPath(namespace, name, container string, previous bool) (string, error) {
	if v.agent == nil {
		return "", fmt.Errorf("the agent is starting")
	}
	return v.agent.LogPath(namespace, name, container, previous)
}

// ExecTarget finds a running container for the MQTT exec server (`mqlet ctl exec`).
func (v *view) ExecTarget(namespace, name, container string) (string, error) {
	if v.agent == nil {
		return "", fmt.Errorf("the agent is starting")
	}
	return v.agent.ExecTarget(namespace, name, container)
}

// ExecStream runs a command for the MQTT exec server.
func (v *view) ExecStream(ctx context.Context, id string, cmd []string, s execio.Streams) (int, error) {
	if v.agent == nil {
		return -1, fmt.Errorf("the agent is starting")
	}
	return v.agent.ExecStream(ctx, id, cmd, s)
}

// AttachStream joins a container's process for the MQTT exec server's attach sessions.
func (v *view) AttachStream(ctx context.Context, id string, s execio.Streams) (int, error) {
	if v.agent == nil {
		return -1, fmt.Errorf("the agent is starting")
	}
	return v.agent.AttachStream(ctx, id, s)
}

// DialPod connects into a pod's network for the MQTT exec server's port-forward sessions.
func (v *view) DialPod(ctx context.Context, namespace, name string, port int) (net.Conn, error) {
	if v.agent == nil {
		return nil, fmt.Errorf("the agent is starting")
	}
	return v.agent.DialPod(ctx, namespace, name, port)
}

// Usage is the node's CPU and memory use for usage requests over MQTT (the bridge's kubelet
// stats), in the protocol's terms.
func (v *view) Usage(ctx context.Context) (*protocol.Usage, error) {
	if v.usage == nil {
		return nil, fmt.Errorf("the agent is starting")
	}
	s, err := v.usage(ctx)
	if err != nil {
		return nil, err
	}
	u := &protocol.Usage{Time: s.Time, Node: protocol.NodeUsage{CPUSeconds: s.Node.CPUSeconds, CPUs: s.Node.CPUs,
		MemoryWorkingSetBytes: s.Node.MemoryWorkingSetBytes, MemoryCapacityBytes: s.Node.MemoryCapacityBytes},
		Containers: make([]protocol.ContainerUsage, 0, len(s.Containers))}
	for _, c := range s.Containers {
		u.Containers = append(u.Containers, protocol.ContainerUsage{Namespace: c.Namespace, Pod: c.Pod, Container: c.Container,
			ID: c.ID, CPUSeconds: c.CPUSeconds, MemoryWorkingSetBytes: c.MemoryWorkingSetBytes})
	}
	return u, nil
}
