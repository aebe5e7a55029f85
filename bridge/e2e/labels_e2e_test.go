package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
)

// TestNodeLabelsAndTaintsFromAgent: labels and taints changed in the agent's config after
// registration reach the Node on the real API server, the agent's dropped ones go, and an
// operator's own stay, also when the operator writes the Node between the bridge's read and its
// write (the API server refuses the bridge's write with a conflict; the bridge reads again and
// loses neither side's change). The bridge talks to the API server through a proxy of the test's
// that makes that interleaving exact: on the bridge's label/taint write (PUT on the Node, not its
// status) it first lets the operator update the Node, then forwards the bridge's request, which
// still carries the resourceVersion the bridge read.
func TestNodeLabelsAndTaintsFromAgent(t *testing.T) {
	w := newEdgeWorld(t)
	p := newAPIProxy(t, w)
	w.bridgeKubeconfig = p.kubeconfig(t, w.bridgeKubeconfig, filepath.Join(w.dir, "bridge-proxied.kubeconfig"))
	b := w.startBridge(t, "bridge-a")
	// Before the proxy's cleanup (registered first, so run last): its Close waits for the
	// bridge's watches to end.
	t.Cleanup(func() { b.stop(syscall.SIGTERM, 30*time.Second) })

	w.startAgentWith(t, "--node-label", "a=1", "--node-taint", "mqlet.io/gone=x:NoSchedule")
	s := &labelSuite{w: w}
	s.wait(t, "the agent's first label and taint", map[string]string{"a": "1"}, nil,
		[]string{"mqlet.io/gone=x:NoSchedule"})

	// The operator's own label and taint, as `kubectl label` / `kubectl taint` add them.
	if err := s.operatorEdit("ops.example/owner", "team-1", v1.Taint{Key: "ops.example/keep", Value: "yes", Effect: v1.TaintEffectNoSchedule}); err != nil {
		t.Fatal(err)
	}
	own := map[string]string{"ops.example/owner": "team-1"}
	ownTaints := []string{"ops.example/keep=yes:NoSchedule"}
	s.wait(t, "the operator's label and taint beside the agent's", merged(own, map[string]string{"a": "1"}), nil,
		append(slices.Clone(ownTaints), "mqlet.io/gone=x:NoSchedule"))

	// The agent's config changes: a changes value, b is new, its taint is replaced by another.
	w.stopAgent(t)
	w.startAgentWith(t, "--node-label", "a=2", "--node-label", "b=1", "--node-taint", "mqlet.io/new=y:PreferNoSchedule")
	s.wait(t, "the agent's changed labels and taints, the operator's untouched",
		merged(own, map[string]string{"a": "2", "b": "1"}), nil,
		append(slices.Clone(ownTaints), "mqlet.io/new=y:PreferNoSchedule"))
	w.checkProcs(t)

	// The operator writes the Node between the bridge's read and write, once: the bridge's
	// write meets a conflict, and its own retry must carry both sides.
	p.arm(1, func(i int) error {
		return s.operatorEdit("ops.example/race", "1", v1.Taint{Key: "ops.example/race", Value: "1", Effect: v1.TaintEffectPreferNoSchedule})
	})
	w.stopAgent(t)
	w.startAgentWith(t, "--node-label", "a=3", "--node-label", "c=1", "--node-taint", "mqlet.io/newer=z:PreferNoSchedule")
	own["ops.example/race"] = "1"
	ownTaints = append(ownTaints, "ops.example/race=1:PreferNoSchedule")
	s.wait(t, "both the agent's change and the operator's edit that raced it",
		merged(own, map[string]string{"a": "3", "c": "1"}), []string{"b"},
		append(slices.Clone(ownTaints), "mqlet.io/newer=z:PreferNoSchedule"))
	p.checkConflicts(t, 1)

	// Three edits in a row, one before each of the bridge's next writes: more conflicts than the
	// bridge's in-place retry absorbs, so the later ones go through its work queue's retry.
	p.arm(3, func(i int) error {
		return s.operatorEdit(fmt.Sprintf("ops.example/race-%d", i), "1",
			v1.Taint{Key: fmt.Sprintf("ops.example/race-%d", i), Effect: v1.TaintEffectNoSchedule})
	})
	w.stopAgent(t)
	w.startAgentWith(t, "--node-label", "a=4", "--node-label", "c=1", "--node-taint", "mqlet.io/newer=z:PreferNoSchedule")
	for i := range 3 {
		own[fmt.Sprintf("ops.example/race-%d", i)] = "1"
		ownTaints = append(ownTaints, fmt.Sprintf("ops.example/race-%d:NoSchedule", i))
	}
	s.wait(t, "the agent's change after three racing operator edits, and all three edits",
		merged(own, map[string]string{"a": "4", "c": "1"}), []string{"b"},
		append(slices.Clone(ownTaints), "mqlet.io/newer=z:PreferNoSchedule"))
	p.checkConflicts(t, 3)
	w.checkProcs(t)
}

type labelSuite struct{ w *edgeWorld }

// operatorEdit adds a label and a taint to the Node as the admin does with kubectl: read, change,
// update, again on a conflict.
func (s *labelSuite) operatorEdit(key, value string, taint v1.Taint) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes := s.w.kube.CoreV1().Nodes()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(ctx, edgeNode, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Labels[key] = value
		n.Spec.Taints = append(n.Spec.Taints, taint)
		_, err = nodes.Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("operator: add label %s=%s and taint %s to node %s: %w", key, value, taintString(taint), edgeNode, err)
	}
	return nil
}

