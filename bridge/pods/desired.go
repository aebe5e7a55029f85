package pods

import (
	"context"
	"fmt"
	"sync"

	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// syncNode brings one node's retained desired state in line with the API: read the retained state
// if this bridge does not know it yet, publish what changed (objects, tombstones, then the index),
// then act on what the node's acks say (refusals, confirmed deletions).
func (c *Controller) syncNode(ctx context.Context, node string) error {
	if !c.o.Served(node) {
		c.mu.Lock()
		delete(c.nodes, node)
		c.mu.Unlock()
		return nil
	}
	c.mu.Lock()
	restatus := c.restatus[node]
	delete(c.restatus, node)
	c.mu.Unlock()
	if restatus {
		if err := c.rereadStatuses(ctx, node); err != nil {
			return err
		}
	}
	st, err := c.nodeState(ctx, node)
	if err != nil {
		return err
	}
	acks := c.nodeAcks(node)
	if acks != nil {
		st.counter = max(st.counter, acksTop(acks))
	}
	want, terminating, err := c.wanted(node, st)
	if err != nil {
		return err
	}
	tomb := make(map[string]bool, len(terminating))
	for _, p := range terminating {
		tomb[protocol.ObjectKey(protocol.KindPod, p.Namespace, p.Name)] = true
	}
	c.mu.Lock()
	resend := c.resync[node]
	delete(c.resync, node)
	c.mu.Unlock()
	pl := st.plan(node, want, tomb, resend, resend != nil)
	if !pl.empty() {
		if err := c.publish(ctx, node, pl); err != nil {
			c.mu.Lock()
			if len(resend) > 0 && c.resync[node] == nil {
				c.resync[node] = resend
			}
			if c.nodes[node] == st {
				c.nodes[node] = nil // some messages may be out: read the retained state again
			}
			c.mu.Unlock()
			return fmt.Errorf("node %s: %w", node, err)
		}
		st.commit(pl)
	}
	c.checkRefusals(node, st, acks)
	if err := c.finishDeletions(ctx, node, st, terminating, acks); err != nil {
		return err
	}
	return c.clearTombstones(ctx, node, st, acks, tomb)
}

// clearTombstones removes the retained tombstones the node has taken in (its acks show the key
// deleted at or above the tombstone's generation), as protocol section 4.3 allows: otherwise every
// pod ever deleted would stay on the broker and in every restart's snapshot. The index keeps the
// deletion safe. A pod still Terminating in the API keeps its tombstone: it is what its deletion
// waits on.
func (c *Controller) clearTombstones(ctx context.Context, node string, st *nodeState, acks *protocol.Acks, terminating map[string]bool) error {
	if acks == nil {
		return nil
	}
	for key, e := range st.entries {
		if !e.Deleted || terminating[key] || acks.Deleted[key] < e.Gen {
			continue
		}
		kind, ns, name, err := protocol.ParseObjectKey(key)
		if err != nil {
			continue
		}
		topic := c.o.Topics.Desired(node, kind, ns, name)
		if err := c.o.Broker.Publish(ctx, topic, nil, true); err != nil {
			return fmt.Errorf("node %s: clear the tombstone %s: %w", node, topic, err)
		}
		st.forget(key)
		c.m.tombstonesCleared.Inc()
	}
	return nil
}

// nodeState returns the node's state, reading its retained index, acks and desired objects first
// when the bridge does not know them (start, reconnect, a resync request, a failed write).
func (c *Controller) nodeState(ctx context.Context, node string) (*nodeState, error) {
	c.mu.Lock()
	st := c.nodes[node]
	c.mu.Unlock()
	if st != nil {
		return st, nil
	}
	snap, err := c.o.Broker.Snapshot(ctx, c.o.Topics.Index(node), c.o.Topics.Acks(node), c.o.Topics.DesiredFilter(node))
	if err != nil {
		return nil, fmt.Errorf("node %s: read the retained desired state: %w", node, err)
	}
	st, problems := newNodeState(node, c.o.Topics, snap, c.o.MaxPayload)
	for _, p := range problems {
		c.log.Warn("retained state of a node is unreadable; it will be rewritten", "node", node, "err", p)
	}
	c.mu.Lock()
	c.nodes[node] = st
	c.mu.Unlock()
	return st, nil
}

// nodeAcks decodes the node's latest acks (nil when none or unreadable).
func (c *Controller) nodeAcks(node string) *protocol.Acks {
	c.mu.Lock()
	payload := c.acks[node]
	c.mu.Unlock()
	if payload == nil {
		return nil
	}
	a, err := protocol.DecodeAcks(payload, c.o.MaxPayload)
	if err == nil && a.Node != node {
		err = fmt.Errorf("payload is for node %q", a.Node)
	}
	if err != nil {
		c.refuse(protocol.Topic{Class: protocol.ClassAcks, Node: node}, "invalid", err)
		c.mu.Lock()
		if string(c.acks[node]) == string(payload) {
			delete(c.acks, node)
		}
		c.mu.Unlock()
		return nil
	}
	return a
}

// wanted is the node's desired set from the informers' caches: every pod bound to it that is not
// being deleted, and the configMaps and secrets those pods reference. Pods being deleted are
// returned apart: they get tombstones. A referenced object that does not exist is not sent (the
// node waits for it, as kubelet does); so secrets reach only nodes whose pods reference them.
func (c *Controller) wanted(node string, st *nodeState) (map[string]*object, []*v1.Pod, error) {
	objs, err := c.pods.GetIndexer().ByIndex(byNode, node)
	if err != nil {
		return nil, nil, fmt.Errorf("node %s: list pods: %w", node, err)
	}
	want := map[string]*object{}
	var terminating []*v1.Pod
	add := func(o *object, err error) {
		if err != nil {
			c.log.Error("cannot encode a desired object; the node keeps the version it has", "node", node, "err", err)
			if o != nil {
				want[o.key()] = o
			}
			return
		}
		// The envelope adds a few hundred bytes to the object.
		if len(o.Raw)+1024 > c.o.MaxPayload {
			c.m.oversize.Inc()
			c.log.Error("a desired object is too large for the node's payload limit; the node keeps the version it has",
				"node", node, "kind", o.Kind, "namespace", o.Namespace, "name", o.Name, "bytes", len(o.Raw), "limit", c.o.MaxPayload)
			o.Stuck = true
		}
		want[o.key()] = o
	}
	for _, x := range objs {
		p := podOf(x)
		if p == nil || p.Spec.NodeName != node {
			continue
		}
		if p.DeletionTimestamp != nil {
			terminating = append(terminating, p)
			continue
		}
		o, sp, err := c.podObject(node, st, p)
		add(o, err)
		if err != nil {
			continue
		}
		for _, r := range References(&sp.Spec) {
			switch r.Kind {
			case "ConfigMap":
				key := protocol.ObjectKey(protocol.KindConfigMap, p.Namespace, r.Name)
				if want[key] != nil {
					continue
				}
				cm, err := c.cmLister.ConfigMaps(p.Namespace).Get(r.Name)
				if err != nil {
					continue // missing: the node reports the pod waiting for it
				}
				add(encodeObject(protocol.KindConfigMap, cm.Namespace, cm.Name, SanitizeConfigMap(cm)))
			case "Secret":
				key := protocol.ObjectKey(protocol.KindSecret, p.Namespace, r.Name)
				if want[key] != nil {
					continue
				}
				s, err := c.secLister.Secrets(p.Namespace).Get(r.Name)
				if err != nil {
					continue
				}
				add(encodeObject(protocol.KindSecret, s.Namespace, s.Name, SanitizeSecret(s)))
			}
		}
	}
	return want, terminating, nil
}

// podObject is the pod as its node gets it, and its sanitized spec. The node re-checks nodeSelector
// and required node affinity at admission, as kubelet does, but only against the labels it knows:
// its own. The role label the bridge puts on the API's Node, and any label an administrator adds,
// are not among them, so a pod the scheduler placed by such a label would be refused by the very
// node it was placed on. kubelet makes this check against the API's Node; the bridge makes it for
// the node, with the agent's own code, and sends a pod the Node satisfies without its node
// selection. A pod the Node does not satisfy (bound by hand through spec.nodeName) keeps it, and
// the node refuses it with kubelet's NodeAffinity reason. Whichever form the node already holds
// stays: a later change of the Node's labels must not hand the node a changed pod
// (IgnoredDuringExecution).
func (c *Controller) podObject(node string, st *nodeState, p *v1.Pod) (*object, *v1.Pod, error) {
	sp := SanitizePod(p)
	full, err := encodeObject(protocol.KindPod, p.Namespace, p.Name, sp)
	if err != nil || !HasNodeSelection(sp) {
		return full, sp, err
	}
	bare := sp.DeepCopy()
	DropNodeSelection(bare)
	lean, err := encodeObject(protocol.KindPod, p.Namespace, p.Name, bare)
	if err != nil {
		return nil, nil, err
	}
	switch sent, ok := st.entries[protocol.ObjectKey(protocol.KindPod, p.Namespace, p.Name)]; {
	case ok && !sent.Deleted && sent.Hash == full.Hash:
		return full, sp, nil
	case ok && !sent.Deleted && sent.Hash == lean.Hash:
		return lean, bare, nil
	}
	if n, err := c.nodeLister.Get(node); err == nil && admission.NodeAffinityMatches(sp, node, n.Labels) {
		return lean, bare, nil
	}
	return full, sp, nil
}

// publish sends a plan: every object and tombstone (at most PublishBurst waiting for their PUBACK
// at once), and only when all are acknowledged, the index.
func (c *Controller) publish(ctx context.Context, node string, pl plan) error {
	type out struct {
		topic   string
		payload []byte
		kind    string
	}
	msgs := make([]out, 0, len(pl.Writes))
	for _, w := range pl.Writes {
		payload, err := protocol.Encode(w.Msg)
		if err != nil {
			return err
		}
		kind := string(w.Msg.Kind)
		if w.Msg.Deleted {
			kind = "tombstone"
		}
		msgs = append(msgs, out{c.o.Topics.Desired(node, w.Msg.Kind, w.Msg.Namespace, w.Msg.Name), payload, kind})
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		sem      = make(chan struct{}, c.o.PublishBurst)
	)
	for _, m := range msgs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := c.o.Broker.Publish(ctx, m.topic, m.payload, true)
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = fmt.Errorf("publish %s: %w", m.topic, err)
				}
				mu.Unlock()
				return
			}
			c.m.published.With(m.kind).Inc()
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if pl.Index == nil {
		return nil
	}
	payload, err := protocol.Encode(pl.Index)
	if err != nil {
		return err
	}
	if len(payload) > c.o.MaxPayload {
		return fmt.Errorf("the index would be %d bytes, more than the %d a node accepts", len(payload), c.o.MaxPayload)
	}
	if err := c.o.Broker.Publish(ctx, c.o.Topics.Index(node), payload, true); err != nil {
		return fmt.Errorf("publish %s: %w", c.o.Topics.Index(node), err)
	}
	c.m.indexWrites.Inc()
	return nil
}

