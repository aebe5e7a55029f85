package pods

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// syncStatus writes the latest status a node reported for one pod (the work queue's key is the
// status topic, so each node's report of a name is its own entry and one node cannot displace
// another's) or, without a report, the node's refusal of the pod.
func (c *Controller) syncStatus(ctx context.Context, topic string) error {
	c.mu.Lock()
	msg, havePending := c.pending[topic]
	delete(c.pending, topic)
	ref, refused := c.refusals[topic]
	c.mu.Unlock()
	t, err := c.o.Topics.Parse(topic)
	if err != nil {
		return nil
	}
	var reported *protocol.PodStatus
	if havePending {
		reported, err = c.checkStatus(msg)
		if err != nil || reported == nil {
			return nil
		}
	}
	pod, err := c.podLister.Pods(t.Namespace).Get(t.Name)
	if apierrors.IsNotFound(err) {
		return nil // the API pod is gone: nothing to write
	}
	if err != nil {
		return err
	}
	if reported != nil {
		// Isolation: a node reports only the pods bound to it, and only the incarnation (uid) the
		// API has. A status of an earlier pod of the same name is also refused here.
		switch {
		case pod.Spec.NodeName != t.Node:
			c.refuse(t, "not-bound", fmt.Errorf("pod %s/%s is bound to node %q", t.Namespace, t.Name, pod.Spec.NodeName))
			return nil
		case string(reported.UID) != string(pod.UID):
			c.refuse(t, "uid", fmt.Errorf("status is of pod uid %q, the API pod has %q", reported.UID, pod.UID))
			return nil
		}
		c.mu.Lock()
		c.summary[topic] = statusSummary{uid: string(reported.UID), deleted: reported.Deleted}
		c.mu.Unlock()
		if reported.Deleted {
			if pod.DeletionTimestamp != nil {
				return c.deletePod(ctx, pod.Namespace, pod.Name, pod.UID)
			}
			c.queueNode(t.Node) // the node dropped a wanted pod: make sure it has the current set
			return nil
		}
		if reported.Object == nil {
			c.refuse(t, "invalid", fmt.Errorf("a status without the pod"))
			return nil
		}
		return c.writeStatus(ctx, pod, func(cur *v1.PodStatus) v1.PodStatus {
			return MergeStatus(cur, &reported.Object.Status, reported.Object.Generation)
		})
	}
	if !refused || ref.uid != string(pod.UID) || pod.Spec.NodeName != t.Node {
		return nil
	}
	c.mu.Lock()
	s, ok := c.summary[topic]
	c.mu.Unlock()
	if ok && s.uid == ref.uid && !s.deleted {
		return nil // the node runs the pod (an earlier generation): its own status is the truth
	}
	return c.writeStatus(ctx, pod, func(cur *v1.PodStatus) v1.PodStatus {
		return RefusedStatus(cur, ref.reason)
	})
}

// checkStatus decodes a reported status and checks it is about the topic it came on. A manifest
// pod of the node (source file) has no API object: nil, no error.
func (c *Controller) checkStatus(m statusMsg) (*protocol.PodStatus, error) {
	t := protocol.Topic{Class: protocol.ClassPodStatus, Node: m.node, Namespace: m.namespace, Name: m.name}
	s, err := protocol.DecodePodStatus(m.payload, c.o.MaxPayload)
	if err == nil {
		switch {
		case s.Node != m.node:
			err = fmt.Errorf("payload is for node %q", s.Node)
		case s.Namespace != m.namespace || s.Name != m.name:
			err = fmt.Errorf("payload names pod %s/%s", s.Namespace, s.Name)
		case s.Object != nil && (s.Object.Name != m.name || s.Object.Namespace != m.namespace || s.Object.UID != s.UID):
			err = fmt.Errorf("the pod in the payload is %s/%s uid %q", s.Object.Namespace, s.Object.Name, s.Object.UID)
		}
	}
	if err != nil {
		c.refuse(t, "invalid", err)
		return nil, err
	}
	if s.Source == "file" {
		return nil, nil
	}
	return s, nil
}

// writeStatus writes the status compute makes of the pod's current one, with UpdateStatus: the
// resourceVersion makes it a compare-and-swap, so a condition another controller adds meanwhile
// (DisruptionTarget) is never overwritten; a conflict reads the pod again and recomputes. The
// first attempt uses the informer's copy and most need no read. Nothing is written when the
// status would not change.
func (c *Controller) writeStatus(ctx context.Context, cached *v1.Pod, compute func(*v1.PodStatus) v1.PodStatus) error {
	pod := cached
	first := true
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !first {
			c.m.statusConflicts.Inc()
			fresh, err := c.o.Kube.CoreV1().Pods(cached.Namespace).Get(ctx, cached.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if fresh.UID != cached.UID {
				return nil // replaced meanwhile: this status is not about the new pod
			}
			pod = fresh
		}
		first = false
		next := compute(&pod.Status)
		if apiequality.Semantic.DeepEqual(next, pod.Status) {
			return nil
		}
		up := pod.DeepCopy()
		up.Status = next
		_, err := c.o.Kube.CoreV1().Pods(up.Namespace).UpdateStatus(ctx, up, metav1.UpdateOptions{})
		if err == nil {
			c.m.statusWrites.Inc()
		}
		return err
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("write status of pod %s/%s: %w", cached.Namespace, cached.Name, err)
	}
	return nil
}

