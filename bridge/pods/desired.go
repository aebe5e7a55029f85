package pods

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mqlet/mqlet/core/nodeaffinity"
	"github.com/mqlet/mqlet/core/satoken"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// syncNode brings one node's retained desired state in line with the API: read the retained state
// if this bridge does not know it yet, publish what changed (objects, then the index, then the
// clearing of what the index no longer lists), then act on what the node's acks say (refusals,
// confirmed deletions).
func (c *Controller) syncNode(ctx context.Context, node string) error {
	if !c.o.Served(node) {
		c.mu.Lock()
		delete(c.nodes, node)
		c.mu.Unlock()
		if c.tokens != nil {
			c.tokens.forget(node)
		}
		return nil
	}
	c.mu.Lock()
	restatus := c.restatus[node]
	delete(c.restatus, node)
	c.mu.Unlock()
	// A read of the statuses that came back short is retried through the queue's back-off once
	// the rest of the sync is done: the node's desired state does not wait for its statuses.
	var later error
	if restatus {
		if err := c.rereadStatuses(ctx, node); errors.Is(err, errShortRead) {
			later = err
		} else if err != nil {
			return err
		}
	}
	st, err := c.nodeState(ctx, node)
	if err != nil {
		return err
	}
	acks := c.nodeAcks(node)
	if acks != nil {
		st.raise(acks.Top())
	}
	want, terminating, err := c.wanted(ctx, node, st)
	if err != nil {
		return err
	}
	termKeys := make(map[string]bool, len(terminating))
	for _, p := range terminating {
		termKeys[protocol.ObjectKey(protocol.KindPod, p.Namespace, p.Name)] = true
	}
	c.mu.Lock()
	resend := c.resync[node]
	delete(c.resync, node)
	c.mu.Unlock()
	iw := indexIfChanged
	switch {
	case nodeRunsAnotherIndex(acks, st):
		iw = indexNewRevision
		c.log.Info("the node runs another index than the one retained; writing the API's desired set at a new revision",
			"node", node, "node_revision", acks.IndexRevision, "retained_revision", st.indexRev)
	case resend != nil:
		iw = indexRepublish
	}
	pl, err := st.plan(node, want, termKeys, resend, iw, c.o.SigningKey)
	if err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
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
	// Only pods waiting for their node's confirmation need the revision that dropped them.
	for k := range st.dropped {
		if !termKeys[k] {
			delete(st.dropped, k)
		}
	}
	c.checkIndexRefused(node, st, acks)
	c.checkRefusals(node, st, acks)
	if err := c.finishDeletions(ctx, node, st, terminating, acks); err != nil {
		return err
	}
	return later
}

