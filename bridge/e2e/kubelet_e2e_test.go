package e2e

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/sync/signing"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
)

// TestKubeletAPI: an unmodified kube-apiserver reaches the bridge as the edge node's kubelet, and
// the bridge reaches the node with requests signed by its --signing-key (the node trusts no other).
// kubectl is the client: logs with --tail, --since, --since-time, --timestamps, --limit-bytes,
// --previous and -f, and node proxy reads (/pods); exec is TestKubectlExec's. The
// bridge's own authentication and authorization are checked by calling its port directly with the
// cluster's client certificates, a foreign one and tokens; an offline node's logs fail at once
// with the bridge's words.
func TestKubeletAPI(t *testing.T) {
	w := newEdgeWorld(t)
	// The node trusts only the bridge's key: every logs and usage request must come signed.
	keys := filepath.Join(w.dir, "signing")
	if _, err := signing.GenerateKeyPair(keys); err != nil {
		t.Fatal(err)
	}
	w.startBridgeWith(t, "bridge-a", "--signing-key", keys+".key")
	w.startAgentWith(t, "--mqtt-trusted-key", keys+".pub")
	s := &edgeSuite{w: w}
	ctx := context.Background()

	// The Node points the API server at the bridge: its kubelet address first, no Hostname (the
	// API server would try it first), a port of the bridge's pool.
	var port int32
	within(t, readyBound, "Node "+edgeNode+" Ready with the bridge's kubelet endpoint", func() (bool, string) {
		n, err := w.kube.CoreV1().Nodes().Get(ctx, edgeNode, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		port = n.Status.DaemonEndpoints.KubeletEndpoint.Port
		a := n.Status.Addresses
		ok := nodeReady(n) == v1.ConditionTrue && len(a) > 0 && a[0].Type == v1.NodeInternalIP && a[0].Address == w.kubeletAddr &&
			!slices.ContainsFunc(a, func(x v1.NodeAddress) bool { return x.Type == v1.NodeHostName }) &&
			slices.Contains(w.kubeletPorts, int(port))
		return ok, fmt.Sprintf("Ready=%s addresses=%v port=%d (pool %v)", nodeReady(n), a, port, w.kubeletPorts)
	})

	// A pod that logs a numbered line a second, and one whose container exits after each line
	// (restarted: --previous has something to show).
	counter := edgePod(uniqueName("counter"), edgeTolerations()...)
	counter.Spec.Containers[0].Command = []string{"sh", "-c", `trap "exit 0" TERM; i=0; while true; do i=$((i+1)); printf "line-%03d\n" $i; sleep 1; done`}
	s.createPod(t, counter)
	crasher := edgePod(uniqueName("crasher"), edgeTolerations()...)
	crasher.Spec.Containers[0].Command = []string{"sh", "-c", `echo "instance-$(cat /proc/sys/kernel/random/uuid)"; sleep 1; exit 1`}
	s.createPod(t, crasher)
	s.waitRunning(t, counter.Name)

	kubectl := func(args ...string) (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, w.cluster.Kubectl(), append([]string{"--kubeconfig", w.cluster.Kubeconfig(), "-n", testNS}, args...)...)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		if err != nil {
			return out.String(), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, errb.String())
		}
		return out.String(), nil
	}
	lineRe := regexp.MustCompile(`^line-(\d{3})$`)
	lines := func(out string) []string { return strings.Split(strings.TrimSuffix(out, "\n"), "\n") }

	var all string
	within(t, runBound, "kubectl logs shows line-008", func() (bool, string) {
		out, err := kubectl("logs", counter.Name)
		if err != nil {
			return false, err.Error()
		}
		all = out
		return strings.Contains(out, "line-008\n"), out
	})
	if !strings.HasPrefix(all, "line-001\nline-002\n") {
		t.Errorf("kubectl logs: want the whole log from line-001, got %q", all)
	}

	t.Run("Tail", func(t *testing.T) {
		out, err := kubectl("logs", counter.Name, "--tail=2")
		if err != nil {
			t.Fatal(err)
		}
		if l := lines(out); len(l) != 2 || !lineRe.MatchString(l[0]) || !lineRe.MatchString(l[1]) {
			t.Errorf("--tail=2: want two lines, got %q", out)
		}
	})
	t.Run("LimitBytes", func(t *testing.T) {
		out, err := kubectl("logs", counter.Name, "--limit-bytes=12")
		if err != nil {
			t.Fatal(err)
		}
		if out != "line-001\nlin" {
			t.Errorf("--limit-bytes=12: got %q, want the log's first 12 bytes %q", out, "line-001\nlin")
		}
	})
	t.Run("Timestamps", func(t *testing.T) {
		out, err := kubectl("logs", counter.Name, "--tail=1", "--timestamps")
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(out)
		if len(f) != 2 || !lineRe.MatchString(f[1]) {
			t.Fatalf("--timestamps: got %q, want one timestamped line", out)
		}
		if _, err := time.Parse(time.RFC3339Nano, f[0]); err != nil {
			t.Errorf("--timestamps: %q does not start with an RFC 3339 time: %v", out, err)
		}
	})
	t.Run("Since", func(t *testing.T) {
		// line-001 was logged 8 s ago or more: 3 s back leaves it out, but has lines.
		out, err := kubectl("logs", counter.Name, "--since=3s")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "line-001") || !lineRe.MatchString(lines(out)[0]) {
			t.Errorf("--since=3s: got %q, want only the last seconds' lines", out)
		}
		at := time.Now().Add(-3 * time.Second).UTC().Format(time.RFC3339)
		out, err = kubectl("logs", counter.Name, "--since-time="+at)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "line-001") || !lineRe.MatchString(lines(out)[0]) {
			t.Errorf("--since-time=%s: got %q, want only the lines since", at, out)
		}
	})
	t.Run("Follow", func(t *testing.T) {
		cur, err := kubectl("logs", counter.Name, "--tail=1")
		if err != nil {
			t.Fatal(err)
		}
		fctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(fctx, w.cluster.Kubectl(), "--kubeconfig", w.cluster.Kubeconfig(), "-n", testNS, "logs", "-f", "--tail=1", counter.Name)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer cmd.Wait()
		defer cancel()
		// Lines logged after the command started arrive on the open stream: three more than
		// the last line before it.
		last := strings.TrimSpace(cur)
		var got []string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			got = append(got, sc.Text())
			if len(got) >= 4 {
				break
			}
		}
		if len(got) < 4 {
			t.Fatalf("kubectl logs -f: the stream ended after %q (%v)", got, sc.Err())
		}
		if !lineRe.MatchString(got[3]) || got[3] <= last {
			t.Errorf("kubectl logs -f: got %q, want lines after %s", got, last)
		}
	})
	t.Run("Previous", func(t *testing.T) {
		within(t, runBound, "pod "+crasher.Name+" restarted", func() (bool, string) {
			p, err := w.kube.CoreV1().Pods(testNS).Get(ctx, crasher.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].RestartCount >= 1, podSummary(p)
		})
		var prev string
		within(t, runBound, "kubectl logs --previous", func() (bool, string) {
			out, err := kubectl("logs", crasher.Name, "--previous")
			if err != nil {
				return false, err.Error()
			}
			prev = out
			return strings.HasPrefix(out, "instance-"), out
		})
		cur, err := kubectl("logs", crasher.Name)
		if err != nil {
			t.Fatal(err)
		}
		if cur == prev {
			t.Errorf("--previous shows the same instance as the current log: %q", cur)
		}
	})
	t.Run("ProxyPods", func(t *testing.T) {
		out, err := kubectl("get", "--raw", "/api/v1/nodes/"+edgeNode+"/proxy/pods")
		if err != nil {
			t.Fatal(err)
		}
		var list v1.PodList
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("/pods is not a PodList: %v\n%s", err, out)
		}
		var names []string
		for _, p := range list.Items {
			names = append(names, p.Name)
		}
		if !slices.Contains(names, counter.Name) || !slices.Contains(names, crasher.Name) {
			t.Errorf("/pods lists %v, want %s and %s", names, counter.Name, crasher.Name)
		}
	})
	t.Run("Stats", func(t *testing.T) {
		out, err := kubectl("get", "--raw", "/api/v1/nodes/"+edgeNode+"/proxy/stats/summary")
		if err != nil {
			t.Fatal(err)
		}
		var sum struct {
			Node struct {
				NodeName string `json:"nodeName"`
				CPU      struct {
					UsageCoreNanoSeconds uint64 `json:"usageCoreNanoSeconds"`
				} `json:"cpu"`
				Memory struct {
					WorkingSetBytes uint64 `json:"workingSetBytes"`
				} `json:"memory"`
			} `json:"node"`
			Pods []struct {
				PodRef struct {
					Name, Namespace, UID string
				} `json:"podRef"`
				Containers []struct {
					Name   string `json:"name"`
					Memory struct {
						WorkingSetBytes uint64 `json:"workingSetBytes"`
					} `json:"memory"`
				} `json:"containers"`
			} `json:"pods"`
		}
		if err := json.Unmarshal([]byte(out), &sum); err != nil {
			t.Fatalf("/stats/summary: %v\n%s", err, out)
		}
		if sum.Node.NodeName != edgeNode || sum.Node.CPU.UsageCoreNanoSeconds == 0 || sum.Node.Memory.WorkingSetBytes == 0 {
			t.Errorf("/stats/summary node: %+v, want %s with CPU and memory use", sum.Node, edgeNode)
		}
		found := false
		for _, p := range sum.Pods {
			if p.PodRef.Name == counter.Name && p.PodRef.UID != "" && len(p.Containers) == 1 && p.Containers[0].Name == "main" &&
				p.Containers[0].Memory.WorkingSetBytes > 0 {
				found = true
			}
		}
		if !found {
			t.Errorf("/stats/summary has no pod %s with its container main and its memory use:\n%s", counter.Name, out)
		}
		out, err = kubectl("get", "--raw", "/api/v1/nodes/"+edgeNode+"/proxy/metrics/resource")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"node_cpu_usage_seconds_total ", "node_memory_working_set_bytes ",
			`container_cpu_usage_seconds_total{container="main",namespace="default",pod="` + counter.Name + `"} `,
			`container_memory_working_set_bytes{container="main",namespace="default",pod="` + counter.Name + `"} `,
			`pod_cpu_usage_seconds_total{namespace="default",pod="` + counter.Name + `"} `} {
			if !strings.Contains(out, want) {
				t.Errorf("/metrics/resource lacks %q:\n%s", want, out)
			}
		}
	})
	t.Run("NodeRefusal", func(t *testing.T) {
		// The counter never restarted: the node has no previous instance, and says so; its words
		// reach kubectl (a 400 through the API server), not a generic "unable to handle".
		_, err := kubectl("logs", counter.Name, "--previous")
		if err == nil || !strings.Contains(err.Error(), "BadRequest") || !strings.Contains(err.Error(), "previous") {
			t.Errorf("kubectl logs --previous of a container that never restarted: %v, want the node's refusal", err)
		}
		t.Logf("kubectl logs --previous: %v", err)
	})

	t.Run("Authn", func(t *testing.T) { checkKubeletAuth(t, w, port) })

	t.Run("Offline", func(t *testing.T) {
		w.stopAgent(t)
		within(t, 30*time.Second, "kubectl logs says the node is offline", func() (bool, string) {
			_, err := kubectl("logs", counter.Name)
			return err != nil && strings.Contains(err.Error(), "node "+edgeNode+" is offline"), fmt.Sprint(err)
		})
	})
}

