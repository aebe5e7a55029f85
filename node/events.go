package node

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/api"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/podevents"
	"github.com/mqlet/mqlet/store"
)

// podEvents loads the pod events kept in the state store and makes the recorder's part (it
// flushes once more when it ends, before the store closes). The returned Reporter passes every
// event through the recorder before report (which may be nil: a standalone node reports to no
// one) and drops a pod's events when it is gone. The recorder asks the view which pods still
// exist, to drop events of pods deleted while the agent was down.
func (n *Node) podEvents(cfg config.Config, st store.State, report agent.Reporter, log *slog.Logger) (agent.Reporter, error) {
	rec := podevents.New(podevents.Options{Store: st, Node: cfg.NodeName, Log: log})
	if err := rec.Load(); err != nil {
		return nil, fmt.Errorf("load pod events: %w", err)
	}
	n.recorder = rec
	n.events = part{name: "pod events", run: func(ctx context.Context) error { return rec.Run(ctx, n.view.alivePods) }}
	return rec.Wrap(report), nil
}

// serveEvents adds the pods' events to the local API (GET .../pods/{name}/events).
func (n *Node) serveEvents(srv *api.Server) { srv.HandleEvents(n.recorder) }
