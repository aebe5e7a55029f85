package node

import (
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/ctrd"
)

// podDNS is what the runtime writes into pods' resolv.conf and hosts files: the cluster DNS servers
// and domain, and the host resolver file ("" for none), from the clusterDNS, clusterDomain and
// resolvConf settings (validated by config.Load).
func podDNS(cfg config.Config) ctrd.DNS {
	return ctrd.DNS{ClusterDNS: cfg.ClusterDNS, ClusterDomain: cfg.ClusterDomain, ResolvConf: cfg.ResolvConf}
}
