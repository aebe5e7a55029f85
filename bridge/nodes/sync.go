package nodes

import (
	"context"
	"fmt"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
)

// syncStatus registers node if it has no Node yet, and posts its status when the bridge vouches
// for it and something is due: a new status from the agent, a repost (back online, or the API's
// Ready differs), or the report frequency's heartbeat. It returns when to look again.
func (c *Controller) syncStatus(ctx context.Context, name string) (time.Duration, error) {
	c.mu.Lock()
	s := c.nodes[name]
	if s == nil || s.status == nil {
		c.mu.Unlock()
		return 0, nil // nothing heard from the node yet
	}
	agent, seq, vouched := s.status, s.seq, c.vouched(s)
	since := c.o.Now().Sub(s.postedAt)
	due := s.repost || seq != s.postedSeq || since >= c.o.StatusReportFrequency-time.Second
	c.mu.Unlock()

	existing, err := c.lister.Get(name)
	switch {
	case apierrors.IsNotFound(err):
		var fresh bool
		existing, fresh, err = c.register(ctx, name, agent, vouched)
		if err != nil || existing == nil {
			return 0, err
		}
		if vouched && fresh && len(existing.Status.Conditions) > 0 {
			c.posted(name, seq) // the API kept the status given at creation
			return c.o.StatusReportFrequency, nil
		}
		due = true
	case err != nil:
		return 0, fmt.Errorf("node %s from the informer cache: %w", name, err)
	}
	if !c.o.Selector.Matches(labels.Set(existing.Labels)) {
		return 0, nil // not served: someone else's node, or relabelled away from the bridge
	}
	if !vouched {
		return 0, nil // offline: no status, no heartbeat; the Lease lapses and the NLC takes over
	}
	if !due {
		return c.o.StatusReportFrequency - since, nil
	}
	if existing, err = c.syncMeta(ctx, existing, agent); err != nil {
		return 0, err
	}
	if err := c.postStatus(ctx, existing, agent); err != nil {
		return 0, err
	}
	c.posted(name, seq)
	return c.o.StatusReportFrequency, nil
}

func (c *Controller) posted(name string, seq uint64) {
	c.mu.Lock()
	if s := c.nodes[name]; s != nil {
		s.postedSeq, s.postedAt, s.repost = seq, c.o.Now(), false
	}
	c.mu.Unlock()
}

// register creates the Node for name unless its would-be labels fall outside the selector (then it
// returns nil). An offline node is registered with every condition Unknown. fresh is false when the
// Node turned out to exist already: its status is then not ours.
func (c *Controller) register(ctx context.Context, name string, agent *v1.Node, vouched bool) (n *v1.Node, fresh bool, err error) {
	// With the record of which labels and taints the agent set (reconcileAgentMeta).
	n, _ = reconcileAgentMeta(registration(name, agent, c.o.RoleLabel), agent, c.o.RoleLabel)
	if !c.o.Selector.Matches(labels.Set(n.Labels)) {
		c.o.Log.Debug("node not registered: its labels do not match the node selector", "node", name, "selector", c.o.Selector.String())
		return nil, false, nil
	}
	now := metav1.NewTime(c.o.Now())
	if vouched {
		n.Status = onlineStatus(nil, agent, now)
	} else {
		n.Status = offlineStatus(agent, now)
	}
	if err := c.kubeletEndpoint(name, nil, &n.Status); err != nil {
		return nil, false, err
	}
	start := time.Now()
	created, err := c.o.Kube.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	c.observe("node_create", start)
	switch {
	case apierrors.IsAlreadyExists(err):
		// Created since the informer's view: take the API's copy and post status onto it.
		got, gerr := c.o.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if gerr != nil {
			return nil, false, fmt.Errorf("get node %s after it already existed: %w", name, gerr)
		}
		return got, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("register node %s: %w", name, err)
	}
	c.m.registrations.Inc()
	c.o.Log.Info("node registered", "node", name, "online", vouched, "labels", len(n.Labels), "taints", len(n.Spec.Taints))
	return created, true, nil
}

// syncMeta brings the agent's changed labels and taints onto the Node (reconcileAgentMeta),
// retrying once on a conflict with a fresh copy, and returns the Node as the API now has it.
func (c *Controller) syncMeta(ctx context.Context, existing, agent *v1.Node) (*v1.Node, error) {
	nodes := c.o.Kube.CoreV1().Nodes()
	for attempt := 0; ; attempt++ {
		upd, changed := reconcileAgentMeta(existing, agent, c.o.RoleLabel)
		if !changed {
			return existing, nil
		}
		start := time.Now()
		out, err := nodes.Update(ctx, upd, metav1.UpdateOptions{})
		c.observe("node_update", start)
		if err == nil {
			c.o.Log.Info("node labels and taints updated from the agent", "node", existing.Name,
				"labels", len(out.Labels), "taints", len(out.Spec.Taints))
			return out, nil
		}
		if !apierrors.IsConflict(err) || attempt > 0 {
			return nil, fmt.Errorf("update labels and taints of node %s: %w", existing.Name, err)
		}
		if existing, err = nodes.Get(ctx, existing.Name, metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("get node %s after a conflict: %w", existing.Name, err)
		}
	}
}