// MergeStatus is the API pod's status updated with what the node reports: the node owns phase,
// reason, message, addresses, start time, container statuses, QoS class and every condition type
// it reports, except PodScheduled (the scheduler's). Conditions of other types (set by controllers,
// DisruptionTarget, readiness gates) stay as the API has them, as kubelet's status manager keeps
// them. observedGeneration is the API generation the node's pod carries.
func MergeStatus(api, node *v1.PodStatus, observedGeneration int64) v1.PodStatus {
	out := *api.DeepCopy()
	n := node.DeepCopy()
	if terminal(api.Phase) && !terminal(n.Phase) {
		// A pod that ended (or that the bridge marked Failed for a node refusal) never runs
		// again under the same UID: kubelet never moves a pod out of a terminal phase.
		return out
	}
	out.Phase = n.Phase
	out.Reason = n.Reason
	out.Message = n.Message
	out.PodIP, out.PodIPs = n.PodIP, n.PodIPs
	out.HostIP, out.HostIPs = n.HostIP, n.HostIPs
	out.StartTime = n.StartTime
	out.ContainerStatuses = n.ContainerStatuses
	out.InitContainerStatuses = n.InitContainerStatuses
	out.EphemeralContainerStatuses = n.EphemeralContainerStatuses
	if n.QOSClass != "" {
		out.QOSClass = n.QOSClass
	}
	if observedGeneration > 0 {
		out.ObservedGeneration = observedGeneration
	}
	// The resize conditions are the node's alone and come and go: one the node no longer reports
	// is over (kubelet's status manager clears them the same way).
	out.Conditions = slices.DeleteFunc(out.Conditions, func(c v1.PodCondition) bool {
		return (c.Type == v1.PodResizePending || c.Type == v1.PodResizeInProgress) &&
			!slices.ContainsFunc(n.Conditions, func(nc v1.PodCondition) bool { return nc.Type == c.Type })
	})
	for _, nc := range n.Conditions {
		if nc.Type == v1.PodScheduled {
			continue
		}
		found := false
		for i := range out.Conditions {
			if out.Conditions[i].Type == nc.Type {
				out.Conditions[i] = nc
				found = true
				break
			}
		}
		if !found {
			out.Conditions = append(out.Conditions, nc)
		}
	}
	return out
}

// RefusedStatus is the status of a pod its node refused: Failed, as kubelet fails a pod its
// admission rejects, with the node's reason as the message.
func RefusedStatus(api *v1.PodStatus, reason string) v1.PodStatus {
	out := *api.DeepCopy()
	if out.Phase == v1.PodFailed && out.Reason == ReasonNodeRefused && out.Message == reason {
		return out
	}
	out.Phase = v1.PodFailed
	out.Reason = ReasonNodeRefused
	out.Message = reason
	return out
}

func terminal(p v1.PodPhase) bool { return p == v1.PodSucceeded || p == v1.PodFailed }

// errShortRead says that a read of a node's retained pod statuses came back with fewer live
// statuses than the node's status summary counts, twice: what it lacks is read again later.
var errShortRead = errors.New("fewer retained pod statuses arrived than the node's status summary counts; read again later")

// readStatuses reads the node's retained pod statuses together with its status summary, whose
// Pods counts the live (not deleted) statuses the node keeps and which the node publishes after
// them. A read with fewer live statuses than that (a broker queue that dropped some, a status
// published meanwhile) is read again once; whole is false when the second read is short too, and
// then the caller must not take a status missing from the read for absent. A node without a
// summary (an older node) is not checked.
func (c *Controller) readStatuses(ctx context.Context, node string) (msgs map[string][]byte, whole bool, err error) {
	var expected, got int
	for attempt := 1; attempt <= 2; attempt++ {
		msgs, err = c.o.Broker.Snapshot(ctx, c.o.Topics.PodStatusFilter(node), c.o.Topics.Summary(node))
		if err != nil {
			return nil, false, fmt.Errorf("node %s: read retained pod statuses: %w", node, err)
		}
		var checked bool
		expected, got, checked = c.countStatuses(node, msgs)
		if !checked || got >= expected {
			if attempt > 1 {
				c.m.shortReads.With("repaired").Inc()
			}
			return msgs, true, nil
		}
	}
	c.m.shortReads.With("short").Inc()
	c.log.Warn("a read of the node's retained pod statuses stays short of its status summary; reading again later",
		"node", node, "expected", expected, "got", got)
	return msgs, false, nil
}

// countStatuses compares a read of the node's statuses with its summary: expected is the summary's
// count of live statuses, got the live statuses in the read (an unreadable one counts: it is there,
// and only the node knows what it says). checked is false without a usable summary.
func (c *Controller) countStatuses(node string, msgs map[string][]byte) (expected, got int, checked bool) {
	sumTopic := c.o.Topics.Summary(node)
	payload := msgs[sumTopic]
	if len(payload) == 0 {
		return 0, 0, false
	}
	sum, err := protocol.DecodeStatusSummary(payload, c.o.MaxPayload)
	if err == nil && sum.Node != node {
		err = fmt.Errorf("payload is for node %q", sum.Node)
	}
	if err != nil {
		c.refuse(protocol.Topic{Class: protocol.ClassSummary, Node: node}, "invalid", err)
		return 0, 0, false
	}
	for topic, p := range msgs {
		if topic == sumTopic || len(p) == 0 {
			continue
		}
		if ps, err := protocol.DecodePodStatus(p, c.o.MaxPayload); err == nil && ps.Deleted {
			continue
		}
		got++
	}
	return sum.Pods, got, true
}
