package node

import (
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/runtime"
)

// withLogRotation puts containerLogMaxSize and containerLogMaxFiles into the runtime's options:
// the runtime writes and rotates container logs itself.
func withLogRotation(cfg config.Config, o runtime.Options) runtime.Options {
	o.LogMaxSize, o.LogMaxFiles = cfg.LogRotation()
	return o
}
