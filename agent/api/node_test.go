package api

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// nodeProvider is a fakeProvider that also computes a node status.
type nodeProvider struct {
	fakeProvider
	mu   sync.Mutex
	node *v1.Node
}

func (p *nodeProvider) Node() *v1.Node {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.node == nil {
		return nil
	}
	return p.node.DeepCopy()
}

func (p *nodeProvider) set(n *v1.Node) {
	p.mu.Lock()
	p.node = n
	p.mu.Unlock()
}

func TestNodes(t *testing.T) {
	p := &nodeProvider{}
	sock := startServer(t, p)
	c := NewClient(sock)
	ctx := context.Background()

	// Before the first computation: an empty list, and a not-found that says why.
	list, err := c.ListNodes(ctx)
	if err != nil || list.Kind != "NodeList" || list.Items == nil || len(list.Items) != 0 {
		t.Fatalf("ListNodes before any status = %+v, %v", list, err)
	}
	if body := rawGet(t, sock, "/api/v1/nodes", http.StatusOK); !strings.Contains(body, `"items":[]`) {
		t.Errorf("empty node list body %q, want an empty items array", body)
	}
	_, err = c.GetNode(ctx, "edge-1")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "not computed its status yet") {
		t.Errorf("GetNode before any status: %v", err)
	}

	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1"}}
	n.Status.Capacity = v1.ResourceList{v1.ResourceCPU: resource.MustParse("4")}
	n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady"}}
	p.set(n)
	got, err := c.GetNode(ctx, "edge-1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "edge-1" || got.Kind != "Node" || got.APIVersion != "v1" || len(got.Status.Conditions) != 1 {
		t.Errorf("GetNode = %+v", got)
	}
	if q := got.Status.Capacity[v1.ResourceCPU]; q.Cmp(resource.MustParse("4")) != 0 {
		t.Errorf("cpu capacity %v", q)
	}
	list, err = c.ListNodes(ctx)
	if err != nil || len(list.Items) != 1 || list.Items[0].Name != "edge-1" || list.Items[0].Kind != "Node" {
		t.Errorf("ListNodes = %+v, %v", list, err)
	}
	_, err = c.GetNode(ctx, "edge-2")
	if !errors.Is(err, ErrNotFound) || err.Error() != "node edge-2 not found (this agent is node edge-1)" {
		t.Errorf("GetNode(edge-2) = %v", err)
	}
	// POST is refused like on every other route.
	if r := rawDo(t, sock, http.MethodPost, "/api/v1/nodes/edge-1"); r.code != http.StatusMethodNotAllowed {
		t.Errorf("POST node: code %d, want 405", r.code)
	}
}

// A provider without node status (an older agent, a test fake) serves an empty list.
func TestNodesWithoutNodeProvider(t *testing.T) {
	c := NewClient(startServer(t, &fakeProvider{}))
	list, err := c.ListNodes(context.Background())
	if err != nil || len(list.Items) != 0 {
		t.Errorf("ListNodes = %+v, %v", list, err)
	}
	if _, err := c.GetNode(context.Background(), "x"); !errors.Is(err, ErrNotFound) || err.Error() != "node x not found" {
		t.Errorf("GetNode = %v", err)
	}
}
