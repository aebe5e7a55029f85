package pods

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Limits of events.k8s.io/v1 validation.
const (
	maxNoteBytes     = 1024
	maxReasonBytes   = 128
	maxInstanceBytes = 128
)

// runEvents writes the nodes' events, at most EventQPS a second; Handle drops what the queue
// cannot hold, so a burst costs neither paho's goroutine nor the status writers anything.
func (c *Controller) runEvents(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-c.events:
			if err := c.eventLimit.Wait(ctx); err != nil {
				return
			}
			c.writeEvent(ctx, e)
		}
	}
}

func (c *Controller) writeEvent(ctx context.Context, raw rawEvent) {
	t := protocol.Topic{Class: protocol.ClassEvents, Node: raw.node}
	e, err := protocol.DecodeEvent(raw.payload, c.o.MaxPayload)
	if err == nil && e.Node != raw.node {
		err = fmt.Errorf("payload is for node %q", e.Node)
	}
	if err != nil {
		c.refuse(t, "invalid", err)
		return
	}
	ev, err := c.apiEvent(raw.node, e)
	if err != nil {
		c.refuse(t, "not-bound", err)
		return
	}
	if _, err := c.o.Kube.EventsV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		if !apierrors.IsNotFound(err) && ctx.Err() == nil { // NotFound: the namespace is being deleted
			c.log.Warn("could not write an event", "node", raw.node, "reason", e.Reason, "err", err)
		}
		return
	}
	c.m.eventsWritten.Inc()
}

// apiEvent makes the Event for a node's event: about the pod (with the API's uid) when it names a
// pod bound to the node, about the Node otherwise. An event naming a pod bound to another node is
// refused: a node speaks only for itself.
func (c *Controller) apiEvent(node string, e *protocol.Event) (*eventsv1.Event, error) {
	regarding := v1.ObjectReference{Kind: "Node", Name: node, UID: "", APIVersion: "v1"}
	ns := metav1.NamespaceDefault
	if e.Object.Kind == "Pod" && e.Object.Name != "" {
		pns := e.Object.Namespace
		if pns == "" {
			pns = metav1.NamespaceDefault
		}
		p, err := c.podLister.Pods(pns).Get(e.Object.Name)
		switch {
		case err == nil && p.Spec.NodeName != node:
			return nil, fmt.Errorf("event about pod %s/%s, which is bound to node %q", pns, e.Object.Name, p.Spec.NodeName)
		case err == nil && (e.Object.UID == "" || e.Object.UID == p.UID):
			regarding = v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name, UID: p.UID}
			ns = p.Namespace
		}
		// A manifest pod of the node or a pod already gone: the event is about the node.
	}
	when := e.Time
	if when.IsZero() {
		when = time.Now()
	}
	typ := e.Type
	if typ != v1.EventTypeNormal && typ != v1.EventTypeWarning {
		typ = v1.EventTypeWarning
	}
	reason := truncate(e.Reason, maxReasonBytes)
	if reason == "" {
		reason = "Unknown"
	}
	note := e.Message
	if e.Object.Kind != "" && regarding.Kind == "Node" && e.Object.Kind != "Node" {
		note = fmt.Sprintf("%s %s/%s: %s", e.Object.Kind, e.Object.Namespace, e.Object.Name, note)
	}
	if e.Dropped > 0 {
		note = fmt.Sprintf("%s (the node dropped %d earlier events)", note, e.Dropped)
	}
	return &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s.%x", regarding.Name, time.Now().UnixNano()),
			Namespace: ns,
		},
		EventTime:           metav1.NewMicroTime(when),
		ReportingController: ReportingController,
		ReportingInstance:   truncate(node, maxInstanceBytes),
		Action:              reason,
		Reason:              reason,
		Regarding:           regarding,
		Note:                truncate(note, maxNoteBytes),
		Type:                typ,
	}, nil
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
