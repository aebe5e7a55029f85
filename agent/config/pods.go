package config

import (
	"net"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/mqlet/mqlet/agent/sysctl"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// minLogMaxSize keeps rotation from turning into a file per line: kubelet has no floor, but a
// size below a few pages rotates on every burst of output and costs an fsync each time.
const minLogMaxSize = 64 << 10

// PodNetwork is podCIDR parsed; Load validated it.
func (c Config) PodNetwork() *net.IPNet {
	_, n, _ := net.ParseCIDR(c.PodCIDR)
	return n
}

// LogRotation is containerLogMaxSize in bytes and containerLogMaxFiles; Load validated them.
func (c Config) LogRotation() (maxBytes int64, maxFiles int) {
	q, _ := resource.ParseQuantity(c.ContainerLogMaxSize)
	return q.Value(), int(c.ContainerLogMaxFiles)
}

// SysctlAllowlist is what pods may set on this node: kubelet's safe set for this kernel plus
// allowedUnsafeSysctls; Load validated them.
func (c Config) SysctlAllowlist() *sysctl.Allowlist {
	a, err := sysctl.NodeAllowlist(c.AllowedUnsafeSysctls)
	if err != nil {
		a, _ = sysctl.NodeAllowlist(nil) // not reached: Load refuses what NodeAllowlist would
	}
	return a
}

// validatePods checks the CNI, DNS, container log, sysctl and registry credential settings.
func (c Config) validatePods(bad func(key, value, reason string, args ...any)) {
	abs := func(key, v string, emptyOK bool) {
		switch {
		case v == "" && emptyOK:
		case v == "":
			bad(key, v, "must not be empty")
		case !filepath.IsAbs(v):
			bad(key, v, "must be an absolute path")
		}
	}
	abs("cniConfDir", c.CNIConfDir, false)
	if len(c.CNIBinDirs) == 0 {
		bad("cniBinDirs", "", "must name at least one directory (Debian's containernetworking-plugins installs to /usr/lib/cni)")
	}
	for _, d := range c.CNIBinDirs {
		abs("cniBinDirs", d, false)
	}
	if ip, n, err := net.ParseCIDR(c.PodCIDR); err != nil {
		bad("podCIDR", c.PodCIDR, "want an IPv4 or IPv6 network such as 10.89.0.0/24: %v", err)
	} else if ones, bits := n.Mask.Size(); bits-ones < 2 {
		bad("podCIDR", c.PodCIDR, "leaves no room for pods: the network needs at least 4 addresses")
	} else if !ip.Equal(n.IP) {
		bad("podCIDR", c.PodCIDR, "has host bits set; did you mean %s?", n.String())
	}
	for _, s := range c.ClusterDNS {
		if net.ParseIP(s) == nil {
			bad("clusterDNS", s, "not an IP address")
		}
	}
	if len(c.ClusterDNS) > 3 {
		// resolv.conf takes three nameservers; kubelet drops the rest with an event, mqlet refuses.
		bad("clusterDNS", strings.Join(c.ClusterDNS, ","), "at most 3 servers (the resolver reads no more)")
	}
	if msgs := validation.IsDNS1123Subdomain(c.ClusterDomain); len(msgs) > 0 {
		bad("clusterDomain", c.ClusterDomain, "must be a DNS-1123 subdomain such as cluster.local: %s", strings.Join(msgs, "; "))
	}
	abs("resolvConf", c.ResolvConf, true)

	if q, err := resource.ParseQuantity(c.ContainerLogMaxSize); err != nil {
		bad("containerLogMaxSize", c.ContainerLogMaxSize, "want a quantity such as 10Mi: %v", err)
	} else if q.Value() < minLogMaxSize {
		bad("containerLogMaxSize", c.ContainerLogMaxSize, "must be at least 64Ki")
	}
	if c.ContainerLogMaxFiles < 2 {
		// As kubelet: the file being written and at least one rotated one.
		bad("containerLogMaxFiles", strconv.FormatInt(c.ContainerLogMaxFiles, 10), "must be at least 2")
	}
	for _, s := range c.AllowedUnsafeSysctls {
		// A name or prefix as kubelet's --allowed-unsafe-sysctls takes it (net.core.somaxconn,
		// net.core.*, kernel.msg*), and namespaced: kubelet refuses to start otherwise, since a pod
		// setting it would change the whole node.
		if _, err := sysctl.NewAllowlist([]string{s}); err != nil {
			bad("allowedUnsafeSysctls", s, "%v", err)
		}
	}
	abs("registryAuthFile", c.RegistryAuthFile, true)
}
