package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/api"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/eviction"
	"github.com/mqlet/mqlet/agent/nodemetrics"
	"github.com/mqlet/mqlet/agent/usage"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/core/prom"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/nodesync"
	v1 "k8s.io/api/core/v1"
)

// agentMetrics is the agent process's metrics registry and the hooks that feed it. It is made
// before the runtime and the store are opened, so their hooks exist when they are.
type agentMetrics struct {
	reg *prom.Registry
	*nodemetrics.Agent
}

func newAgentMetrics(version, commit string) *agentMetrics {
	reg := prom.NewRegistry()
	prom.RegisterProcess(reg, "/proc")
	return &agentMetrics{reg: reg, Agent: nodemetrics.NewAgent(reg, version, commit)}
}

// reporter counts every event the agent emits (OOM kills, evictions, rejections) on its way to r;
// r nil is a standalone node's (nothing is reported, but events are still counted).
func (m *agentMetrics) reporter(r agent.Reporter) agent.Reporter {
	if r == nil {
		r = standaloneReporter{}
	}
	return countingReporter{Reporter: r, events: m.Events(r)}
}

// countingReporter is a Reporter whose events pass through the metrics' counter first.
type countingReporter struct {
	agent.Reporter
	events event.Sink
}

func (c countingReporter) Emit(e event.Event) { c.events.Emit(e) }

type standaloneReporter struct{}

func (standaloneReporter) PodStatus(store.DesiredPod, v1.PodStatus) {}
func (standaloneReporter) PodGone(store.DesiredPod)                 {}
func (standaloneReporter) Emit(event.Event)                         {}

// serve registers the figures read at scrape time (the agent's pods, the eviction manager's count;
// the MQTT link and outbox when there is a channel) and adds /metrics to the local API. With
// --metrics-address it listens on TCP now (an address that cannot be listened on is an error at
// start, naming it) and returns the part that serves /metrics, /healthz and /readyz there until
// its context ends; without, a part that has nothing to do. release closes the listener of a node
// that never runs (Serve closes it otherwise).
func (m *agentMetrics) serve(cfg config.Config, a *agent.Agent, ev *eviction.Manager, ch *nodesync.Sync, db *store.DB,
	srv *api.Server, log *slog.Logger) (run func(ctx context.Context) error, release func() error, err error) {
	m.Pods(a.Pods)
	m.evictions(cfg, ev)
	if ch != nil {
		m.MQTT(ch.Connected, db.OutboxStats)
	}
	srv.Handle("GET /metrics", m.reg.Handler())
	if cfg.MetricsAddress == "" {
		return func(context.Context) error { return nil }, func() error { return nil }, nil
	}
	ln, err := prom.Listen(cfg.MetricsListenAddress())
	if err != nil {
		return nil, nil, fmt.Errorf("%w (--metrics-address)", err)
	}
	release = func() error {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
		return nil
	}
	return func(ctx context.Context) error {
		if err := prom.Serve(ctx, ln, prom.Endpoints(m.reg.Handler(), srv.Handler()), log); err != nil {
			// The agent and its pods go on; only the scrapes fail, and the log says why.
			log.Error("metrics endpoint stopped", "err", err)
		}
		return nil
	}, release, nil
}

// usageMaxAge is how long a usage reading serves the metrics: the four usage families of one
// scrape read the cgroups once; two scrapes are seconds apart at the least.
const usageMaxAge = time.Second

// usage registers the node's and the containers' CPU and memory use and the node's temperature
// and throttling as metrics, and serves fresh readings to `mqlet top` on the local API
// (/api/v1/usage), all from one usage.Reader over the containers' cgroups.
func (m *agentMetrics) usage(a *agent.Agent, rt *ctrd.Runtime, srv *api.Server, v *view) {
	r := usage.New(usage.Options{Root: "/", Pods: a.Pods, CgroupOf: rt.ContainerCgroup})
	m.Usage(func() (usage.Snapshot, error) {
		// A scrape has no context of its own here; the runtime call is bounded like the API's.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return r.Recent(ctx, usageMaxAge)
	})
	// Usage requests over MQTT (the bridge's kubelet stats) share the scrapes' recent reading.
	v.usage = func(ctx context.Context) (usage.Snapshot, error) { return r.Recent(ctx, usageMaxAge) }
	m.Thermal("/")
	srv.HandleUsage(r.Read)
}

// evictions registers the eviction manager's count of evicted pods by signal, each signal with a
// threshold listed from 0.
func (m *agentMetrics) evictions(cfg config.Config, ev *eviction.Manager) {
	var signals []string
	for _, t := range evictionThresholds(cfg) {
		if s := string(t.Signal); !slices.Contains(signals, s) {
			signals = append(signals, s)
		}
	}
	m.Evictions(signals, func() map[string]int64 {
		out := map[string]int64{}
		for s, n := range ev.Evictions() {
			out[string(s)] = n
		}
		return out
	})
}