// postStatus writes the node's status subresource from the agent's, retrying once on a conflict
// with a fresh copy (the node lifecycle controller writes the same object).
func (c *Controller) postStatus(ctx context.Context, existing *v1.Node, agent *v1.Node) error {
	nodes := c.o.Kube.CoreV1().Nodes()
	for attempt := 0; ; attempt++ {
		upd := existing.DeepCopy()
		upd.Status = onlineStatus(existing, agent, metav1.NewTime(c.o.Now()))
		if err := c.kubeletEndpoint(existing.Name, existing, &upd.Status); err != nil {
			return err
		}
		start := time.Now()
		_, err := nodes.UpdateStatus(ctx, upd, metav1.UpdateOptions{})
		c.observe("node_status_update", start)
		if err == nil {
			c.m.statusPosts.With("ok").Inc()
			return nil
		}
		if !apierrors.IsConflict(err) || attempt > 0 {
			c.m.statusPosts.With("error").Inc()
			return fmt.Errorf("update status of node %s: %w", existing.Name, err)
		}
		if existing, err = nodes.Get(ctx, existing.Name, metav1.GetOptions{}); err != nil {
			c.m.statusPosts.With("error").Inc()
			return fmt.Errorf("get node %s after a conflict: %w", existing.Name, err)
		}
	}
}

// renewLease renews node's Lease when the bridge vouches for the node and serves it, and returns
// the renew interval; otherwise it writes nothing and returns 0 (the next online message, or the
// Node appearing, queues it again).
func (c *Controller) renewLease(ctx context.Context, name string) (time.Duration, error) {
	c.mu.Lock()
	s := c.nodes[name]
	vouched := s != nil && c.vouched(s)
	var lease *coordv1.Lease
	if s != nil {
		lease = s.lease
	}
	c.mu.Unlock()
	if !vouched {
		c.leaseSkips.Add(1)
		return 0, nil
	}
	n, err := c.lister.Get(name)
	if err != nil || !c.o.Selector.Matches(labels.Set(n.Labels)) {
		return 0, nil // not (yet) a served Node: registration comes first
	}
	out, err := c.writeLease(ctx, n, lease)
	if err != nil {
		c.m.leaseErrors.Inc()
		c.setLease(name, nil)
		return 0, err
	}
	c.m.renewals.Inc()
	c.setLease(name, out)
	return c.o.RenewInterval, nil
}

func (c *Controller) setLease(name string, l *coordv1.Lease) {
	c.mu.Lock()
	if s := c.nodes[name]; s != nil {
		s.lease = l
	}
	c.mu.Unlock()
}

// writeLease updates the cached Lease (no read per renewal), reading or creating it when there is
// none or the cached copy is stale.
func (c *Controller) writeLease(ctx context.Context, n *v1.Node, cached *coordv1.Lease) (*coordv1.Lease, error) {
	leases := c.o.Kube.CoordinationV1().Leases(LeaseNamespace)
	now := metav1.NewMicroTime(c.o.Now())
	if cached != nil {
		l := c.renewed(cached, n, now)
		start := time.Now()
		out, err := leases.Update(ctx, l, metav1.UpdateOptions{})
		c.observe("lease_update", start)
		if err == nil {
			return out, nil
		}
		if !isGone(err) {
			return nil, fmt.Errorf("renew lease %s/%s: %w", LeaseNamespace, n.Name, err)
		}
	}
	cur, err := leases.Get(ctx, n.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		l := c.renewed(&coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Namespace: LeaseNamespace}}, n, now)
		start := time.Now()
		out, err := leases.Create(ctx, l, metav1.CreateOptions{})
		c.observe("lease_create", start)
		if err != nil {
			return nil, fmt.Errorf("create lease %s/%s: %w", LeaseNamespace, n.Name, err)
		}
		return out, nil
	case err != nil:
		return nil, fmt.Errorf("get lease %s/%s: %w", LeaseNamespace, n.Name, err)
	}
	start := time.Now()
	out, err := leases.Update(ctx, c.renewed(cur, n, now), metav1.UpdateOptions{})
	c.observe("lease_update", start)
	if err != nil {
		return nil, fmt.Errorf("renew lease %s/%s: %w", LeaseNamespace, n.Name, err)
	}
	return out, nil
}

// renewed is l held by the node and renewed now, owned by the Node (so deleting the Node deletes
// it), as kubelet writes it.
func (c *Controller) renewed(l *coordv1.Lease, n *v1.Node, now metav1.MicroTime) *coordv1.Lease {
	l = l.DeepCopy()
	l.Spec.HolderIdentity = ptr.To(n.Name)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(c.o.LeaseDuration / time.Second))
	l.Spec.RenewTime = &now
	if n.UID != "" {
		owned := false
		for _, r := range l.OwnerReferences {
			owned = owned || r.UID == n.UID
		}
		if !owned {
			l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}}
		}
	}
	return l
}

// kubeletEndpoint puts the bridge's kubelet API endpoint for node into st, keeping the port that
// existing (the Node as the API has it; nil at registration) records when it can.
func (c *Controller) kubeletEndpoint(node string, existing *v1.Node, st *v1.NodeStatus) error {
	if c.o.KubeletEndpoint == nil {
		return nil
	}
	var recorded int32
	if existing != nil {
		recorded = existing.Status.DaemonEndpoints.KubeletEndpoint.Port
	}
	ip, port, err := c.o.KubeletEndpoint(node, recorded)
	if err != nil {
		return fmt.Errorf("kubelet endpoint of node %s: %w", node, err)
	}
	withKubeletEndpoint(st, ip, port)
	return nil
}
