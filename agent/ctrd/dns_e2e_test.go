package ctrd_test

// resolv.conf, hosts and hostname as the pod's containers see them, on the test environment's
// containerd: a busybox container of each pod prints the three files and its hostname.

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/internal/testenv"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// hostResolv is the node's resolver file in these tests (the resolvConf setting).
const hostResolv = "# the node's\nnameserver 192.0.2.53\nsearch lab.example\noptions timeout:2\n"

// newDNSRig is newRig with the node's DNS settings: a cluster DNS server unless noCluster.
func newDNSRig(t *testing.T, noCluster bool) *rig {
	t.Helper()
	env := testenv.Require(t)
	ns := testenv.Namespace(t, env.ContainerdAddress)
	state := t.TempDir()
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte(hostResolv), 0o644); err != nil {
		t.Fatal(err)
	}
	dns := ctrd.DNS{ClusterDNS: []string{"10.96.0.10"}, ClusterDomain: "cluster.local", ResolvConf: resolv}
	if noCluster {
		dns.ClusterDNS = nil
	}
	r, err := ctrd.New(context.Background(), ctrd.Options{Address: env.ContainerdAddress, Namespace: ns, StateDir: state,
		DNS: dns, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if _, err := r.ImportArchiveIfMissing(context.Background(), env.Image(testenv.Busybox)); err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, r: r, state: state}
}

// podFiles is what a container of the pod printed.
type podFiles struct{ resolv, hosts, hostnameFile, hostname string }

const printFiles = `cat /etc/resolv.conf; echo '@@'; cat /etc/hosts; echo '@@'; cat /etc/hostname; echo '@@'; hostname; echo '@@END'`

// files starts a busybox container in pod that prints the files, and returns what it printed.
func (g *rig) files(p *v1.Pod) (podFiles, *ctrd.Sandbox) {
	g.t.Helper()
	sb := g.sandbox(p)
	c := g.start(p, sb, &p.Spec.Containers[0])
	g.waitLog(c, "@@END")
	b, err := readLog(c.LogPath)
	if err != nil {
		g.t.Fatal(err)
	}
	parts := strings.Split(string(b), "@@\n")
	if len(parts) != 4 {
		g.t.Fatalf("pod %s printed %q", p.Name, b)
	}
	return podFiles{resolv: parts[0], hosts: parts[1], hostnameFile: parts[2], hostname: strings.TrimSpace(strings.TrimSuffix(parts[3], "@@END\n"))}, sb
}

func dnsE2EPod(uid, name string, mutate func(s *v1.PodSpec)) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", UID: types.UID(uid)},
		Spec: v1.PodSpec{DNSPolicy: v1.DNSClusterFirst, Containers: []v1.Container{{Name: "c", Image: testenv.BusyboxRef,
			ImagePullPolicy: v1.PullNever, Command: []string{"sh", "-c", printFiles}}}}}
	if mutate != nil {
		mutate(&p.Spec)
	}
	return p
}

