package pods

import (
	"github.com/mqlet/mqlet/core/prom"
)

type ctlMetrics struct {
	published       *prom.CounterVec
	indexWrites     *prom.Counter
	oversize        *prom.Counter
	statusWrites    *prom.Counter
	statusConflicts *prom.Counter
	refused         *prom.CounterVec
	deletions       *prom.Counter
	cleared         *prom.Counter
	shortReads      *prom.CounterVec
	eventsWritten   *prom.Counter
	eventsDropped   *prom.Counter
}

func newMetrics(r *prom.Registry, c *Controller) *ctlMetrics {
	m := &ctlMetrics{
		published: r.CounterVec("mqlet_bridge_desired_published_total",
			"Retained desired messages published, by kind (Pod, ConfigMap, Secret).", "kind"),
		indexWrites: r.Counter("mqlet_bridge_index_writes_total", "Node indexes published."),
		oversize: r.Counter("mqlet_bridge_desired_oversize_total",
			"Desired objects not sent because they exceed the payload limit."),
		statusWrites:    r.Counter("mqlet_bridge_pod_status_writes_total", "Pod status writes to the API."),
		statusConflicts: r.Counter("mqlet_bridge_pod_status_conflicts_total", "Pod status writes retried after a conflict."),
		refused: r.CounterVec("mqlet_bridge_refused_messages_total",
			"Node messages refused (invalid, too large, about a pod not bound to the node, another uid), by class and reason.",
			"class", "reason"),
		cleared: r.Counter("mqlet_bridge_desired_cleared_total",
			"Retained desired topics cleared (an empty payload) after an index that no longer lists them was published."),
		shortReads: r.CounterVec("mqlet_bridge_status_reads_short_total",
			"Reads of a node's retained pod statuses that came back with fewer live statuses than its status summary counts, by outcome (repaired: a second read was whole; short: it was not, read again later).",
			"outcome"),
		deletions:     r.Counter("mqlet_bridge_pod_deletions_total", "API pods deleted after their node confirmed them gone."),
		eventsWritten: r.Counter("mqlet_bridge_events_written_total", "Events written to the API from node events."),
		eventsDropped: r.Counter("mqlet_bridge_events_dropped_total", "Node events dropped because the event queue was full."),
	}
	r.Func("mqlet_bridge_queue_depth", "Work waiting in the pod controller's queues.", prom.GaugeType,
		[]string{"queue"}, func(emit prom.Emit) {
			c.mu.Lock()
			nq, sq := c.nodeQ, c.statusQ
			c.mu.Unlock()
			if nq != nil {
				emit(float64(nq.Len()), "nodes")
			}
			if sq != nil {
				emit(float64(sq.Len()), "status")
			}
			emit(float64(len(c.events)), "events")
		})
	return m
}