// wait polls the Node until it has the labels want (and none of the keys gone) and exactly the
// taints taints, the node lifecycle controller's node.kubernetes.io/ ones aside.
func (s *labelSuite) wait(t *testing.T, what string, want map[string]string, gone []string, taints []string) {
	t.Helper()
	slices.Sort(taints)
	within(t, readyBound, "Node "+edgeNode+": "+what, func() (bool, string) {
		n, err := s.w.kube.CoreV1().Nodes().Get(context.Background(), edgeNode, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		var problems []string
		for k, v := range want {
			if got, ok := n.Labels[k]; !ok || got != v {
				problems = append(problems, fmt.Sprintf("label %s=%q, want %q", k, got, v))
			}
		}
		for _, k := range gone {
			if v, ok := n.Labels[k]; ok {
				problems = append(problems, fmt.Sprintf("label %s=%q still there", k, v))
			}
		}
		var got []string
		for _, x := range n.Spec.Taints {
			if !strings.HasPrefix(x.Key, "node.kubernetes.io/") {
				got = append(got, taintString(x))
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, taints) {
			problems = append(problems, fmt.Sprintf("taints %v, want %v", got, taints))
		}
		return len(problems) == 0, fmt.Sprintf("%s (labels %v)", strings.Join(problems, "; "), n.Labels)
	})
}

func taintString(x v1.Taint) string {
	if x.Value == "" {
		return x.Key + ":" + string(x.Effect)
	}
	return x.Key + "=" + x.Value + ":" + string(x.Effect)
}

func merged(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		maps.Copy(out, m)
	}
	return out
}

// apiProxy stands between the bridge and the API server (TLS both ways; the bridge's own token
// passes through). When armed, each of the bridge's next label/taint writes of the edge Node
// (PUT /api/v1/nodes/<node>) waits for an edit of the operator's before it is forwarded.
type apiProxy struct {
	srv *httptest.Server
	rp  *httputil.ReverseProxy

	mu      sync.Mutex
	pending int               // writes still to be preceded by an edit
	edits   int               // edits made since arm, numbering them
	edit    func(i int) error // the operator's edit
	errs    []error           // edits that failed
	codes   []int             // the API server's answers to the bridge's writes since arm
}

func newAPIProxy(t *testing.T, w *edgeWorld) *apiProxy {
	t.Helper()
	target, err := url.Parse(w.cluster.Host())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(w.cluster.CACert()) {
		t.Fatal("the cluster's CA certificate does not parse")
	}
	p := &apiProxy{}
	p.rp = &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
		FlushInterval: -1, // watches stream
		ModifyResponse: func(resp *http.Response) error {
			if p.isMetaWrite(resp.Request) {
				p.mu.Lock()
				p.codes = append(p.codes, resp.StatusCode)
				p.mu.Unlock()
			}
			return nil
		},
	}
	p.srv = httptest.NewTLSServer(http.HandlerFunc(p.serve))
	t.Cleanup(func() {
		p.srv.CloseClientConnections()
		p.srv.Close()
	})
	return p
}

func (p *apiProxy) isMetaWrite(r *http.Request) bool {
	return r.Method == http.MethodPut && r.URL.Path == "/api/v1/nodes/"+edgeNode
}

func (p *apiProxy) serve(rw http.ResponseWriter, r *http.Request) {
	if p.isMetaWrite(r) {
		p.mu.Lock()
		var edit func(int) error
		i := p.edits
		if p.pending > 0 {
			p.pending--
			p.edits++
			edit = p.edit
		}
		p.mu.Unlock()
		if edit != nil {
			if err := edit(i); err != nil {
				p.mu.Lock()
				p.errs = append(p.errs, err)
				p.mu.Unlock()
			}
		}
	}
	p.rp.ServeHTTP(rw, r)
}

// arm makes the next n label/taint writes of the bridge wait for edit(i), i counting from 0.
func (p *apiProxy) arm(n int, edit func(i int) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending, p.edits, p.edit, p.errs, p.codes = n, 0, edit, nil, nil
}

// checkConflicts fails the test unless the first n of the bridge's writes since arm met a
// conflict (each came after an operator's edit), a later one succeeded, and every edit was made.
func (p *apiProxy) checkConflicts(t *testing.T, n int) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, err := range p.errs {
		t.Error(err)
	}
	if p.pending > 0 {
		t.Errorf("%d operator edits still waiting for a bridge write; writes seen: %v", p.pending, p.codes)
	}
	if len(p.codes) <= n || !slices.Equal(p.codes[:n], slices.Repeat([]int{http.StatusConflict}, n)) ||
		!slices.Contains(p.codes[n:], http.StatusOK) {
		t.Errorf("the bridge's label/taint writes were answered %v; want %d conflicts (409), then a success (200)", p.codes, n)
	}
}

// kubeconfig writes a copy of the kubeconfig at from that points at the proxy, and returns its path.
func (p *apiProxy) kubeconfig(t *testing.T, from, to string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(from)
	if err != nil {
		t.Fatal(err)
	}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})
	for _, c := range cfg.Clusters {
		c.Server, c.CertificateAuthorityData, c.CertificateAuthority = p.srv.URL, ca, ""
	}
	if err := clientcmd.WriteToFile(*cfg, to); err != nil {
		t.Fatal(err)
	}
	return to
}