func TestPodDNSFilesPerPolicy(t *testing.T) {
	g := newDNSRig(t, false)
	hostName, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	hostHosts, err := os.ReadFile("/etc/hosts")
	if err != nil {
		t.Fatal(err)
	}
	aliases := []v1.HostAlias{{IP: "10.0.0.5", Hostnames: []string{"db", "db.local"}}}
	aliasBlock := "\n# Entries added by HostAliases.\n10.0.0.5\tdb\tdb.local\n"
	clusterResolv := "search shop.svc.cluster.local svc.cluster.local cluster.local lab.example\nnameserver 10.96.0.10\noptions ndots:5\n"
	hostResolvRendered := "search lab.example\nnameserver 192.0.2.53\noptions timeout:2\n"
	yes := true

	tests := []struct {
		name         string
		pod          *v1.Pod
		resolv       string
		hostsHas     []string
		hostsExact   string // when set, the whole hosts file
		hostname     string
		hostnameFile string
	}{
		{
			name: "ClusterFirst with hostname, subdomain and hostAliases",
			pod: dnsE2EPod("d5e2e000-0001", "web", func(s *v1.PodSpec) {
				s.Hostname, s.Subdomain, s.HostAliases = "web-0", "api", aliases
			}),
			resolv:   clusterResolv,
			hostsHas: []string{"# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n", aliasBlock},
			hostname: "web-0",
		},
		{
			name: "ClusterFirst with setHostnameAsFQDN",
			pod: dnsE2EPod("d5e2e000-0002", "fqdn", func(s *v1.PodSpec) {
				s.Subdomain, s.SetHostnameAsFQDN = "api", &yes
			}),
			resolv:   clusterResolv,
			hostsHas: []string{"127.0.0.1\tlocalhost\n"},
			hostname: "fqdn.api.shop.svc.cluster.local",
		},
		{
			name:     "Default",
			pod:      dnsE2EPod("d5e2e000-0003", "dflt", func(s *v1.PodSpec) { s.DNSPolicy = v1.DNSDefault }),
			resolv:   hostResolvRendered,
			hostsHas: []string{"127.0.0.1\tlocalhost\n"},
			hostname: "dflt",
		},
		{
			name: "None with dnsConfig",
			pod: dnsE2EPod("d5e2e000-0004", "none", func(s *v1.PodSpec) {
				two := "2"
				s.DNSPolicy = v1.DNSNone
				s.DNSConfig = &v1.PodDNSConfig{Nameservers: []string{"1.1.1.1", "9.9.9.9"}, Searches: []string{"x.example"},
					Options: []v1.PodDNSConfigOption{{Name: "ndots", Value: &two}, {Name: "edns0"}}}
			}),
			resolv:   "search x.example\nnameserver 1.1.1.1\nnameserver 9.9.9.9\noptions ndots:2 edns0\n",
			hostsHas: []string{"127.0.0.1\tlocalhost\n"},
			hostname: "none",
		},
		{
			name: "ClusterFirst with dnsConfig merged",
			pod: dnsE2EPod("d5e2e000-0005", "merge", func(s *v1.PodSpec) {
				one := "1"
				s.DNSConfig = &v1.PodDNSConfig{Nameservers: []string{"1.1.1.1"}, Searches: []string{"x.example"},
					Options: []v1.PodDNSConfigOption{{Name: "ndots", Value: &one}}}
			}),
			resolv:   "search shop.svc.cluster.local svc.cluster.local cluster.local lab.example x.example\nnameserver 10.96.0.10\nnameserver 1.1.1.1\noptions ndots:1\n",
			hostsHas: []string{"127.0.0.1\tlocalhost\n"},
			hostname: "merge",
		},
		{
			name: "hostNetwork with ClusterFirstWithHostNet",
			pod: dnsE2EPod("d5e2e000-0006", "hostnet", func(s *v1.PodSpec) {
				s.HostNetwork, s.DNSPolicy, s.HostAliases = true, v1.DNSClusterFirstWithHostNet, aliases
			}),
			resolv:     clusterResolv,
			hostsExact: "# Kubernetes-managed hosts file (host network).\n" + string(hostHosts) + aliasBlock,
			hostname:   hostName,
		},
		{
			name: "hostNetwork with ClusterFirst is Default",
			pod: dnsE2EPod("d5e2e000-0007", "hostnet-cf", func(s *v1.PodSpec) {
				s.HostNetwork = true
			}),
			resolv:     hostResolvRendered,
			hostsExact: "# Kubernetes-managed hosts file (host network).\n" + string(hostHosts),
			hostname:   hostName,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &rig{t: t, r: g.r, state: g.state}
			got, sb := g.files(tt.pod)
			if got.resolv != tt.resolv {
				t.Errorf("/etc/resolv.conf =\n%s\nwant\n%s", got.resolv, tt.resolv)
			}
			for _, want := range tt.hostsHas {
				if !strings.Contains(got.hosts, want) {
					t.Errorf("/etc/hosts =\n%s\nwant it to hold\n%s", got.hosts, want)
				}
			}
			if tt.hostsExact != "" && got.hosts != tt.hostsExact {
				t.Errorf("/etc/hosts =\n%s\nwant\n%s", got.hosts, tt.hostsExact)
			}
			// Until the pod has IPs (CNI), its hosts file names it on no address line.
			if !tt.pod.Spec.HostNetwork && len(sb.PodIPs) == 0 && strings.Contains(got.hosts, "\t"+tt.hostname) {
				t.Errorf("/etc/hosts names the pod without a pod IP:\n%s", got.hosts)
			}
			for _, ip := range sb.PodIPs {
				if !strings.Contains(got.hosts, ip+"\t") {
					t.Errorf("/etc/hosts has no line for pod IP %s:\n%s", ip, got.hosts)
				}
			}
			if got.hostname != tt.hostname || got.hostnameFile != tt.hostname+"\n" {
				t.Errorf("hostname %q, /etc/hostname %q; want %q", got.hostname, got.hostnameFile, tt.hostname)
			}
			if len(sb.Warnings) != 0 {
				t.Errorf("warnings %v on a node with cluster DNS", sb.Warnings)
			}
		})
	}
}

