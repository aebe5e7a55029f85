package node

import (
	"log/slog"

	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/devices"
)

// newDeviceManager offers the host devices of the devices setting as extended resources. It is made
// even when none are configured, so a pod asking for one is told the node offers none. The runtime
// gives it the allocations recorded in the pod dirs; node status reads its Capacity and Allocatable.
func newDeviceManager(cfg config.Config, log *slog.Logger) *devices.Manager {
	return devices.New(cfg.DeviceResources(), "/", log.With("part", "devices"))
}
