// Package nodemetrics is the agent's own figures (pods, containers, syncs, store writes, image pulls,
// evictions, the MQTT link, usage and temperature) registered in a core/prom Registry, with the
// hooks that feed them.
package nodemetrics

import (
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/core/prom"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
)

// Event reasons with a counter of their own: OOMKilled is the reason kubelet gives a container the
// kernel killed for its memory limit. Evicted (pod.ReasonEvicted) has none: admission gives it to a
// pod it refuses under node pressure too, as kubelet does, and that evicts nothing; evictions are
// counted by the eviction manager (Agent.Evictions).
const (
	ReasonOOMKilled = "OOMKilled"
	ReasonEvicted   = "Evicted"
)

// Bucket bounds, in seconds. A pod sync ranges from a millisecond (nothing to do) to minutes (an
// image pull); a store write is an fsync on flash, from a fraction of a millisecond to seconds.
var (
	syncBuckets  = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}
	storeBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}
	pullBuckets  = []float64{0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
)

// Pod phases always reported, so a dashboard sees 0 rather than no series.
var podPhases = []v1.PodPhase{v1.PodPending, v1.PodRunning, v1.PodSucceeded, v1.PodFailed, v1.PodUnknown}

// Agent is mqlet's own figures in one Registry, with the hooks that feed them: ObserveSync for the
// pod workers, ImagePulled for the runtime, Events around the agent's event sink, Store around the
// state store, and Pods and MQTT for the figures read at scrape time.
type Agent struct {
	reg *prom.Registry

	events      *prom.CounterVec
	ooms        *prom.CounterVec
	syncs       *prom.Histogram
	storeWrites *prom.HistogramVec
	storeErrors *prom.CounterVec
	pulls       *prom.CounterVec
	pullTime    *prom.Histogram
}

// NewAgent registers the agent's figures in reg; version and commit are the build's.
func NewAgent(reg *prom.Registry, version, commit string) *Agent {
	reg.GaugeVec("mqlet_build_info", "The build of mqlet that is running; the value is always 1.", "version", "commit").
		With(version, commit).Set(1)
	a := &Agent{
		reg: reg,
		events: reg.CounterVec("mqlet_events_total",
			"Events the node emitted, by type and reason.", "type", "reason"),
		ooms: reg.CounterVec("mqlet_container_oom_kills_total",
			"Containers killed by the kernel for their memory limit (OOMKilled events), by namespace, pod and container.",
			"namespace", "pod", "container"),
		syncs: reg.Histogram("mqlet_pod_sync_duration_seconds",
			"Time a pod worker took for one sync of its pod (including image pulls and container starts), in seconds.", syncBuckets),
		storeWrites: reg.HistogramVec("mqlet_store_write_duration_seconds",
			"Time a write to the state store took (transaction and fsync, with any wait for a batch), in seconds, by operation.", storeBuckets, "operation"),
		storeErrors: reg.CounterVec("mqlet_store_write_errors_total",
			"Writes to the state store that failed, by operation.", "operation"),
		pulls: reg.CounterVec("mqlet_image_pulls_total",
			"Image pulls from a registry, by result (success, failure).", "result"),
		pullTime: reg.Histogram("mqlet_image_pull_duration_seconds",
			"Time a successful image pull took, in seconds.", pullBuckets),
	}
	// Made now so that the first failure is a change from 0 that rate() sees.
	a.pulls.With("success")
	a.pulls.With("failure")
	return a
}

// ObserveSync records one pod worker sync (pod.Env.OnSync).
func (a *Agent) ObserveSync(d time.Duration) { a.syncs.Observe(d.Seconds()) }

// ImagePulled records one pull from a registry (ctrd.Options.OnPull).
func (a *Agent) ImagePulled(ref string, took time.Duration, err error) {
	if err != nil {
		a.pulls.With("failure").Inc()
		return
	}
	a.pulls.With("success").Inc()
	a.pullTime.Observe(took.Seconds())
}

// Events returns a sink that counts every event, then hands it to next (nil: nobody).
func (a *Agent) Events(next event.Sink) event.Sink { return eventCounter{a: a, next: next} }

type eventCounter struct {
	a    *Agent
	next event.Sink
}

func (c eventCounter) Emit(e event.Event) {
	c.a.events.With(string(e.Type), e.Reason).Inc()
	if e.Reason == ReasonOOMKilled {
		c.a.ooms.With(e.Object.Namespace, e.Object.Name, containerOf(e.Object.FieldPath)).Inc()
	}
	if c.next != nil {
		c.next.Emit(e)
	}
}

