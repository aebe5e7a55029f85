package main

import (
	"context"
	"log/slog"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/event"
	"github.com/mqlet/mqlet/agent/imagegc"
	"github.com/mqlet/mqlet/agent/runtime"
)

// imageGC is image garbage collection running alongside the agent. Its ReclaimDisk is the eviction
// manager's node-level disk reclaim.
type imageGC struct {
	*imagegc.Manager
	stop func()
}

// Stop ends the collection loop and waits for it (a pass under way is cut short by its context).
func (g *imageGC) Stop() { g.stop() }

// startImageGC starts image garbage collection for agent a with the configured thresholds; it runs
// until ctx ends or Stop. Events go to sink (nil on a standalone node: they are logged only).
func startImageGC(ctx context.Context, cfg config.Config, rt *runtime.Runtime, a *agent.Agent, sink event.Sink, log *slog.Logger) (*imageGC, error) {
	m, err := imagegc.New(rt, imagegc.Options{
		NodeName:             cfg.NodeName,
		ImageFSDir:           cfg.ImageFSDir,
		NodeFSDir:            cfg.StateDir,
		PreloadDir:           cfg.ImagePreloadDir,
		HighThresholdPercent: int(cfg.ImageGCHighThresholdPercent),
		LowThresholdPercent:  int(cfg.ImageGCLowThresholdPercent),
		MinAge:               cfg.ImageMinimumGCAge.Duration,
		Pods:                 a.Pods,
		Ready:                a.Ready,
		Events:               sink,
		Log:                  log,
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(ctx)
	}()
	return &imageGC{Manager: m, stop: func() { cancel(); <-done }}, nil
}