// checkRefusals notes the pods whose current generation the node refused, so their status
// becomes Failed (kubelet fails pods its admission rejects), and forgets refusals of older
// generations.
func (c *Controller) checkRefusals(node string, st *nodeState, acks *protocol.Acks) {
	var queue []string
	c.mu.Lock()
	for topic, r := range c.refusals {
		if t, err := c.o.Topics.Parse(topic); err == nil && t.Node == node {
			e := st.entries[protocol.ObjectKey(protocol.KindPod, t.Namespace, t.Name)]
			if e.Deleted || e.Gen != r.gen {
				delete(c.refusals, topic)
			}
		}
	}
	c.mu.Unlock()
	if acks == nil {
		return
	}
	for key, r := range acks.Refused {
		kind, ns, name, err := protocol.ParseObjectKey(key)
		if err != nil || kind != protocol.KindPod {
			continue
		}
		e, ok := st.entries[key]
		if !ok || e.Deleted || e.Gen != r.Generation {
			continue
		}
		p, err := c.podLister.Pods(ns).Get(name)
		if err != nil || p.Spec.NodeName != node {
			continue
		}
		topic := c.o.Topics.PodStatus(node, ns, name)
		c.mu.Lock()
		if old, ok := c.refusals[topic]; !ok || old.gen != r.Generation || old.uid != string(p.UID) {
			c.refusals[topic] = refusal{uid: string(p.UID), gen: r.Generation, reason: r.Reason}
			queue = append(queue, topic)
		}
		c.mu.Unlock()
	}
	for _, t := range queue {
		c.queueStatus(t)
	}
}

