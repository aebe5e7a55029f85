package e2e

// Pod networking end to end: the real agent attaching real pods to a private bridge network with
// Debian's CNI plugins. Each test has its own bridge, subnet, host-local data dir and plugin dir
// (testenv.NewCNINet), removed at its end.

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/cni"
	"github.com/mqlet/mqlet/internal/testenv"
	v1 "k8s.io/api/core/v1"
)

// cniHarness is a harness whose agent attaches pods to a private network with mqlet's default
// chain. The network is made first, so its clean-up runs after the agent and the pods are gone.
func cniHarness(t *testing.T) (*harness, *testenv.CNINet) {
	t.Helper()
	testenv.Require(t)
	n := testenv.NewCNINet(t, func(n *testenv.CNINet) []byte {
		b, err := cni.DefaultNetwork{Name: n.Name, Bridge: n.Bridge, Subnet: n.Subnet.String(), DataDir: n.DataDir}.ConfList()
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
	h := newHarness(t)
	h.cniConfDir, h.cniBinDir = n.ConfDir, n.BinDir
	return h, n
}

// hostPortFree finds a TCP port on the host that nothing listens on.
func hostPortFree(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// webPod serves "hello-from-web" with busybox httpd on port 80, published on hostPort.
func webPod(hostPort int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: httpd
    image: mqlet.test/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "mkdir -p /www && echo hello-from-web > /www/index.html && exec httpd -f -p 80 -h /www"]
    ports:
    - {containerPort: 80, hostPort: %d}
`, hostPort)
}

// clientPod fetches the web pod's page every half second with nc (busybox's static wget crashes
// in getaddrinfo), logging each success, and logs its own address as the status.podIP env gives it.
func clientPod(webIP string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: wget
    image: mqlet.test/busybox:1
    imagePullPolicy: Never
    env:
    - name: MY_IP
      valueFrom: {fieldRef: {fieldPath: status.podIP}}
    command: ["sh", "-c", "echo myip=$MY_IP; trap 'exit 0' TERM; while :; do printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 %s 80 | grep -q hello-from-web && echo fetched-ok; sleep 0.5 & wait $!; done"]
`, webIP)
}

func inSubnet(n *testenv.CNINet, ip string) bool {
	p := net.ParseIP(ip)
	return p != nil && n.Subnet.Contains(p)
}

// runningInNet is allRunning with a pod address from the network.
func runningInNet(n *testenv.CNINet) func(*v1.Pod) bool {
	return func(p *v1.Pod) bool {
		return allRunning(p) && inSubnet(n, p.Status.PodIP) && len(p.Status.PodIPs) == 1 && p.Status.PodIPs[0].IP == p.Status.PodIP
	}
}

// httpGet fetches url from the host, retrying for a bounded time; "" if it never answers.
func httpGet(url string) string {
	c := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := c.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return string(b)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return ""
}

// removeAll deletes the manifests and waits until the pods and their containers are gone and the
// network holds no address and no rule of theirs.
func removeAll(t *testing.T, h *harness, n *testenv.CNINet, names ...string) {
	t.Helper()
	for _, name := range names {
		if err := os.Remove(h.manifests + "/" + name + ".yaml"); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "pods and containers gone", func() bool {
		for _, name := range names {
			if _, err := h.getPod(name); err == nil {
				return false
			}
		}
		return len(h.containerIDs()) == 0
	})
	waitFor(t, "addresses released", func() bool { return len(n.Allocated(t)) == 0 })
	if r := n.Rules(t); len(r) != 0 {
		t.Errorf("rules left after the pods went:\n%s", strings.Join(r, "\n"))
	}
}

// Two pods get distinct addresses from the pod network and one fetches the other's page; the web
// pod's hostPort answers on the host's 127.0.0.1; a hostNetwork pod beside them sees the host's
// interfaces and takes no address from the network. Deleting the pods releases their addresses.
func TestCNIPodsTalkHostPortAndHostNetwork(t *testing.T) {
	h, n := cniHarness(t)
	port := hostPortFree(t)
	h.writeManifest("web.yaml", webPod(port))
	h.writeManifest("hostnet.yaml", `apiVersion: v1
kind: Pod
metadata: {name: hostnet}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: mqlet.test/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "cat /proc/net/dev; trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done"]
`)
	// The host's interfaces before any pod's veth exists (veths come and go with pods).
	before, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	h.startAgent()
	web := h.waitPod("web", "running with an address from the network", runningInNet(n))
	h.writeManifest("client.yaml", clientPod(web.Status.PodIP))
	client := h.waitPod("client", "running with an address from the network", runningInNet(n))
	start := time.Now()
	if client.Status.PodIP == web.Status.PodIP {
		t.Fatalf("both pods have %s", web.Status.PodIP)
	}
	waitFor(t, "client fetched the web pod's page", func() bool {
		if strings.Contains(h.logOf(client, "wget"), "fetched-ok") {
			return true
		}
		if time.Since(start) > 50*time.Second {
			t.Logf("client log:\n%s\nweb log:\n%s", h.logOf(client, "wget"), h.logOf(web, "httpd"))
		}
		return false
	})
	if log := h.logOf(client, "wget"); !strings.Contains(log, "myip="+client.Status.PodIP+"\n") {
		t.Errorf("status.podIP env in the client: log\n%s\nwant myip=%s", log, client.Status.PodIP)
	}
	if got := httpGet(fmt.Sprintf("http://127.0.0.1:%d/", port)); got != "hello-from-web\n" {
		t.Errorf("hostPort %d on 127.0.0.1 answered %q", port, got)
	}

	hostnet := h.waitPod("hostnet", "running", allRunning)
	if hostnet.Status.PodIP == "" || hostnet.Status.PodIP != hostnet.Status.HostIP {
		t.Errorf("hostNetwork pod: podIP %q, hostIP %q; want the host's", hostnet.Status.PodIP, hostnet.Status.HostIP)
	}
	waitFor(t, "hostNetwork pod's interface list", func() bool { return strings.Contains(h.logOf(hostnet, "main"), "lo:") })
	after, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	log := h.logOf(hostnet, "main")
	for _, ifc := range before {
		if slices.ContainsFunc(after, func(a net.Interface) bool { return a.Name == ifc.Name }) && !strings.Contains(log, ifc.Name+":") {
			t.Errorf("host interface %s not visible in the hostNetwork pod", ifc.Name)
		}
	}
	if got := n.Allocated(t); len(got) != 2 || !slices.Contains(got, web.Status.PodIP) || !slices.Contains(got, client.Status.PodIP) {
		t.Errorf("host-local holds %v; want only the web and client pods' addresses", got)
	}
	removeAll(t, h, n, "web", "client", "hostnet")
}

// countFetches is how many pages the client has fetched so far.
func countFetches(h *harness, p *v1.Pod) int { return strings.Count(h.logOf(p, "wget"), "fetched-ok") }

// An agent restart and a kill -9 leave the pods running in the namespaces they had: same
// addresses, same containers, no second attachment, and traffic still flows between them and
// through the host port.
func TestCNIAgentRestartAndKill9KeepPodIPs(t *testing.T) {
	h, n := cniHarness(t)
	port := hostPortFree(t)
	h.writeManifest("web.yaml", webPod(port))
	h.startAgent()
	web := h.waitPod("web", "running", runningInNet(n))
	h.writeManifest("client.yaml", clientPod(web.Status.PodIP))
	client := h.waitPod("client", "running", runningInNet(n))
	waitFor(t, "first fetch", func() bool { return countFetches(h, client) > 0 })
	tasks := h.tasks()

	for _, restart := range []struct {
		name string
		stop func()
	}{{"SIGTERM", h.stopAgent}, {"kill -9", h.kill9Agent}} {
		restart.stop()
		h.startAgent()
		// The positive signal that the new agent has set up each pod's sandbox: its adoption of
		// the attachment, with the addresses it keeps.
		for _, want := range []*v1.Pod{web, client} {
			line := fmt.Sprintf(`msg="kept the pod's network attachment" pod=default/%s network=%s ips=[%s]`, want.Name, n.Name, want.Status.PodIP)
			waitFor(t, want.Name+" adopted with its address after "+restart.name, func() bool { return strings.Contains(h.agentLog.String(), line) })
			got := h.waitPod(want.Name, "running", runningInNet(n))
			if got.Status.PodIP != want.Status.PodIP {
				t.Errorf("after %s: pod %s has %s, had %s", restart.name, want.Name, got.Status.PodIP, want.Status.PodIP)
			}
		}
		if strings.Contains(h.agentLog.String(), "pod attached to CNI network") {
			t.Errorf("after %s a pod was attached again:\n%s", restart.name, h.agentLog)
		}
		if now := h.tasks(); !maps.Equal(now, tasks) {
			t.Errorf("after %s the containers changed: %v, were %v", restart.name, now, tasks)
		}
		if got := n.Allocated(t); len(got) != 2 || !slices.Contains(got, web.Status.PodIP) || !slices.Contains(got, client.Status.PodIP) {
			t.Errorf("after %s host-local holds %v, want the two pods' addresses", restart.name, got)
		}
		before := countFetches(h, client)
		waitFor(t, "fetches after "+restart.name, func() bool { return countFetches(h, client) >= before+2 })
		if got := httpGet(fmt.Sprintf("http://127.0.0.1:%d/", port)); got != "hello-from-web\n" {
			t.Errorf("after %s hostPort %d answered %q", restart.name, port, got)
		}
	}
	removeAll(t, h, n, "web", "client")
}

// quickPod stops at once on SIGTERM, so a hundred of them come and go fast.
func quickPod(name string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: main
    image: mqlet.test/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done"]
`, name)
}

// A hundred pods come and go, ten at a time, and the agent is killed with kill -9 in the middle of
// a round whose pods are then deleted while it is down: at the end host-local holds no address, no
// attachment record is left and no rule names the network.
func TestCNINoAddressLeakOver100PodsAndKill9(t *testing.T) {
	h, n := cniHarness(t)
	h.startAgent()
	const rounds, perRound, killRound = 10, 10, 4
	for r := range rounds {
		var names []string
		for i := range perRound {
			name := fmt.Sprintf("p%d-%d", r, i)
			names = append(names, name)
			h.writeManifest(name+".yaml", quickPod(name))
		}
		if r == killRound {
			// Kill while the round's pods are being attached, delete them while the agent is down.
			h.waitPod(names[0], "running", runningInNet(n))
			h.kill9Agent()
			for _, name := range names {
				os.Remove(h.manifests + "/" + name + ".yaml")
			}
			h.startAgent()
			waitFor(t, "round of the kill swept", func() bool { return len(h.containerIDs()) == 0 })
			waitFor(t, "addresses of the killed round released", func() bool { return len(n.Allocated(t)) == 0 })
			continue
		}
		ips := map[string]bool{}
		for _, name := range names {
			p := h.waitPod(name, "running", runningInNet(n))
			if ips[p.Status.PodIP] {
				t.Fatalf("round %d: address %s given twice", r, p.Status.PodIP)
			}
			ips[p.Status.PodIP] = true
		}
		removeAll(t, h, n, names...)
	}
	if recs, _ := os.ReadDir(h.state + "/cni/pods"); len(recs) != 0 {
		t.Errorf("attachment records left: %d", len(recs))
	}
}

// While a plugin is missing the pod waits (not Failed) saying which, and the node reports
// NetworkUnavailable and not Ready; once the plugin is back the pod starts and the node is Ready.
func TestCNIMissingPluginPodWaitsThenStarts(t *testing.T) {
	h, n := cniHarness(t)
	n.RemovePlugin(t, "bridge")
	h.writeManifest("web.yaml", webPod(hostPortFree(t)))
	h.startAgent()
	p := h.waitPod("web", "waiting with the missing plugin named", func(p *v1.Pod) bool {
		cs := containerStatus(p, "httpd")
		return cs.State.Waiting != nil && strings.Contains(cs.State.Waiting.Message, `CNI plugin "bridge"`)
	})
	if p.Status.Phase != v1.PodPending || containerStatus(p, "httpd").State.Waiting.Reason != "ContainerCreating" {
		t.Errorf("pod while the plugin is missing: phase %s, waiting %+v", p.Status.Phase, containerStatus(p, "httpd").State.Waiting)
	}
	cond := func(node *v1.Node, typ v1.NodeConditionType) v1.NodeCondition {
		for _, c := range node.Status.Conditions {
			if c.Type == typ {
				return c
			}
		}
		return v1.NodeCondition{}
	}
	node := func() *v1.Node {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		nd, err := h.client.GetNode(ctx, "e2e-node")
		if err != nil {
			return &v1.Node{}
		}
		return nd
	}
	waitFor(t, "NetworkUnavailable True naming the plugin", func() bool {
		nd := node()
		nu, ready := cond(nd, v1.NodeNetworkUnavailable), cond(nd, v1.NodeReady)
		return nu.Status == v1.ConditionTrue && strings.Contains(nu.Message, `"bridge"`) &&
			ready.Status == v1.ConditionFalse && strings.Contains(ready.Message, `"bridge"`)
	})
	if len(n.Allocated(t)) != 0 || len(h.tasks()) != 0 {
		t.Errorf("with the plugin missing: addresses %v, tasks %v; want none", n.Allocated(t), h.tasks())
	}
	n.RestorePlugin(t, "bridge")
	h.waitPod("web", "running once the plugin is back", runningInNet(n))
	waitFor(t, "NetworkUnavailable False and Ready", func() bool {
		nd := node()
		return cond(nd, v1.NodeNetworkUnavailable).Status == v1.ConditionFalse && cond(nd, v1.NodeReady).Status == v1.ConditionTrue
	})
	removeAll(t, h, n, "web")
}

// A pod whose network went while the agent was down (its veth deleted) is not reported Running
// with its old address and only lo: the restarted agent attaches it again, so the address it
// reports is on the pod's eth0, host-local holds that one, and the hostPort answers again.
func TestCNILostInterfaceRepairedAfterKill9(t *testing.T) {
	h, n := cniHarness(t)
	port := hostPortFree(t)
	h.writeManifest("web.yaml", webPod(port))
	h.startAgent()
	h.waitPod("web", "running", runningInNet(n))
	nss, _ := filepath.Glob(filepath.Join(h.state, "netns", "*"))
	if len(nss) != 1 {
		t.Fatalf("pod network namespaces %v, want one", nss)
	}
	if out, err := exec.Command("nsenter", "--net="+nss[0], "ip", "link", "del", "eth0").CombinedOutput(); err != nil {
		t.Fatalf("delete the pod's veth: %v\n%s", err, out)
	}
	h.kill9Agent()
	h.startAgent()
	web := h.waitPod("web", "running again", runningInNet(n))
	waitFor(t, "the address the pod reports on its eth0", func() bool {
		out, _ := exec.Command("nsenter", "--net="+nss[0], "ip", "-4", "addr", "show", "dev", "eth0").CombinedOutput()
		p, err := h.getPod("web")
		return err == nil && strings.Contains(string(out), p.Status.PodIP+"/")
	})
	web, _ = h.getPod("web")
	if got := n.Allocated(t); len(got) != 1 || got[0] != web.Status.PodIP {
		t.Errorf("host-local holds %v, want only the pod's %s", got, web.Status.PodIP)
	}
	if got := httpGet(fmt.Sprintf("http://127.0.0.1:%d/", port)); got != "hello-from-web\n" {
		t.Errorf("hostPort %d answered %q after the repair", port, got)
	}
	removeAll(t, h, n, "web")
}
