package config

import (
	"strings"
	"testing"
)

func TestLoadPodSettings(t *testing.T) {
	c, err := Load(Flags{NodeName: ptr("n1"), PodCIDR: ptr("10.90.0.0/16"),
		ContainerLogMaxSize: ptr("1Mi"), ContainerLogMaxFiles: ptr(int64(3)),
		CNIBinDirs: []string{"/a,/b"}},
		[]string{"MQLET_CLUSTER_DNS=10.96.0.10", "MQLET_ALLOWED_UNSAFE_SYSCTLS=net.core.*,kernel.msg*"})
	if err != nil {
		t.Fatal(err)
	}
	if n := c.PodNetwork(); n == nil || n.String() != "10.90.0.0/16" {
		t.Errorf("PodNetwork = %v", n)
	}
	if size, files := c.LogRotation(); size != 1<<20 || files != 3 {
		t.Errorf("LogRotation = %d, %d", size, files)
	}
	if len(c.CNIBinDirs) != 2 || len(c.ClusterDNS) != 1 || len(c.AllowedUnsafeSysctls) != 2 {
		t.Errorf("lists: %v %v %v", c.CNIBinDirs, c.ClusterDNS, c.AllowedUnsafeSysctls)
	}
}

func TestLoadPodSettingErrors(t *testing.T) {
	for _, tc := range []struct {
		f    Flags
		want string
	}{
		{Flags{PodCIDR: ptr("10.89.0.0")}, `invalid podCIDR (--pod-cidr) "10.89.0.0"`},
		{Flags{PodCIDR: ptr("10.89.0.1/24")}, `did you mean 10.89.0.0/24?`},
		{Flags{PodCIDR: ptr("10.89.0.0/31")}, `no room for pods`},
		{Flags{CNIConfDir: ptr("net.d")}, `invalid cniConfDir (--cni-conf-dir) "net.d" (from flag --cni-conf-dir): must be an absolute path`},
		{Flags{CNIBinDirs: []string{"bin"}}, `cniBinDirs`},
		{Flags{ClusterDNS: []string{"dns.local"}}, `not an IP address`},
		{Flags{ClusterDNS: []string{"1.1.1.1,1.1.1.2,1.1.1.3,1.1.1.4"}}, `at most 3 servers`},
		{Flags{ClusterDomain: ptr("Cluster_Local")}, `DNS-1123 subdomain`},
		{Flags{ResolvConf: ptr("resolv.conf")}, `resolvConf`},
		{Flags{ContainerLogMaxSize: ptr("ten")}, `want a quantity`},
		{Flags{ContainerLogMaxSize: ptr("1Ki")}, `at least 64Ki`},
		{Flags{ContainerLogMaxFiles: ptr(int64(1))}, `containerLogMaxFiles`},
		{Flags{AllowedUnsafeSysctls: []string{"net/*/x!"}}, `not a sysctl name`},
		{Flags{AllowedUnsafeSysctls: []string{"vm.swappiness"}}, `"vm.swappiness" is not known to be namespaced`},
		{Flags{AllowedUnsafeSysctls: []string{"kernel.*"}}, `not known to be namespaced`},
		{Flags{RegistryAuthFile: ptr("auth.json")}, `registryAuthFile`},
	} {
		tc.f.NodeName = ptr("n1")
		_, err := Load(tc.f, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want it to mention %q", tc.f, err, tc.want)
		}
	}
	if _, err := Load(Flags{NodeName: ptr("n1"), ResolvConf: ptr("")}, nil); err != nil {
		t.Errorf("empty resolvConf (no resolver for Default pods) refused: %v", err)
	}
}