// checkIndexRefused reports a node that refused the index this bridge holds for it (stale,
// conflicting, invalid): its desired set cannot follow the API until a writer fixes that, and only
// a person can tell why two writers meet (docs/protocol.md section 16).
func (c *Controller) checkIndexRefused(node string, st *nodeState, acks *protocol.Acks) {
	if acks == nil || acks.IndexRefused == nil {
		return
	}
	r := acks.IndexRefused
	if r.Generation != st.indexRev || r.Digest != "" && r.Digest != st.indexDigest {
		return // an index this bridge no longer holds: the node has moved on
	}
	if st.warnedRefusedRev == r.Generation {
		return // said once per revision: every sync of the node would repeat it
	}
	st.warnedRefusedRev = r.Generation
	c.log.Warn("the node refused the current index", "node", node, "revision", r.Generation, "reason", r.Reason)
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
	var trust []ed25519.PublicKey
	if c.o.SigningKey != nil {
		trust = []ed25519.PublicKey{c.o.SigningKey.Public().(ed25519.PublicKey)}
	}
	st, problems := newNodeState(node, c.o.Topics, snap, c.o.MaxPayload, trust)
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

// wanted is the node's desired set from the informers' caches: every pod bound to it, and the
// configMaps and secrets those pods reference. Pods being deleted are also returned apart, since
// their deletion waits for the node to confirm it. A node that takes a listed pod with a
// deletionTimestamp as its deletion (gracefulDeletion) keeps getting them, with the API's
// deletionTimestamp and deletionGracePeriodSeconds, so it stops them with the API's grace period
// (and a shortened one when a later delete shortens it); for an older node the index leaves
// them out, and it stops them with their spec's.
// A referenced object that does not exist is not sent (the node waits for it, as kubelet does); so
// secrets reach only nodes whose pods reference them.
func (c *Controller) wanted(ctx context.Context, node string, st *nodeState) (map[string]*object, []*v1.Pod, error) {
	objs, err := c.pods.GetIndexer().ByIndex(byNode, node)
	if err != nil {
		return nil, nil, fmt.Errorf("node %s: list pods: %w", node, err)
	}
	want := map[string]*object{}
	var terminating []*v1.Pod
	graceful := c.gracefulDeletion(node)
	stuck := map[string]bool{}
	// logStuck logs why an object cannot be sent, once per reason: the node is synced again at
	// every change and resync, and the reason (a Secret waiting for the node's sealing key) may
	// last.
	logStuck := func(key, reason string, args ...any) {
		stuck[key] = true
		if st.stuckLogged[key] == reason {
			return
		}
		st.stuckLogged[key] = reason
		c.log.Error(reason, append([]any{"node", node, "object", key}, args...)...)
	}
	add := func(o *object, err error) {
		if err != nil {
			if o != nil {
				logStuck(o.key(), "cannot encode a desired object; the node keeps the version it has: "+err.Error())
				want[o.key()] = o
			} else {
				c.log.Error("cannot encode a desired object; the node keeps the version it has", "node", node, "err", err)
			}
			return
		}
		// The envelope adds a few hundred bytes to the object.
		if len(o.Raw)+1024 > c.o.MaxPayload {
			c.m.oversize.Inc()
			logStuck(o.key(), "a desired object is too large for the node's payload limit; the node keeps the version it has",
				"bytes", len(o.Raw), "limit", c.o.MaxPayload)
			o.Stuck = true
		}
		want[o.key()] = o
	}
	defer func() {
		for key := range st.stuckLogged {
			if !stuck[key] {
				delete(st.stuckLogged, key) // sent again: a new failure is news
			}
		}
	}()
	uids := map[types.UID]bool{}
	if c.tokens != nil {
		defer c.tokens.retain(node, uids)
	}
	for _, x := range objs {
		p := podOf(x)
		if p == nil || p.Spec.NodeName != node {
			continue
		}
		if p.DeletionTimestamp != nil {
			terminating = append(terminating, p)
			if !graceful {
				continue
			}
		}
		uids[p.UID] = true
		o, sp, toks, tokErrs, err := c.podObject(ctx, node, st, p)
		add(o, err)
		if err != nil {
			continue
		}
		for _, s := range toks {
			add(c.secretObject(node, s))
		}
		for name, err := range tokErrs {
			logStuck(protocol.ObjectKey(protocol.KindSecret, p.Namespace, name),
				"no service account token for a pod; its node waits for it: "+err.Error(), "pod", p.Namespace+"/"+p.Name)
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
				if want[key] != nil || satoken.Reserved(r.Name) {
					// A token Secret is the bridge's own, made above for its pod only: one of
					// that name in the API (a user's) is never sent in its place.
					continue
				}
				s, err := c.secLister.Secrets(p.Namespace).Get(r.Name)
				if err != nil {
					continue
				}
				add(c.secretObject(node, s))
			}
		}
	}
	return want, terminating, nil
}