// Without cluster DNS, a ClusterFirst pod gets the host's resolver, and the sandbox says why.
func TestPodDNSClusterFirstWithoutClusterDNS(t *testing.T) {
	g := newDNSRig(t, true)
	got, sb := g.files(dnsE2EPod("d5e2e000-0010", "nocluster", nil))
	if want := "search lab.example\nnameserver 192.0.2.53\noptions timeout:2\n"; got.resolv != want {
		t.Errorf("/etc/resolv.conf =\n%s\nwant the host's\n%s", got.resolv, want)
	}
	if len(sb.Warnings) != 1 || sb.Warnings[0].Reason != ctrd.ReasonMissingClusterDNS || !strings.Contains(sb.Warnings[0].Message, "clusterDNS") {
		t.Errorf("warnings = %v, want one MissingClusterDNS naming clusterDNS", sb.Warnings)
	}
}

// A spec change that only touches the files (hostAliases, dnsConfig) reaches the running container:
// the files are rewritten in place, not replaced.
func TestPodDNSFilesUpdatedInRunningContainer(t *testing.T) {
	g := newDNSRig(t, false)
	p := dnsE2EPod("d5e2e000-0020", "live", func(s *v1.PodSpec) {
		// Bounded: about 60 s at most, far beyond the test's own wait.
		s.Containers[0].Command = []string{"sh", "-c", `echo READY; i=0; while [ $i -lt 600 ]; do
			if grep -q '10.0.0.9' /etc/hosts && grep -q '^nameserver 1.1.1.1' /etc/resolv.conf; then echo SEEN; cat /etc/hosts; break; fi
			i=$((i+1)); sleep 0.1; done; sleep 600`}
	})
	sb := g.sandbox(p)
	c := g.start(p, sb, &p.Spec.Containers[0])
	g.waitLog(c, "READY")

	changed := p.DeepCopy()
	changed.Spec.HostAliases = []v1.HostAlias{{IP: "10.0.0.9", Hostnames: []string{"cache"}}}
	changed.Spec.DNSConfig = &v1.PodDNSConfig{Nameservers: []string{"1.1.1.1"}}
	if ctrspec.SpecHash(changed, &changed.Spec.Containers[0]) != ctrspec.SpecHash(p, &p.Spec.Containers[0]) {
		t.Fatalf("hostAliases/dnsConfig change the container's hash: it would be restarted")
	}
	if _, err := g.r.EnsureSandbox(context.Background(), changed); err != nil {
		t.Fatal(err)
	}
	g.waitLog(c, "SEEN")
	// The log is copied by the runtime as it comes: the hosts file printed after SEEN may land a
	// moment later, so wait for its end (the alias is its last line).
	g.waitLog(c, "10.0.0.9\tcache\n")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.r.StopContainer(ctx, c.ID, 0); err != nil {
		t.Logf("stop: %v", err)
	}
}
