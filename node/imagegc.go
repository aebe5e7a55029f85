package node

import (
	"log/slog"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/imagegc"
	"github.com/mqlet/mqlet/core/event"
)

// newImageGC makes image garbage collection for agent a with the configured thresholds. Events go
// to sink (nil on a standalone node: they are logged only). It is also the eviction manager's
// node-level disk reclaim.
func newImageGC(cfg config.Config, rt *ctrd.Runtime, a *agent.Agent, sink event.Sink, log *slog.Logger) (*imagegc.Manager, error) {
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
	return m, err
}