// finishDeletions deletes, with grace period 0 and a UID precondition, the API pods being deleted
// whose node confirmed the tombstone: its acks show the key deleted at or above the tombstone's
// generation, and the node does not report the pod still there (the agent stops a pod within its
// grace period and then reports it gone; a pod it never ran is confirmed by the acks alone). A
// node that is offline confirms nothing: the pod stays Terminating, as with kubelet.
func (c *Controller) finishDeletions(ctx context.Context, node string, st *nodeState, terminating []*v1.Pod, acks *protocol.Acks) error {
	for _, p := range terminating {
		key := protocol.ObjectKey(protocol.KindPod, p.Namespace, p.Name)
		e, ok := st.entries[key]
		if !ok || !e.Deleted {
			continue
		}
		topic := c.o.Topics.PodStatus(node, p.Namespace, p.Name)
		c.mu.Lock()
		s, reported := c.summary[topic]
		c.mu.Unlock()
		ackedDeleted := acks != nil && acks.Deleted[key] >= e.Gen
		if ackedDeleted && (!reported || s.uid != string(p.UID)) {
			// The node writes acks.deleted when it takes the tombstone in, before the pod has
			// stopped. With no status of this pod in memory (a bridge that just started, its
			// statuses still being read), only the retained status can tell "never ran" from
			// "still stopping".
			rs, ok, err := c.retainedStatus(ctx, topic)
			if err != nil {
				return err
			}
			if ok {
				s, reported = rs, true
			}
		}
		goneReported := reported && s.uid == string(p.UID) && s.deleted
		stillThere := reported && s.uid == string(p.UID) && !s.deleted
		if goneReported || ackedDeleted && !stillThere {
			if err := c.deletePod(ctx, p.Namespace, p.Name, p.UID); err != nil {
				return err
			}
		}
	}
	return nil
}