// checkKubeletAuth calls the bridge's port for the edge node directly: the API server's kind of
// client certificate passes, a certificate of the cluster CA without RBAC gets 403 and one whose
// user a role grants nodes/proxy 200, one of another CA 401, no credentials 401, a ServiceAccount
// token goes through TokenReview (403 without rights), a bogus token 401.
func checkKubeletAuth(t *testing.T, w *edgeWorld, port int32) {
	ctx := context.Background()
	url := fmt.Sprintf("https://%s/pods", net.JoinHostPort(w.kubeletAddr, fmt.Sprint(port)))
	get := func(cert *tls.Certificate, token string) (int, string) {
		t.Helper()
		tc := &tls.Config{InsecureSkipVerify: true} // the bridge's serving certificate is self-signed
		if cert != nil {
			tc.Certificates = []tls.Certificate{*cert}
		}
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300)) // enough for an error; a PodList is cut
		return resp.StatusCode, string(b)
	}
	userCert := func(name string, groups ...string) *tls.Certificate {
		t.Helper()
		cfg := w.cluster.UserRESTConfig(name, groups...)
		c, err := tls.X509KeyPair(cfg.CertData, cfg.KeyData)
		if err != nil {
			t.Fatal(err)
		}
		return &c
	}

	if code, body := get(userCert("kubelet-admin-e2e", "system:masters"), ""); code != http.StatusOK {
		t.Errorf("system:masters certificate: %d %s, want 200", code, body)
	}
	nobody := userCert("nobody-e2e")
	if code, body := get(nobody, ""); code != http.StatusForbidden || !strings.Contains(body, "subresource=proxy") {
		t.Errorf("certificate without RBAC: %d %s, want 403 naming nodes/proxy", code, body)
	}
	// A user granted nodes/proxy get on this node only passes. (Another user than nobody-e2e: the
	// bridge remembers nobody-e2e's denial for 30 s, as kubelet does.)
	rb := w.kube.RbacV1()
	if _, err := rb.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e-node-proxy"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/proxy"}, Verbs: []string{"get"}, ResourceNames: []string{edgeNode}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rb.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-node-proxy"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "e2e-node-proxy"},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "granted-e2e"}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	granted := userCert("granted-e2e")
	within(t, 30*time.Second, "granted-e2e may get nodes/proxy once bound", func() (bool, string) {
		code, body := get(granted, "")
		return code == http.StatusOK, fmt.Sprint(code, " ", body)
	})
	if code, _ := get(nobody, ""); code != http.StatusForbidden {
		t.Errorf("nobody-e2e after another user's grant: %d, want 403", code)
	}

	foreign := foreignCert(t)
	if code, body := get(&foreign, ""); code != http.StatusUnauthorized {
		t.Errorf("certificate of another CA: %d %s, want 401", code, body)
	}
	if code, body := get(nil, ""); code != http.StatusUnauthorized {
		t.Errorf("no credentials: %d %s, want 401", code, body)
	}
	if code, body := get(nil, "not-a-token"); code != http.StatusUnauthorized {
		t.Errorf("bogus token: %d %s, want 401", code, body)
	}
	kc, err := clientcmd.LoadFromFile(w.bridgeKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	var token string
	for _, a := range kc.AuthInfos {
		token = a.Token
	}
	if code, body := get(nil, token); code != http.StatusForbidden || !strings.Contains(body, "system:serviceaccount:"+bridgeNamespace+":mqlet-bridge") {
		t.Errorf("the bridge's ServiceAccount token (no nodes/proxy): %d %s, want 403 naming the ServiceAccount", code, body)
	}
}

// foreignCert is a client certificate from a CA the cluster does not know.
func foreignCert(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "system:admin", Organization: []string{"system:masters"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.X509KeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}
