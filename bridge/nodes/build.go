package nodes

import (
	"fmt"
	"maps"
	"slices"

	"github.com/mqlet/mqlet/sync/protocol"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Well-known labels every registered Node carries, as kubelet sets them.
const (
	LabelHostname = "kubernetes.io/hostname"
	LabelOS       = "kubernetes.io/os"
	LabelArch     = "kubernetes.io/arch"
	// DefaultRoleLabel marks a Node as an edge node served by the bridge; its value is empty.
	DefaultRoleLabel = "node-role.kubernetes.io/edge"
)

// Reasons of the conditions the bridge writes for a node it cannot vouch for, as the node
// lifecycle controller words its own.
const (
	reasonUnknown  = "NodeStatusUnknown"
	messageOffline = "mqlet-bridge: the node is offline (its MQTT liveness says so); its status is not confirmed"
)

// checkStatus is the isolation check of a node status message: a node may only speak for itself.
// The broker's ACL already confines a node to its own subtree; this check holds without it (a
// broker configured too loosely, a bug in an ACL), since the message would otherwise change
// another node's Node object.
func checkStatus(t protocol.Topic, x *protocol.NodeStatus) error {
	if x.Node != t.Node {
		return fmt.Errorf("payload names node %q but was published on node %q's topic", x.Node, t.Node)
	}
	if x.Object.Name != t.Node {
		return fmt.Errorf("object metadata.name %q is not the topic's node %q", x.Object.Name, t.Node)
	}
	return nil
}

// registration is the Node the bridge creates the first time it hears a node's status: named as the
// node, with the agent's labels (its config's nodeLabels plus hostname, os and arch), the well-known
// labels filled from the status when the agent left them out, the edge role label (roleLabel; ""
// adds none), and the agent's taints (its nodeTaints). Annotations the agent publishes are kept.
func registration(node string, agent *v1.Node, roleLabel string) *v1.Node {
	l := make(map[string]string, len(agent.Labels)+4)
	maps.Copy(l, agent.Labels)
	if l[LabelHostname] == "" {
		l[LabelHostname] = node
		for _, a := range agent.Status.Addresses {
			if a.Type == v1.NodeHostName && a.Address != "" {
				l[LabelHostname] = a.Address
				break
			}
		}
	}
	if l[LabelOS] == "" && agent.Status.NodeInfo.OperatingSystem != "" {
		l[LabelOS] = agent.Status.NodeInfo.OperatingSystem
	}
	if l[LabelArch] == "" && agent.Status.NodeInfo.Architecture != "" {
		l[LabelArch] = agent.Status.NodeInfo.Architecture
	}
	if roleLabel != "" {
		l[roleLabel] = ""
	}
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: node, Labels: l},
		Spec:       v1.NodeSpec{Taints: slices.Clone(agent.Spec.Taints)},
	}
	if len(agent.Annotations) > 0 {
		n.Annotations = maps.Clone(agent.Annotations)
	}
	return n
}

// onlineStatus is the status the bridge posts for a node it vouches for (online on the current
// connection): the agent's addresses, capacity, allocatable, nodeInfo, images and daemon
// endpoints, and its conditions with lastHeartbeatTime set to now, as kubelet sets it each time it
// posts. A condition keeps the lastTransitionTime already in the API while its status is
// unchanged, and transitions now otherwise (e.g. Ready going back to True after the node
// lifecycle controller set it Unknown). Conditions the agent does not report (other controllers')
// and the fields it does not own are kept as they are.
func onlineStatus(existing *v1.Node, agent *v1.Node, now metav1.Time) v1.NodeStatus {
	var st v1.NodeStatus
	if existing != nil {
		st = *existing.Status.DeepCopy()
	}
	a := agent.Status.DeepCopy()
	st.Capacity, st.Allocatable = a.Capacity, a.Allocatable
	st.Addresses, st.NodeInfo, st.Images = a.Addresses, a.NodeInfo, a.Images
	st.DaemonEndpoints = a.DaemonEndpoints
	if a.RuntimeHandlers != nil {
		st.RuntimeHandlers = a.RuntimeHandlers
	}
	if a.Features != nil {
		st.Features = a.Features
	}
	prev := map[v1.NodeConditionType]v1.NodeCondition{}
	for _, c := range st.Conditions {
		prev[c.Type] = c
	}
	out := make([]v1.NodeCondition, 0, len(a.Conditions)+len(st.Conditions))
	reported := map[v1.NodeConditionType]bool{}
	for _, c := range a.Conditions {
		if reported[c.Type] {
			continue // a type listed twice: the first one counts
		}
		reported[c.Type] = true
		c.LastHeartbeatTime = now
		if p, ok := prev[c.Type]; ok && p.Status == c.Status && !p.LastTransitionTime.IsZero() {
			c.LastTransitionTime = p.LastTransitionTime
		} else {
			c.LastTransitionTime = now
		}
		out = append(out, c)
	}
	for _, c := range st.Conditions {
		if !reported[c.Type] {
			out = append(out, c)
		}
	}
	st.Conditions = out
	return st
}

// offlineStatus is the status of a Node registered while the node is offline: what the agent last
// reported, but every condition Unknown and no heartbeat, so the Node never looks healthier than
// the bridge can tell. Ready is added when the agent's status lacks it.
func offlineStatus(agent *v1.Node, now metav1.Time) v1.NodeStatus {
	st := *agent.Status.DeepCopy()
	hasReady := false
	for i := range st.Conditions {
		c := &st.Conditions[i]
		hasReady = hasReady || c.Type == v1.NodeReady
		c.Status, c.Reason, c.Message = v1.ConditionUnknown, reasonUnknown, messageOffline
		c.LastHeartbeatTime, c.LastTransitionTime = metav1.Time{}, now
	}
	if !hasReady {
		st.Conditions = append(st.Conditions, v1.NodeCondition{Type: v1.NodeReady, Status: v1.ConditionUnknown,
			Reason: reasonUnknown, Message: messageOffline, LastTransitionTime: now})
	}
	return st
}

// readyStatus is the status of n's Ready condition ("" when it has none).
func readyStatus(n *v1.Node) v1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status
		}
	}
	return ""
}

// withKubeletEndpoint points st at the bridge's kubelet API for the node: ip becomes the first
// InternalIP and port the kubeletEndpoint port. The API server dials the first address of the
// first type in its --kubelet-preferred-address-types (default Hostname, InternalDNS, InternalIP,
// ...), so the agent's Hostname and InternalDNS addresses are dropped (a device's hostname does not
// resolve in the cloud: "dial tcp: lookup edge-1: no such host"), and its external ones (a cluster
// may prefer them); its own InternalIPs follow the bridge's, for readers that want them.
func withKubeletEndpoint(st *v1.NodeStatus, ip string, port int32) {
	addrs := []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip}}
	for _, a := range st.Addresses {
		// Only the device's InternalIPs follow the bridge's: the API server dials the first address
		// of the first type in its --kubelet-preferred-address-types that the Node has, and a
		// Hostname, InternalDNS, ExternalIP or ExternalDNS the device (or the broker, through its
		// status) chose could come before InternalIP there and take exec and logs off the sealed
		// path to an address of their choosing (found by review for External*).
		if a.Type != v1.NodeInternalIP || a.Address == ip {
			continue
		}
		addrs = append(addrs, a)
	}
	st.Addresses = addrs
	st.DaemonEndpoints.KubeletEndpoint.Port = port
}
