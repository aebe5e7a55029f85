package ctrd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/mqlet/mqlet/agent/ctrspec"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func dnsPod(policy v1.DNSPolicy, hostNetwork bool, cfg *v1.PodDNSConfig) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", UID: "0b0e2c9e-5d1f-4a7b-9c3d-2e1f0a9b8c7d"},
		Spec:       v1.PodSpec{DNSPolicy: policy, HostNetwork: hostNetwork, DNSConfig: cfg},
	}
}

func TestParseResolvConf(t *testing.T) {
	in := `# written by DHCP
nameserver 192.168.1.1
; old style comment
search old.example
nameserver 192.168.1.2 # trailing comment
domain ignored.example
search corp.example. lab.example .
options timeout:2
options ndots:2 rotate
nameserver
`
	got := parseResolvConf([]byte(in))
	want := resolver{
		Servers:  []string{"192.168.1.1", "192.168.1.2"},
		Searches: []string{"corp.example", "lab.example"},
		Options:  []string{"ndots:2", "rotate"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseResolvConf = %+v, want %+v", got, want)
	}
}

func TestResolverRender(t *testing.T) {
	rv := resolver{Servers: []string{"10.96.0.10", "fd00::a"}, Searches: []string{"a.svc.cluster.local", "cluster.local"}, Options: []string{"ndots:5", "edns0"}}
	want := "search a.svc.cluster.local cluster.local\nnameserver 10.96.0.10\nnameserver fd00::a\noptions ndots:5 edns0\n"
	if got := string(rv.render()); got != want {
		t.Errorf("render =\n%s\nwant\n%s", got, want)
	}
	if got := string((resolver{}).render()); got != "" {
		t.Errorf("empty resolver renders %q", got)
	}
}

func TestPodResolver(t *testing.T) {
	host := resolver{Servers: []string{"192.168.1.1"}, Searches: []string{"lab.example", "cluster.local"}, Options: []string{"timeout:2"}}
	cluster := DNS{ClusterDNS: []string{"10.96.0.10"}, ClusterDomain: "cluster.local", ResolvConf: "/etc/resolv.conf"}
	noCluster := DNS{ClusterDomain: "cluster.local", ResolvConf: "/etc/resolv.conf"}
	str := func(s string) *string { return &s }
	tests := []struct {
		name  string
		pod   *v1.Pod
		dns   DNS
		want  resolver
		warns []string // reasons
	}{
		{"ClusterFirst", dnsPod(v1.DNSClusterFirst, false, nil), cluster,
			resolver{Servers: []string{"10.96.0.10"}, Searches: []string{"shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "lab.example"}, Options: []string{"ndots:5"}}, nil},
		{"ClusterFirst without cluster DNS falls back to Default", dnsPod(v1.DNSClusterFirst, false, nil), noCluster,
			host, []string{ReasonMissingClusterDNS}},
		{"ClusterFirst on the host network is Default", dnsPod(v1.DNSClusterFirst, true, nil), cluster, host, nil},
		{"ClusterFirstWithHostNet", dnsPod(v1.DNSClusterFirstWithHostNet, true, nil), cluster,
			resolver{Servers: []string{"10.96.0.10"}, Searches: []string{"shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "lab.example"}, Options: []string{"ndots:5"}}, nil},
		{"ClusterFirstWithHostNet without cluster DNS", dnsPod(v1.DNSClusterFirstWithHostNet, true, nil), noCluster, host, []string{ReasonMissingClusterDNS}},
		{"Default", dnsPod(v1.DNSDefault, false, nil), cluster, host, nil},
		{"Default without a host resolver file", dnsPod(v1.DNSDefault, false, nil), DNS{ClusterDomain: "cluster.local"},
			resolver{Servers: []string{"127.0.0.1"}, Searches: []string{"."}}, nil},
		{"None", dnsPod(v1.DNSNone, false, &v1.PodDNSConfig{Nameservers: []string{"1.1.1.1"}, Searches: []string{"x.example"}, Options: []v1.PodDNSConfigOption{{Name: "edns0"}}}), cluster,
			resolver{Servers: []string{"1.1.1.1"}, Searches: []string{"x.example"}, Options: []string{"edns0"}}, nil},
		{"ClusterFirst with dnsConfig merged", dnsPod(v1.DNSClusterFirst, false, &v1.PodDNSConfig{
			Nameservers: []string{"10.96.0.10", "1.1.1.1"}, Searches: []string{"cluster.local", "x.example"},
			Options: []v1.PodDNSConfigOption{{Name: "ndots", Value: str("2")}, {Name: "edns0"}}}), cluster,
			resolver{Servers: []string{"10.96.0.10", "1.1.1.1"}, Searches: []string{"shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "lab.example", "x.example"},
				Options: []string{"ndots:2", "edns0"}}, nil},
		{"Default with dnsConfig beyond the nameserver limit", dnsPod(v1.DNSDefault, false, &v1.PodDNSConfig{Nameservers: []string{"1.1.1.1", "8.8.8.8", "9.9.9.9"}}), cluster,
			resolver{Servers: []string{"192.168.1.1", "1.1.1.1", "8.8.8.8"}, Searches: host.Searches, Options: host.Options}, []string{ReasonDNSConfigForming}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, warns := podResolver(tt.pod, tt.dns, host)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("resolver = %+v, want %+v", got, tt.want)
			}
			var reasons []string
			for _, w := range warns {
				reasons = append(reasons, w.Reason)
				if !strings.Contains(w.Message, "shop/web") {
					t.Errorf("warning %q does not name the pod", w.Message)
				}
			}
			if !reflect.DeepEqual(reasons, tt.warns) {
				t.Errorf("warnings = %v, want reasons %v", warns, tt.warns)
			}
		})
	}
	// The host's resolver is not changed by building a pod's from it.
	if host.Searches[0] != "lab.example" || len(host.Servers) != 1 {
		t.Errorf("host resolver modified: %+v", host)
	}
}

func TestFitLimits(t *testing.T) {
	var many []string
	for i := 0; i < 40; i++ {
		many = append(many, "d"+strings.Repeat("x", 3)+string(rune('a'+i%26))+".example")
	}
	rv, msgs := fitLimits(resolver{Searches: unique(many)})
	if len(rv.Searches) != 26 || len(msgs) != 0 { // unique() left 26, within the limits
		t.Fatalf("26 searches: got %d, msgs %v", len(rv.Searches), msgs)
	}
	var distinct []string
	for i := 0; i < 40; i++ {
		distinct = append(distinct, strings.Repeat("a", i+1)+".example")
	}
	rv, msgs = fitLimits(resolver{Searches: distinct})
	if len(rv.Searches) != maxSearches || len(msgs) != 1 || rv.Searches[31] != distinct[31] {
		t.Errorf("40 searches cut to %d (msgs %v), want the first %d", len(rv.Searches), msgs, maxSearches)
	}
	long := strings.Repeat("l", 250) + ".com" // 254 characters: past what glibc takes
	rv, msgs = fitLimits(resolver{Searches: []string{"a.example", long, "b.example"}})
	if !reflect.DeepEqual(rv.Searches, []string{"a.example", "b.example"}) || len(msgs) != 1 {
		t.Errorf("too long a domain: searches %v msgs %v", rv.Searches, msgs)
	}
	var wide []string // 20 domains of 200 characters: 4019 with spaces
	for i := 0; i < 20; i++ {
		wide = append(wide, strings.Repeat(string(rune('a'+i)), 196)+".com")
	}
	rv, msgs = fitLimits(resolver{Searches: wide})
	if n := len(strings.Join(rv.Searches, " ")); n > maxSearchListChars || len(rv.Searches) != 10 || len(msgs) != 1 {
		t.Errorf("wide search list cut to %d domains, %d characters (msgs %v); want 10 within %d", len(rv.Searches), n, msgs, maxSearchListChars)
	}
	rv, msgs = fitLimits(resolver{Servers: []string{"1.1.1.1", "2.2.2.2", "3.3.3.3", "4.4.4.4"}})
	if len(rv.Servers) != 3 || len(msgs) != 1 || !strings.Contains(msgs[0], "1.1.1.1 2.2.2.2 3.3.3.3") {
		t.Errorf("4 servers: %v, msgs %v", rv.Servers, msgs)
	}
}

func TestMergeOptions(t *testing.T) {
	str := func(s string) *string { return &s }
	got := mergeOptions([]string{"ndots:5", "timeout:2", "ndots:3", "rotate"},
		[]v1.PodDNSConfigOption{{Name: "ndots", Value: str("1")}, {Name: "rotate", Value: str("")}, {Name: "edns0"}, {Name: "attempts", Value: str("3")}})
	want := []string{"ndots:1", "timeout:2", "rotate", "edns0", "attempts:3"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("mergeOptions = %v, want %v", got, want)
	}
}

func TestManagedHosts(t *testing.T) {
	aliases := []v1.HostAlias{{IP: "10.0.0.5", Hostnames: []string{"db", "db.local"}}, {IP: "fd00::5", Hostnames: []string{"db6"}}}
	got := string(managedHosts([]string{"10.88.0.7", "fd00:88::7"}, "web", "api.shop.svc.cluster.local", aliases))
	want := `# Kubernetes-managed hosts file.
127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
fe00::0	ip6-localnet
fe00::0	ip6-mcastprefix
fe00::1	ip6-allnodes
fe00::2	ip6-allrouters
10.88.0.7	web.api.shop.svc.cluster.local	web
fd00:88::7	web.api.shop.svc.cluster.local	web

# Entries added by HostAliases.
10.0.0.5	db	db.local
fd00::5	db6
`
	if got != want {
		t.Errorf("managedHosts =\n%s\nwant\n%s", got, want)
	}
	got = string(managedHosts([]string{"10.88.0.7"}, "web", "", nil))
	if !strings.HasSuffix(got, "fe00::2\tip6-allrouters\n10.88.0.7\tweb\n") {
		t.Errorf("without a domain:\n%s", got)
	}
	got = string(managedHosts(nil, "web", "", nil))
	if strings.Contains(got, "web") || !strings.HasSuffix(got, "ip6-allrouters\n") {
		t.Errorf("without pod IPs the pod has no line:\n%s", got)
	}
}

func TestHostNetworkHosts(t *testing.T) {
	host := "127.0.0.1 localhost\n192.168.1.20 gw\n"
	got := string(hostNetworkHosts([]byte(host), []v1.HostAlias{{IP: "10.0.0.5", Hostnames: []string{"db"}}}))
	want := "# Kubernetes-managed hosts file (host network).\n" + host + "\n# Entries added by HostAliases.\n10.0.0.5\tdb\n"
	if got != want {
		t.Errorf("hostNetworkHosts =\n%s\nwant\n%s", got, want)
	}
}

func TestKernelHostname(t *testing.T) {
	yes := true
	pod := dnsPod(v1.DNSClusterFirst, false, nil)
	pod.Spec.Hostname, pod.Spec.Subdomain = "web-0", "api"
	domain := podDomain(pod, "cluster.local")
	if domain != "api.shop.svc.cluster.local" {
		t.Fatalf("podDomain = %q", domain)
	}
	if h, err := kernelHostname(pod, domain); err != nil || h != "web-0" {
		t.Errorf("without setHostnameAsFQDN: %q %v", h, err)
	}
	pod.Spec.SetHostnameAsFQDN = &yes
	if h, err := kernelHostname(pod, domain); err != nil || h != "web-0.api.shop.svc.cluster.local" {
		t.Errorf("setHostnameAsFQDN: %q %v", h, err)
	}
	pod.Spec.Hostname = strings.Repeat("h", 40)
	_, err := kernelHostname(pod, domain)
	var ce *ctrspec.ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "setHostnameAsFQDN") {
		t.Errorf("a 67-character FQDN: err = %v, want a ConfigError naming setHostnameAsFQDN", err)
	}
	pod.Spec.Subdomain = ""
	if h, err := kernelHostname(pod, podDomain(pod, "cluster.local")); err != nil || h != pod.Spec.Hostname {
		t.Errorf("setHostnameAsFQDN without a subdomain: %q %v", h, err)
	}
}

func TestCheckFileInput(t *testing.T) {
	bad := map[string]func(p *v1.Pod) []string{
		"hostname with a newline": func(p *v1.Pod) []string { p.Spec.Hostname = "web\n1.2.3.4 evil"; return nil },
		"subdomain":               func(p *v1.Pod) []string { p.Spec.Subdomain = "a b"; return nil },
		"alias IP": func(p *v1.Pod) []string {
			p.Spec.HostAliases = []v1.HostAlias{{IP: "1.2.3.4\n", Hostnames: []string{"x"}}}
			return nil
		},
		"alias hostname": func(p *v1.Pod) []string {
			p.Spec.HostAliases = []v1.HostAlias{{IP: "1.2.3.4", Hostnames: []string{"x\ty"}}}
			return nil
		},
		"nameserver": func(p *v1.Pod) []string {
			p.Spec.DNSConfig = &v1.PodDNSConfig{Nameservers: []string{"1.1.1.1\nsearch evil"}}
			return nil
		},
		"search": func(p *v1.Pod) []string {
			p.Spec.DNSConfig = &v1.PodDNSConfig{Searches: []string{"a.example b"}}
			return nil
		},
		"option": func(p *v1.Pod) []string {
			p.Spec.DNSConfig = &v1.PodDNSConfig{Options: []v1.PodDNSConfigOption{{Name: "a#b"}}}
			return nil
		},
		"pod IP": func(p *v1.Pod) []string { return []string{"10.0.0.1 x"} },
		"no name": func(p *v1.Pod) []string {
			p.Spec.DNSConfig = &v1.PodDNSConfig{Options: []v1.PodDNSConfigOption{{Name: ""}}}
			return nil
		},
	}
	for what, f := range bad {
		p := dnsPod(v1.DNSClusterFirst, false, nil)
		ips := f(p)
		err := checkFileInput(p, ips)
		var ce *ctrspec.ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("%s: err = %v, want a ConfigError", what, err)
		}
	}
	ok := dnsPod(v1.DNSNone, false, &v1.PodDNSConfig{Nameservers: []string{"fd00::1"}, Searches: []string{"a.example."},
		Options: []v1.PodDNSConfigOption{{Name: "ndots", Value: new(string)}}})
	ok.Spec.Hostname, ok.Spec.Subdomain = "web-0", "api"
	ok.Spec.HostAliases = []v1.HostAlias{{IP: "10.0.0.5", Hostnames: []string{"db.local"}}}
	if err := checkFileInput(ok, []string{"10.88.0.2", "fd00:88::2"}); err != nil {
		t.Errorf("a valid pod: %v", err)
	}
}

func TestPodFileMounts(t *testing.T) {
	sb := &Sandbox{HostsFile: "/s/hosts", ResolvConf: "/s/resolv.conf", HostnameFile: "/s/hostname"}
	yes := true
	mounts := func(c *v1.Container) map[string]specs.Mount {
		t.Helper()
		opt, err := podFileMounts(dnsPod(v1.DNSDefault, false, nil), sb, c)
		if err != nil {
			t.Fatal(err)
		}
		s := applyOpts(t, nil)
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/etc/resolv.conf", Source: "/etc/resolv.conf"}) // as WithHostResolvconf would
		if err := opt(context.Background(), nil, nil, s); err != nil {
			t.Fatal(err)
		}
		out := map[string]specs.Mount{}
		for _, m := range s.Mounts {
			if strings.HasPrefix(m.Destination, "/etc/") {
				if _, dup := out[m.Destination]; dup {
					t.Errorf("%s mounted twice", m.Destination)
				}
				out[m.Destination] = m
			}
		}
		return out
	}
	m := mounts(&v1.Container{Name: "a"})
	for dst, src := range map[string]string{"/etc/hosts": "/s/hosts", "/etc/resolv.conf": "/s/resolv.conf", "/etc/hostname": "/s/hostname"} {
		if m[dst].Source != src || !reflect.DeepEqual(m[dst].Options, []string{"rbind", "rw"}) {
			t.Errorf("%s: %+v, want %s rw", dst, m[dst], src)
		}
	}
	m = mounts(&v1.Container{Name: "a", SecurityContext: &v1.SecurityContext{ReadOnlyRootFilesystem: &yes},
		VolumeMounts: []v1.VolumeMount{{Name: "etc", MountPath: "/etc/hosts/"}}})
	if _, ok := m["/etc/hosts"]; ok {
		t.Errorf("a container's own /etc/hosts volume is overmounted: %+v", m)
	}
	mode := func(m specs.Mount) string { return strings.Join(m.Options, ",") }
	if mode(m["/etc/resolv.conf"]) != "rbind,ro" || mode(m["/etc/hostname"]) != "rbind,ro" {
		t.Errorf("readOnlyRootFilesystem: resolv.conf/hostname not read-only: %+v", m)
	}
	if _, err := podFileMounts(dnsPod(v1.DNSDefault, false, nil), &Sandbox{}, &v1.Container{}); err == nil {
		t.Errorf("a sandbox without the files is accepted")
	}
}

// The hook writes the three files, rewrites one only when its content changes, and then in place
// (the same inode, which running containers have mounted); the DNS warnings come with a write.
func TestHostsHookWritesOnChangeInPlace(t *testing.T) {
	dir := t.TempDir()
	hostResolv := filepath.Join(dir, "host-resolv.conf")
	if err := os.WriteFile(hostResolv, []byte("nameserver 192.168.1.1\nsearch lab.example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &Runtime{opts: Options{StateDir: dir, DNS: DNS{ClusterDomain: "cluster.local", ResolvConf: hostResolv}}}
	pod := dnsPod(v1.DNSClusterFirst, false, nil)
	pod.Spec.Subdomain = "api"
	run := func() *Sandbox {
		t.Helper()
		sb := &Sandbox{Dir: dir, PodIPs: []string{"10.88.0.9"}}
		if err := (hostsHook{dns: r.opts.DNS}).Prerun(context.Background(), pod, sb); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	ino := func(p string) uint64 {
		t.Helper()
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	read := func(p string) string { b, _ := os.ReadFile(p); return string(b) }

	sb := run()
	if sb.Hostname != "web" || read(sb.HostnameFile) != "web\n" {
		t.Errorf("hostname %q, file %q", sb.Hostname, read(sb.HostnameFile))
	}
	if !strings.Contains(read(sb.HostsFile), "10.88.0.9\tweb.api.shop.svc.cluster.local\tweb\n") {
		t.Errorf("hosts file:\n%s", read(sb.HostsFile))
	}
	if got := read(sb.ResolvConf); got != "search lab.example\nnameserver 192.168.1.1\n" {
		t.Errorf("resolv.conf (ClusterFirst without cluster DNS = Default):\n%s", got)
	}
	if len(sb.Warnings) != 1 || sb.Warnings[0].Reason != ReasonMissingClusterDNS {
		t.Errorf("warnings of the first set-up = %v, want MissingClusterDNS", sb.Warnings)
	}
	hostsIno, resolvIno := ino(sb.HostsFile), ino(sb.ResolvConf)
	before, _ := os.Stat(sb.ResolvConf)

	again := run() // an agent restart: nothing changed
	after, _ := os.Stat(again.ResolvConf)
	if len(again.Warnings) != 0 || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("unchanged files: rewritten (mtime %v -> %v) or warned again (%v)", before.ModTime(), after.ModTime(), again.Warnings)
	}

	pod.Spec.HostAliases = []v1.HostAlias{{IP: "10.0.0.5", Hostnames: []string{"db"}}}
	pod.Spec.DNSPolicy, pod.Spec.DNSConfig = v1.DNSNone, &v1.PodDNSConfig{Nameservers: []string{"1.1.1.1"}}
	changed := run()
	if !strings.HasSuffix(read(changed.HostsFile), "10.0.0.5\tdb\n") || read(changed.ResolvConf) != "nameserver 1.1.1.1\n" {
		t.Errorf("after a spec change: hosts\n%s\nresolv.conf\n%s", read(changed.HostsFile), read(changed.ResolvConf))
	}
	if ino(changed.HostsFile) != hostsIno || ino(changed.ResolvConf) != resolvIno {
		t.Errorf("files replaced instead of rewritten in place: running containers would not see the change")
	}
}

// applyOpts applies opts to an empty spec (as ctrspec's tests do), for the sandbox's file mounts.
func applyOpts(t *testing.T, opts []oci.SpecOpts) *oci.Spec {
	t.Helper()
	s := &oci.Spec{
		Root:    &specs.Root{Path: t.TempDir()},
		Process: &specs.Process{},
		Linux:   &specs.Linux{Resources: &specs.LinuxResources{}},
	}
	for i, opt := range opts {
		if err := opt(context.Background(), nil, &containers.Container{}, s); err != nil {
			t.Fatalf("spec option %d: %v", i, err)
		}
	}
	return s
}
