package node

import (
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/ctrd"
)

// withLogRotation puts containerLogMaxSize and containerLogMaxFiles into the runtime's options:
// the runtime writes and rotates container logs itself.
func withLogRotation(cfg config.Config, o ctrd.Options) ctrd.Options {
	o.LogMaxSize, o.LogMaxFiles = cfg.LogRotation()
	return o
}