// secretObject is a Secret as its node gets it: sealed to the key the node publishes (its API
// Node's annotation, from its node status). A node whose key is unknown gets no new version.
func (c *Controller) secretObject(node string, s *v1.Secret) (*object, error) {
	o, err := encodeObject(protocol.KindSecret, s.Namespace, s.Name, SanitizeSecret(s))
	if err != nil {
		return o, err
	}
	n, err := c.nodeLister.Get(node)
	if err != nil {
		o.Stuck = true
		return o, fmt.Errorf("secret %s/%s is not sent to node %s: its sealing key is unknown (no API Node yet: %w)", s.Namespace, s.Name, node, err)
	}
	pub, err := c.o.NodeTrust.NodeKey(n, time.Now())
	if err != nil {
		o.Stuck = true
		return o, fmt.Errorf("secret %s/%s is not sent to node %s: %w", s.Namespace, s.Name, node, err)
	}
	o.SealTo = pub
	// Another node key (a node set up again) must have the Secret sealed again.
	o.Hash = hashRaw(append(slices.Clip(o.Raw), sealing.KeyID(pub)...))
	return o, nil
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
//
// With service account tokens on, the pod's serviceAccountToken projections name Secrets made for
// them (withTokens), returned as toks; a token the API did not give is in tokErrs, by Secret name,
// and the node waits for it.
func (c *Controller) podObject(ctx context.Context, node string, st *nodeState, p *v1.Pod) (o *object, spec *v1.Pod, toks []*v1.Secret, tokErrs map[string]error, err error) {
	sent, held := st.entries[protocol.ObjectKey(protocol.KindPod, p.Namespace, p.Name)]
	if c.tokens != nil && held && hasInjectedTokenVolume(p) {
		// A pod the node took without its token volume (from a bridge before service account
		// tokens, or one run with --no-service-account-tokens) keeps that form: the volume added
		// would restart its containers, and a pod runs the spec it started with.
		old := SanitizePod(p)
		WithDeletion(old, p)
		c.withServiceEnv(old, p)
		if o, sp, ok := heldForm(p, old, sent.Hash); ok {
			return o, sp, nil, nil, nil
		}
	}
	sp := sanitizePod(p, c.tokens != nil)
	WithDeletion(sp, p)
	c.withServiceEnv(sp, p)
	if c.tokens != nil {
		toks, tokErrs = c.withTokens(ctx, node, sp, p)
	}
	full, err := encodeObject(protocol.KindPod, p.Namespace, p.Name, sp)
	if err != nil || !HasNodeSelection(sp) {
		return full, sp, toks, tokErrs, err
	}
	bare := sp.DeepCopy()
	DropNodeSelection(bare)
	lean, err := encodeObject(protocol.KindPod, p.Namespace, p.Name, bare)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	switch {
	case held && sent.Hash == full.Hash:
		return full, sp, toks, tokErrs, nil
	case held && sent.Hash == lean.Hash:
		return lean, bare, toks, tokErrs, nil
	}
	if n, err := c.nodeLister.Get(node); err == nil && nodeaffinity.Matches(sp, node, n.Labels) {
		return lean, bare, toks, tokErrs, nil
	}
	return full, sp, toks, tokErrs, nil
}

// heldForm returns sp encoded as the node holds it (hash), with or without its node selection,
// and false when the node holds neither form.
func heldForm(p, sp *v1.Pod, hash string) (*object, *v1.Pod, bool) {
	full, err := encodeObject(protocol.KindPod, p.Namespace, p.Name, sp)
	if err != nil {
		return nil, nil, false
	}
	if full.Hash == hash {
		return full, sp, true
	}
	if !HasNodeSelection(sp) {
		return nil, nil, false
	}
	bare := sp.DeepCopy()
	DropNodeSelection(bare)
	lean, err := encodeObject(protocol.KindPod, p.Namespace, p.Name, bare)
	if err != nil || lean.Hash != hash {
		return nil, nil, false
	}
	return lean, bare, true
}

// gracefulDeletion says whether the node takes a listed pod with a deletionTimestamp as its
// deletion, with the API's grace period: its API Node carries protocol.AnnotationPodDeletion,
// which the agent publishes in its status. A node not (yet) known says no: it gets the deletion
// the way every node version takes it, an index that leaves the pod out.
func (c *Controller) gracefulDeletion(node string) bool {
	n, err := c.nodeLister.Get(node)
	return err == nil && n.Annotations[protocol.AnnotationPodDeletion] == protocol.PodDeletionGraceful
}

// publish sends a plan: every object (at most PublishBurst waiting for their PUBACK at once), and
// only when all are acknowledged the index, and only once the index is acknowledged the clearing
// of the topics it no longer lists.
func (c *Controller) publish(ctx context.Context, node string, pl plan) error {
	type out struct {
		topic   string
		payload []byte
		kind    string
	}
	msgs := make([]out, 0, len(pl.Writes))
	for _, w := range pl.Writes {
		msgs = append(msgs, out{c.o.Topics.Desired(node, w.Msg.Kind, w.Msg.Namespace, w.Msg.Name), w.Payload, string(w.Msg.Kind)})
	}
	if err := publishAll(c, ctx, msgs, func(m out) (string, []byte) { return m.topic, m.payload },
		func(m out) { c.m.published.With(m.kind).Inc() }); err != nil {
		return err
	}
	if pl.Index != nil {
		if len(pl.IndexPayload) > c.o.MaxPayload {
			return fmt.Errorf("the index at revision %d would be %d bytes, more than the %d a node accepts",
				pl.Index.Revision, len(pl.IndexPayload), c.o.MaxPayload)
		}
		if err := c.o.Broker.Publish(ctx, c.o.Topics.Index(node), pl.IndexPayload, true); err != nil {
			return fmt.Errorf("publish %s (revision %d): %w", c.o.Topics.Index(node), pl.Index.Revision, err)
		}
		c.m.indexWrites.Inc()
	}
	clears := make([]string, 0, len(pl.Clears))
	for _, k := range pl.Clears {
		kind, ns, name, err := protocol.ParseObjectKey(k)
		if err != nil {
			return fmt.Errorf("clear retained desired object %q: %w", k, err) // keys come from parsed topics: a bug
		}
		clears = append(clears, c.o.Topics.Desired(node, kind, ns, name))
	}
	return publishAll(c, ctx, clears, func(topic string) (string, []byte) { return topic, nil },
		func(string) { c.m.cleared.Inc() })
}

// publishAll publishes items as retained messages, at most PublishBurst waiting for their PUBACK at
// once, calling done for each acknowledged one; the first failure is returned once all ended.
func publishAll[T any](c *Controller, ctx context.Context, items []T, msg func(T) (string, []byte), done func(T)) error {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		sem      = make(chan struct{}, c.o.PublishBurst)
	)
	for _, it := range items {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			topic, payload := msg(it)
			if err := c.o.Broker.Publish(ctx, topic, payload, true); err != nil {
				mu.Lock()
				if firstErr == nil {
					what := "publish"
					if len(payload) == 0 {
						what = "clear"
					}
					firstErr = fmt.Errorf("%s %s: %w", what, topic, err)
				}
				mu.Unlock()
				return
			}
			done(it)
		})
	}
	wg.Wait()
	return firstErr
}