// Pods registers the figures read from the agent's pods at every scrape: pods by phase, containers
// by state and container restarts. pods is Agent.Pods.
func (a *Agent) Pods(pods func() []v1.Pod) {
	// Each family reads the pods itself: a scrape is rare, and Pods copies a few dozen small
	// objects, cheaper than keeping them in step between families and concurrent scrapes.
	a.reg.Func("mqlet_pods", "Pods the agent manages, by phase.", prom.GaugeType, []string{"phase"},
		func(emit prom.Emit) {
			n := map[v1.PodPhase]int{}
			for _, p := range pods() {
				n[p.Status.Phase]++
			}
			for _, ph := range podPhases {
				emit(float64(n[ph]), string(ph))
			}
			for ph, c := range n {
				if ph != "" && !isKnownPhase(ph) {
					emit(float64(c), string(ph))
				}
			}
		})
	a.reg.Func("mqlet_containers", "Containers of the agent's pods, by state (running, waiting, terminated).", prom.GaugeType, []string{"state"},
		func(emit prom.Emit) {
			n := map[string]int{"running": 0, "waiting": 0, "terminated": 0}
			for _, p := range pods() {
				for _, cs := range allStatuses(&p.Status) {
					switch {
					case cs.State.Running != nil:
						n["running"]++
					case cs.State.Terminated != nil:
						n["terminated"]++
					default:
						n["waiting"]++
					}
				}
			}
			for s, c := range n {
				emit(float64(c), s)
			}
		})
	a.reg.Func("mqlet_container_restarts_total", "Restarts of each container of the agent's pods, as its status counts them.", prom.CounterType,
		[]string{"namespace", "pod", "container"},
		func(emit prom.Emit) {
			for _, p := range pods() {
				for _, cs := range allStatuses(&p.Status) {
					emit(float64(cs.RestartCount), p.Namespace, p.Name, cs.Name)
				}
			}
		})
}

// containerOf is the container name in a field path ("spec.containers{web}" -> "web"), or "" for
// none.
func containerOf(fieldPath string) string {
	_, rest, ok := strings.Cut(fieldPath, "{")
	if !ok || !strings.HasSuffix(rest, "}") {
		return ""
	}
	return strings.TrimSuffix(rest, "}")
}

func isKnownPhase(ph v1.PodPhase) bool {
	for _, k := range podPhases {
		if k == ph {
			return true
		}
	}
	return false
}

func allStatuses(st *v1.PodStatus) []v1.ContainerStatus {
	out := make([]v1.ContainerStatus, 0, len(st.InitContainerStatuses)+len(st.ContainerStatuses)+len(st.EphemeralContainerStatuses))
	out = append(out, st.InitContainerStatuses...)
	out = append(out, st.ContainerStatuses...)
	return append(out, st.EphemeralContainerStatuses...)
}

// Evictions registers mqlet_pod_evictions_total{eviction_signal}, read at every scrape from counts
// (eviction.Manager.Evictions): the pods the eviction manager evicted since the agent started, by
// the signal whose threshold they were evicted for, as kubelet's kubelet_evictions counts them. An
// admission refusal under pressure is not one, although its reason is Evicted too. Each of signals
// (those with a threshold) is listed from 0, so the first eviction is a change rate() sees.
func (a *Agent) Evictions(signals []string, counts func() map[string]int64) {
	a.reg.Func("mqlet_pod_evictions_total", "Pods the eviction manager evicted, by eviction signal.", prom.CounterType,
		[]string{"eviction_signal"},
		func(emit prom.Emit) {
			n := counts()
			for _, s := range signals {
				if _, ok := n[s]; !ok {
					emit(0, s)
				}
			}
			for _, s := range slices.Sorted(maps.Keys(n)) {
				emit(float64(n[s]), s)
			}
		})
}

// MQTT registers the channel's figures, read at every scrape: whether the link to the broker is up,
// and the outbox's depth and drops (store.DB.OutboxStats). Only a node with a broker calls it.
func (a *Agent) MQTT(connected func() bool, outbox func() (store.OutboxStats, error)) {
	a.reg.Func("mqlet_mqtt_connected", "1 when the MQTT link to the broker is up, else 0.", prom.GaugeType, nil,
		func(emit prom.Emit) {
			v := 0.0
			if connected() {
				v = 1
			}
			emit(v)
		})
	a.reg.Func("mqlet_mqtt_outbox_entries", "Messages queued in the outbox for the broker.", prom.GaugeType, nil,
		func(emit prom.Emit) {
			if st, err := outbox(); err == nil {
				emit(float64(st.Entries))
			}
		})
	a.reg.Func("mqlet_mqtt_outbox_bytes", "Bytes queued in the outbox for the broker.", prom.GaugeType, nil,
		func(emit prom.Emit) {
			if st, err := outbox(); err == nil {
				emit(float64(st.Bytes))
			}
		})
	a.reg.Func("mqlet_mqtt_outbox_dropped_events_total", "Events the full outbox dropped (oldest first), since the state file was created.", prom.CounterType, nil,
		func(emit prom.Emit) {
			if st, err := outbox(); err == nil {
				emit(float64(st.DroppedEvents))
			}
		})
}
