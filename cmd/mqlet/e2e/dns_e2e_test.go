package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/internal/mqtttest"
	v1 "k8s.io/api/core/v1"
)

const dnsPods = `apiVersion: v1
kind: Pod
metadata: {name: dns-cluster}
spec:
  restartPolicy: Never
  hostname: web-0
  subdomain: api
  hostAliases: [{ip: 10.0.0.5, hostnames: [db]}]
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "cat /etc/resolv.conf /etc/hosts /etc/hostname"]
---
apiVersion: v1
kind: Pod
metadata: {name: dns-hostnet}
spec:
  restartPolicy: Never
  hostNetwork: true
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "cat /etc/resolv.conf /etc/hosts /etc/hostname"]
`

func succeeded(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded }

// The agent's clusterDNS, clusterDomain and resolvConf settings reach the pods' files: a
// ClusterFirst pod gets the cluster's resolver, a hostNetwork one (ClusterFirst = Default) the
// host resolver file's.
func TestAgentPodDNSFromConfig(t *testing.T) {
	h := newHarness(t)
	resolv := filepath.Join(h.dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 192.0.2.53\nsearch lab.example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.writeManifest("dns.yaml", dnsPods)
	h.startAgent("--cluster-dns", "10.96.0.10", "--cluster-domain", "edge.local", "--resolv-conf", resolv)

	p := h.waitPod("dns-cluster", "succeeded", succeeded)
	out := h.logOf(p, "c")
	for _, want := range []string{
		"search default.svc.edge.local svc.edge.local edge.local lab.example\nnameserver 10.96.0.10\noptions ndots:5\n",
		"# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n",
		"# Entries added by HostAliases.\n10.0.0.5\tdb\n",
		"\nweb-0\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dns-cluster printed\n%s\nwant it to hold\n%s", out, want)
		}
	}
	host, _ := os.Hostname()
	p = h.waitPod("dns-hostnet", "succeeded", succeeded)
	out = h.logOf(p, "c")
	for _, want := range []string{
		"search lab.example\nnameserver 192.0.2.53\n# Kubernetes-managed hosts file (host network).\n",
		"\n" + host + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dns-hostnet printed\n%s\nwant it to hold\n%s", out, want)
		}
	}
}

// Without clusterDNS, a ClusterFirst pod runs with the host's resolver and a MissingClusterDNS
// Warning event says why, as kubelet's does.
func TestAgentMissingClusterDNSEvent(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{})
	ev := subscribeEvents(t, b.Plain)
	resolv := filepath.Join(h.dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 192.0.2.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.writeManifest("dns.yaml", dnsPods)
	h.startMQTTAgent(b.Plain, "--resolv-conf", resolv)

	p := h.waitPod("dns-cluster", "succeeded", succeeded)
	if out := h.logOf(p, "c"); !strings.HasPrefix(out, "nameserver 192.0.2.53\n# Kubernetes-managed hosts file.") {
		t.Errorf("dns-cluster without cluster DNS printed\n%s\nwant the host's resolver", out)
	}
	waitFor(t, "a MissingClusterDNS event for dns-cluster", func() bool { return len(ev.of("MissingClusterDNS", "dns-cluster")) > 0 })
	if e := ev.of("MissingClusterDNS", "dns-cluster")[0]; e.Type != "Warning" || !strings.Contains(e.Message, "clusterDNS") {
		t.Errorf("MissingClusterDNS event: %+v", e)
	}
	// A hostNetwork ClusterFirst pod uses the host's resolver by design: no warning.
	h.waitPod("dns-hostnet", "succeeded", succeeded)
	if got := ev.of("MissingClusterDNS", "dns-hostnet"); len(got) != 0 {
		t.Errorf("MissingClusterDNS for a hostNetwork pod: %+v", got)
	}
}

const dnsLive = `apiVersion: v1
kind: Pod
metadata: {name: dns-live}
spec:
  terminationGracePeriodSeconds: 1
  hostAliases: [{ip: 10.0.0.5, hostnames: [%s]}]
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "i=0; while [ $i -lt 900 ]; do grep -q cache /etc/hosts && echo SEEN-CACHE && break; i=$((i+1)); sleep 0.1; done; sleep 3600"]
%s`

// Editing a pod's hostAliases reaches its running container's /etc/hosts without a restart. The
// edit also adds a container after c: once it runs, the worker has reconciled c against the new
// spec (containers are reconciled in order), so a c that was going to be recreated would have been.
func TestAgentHostAliasesEditedInPlace(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("live.yaml", fmt.Sprintf(dnsLive, "db", ""))
	h.startAgent()
	p := h.waitPod("dns-live", "running", allRunning)
	id := containerStatus(p, "c").ContainerID
	h.writeManifest("live.yaml", fmt.Sprintf(dnsLive, "cache", "  - {name: marker, image: mqlet.test/busybox:1, command: [sleep, \"3600\"]}\n"))
	p = h.waitPod("dns-live", "running the new spec and seeing the new alias", func(p *v1.Pod) bool {
		return containerStatus(p, "marker").State.Running != nil && strings.Contains(h.logOf(p, "c"), "SEEN-CACHE")
	})
	if cs := containerStatus(p, "c"); cs.ContainerID != id || cs.RestartCount != 0 {
		t.Errorf("container replaced (%s -> %s, restarts %d) for a hostAliases edit", id, cs.ContainerID, cs.RestartCount)
	}
}