// retainedStatus reads one pod's retained status from the broker: ok is false when the broker
// holds none (or an unreadable one, which says nothing about the pod either).
func (c *Controller) retainedStatus(ctx context.Context, topic string) (statusSummary, bool, error) {
	msgs, err := c.o.Broker.Snapshot(ctx, topic)
	if err != nil {
		return statusSummary{}, false, fmt.Errorf("read retained status %s: %w", topic, err)
	}
	payload, ok := msgs[topic]
	if !ok || len(payload) == 0 {
		return statusSummary{}, false, nil
	}
	ps, err := protocol.DecodePodStatus(payload, c.o.MaxPayload)
	if err != nil {
		return statusSummary{}, false, nil
	}
	return statusSummary{uid: string(ps.UID), deleted: ps.Deleted}, true, nil
}

// deletePod removes an API pod the node confirmed gone. Already gone, or replaced by a pod of
// another UID: nothing to do.
func (c *Controller) deletePod(ctx context.Context, namespace, name string, uid types.UID) error {
	zero := int64(0)
	err := c.o.Kube.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	switch {
	case err == nil:
		c.m.deletions.Inc()
		c.log.Info("deleted a pod its node confirmed gone", "namespace", namespace, "name", name, "uid", uid)
		return nil
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return nil
	}
	return fmt.Errorf("delete pod %s/%s (uid %s): %w", namespace, name, uid, err)
}