// checkRefusals notes the pods whose current generation the node refused, so their status
// becomes Failed (kubelet fails pods its admission rejects), and forgets refusals of older
// generations. Every refusal counts the same: the node's admission or policy, and a payload the
// node could not decode (its reason starts with "undecodable"), which the node will not run either
// until a new generation comes. A refusal of another payload than the one retained (another
// digest) is not about what this bridge sent.
func (c *Controller) checkRefusals(node string, st *nodeState, acks *protocol.Acks) {
	var queue []string
	c.mu.Lock()
	for topic, r := range c.refusals {
		if t, err := c.o.Topics.Parse(topic); err == nil && t.Node == node {
			e, ok := st.entries[protocol.ObjectKey(protocol.KindPod, t.Namespace, t.Name)]
			if !ok || e.Gen != r.gen {
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
		if !ok || e.Gen != r.Generation || r.Digest != "" && r.Digest != e.Digest {
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
			if strings.HasPrefix(r.Reason, reasonUndecodable) {
				// The bridge wrote it: a node that cannot decode it speaks another contract,
				// or the bridge has a bug.
				c.log.Warn("the node could not decode a pod the bridge sent; the pod fails", "node", node,
					"namespace", ns, "name", name, "generation", r.Generation, "reason", r.Reason)
			}
		}
		c.mu.Unlock()
	}
	for _, t := range queue {
		c.queueStatus(t)
	}
}

// reasonUndecodable starts the reason of a refusal of a payload the node could not decode.
const reasonUndecodable = "undecodable"

// finishDeletions deletes, with grace period 0 and a UID precondition, the API pods being deleted
// whose node confirmed the deletion: its acks are at or above the revision of the index that left
// the pod out and name the pod in none of their outcomes, and the node does not report the pod
// still there (the agent stops a pod within its grace period and then reports it gone; a pod it
// never ran is confirmed by the acks alone). A node that is offline confirms nothing: the pod
// stays Terminating, as with kubelet.
func (c *Controller) finishDeletions(ctx context.Context, node string, st *nodeState, terminating []*v1.Pod, acks *protocol.Acks) error {
	var (
		retained map[string][]byte // the node's retained statuses, read once when needed
		whole    bool
		short    error
	)
	for _, p := range terminating {
		key := protocol.ObjectKey(protocol.KindPod, p.Namespace, p.Name)
		// A node that refused the generation that carries the deletion (gracefulDeletion) holds
		// nothing of it either: as for a dropped pod, only a status can say an older one runs.
		acked := goneFromNode(acks, key, st.dropRevision(key), st.current()) || refusedCurrent(acks, st, key)
		topic := c.o.Topics.PodStatus(node, p.Namespace, p.Name)
		c.mu.Lock()
		s, reported := c.summary[topic]
		c.mu.Unlock()
		if acked && (!reported || s.uid != string(p.UID)) {
			// The node acks the index that leaves the pod out when it takes that index in,
			// before the pod has stopped. With no status of this pod in memory (a bridge that
			// just started, its statuses still being read), only the retained status can tell
			// "never ran" from "still stopping", and only a whole read can tell it is absent.
			if retained == nil {
				var err error
				if retained, whole, err = c.readStatuses(ctx, node); err != nil {
					return err
				}
			}
			rs, ok := c.statusIn(retained, topic)
			switch {
			case ok:
				s, reported = rs, true
			case !whole:
				short = fmt.Errorf("node %s: pod %s/%s waits for its deletion: %w", node, p.Namespace, p.Name, errShortRead)
				continue
			}
		}
		goneReported := reported && s.uid == string(p.UID) && s.deleted
		stillThere := reported && s.uid == string(p.UID) && !s.deleted
		if goneReported || acked && !stillThere {
			if err := c.deletePod(ctx, p.Namespace, p.Name, p.UID); err != nil {
				return err
			}
		}
	}
	return short
}

// refusedCurrent says whether the node's acks refuse the generation of key this bridge has retained.
func refusedCurrent(acks *protocol.Acks, st *nodeState, key string) bool {
	if acks == nil {
		return false
	}
	r, refused := acks.Refused[key]
	e, ok := st.entries[key]
	return refused && ok && e.Gen == r.Generation && (r.Digest == "" || r.Digest == e.Digest)
}

// statusIn is what a pod's retained status in a read of the node's statuses says: ok is false when
// the read holds none (or an unreadable one, which says nothing about the pod either).
func (c *Controller) statusIn(retained map[string][]byte, topic string) (statusSummary, bool) {
	payload, ok := retained[topic]
	if !ok || len(payload) == 0 {
		return statusSummary{}, false
	}
	ps, err := protocol.DecodePodStatus(payload, c.o.MaxPayload)
	if err != nil {
		return statusSummary{}, false
	}
	return statusSummary{uid: string(ps.UID), deleted: ps.Deleted}, true
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
