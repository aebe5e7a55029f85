package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/api"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/podevents"
	"github.com/mqlet/mqlet/store"
	"k8s.io/apimachinery/pkg/types"
)

// podEvents is the agent's pod event recorder and its flusher.
type podEvents struct {
	rec  *podevents.Recorder
	stop func()
}

// startPodEvents loads the pod events kept in the state store and starts the recorder's flusher.
// The returned Reporter passes every event through the recorder before report (which may be nil:
// a standalone node reports to no one) and drops a pod's events when it is gone. agentOf returns
// the agent once it is built: the flusher asks it which pods still exist, to drop events of pods
// deleted while the agent was down. stop ends the flusher after a last flush; call it before the
// store closes.
func startPodEvents(ctx context.Context, cfg config.Config, st store.State, report agent.Reporter, log *slog.Logger,
	agentOf func() *agent.Agent) (*podEvents, agent.Reporter, error) {
	rec := podevents.New(podevents.Options{Store: st, Node: cfg.NodeName, Log: log})
	if err := rec.Load(); err != nil {
		return nil, nil, fmt.Errorf("load pod events: %w", err)
	}
	alive := func() (map[types.UID]bool, bool) {
		a := agentOf()
		if a == nil || a.Ready() != nil {
			return nil, false // before the sources were read, a missing pod may just not be back yet
		}
		keep := map[types.UID]bool{}
		for _, p := range a.Pods() {
			keep[p.UID] = true
		}
		return keep, true
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); rec.Run(rctx, alive) }()
	stop := func() { cancel(); wg.Wait() }
	return &podEvents{rec: rec, stop: stop}, rec.Wrap(report), nil
}

// serve adds the pods' events to the local API (GET .../pods/{name}/events).
func (e *podEvents) serve(srv *api.Server) { srv.HandleEvents(e.rec) }
