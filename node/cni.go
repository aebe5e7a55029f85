package node

import (
	"log/slog"
	"path/filepath"

	"github.com/mqlet/mqlet/agent/cni"
	"github.com/mqlet/mqlet/agent/config"
)

// newPodNetwork is the CNI manager of the pods' networks (cniConfDir, cniBinDirs), with its records
// under <state>/cni/pods. When the configuration directory holds no configuration it first writes
// mqlet's default there: a bridge on podCIDR whose host-local allocations live in
// <state>/cni/networks. A network that is not usable (no valid configuration, a plugin missing) is
// no reason to stop: hostNetwork pods run, the others wait, and the node status says why.
func newPodNetwork(cfg config.Config, log *slog.Logger) *cni.Manager {
	state := filepath.Join(cfg.StateDir, "cni")
	d := cni.DefaultNetwork{Name: cni.DefaultNetworkName, Bridge: cni.DefaultBridge, Subnet: cfg.PodNetwork().String(),
		DataDir: filepath.Join(state, "networks")}
	if wrote, err := cni.WriteDefault(cfg.CNIConfDir, d); err != nil {
		log.Error("cannot write the default CNI network (--cni-conf-dir)", "dir", cfg.CNIConfDir, "err", err)
	} else if wrote {
		log.Info("wrote the default CNI network", "file", filepath.Join(cfg.CNIConfDir, cni.DefaultConfFile),
			"bridge", cni.DefaultBridge, "podCIDR", d.Subnet)
	}
	m := cni.New(cni.Options{ConfDir: cfg.CNIConfDir, BinDirs: cfg.CNIBinDirs, StateDir: filepath.Join(state, "pods"), Log: log})
	if err := m.Ready(); err != nil {
		log.Warn("pod network not ready: pods without hostNetwork wait until it is", "err", err)
	}
	return m
}
