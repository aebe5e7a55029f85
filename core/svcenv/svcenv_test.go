package svcenv

import (
	"maps"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func svc(ns, name, ip string, ports ...v1.ServicePort) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1.ServiceSpec{ClusterIP: ip, Ports: ports},
	}
}

func port(name string, n int32, proto v1.Protocol) v1.ServicePort {
	return v1.ServicePort{Name: name, Port: n, Protocol: proto}
}

// The variables of one service, against the names Kubernetes documents ("Discovering services",
// Environment variables: REDIS_PRIMARY_SERVICE_HOST and the docker links ones) and kubelet's
// envvars.FromServices: order, the first port's special names, named ports, protocols, IPv6.
func TestVars(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    *v1.Service
		want string // NAME=VALUE lines in order
	}{
		{"documented redis-primary", svc("ns", "redis-primary", "10.0.0.11", port("", 6379, v1.ProtocolTCP)), `
REDIS_PRIMARY_SERVICE_HOST=10.0.0.11
REDIS_PRIMARY_SERVICE_PORT=6379
REDIS_PRIMARY_PORT=tcp://10.0.0.11:6379
REDIS_PRIMARY_PORT_6379_TCP=tcp://10.0.0.11:6379
REDIS_PRIMARY_PORT_6379_TCP_PROTO=tcp
REDIS_PRIMARY_PORT_6379_TCP_PORT=6379
REDIS_PRIMARY_PORT_6379_TCP_ADDR=10.0.0.11`},
		{"protocol defaults to tcp", svc("ns", "web", "10.0.0.2", port("", 80, "")), `
WEB_SERVICE_HOST=10.0.0.2
WEB_SERVICE_PORT=80
WEB_PORT=tcp://10.0.0.2:80
WEB_PORT_80_TCP=tcp://10.0.0.2:80
WEB_PORT_80_TCP_PROTO=tcp
WEB_PORT_80_TCP_PORT=80
WEB_PORT_80_TCP_ADDR=10.0.0.2`},
		{"named ports, udp, second port has no plain _PORT", svc("ns", "dns-cache", "10.0.0.10",
			port("dns-udp", 53, v1.ProtocolUDP), port("metrics", 9153, v1.ProtocolTCP)), `
DNS_CACHE_SERVICE_HOST=10.0.0.10
DNS_CACHE_SERVICE_PORT=53
DNS_CACHE_SERVICE_PORT_DNS_UDP=53
DNS_CACHE_SERVICE_PORT_METRICS=9153
DNS_CACHE_PORT=udp://10.0.0.10:53
DNS_CACHE_PORT_53_UDP=udp://10.0.0.10:53
DNS_CACHE_PORT_53_UDP_PROTO=udp
DNS_CACHE_PORT_53_UDP_PORT=53
DNS_CACHE_PORT_53_UDP_ADDR=10.0.0.10
DNS_CACHE_PORT_9153_TCP=tcp://10.0.0.10:9153
DNS_CACHE_PORT_9153_TCP_PROTO=tcp
DNS_CACHE_PORT_9153_TCP_PORT=9153
DNS_CACHE_PORT_9153_TCP_ADDR=10.0.0.10`},
		{"ipv6 in brackets in URLs only", svc("ns", "v6", "fd00::1", port("", 443, v1.ProtocolSCTP)), `
V6_SERVICE_HOST=fd00::1
V6_SERVICE_PORT=443
V6_PORT=sctp://[fd00::1]:443
V6_PORT_443_SCTP=sctp://[fd00::1]:443
V6_PORT_443_SCTP_PROTO=sctp
V6_PORT_443_SCTP_PORT=443
V6_PORT_443_SCTP_ADDR=fd00::1`},
		{"headless has none", svc("ns", "db", v1.ClusterIPNone, port("", 5432, "")), ``},
		{"no cluster IP (ExternalName) has none", svc("ns", "ext", "", port("", 5432, "")), ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, e := range Vars(tc.s) {
				got = append(got, e.Name+"="+e.Value)
			}
			if g, w := strings.Join(got, "\n"), strings.TrimSpace(tc.want); g != w {
				t.Errorf("got\n%s\nwant\n%s", g, w)
			}
		})
	}
}

// Which services a pod sees, as kubelet's getServiceEnvVarMap picks them.
func TestForPod(t *testing.T) {
	master := svc("default", "kubernetes", "10.96.0.1", port("https", 443, v1.ProtocolTCP))
	all := []*v1.Service{
		master,
		svc("default", "other", "10.96.0.9", port("", 1, "")),
		svc("app", "foo", "10.96.0.5", port("http", 8080, v1.ProtocolTCP)),
		svc("app", "headless", v1.ClusterIPNone, port("", 80, "")),
		svc("elsewhere", "bar", "10.96.0.6", port("", 80, "")),
	}
	keys := func(m map[string]string) map[string]bool {
		out := map[string]bool{}
		for k := range m {
			// one variable per service is enough to say which services count
			if strings.HasSuffix(k, "_SERVICE_HOST") {
				out[strings.TrimSuffix(k, "_SERVICE_HOST")] = true
			}
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		ns    string
		links bool
		svcs  []*v1.Service
		want  []string
	}{
		{"links: own namespace and the master service", "app", true, all, []string{"FOO", "KUBERNETES"}},
		{"no links: the master service only", "app", false, all, []string{"KUBERNETES"}},
		{"default namespace with links", "default", true, all, []string{"KUBERNETES", "OTHER"}},
		{"default namespace without links", "default", false, all, []string{"KUBERNETES"}},
		{"no services (no API)", "app", true, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := keys(ForPod(tc.svcs, tc.ns, tc.links))
			want := map[string]bool{}
			for _, w := range tc.want {
				want[w] = true
			}
			if !maps.Equal(got, want) {
				t.Errorf("services seen: got %v, want %v", got, want)
			}
		})
	}

	// The namespace's own service named kubernetes wins over the master service, in either order.
	own := svc("app", "kubernetes", "10.96.7.7", port("", 80, ""))
	for _, list := range [][]*v1.Service{{master, own}, {own, master}} {
		if got := ForPod(list, "app", true)["KUBERNETES_SERVICE_HOST"]; got != "10.96.7.7" {
			t.Errorf("KUBERNETES_SERVICE_HOST = %q, want the namespace's own 10.96.7.7", got)
		}
	}
	if got := ForPod([]*v1.Service{own, master}, "app", false)["KUBERNETES_SERVICE_HOST"]; got != "10.96.0.1" {
		t.Errorf("without links KUBERNETES_SERVICE_HOST = %q, want the master's 10.96.0.1", got)
	}
}

func TestEncodeFromPod(t *testing.T) {
	vars := map[string]string{"FOO_SERVICE_HOST": "10.0.0.1", "FOO_PORT": "tcp://10.0.0.1:80"}
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{Annotation: Encode(vars)}}}
	got, err := FromPod(p)
	if err != nil || !maps.Equal(got, vars) {
		t.Fatalf("FromPod(Encode(vars)) = %v, %v; want %v", got, err, vars)
	}
	if got, err := FromPod(&v1.Pod{}); got != nil || err != nil {
		t.Errorf("pod without the annotation: %v, %v; want nothing", got, err)
	}
	for _, bad := range []string{`[1]`, `{"A":1}`, `{"1BAD":"x"}`, `{"A=B":"x"}`} {
		p.Annotations[Annotation] = bad
		if _, err := FromPod(p); err == nil || !strings.Contains(err.Error(), Annotation) {
			t.Errorf("annotation %s: err %v, want one naming the annotation", bad, err)
		}
	}
}
