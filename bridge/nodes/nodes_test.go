package nodes

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mqlet/mqlet/bridge/mq"
	"github.com/mqlet/mqlet/sync/protocol"

	coordv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const wait = 10 * time.Second

var topics = protocol.MustTopics("")

// conn stands in for the bridge's MQTT connection state.
type conn struct {
	mu      sync.Mutex
	session int64
	up      bool
}

func (c *conn) Connected() (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.session, c.up
}

func (c *conn) set(session int64, up bool) {
	c.mu.Lock()
	c.session, c.up = session, up
	c.mu.Unlock()
}

type harness struct {
	t      *testing.T
	c      *Controller
	kube   *fake.Clientset
	conn   *conn
	served chan string

	leaseWrites  atomic.Int64
	statusWrites atomic.Int64
}

func newHarness(t *testing.T, mod func(*Options), objs ...runtime.Object) *harness {
	t.Helper()
	h := &harness{t: t, kube: fake.NewClientset(objs...), conn: &conn{session: 1, up: true}, served: make(chan string, 100)}
	h.kube.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() == "update" || a.GetVerb() == "create" {
			h.leaseWrites.Add(1)
		}
		return false, nil, nil
	})
	h.kube.PrependReactor("create", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		// The fake tracker leaves UIDs empty; the API server never does.
		n := a.(k8stesting.CreateAction).GetObject().(*v1.Node)
		n.UID = types.UID("uid-" + n.Name)
		return false, nil, nil
	})
	h.kube.PrependReactor("update", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "status" {
			h.statusWrites.Add(1)
		}
		return false, nil, nil
	})
	f := informers.NewSharedInformerFactory(h.kube, 0)
	o := Options{
		Kube:          h.kube,
		Informers:     f,
		Connected:     h.conn.Connected,
		RenewInterval: 100 * time.Millisecond,
		OnServed:      func(n string) { h.served <- n },
		Workers:       2,
	}
	if mod != nil {
		mod(&o)
	}
	c, err := New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.c = c
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		f.Shutdown()
		<-done
	})
	return h
}

// agentStatus is a node status as the agent publishes it.
func agentStatus(node string, ready v1.ConditionStatus) *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{
			LabelHostname: node + "-host", LabelOS: "linux", LabelArch: "arm64", "site": "plant-7"}},
		Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "mqlet.io/edge", Value: "true", Effect: v1.TaintEffectNoSchedule}}},
		Status: v1.NodeStatus{
			Capacity:    v1.ResourceList{v1.ResourceCPU: resource.MustParse("4"), v1.ResourcePods: resource.MustParse("110")},
			Allocatable: v1.ResourceList{v1.ResourceCPU: resource.MustParse("4"), v1.ResourcePods: resource.MustParse("110")},
			Conditions: []v1.NodeCondition{
				{Type: v1.NodeReady, Status: ready, Reason: "KubeletReady", Message: "mqlet is posting ready status",
					LastHeartbeatTime: metav1.NewTime(time.Unix(1000, 0)), LastTransitionTime: metav1.NewTime(time.Unix(1000, 0))},
				{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse, Reason: "KubeletHasSufficientMemory"},
			},
			Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.10.21"}, {Type: v1.NodeHostName, Address: node + "-host"}},
			NodeInfo:  v1.NodeSystemInfo{OperatingSystem: "linux", Architecture: "arm64", KubeletVersion: "mqlet-test"},
		},
	}
}

func (h *harness) statusMsg(node string, n *v1.Node, session int64) {
	h.t.Helper()
	p, err := protocol.Encode(&protocol.NodeStatus{Node: node, Object: n})
	if err != nil {
		h.t.Fatal(err)
	}
	h.raw(protocol.ClassNodeStatus, node, p, session)
}

func (h *harness) raw(class protocol.Class, node string, p []byte, session int64) {
	h.c.HandleMessage(mq.Message{Topic: protocol.Topic{Class: class, Node: node}, Name: topics.Node(node) + "/" + string(class), Payload: p, Session: session})
}

func (h *harness) liveness(node string, online bool, nodeSession, connSession int64) {
	h.t.Helper()
	p, err := protocol.Encode(&protocol.Liveness{Node: node, Online: online, Session: nodeSession})
	if err != nil {
		h.t.Fatal(err)
	}
	h.raw(protocol.ClassLiveness, node, p, connSession)
}

// eventually waits for cond, failing with what when it never holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, wait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (h *harness) node(name string) *v1.Node {
	n, err := h.kube.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return n
}

func (h *harness) waitNode(name string, what string, ok func(*v1.Node) bool) *v1.Node {
	h.t.Helper()
	var n *v1.Node
	eventually(h.t, what, func() bool { n = h.node(name); return n != nil && ok(n) })
	return n
}

func cond(n *v1.Node, t v1.NodeConditionType) *v1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == t {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func TestRegistersOnlineNodeWithLabelsTaintsAndReady(t *testing.T) {
	h := newHarness(t, nil)
	h.liveness("edge-1", true, 3, 1)
	h.statusMsg("edge-1", agentStatus("edge-1", v1.ConditionTrue), 1)

	n := h.waitNode("edge-1", "node registered Ready", func(n *v1.Node) bool {
		c := cond(n, v1.NodeReady)
		return c != nil && c.Status == v1.ConditionTrue
	})
	want := map[string]string{LabelHostname: "edge-1-host", LabelOS: "linux", LabelArch: "arm64", "site": "plant-7", DefaultRoleLabel: ""}
	for k, v := range want {
		if got, ok := n.Labels[k]; !ok || got != v {
			t.Errorf("label %s = %q (present %v), want %q", k, got, ok, v)
		}
	}
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != "mqlet.io/edge" {
		t.Errorf("taints %v, want the agent's mqlet.io/edge", n.Spec.Taints)
	}
	ready := cond(n, v1.NodeReady)
	if ready.LastHeartbeatTime.Time.Before(time.Now().Add(-time.Minute)) {
		t.Errorf("Ready heartbeat %s: the bridge must set it when it posts, not keep the agent's", ready.LastHeartbeatTime)
	}
	if n.Status.NodeInfo.KubeletVersion != "mqlet-test" || n.Status.Capacity.Cpu().String() != "4" || len(n.Status.Addresses) != 2 {
		t.Errorf("status not taken from the agent: %+v", n.Status)
	}
	select {
	case got := <-h.served:
		if got != "edge-1" {
			t.Errorf("OnServed(%q), want edge-1", got)
		}
	case <-time.After(wait):
		t.Error("OnServed not called after registration")
	}
	if !h.c.Served("edge-1") {
		t.Error("Served(edge-1) false after registration")
	}

	// The Lease: held by the node, 40 s, renewed.
	var l *coordv1.Lease
	eventually(t, "lease created", func() bool {
		var err error
		l, err = h.kube.CoordinationV1().Leases(LeaseNamespace).Get(context.Background(), "edge-1", metav1.GetOptions{})
		return err == nil
	})
	if *l.Spec.HolderIdentity != "edge-1" || *l.Spec.LeaseDurationSeconds != 40 || l.Spec.RenewTime == nil {
		t.Errorf("lease spec %+v", l.Spec)
	}
	if len(l.OwnerReferences) != 1 || l.OwnerReferences[0].Kind != "Node" || l.OwnerReferences[0].UID != n.UID {
		t.Errorf("lease owner %v, want the Node", l.OwnerReferences)
	}
	before := h.leaseWrites.Load()
	eventually(t, "lease renewed again", func() bool { return h.leaseWrites.Load() >= before+3 })
}

func TestOfflineNodeRegisteredUnknownAndNoLease(t *testing.T) {
	h := newHarness(t, nil)
	h.liveness("edge-2", false, 4, 1)
	h.statusMsg("edge-2", agentStatus("edge-2", v1.ConditionTrue), 1)
	n := h.waitNode("edge-2", "offline node registered", func(*v1.Node) bool { return true })
	for _, c := range n.Status.Conditions {
		if c.Status != v1.ConditionUnknown || !c.LastHeartbeatTime.IsZero() {
			t.Errorf("offline node's condition %s = %s heartbeat %s, want Unknown and no heartbeat", c.Type, c.Status, c.LastHeartbeatTime)
		}
	}
	// Registration makes the informer queue a lease check: it must write nothing.
	eventually(t, "the registration is in the informer", func() bool { return h.c.Served("edge-2") })
	time.Sleep(300 * time.Millisecond) // three renew intervals: a renewal would have happened
	if w := h.leaseWrites.Load(); w != 0 {
		t.Errorf("%d lease writes for an offline node", w)
	}

	// It comes online: Ready posted (the retained status unchanged), lease created.
	h.liveness("edge-2", true, 5, 1)
	h.waitNode("edge-2", "Ready True after coming online", func(n *v1.Node) bool {
		c := cond(n, v1.NodeReady)
		return c != nil && c.Status == v1.ConditionTrue && !c.LastHeartbeatTime.IsZero()
	})
	eventually(t, "lease written once online", func() bool { return h.leaseWrites.Load() > 0 })
}

func TestLivenessSessionsAndBridgeConnection(t *testing.T) {
	h := newHarness(t, nil)
	h.liveness("n", true, 7, 1)
	if !h.c.Online("n") {
		t.Fatal("online session 7 not vouched")
	}
	h.liveness("n", false, 6, 1) // a stale Will of an older session
	if !h.c.Online("n") {
		t.Fatal("a stale offline (session 6 < 7) took the node offline")
	}
	h.conn.set(1, false) // the bridge lost the broker
	if h.c.Online("n") {
		t.Fatal("vouched for a node while the bridge is disconnected")
	}
	h.conn.set(2, true) // reconnected: not vouched until its online comes again on this connection
	if h.c.Online("n") {
		t.Fatal("vouched after a reconnect before the node's online message came again")
	}
	h.liveness("n", true, 7, 2)
	if !h.c.Online("n") {
		t.Fatal("retained online resent on the new connection not vouched")
	}
	h.liveness("n", false, 7, 2) // the session's own Will: offline
	if h.c.Online("n") {
		t.Fatal("offline of the current session ignored")
	}
	h.liveness("n", true, 6, 2) // an older online: not a resurrection
	if h.c.Online("n") {
		t.Fatal("an online of an older session revived the node")
	}
	h.liveness("n", true, 8, 2)
	if !h.c.Online("n") || h.c.OnlineCount() != 1 {
		t.Fatal("new session's online not vouched")
	}
}

func TestLeaseStopsWhenOfflineOrDisconnected(t *testing.T) {
	for _, how := range []string{"node offline", "bridge disconnected"} {
		t.Run(how, func(t *testing.T) {
			h := newHarness(t, nil)
			h.liveness("n", true, 1, 1)
			h.statusMsg("n", agentStatus("n", v1.ConditionTrue), 1)
			eventually(t, "renewals", func() bool { return h.leaseWrites.Load() >= 2 })
			if how == "node offline" {
				h.liveness("n", false, 1, 1)
			} else {
				h.conn.set(1, false)
			}
			// A renewal in flight may still land. The next check of the node's lease key (never run
			// concurrently with the previous one) skips: from then on nothing may be written.
			skipped := h.c.leaseSkips.Load()
			eventually(t, "a lease check that skips", func() bool { return h.c.leaseSkips.Load() > skipped })
			after := h.leaseWrites.Load()
			time.Sleep(500 * time.Millisecond) // five renew intervals
			if got := h.leaseWrites.Load(); got != after {
				t.Errorf("%d lease writes after %s", got-after, how)
			}
		})
	}
}

func TestIsolationAndBadPayloads(t *testing.T) {
	h := newHarness(t, nil)
	h.liveness("victim", true, 1, 1)
	h.statusMsg("victim", agentStatus("victim", v1.ConditionTrue), 1)
	orig := h.waitNode("victim", "victim registered", func(n *v1.Node) bool { return cond(n, v1.NodeReady) != nil })
	posts := h.statusWrites.Load()

	attacker := agentStatus("victim", v1.ConditionFalse)
	// Published on the attacker's topic, naming the victim in the payload.
	p, _ := protocol.Encode(&protocol.NodeStatus{Node: "victim", Object: attacker})
	h.raw(protocol.ClassNodeStatus, "attacker", p, 1)
	// Payload node right, object name wrong.
	p, _ = protocol.Encode(&protocol.NodeStatus{Node: "attacker", Object: attacker})
	h.raw(protocol.ClassNodeStatus, "attacker", p, 1)
	// Liveness naming another node.
	p, _ = protocol.Encode(&protocol.Liveness{Node: "victim", Online: false, Session: 99})
	h.raw(protocol.ClassLiveness, "attacker", p, 1)
	// Garbled, unknown field, oversized.
	h.raw(protocol.ClassNodeStatus, "victim", []byte(`{"apiVersion":`), 1)
	h.raw(protocol.ClassNodeStatus, "victim", []byte(`{"apiVersion":"mqlet.io/v2","node":"victim","object":{"metadata":{"name":"victim"}},"extra":1}`), 1)
	big, _ := json.Marshal(map[string]string{"apiVersion": "mqlet.io/v2", "pad": strings.Repeat("x", protocol.DefaultMaxPayload)})
	h.raw(protocol.ClassNodeStatus, "victim", big, 1)
	h.raw(protocol.ClassLiveness, "victim", []byte("garbage"), 1)

	for _, r := range []struct {
		class, reason string
		want          float64
	}{{"status/node", "other_node", 2}, {"online", "other_node", 1}, {"status/node", "decode", 3}, {"online", "decode", 1}} {
		if got := h.c.m.refused.With(r.class, r.reason).Value(); got != r.want {
			t.Errorf("refused %s/%s = %v, want %v", r.class, r.reason, got, r.want)
		}
	}
	if h.node("attacker") != nil {
		t.Error("a Node was registered from refused messages")
	}
	if !h.c.Online("victim") {
		t.Error("a liveness message on another node's topic took the victim offline")
	}
	time.Sleep(200 * time.Millisecond)
	n := h.node("victim")
	if cond(n, v1.NodeReady).Status != v1.ConditionTrue || h.statusWrites.Load() != posts {
		t.Errorf("refused messages changed the victim: Ready %s, %d more status writes", cond(n, v1.NodeReady).Status, h.statusWrites.Load()-posts)
	}
	if n.ResourceVersion != orig.ResourceVersion && cond(n, v1.NodeReady).Status != v1.ConditionTrue {
		t.Error("victim changed")
	}
}

func TestSelectorDecidesRegistrationAndServed(t *testing.T) {
	sel, err := labels.Parse("site=plant-7")
	if err != nil {
		t.Fatal(err)
	}
	other := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "kubelet-node", Labels: map[string]string{"site": "hq"}}}
	h := newHarness(t, func(o *Options) { o.Selector = sel }, other)

	h.liveness("in", true, 1, 1)
	h.statusMsg("in", agentStatus("in", v1.ConditionTrue), 1)
	outStatus := agentStatus("out", v1.ConditionTrue)
	outStatus.Labels["site"] = "plant-9"
	h.liveness("out", true, 1, 1)
	h.statusMsg("out", outStatus, 1)

	h.waitNode("in", "matching node registered", func(*v1.Node) bool { return true })
	eventually(t, "served", func() bool { return h.c.Served("in") })
	time.Sleep(200 * time.Millisecond)
	if h.node("out") != nil {
		t.Error("a node outside the selector was registered")
	}
	if h.c.Served("kubelet-node") || h.c.Served("out") {
		t.Error("Served true for a node outside the selector")
	}
	// Relabelling a Node into the selector makes it served, and OnServed says so.
	drain(h.served)
	kn := h.node("kubelet-node")
	kn.Labels["site"] = "plant-7"
	if _, err := h.kube.CoreV1().Nodes().Update(context.Background(), kn, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-h.served:
		if got != "kubelet-node" {
			t.Errorf("OnServed(%q)", got)
		}
	case <-time.After(wait):
		t.Error("OnServed not called when a Node started matching the selector")
	}
}

func drain(ch chan string) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

func TestBackOnlineAfterUnknownPostsReady(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.StatusReportFrequency = time.Hour })
	h.liveness("n", true, 1, 1)
	h.statusMsg("n", agentStatus("n", v1.ConditionTrue), 1)
	h.waitNode("n", "Ready", func(n *v1.Node) bool { return cond(n, v1.NodeReady).Status == v1.ConditionTrue })

	h.liveness("n", false, 1, 1)
	// The node lifecycle controller marks it Unknown.
	n := h.node("n")
	cond(n, v1.NodeReady).Status = v1.ConditionUnknown
	cond(n, v1.NodeReady).Reason = "NodeStatusUnknown"
	if _, err := h.kube.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if got := cond(h.node("n"), v1.NodeReady).Status; got != v1.ConditionUnknown {
		t.Fatalf("Ready %s while offline: the bridge must not post for an offline node", got)
	}
	// Back online with a new session; the retained status did not change.
	h.liveness("n", true, 2, 1)
	n = h.waitNode("n", "Ready True again", func(n *v1.Node) bool { return cond(n, v1.NodeReady).Status == v1.ConditionTrue })
	if c := cond(n, v1.NodeReady); time.Since(c.LastTransitionTime.Time) > time.Minute {
		t.Errorf("Ready transition time %s: the Unknown -> True transition is now", c.LastTransitionTime)
	}
}

func TestOnlineStatusSemantics(t *testing.T) {
	t0 := metav1.NewTime(time.Unix(5000, 0))
	now := metav1.NewTime(time.Unix(9000, 0))
	existing := &v1.Node{Status: v1.NodeStatus{Conditions: []v1.NodeCondition{
		{Type: v1.NodeReady, Status: v1.ConditionTrue, LastTransitionTime: t0},
		{Type: v1.NodeMemoryPressure, Status: v1.ConditionTrue, LastTransitionTime: t0},
		{Type: v1.NodeNetworkUnavailable, Status: v1.ConditionFalse, LastTransitionTime: t0, Reason: "RouteCreated"},
	}}}
	st := onlineStatus(existing, agentStatus("n", v1.ConditionTrue), now)
	byType := map[v1.NodeConditionType]v1.NodeCondition{}
	for _, c := range st.Conditions {
		byType[c.Type] = c
	}
	if c := byType[v1.NodeReady]; !c.LastHeartbeatTime.Equal(&now) || !c.LastTransitionTime.Equal(&t0) {
		t.Errorf("Ready unchanged: heartbeat %s transition %s, want now and the old transition", c.LastHeartbeatTime, c.LastTransitionTime)
	}
	if c := byType[v1.NodeMemoryPressure]; c.Status != v1.ConditionFalse || !c.LastTransitionTime.Equal(&now) {
		t.Errorf("MemoryPressure True -> False: %s at %s, want False transitioned now", c.Status, c.LastTransitionTime)
	}
	if c, ok := byType[v1.NodeNetworkUnavailable]; !ok || c.Reason != "RouteCreated" {
		t.Error("a condition the agent does not report (another controller's) was dropped")
	}
	off := offlineStatus(agentStatus("n", v1.ConditionTrue), now)
	for _, c := range off.Conditions {
		if c.Status != v1.ConditionUnknown {
			t.Errorf("offline %s = %s", c.Type, c.Status)
		}
	}
	noReady := agentStatus("n", v1.ConditionTrue)
	noReady.Status.Conditions = noReady.Status.Conditions[1:]
	if c := cond(&v1.Node{Status: offlineStatus(noReady, now)}, v1.NodeReady); c == nil || c.Status != v1.ConditionUnknown {
		t.Error("offline status without Ready from the agent must still say Ready Unknown")
	}
}

func TestRegistrationLabels(t *testing.T) {
	a := agentStatus("n", v1.ConditionTrue)
	a.Labels = nil // an agent that sent no labels: filled from the status
	r := registration("n", a, "node-role.kubernetes.io/gateway")
	want := map[string]string{LabelHostname: "n-host", LabelOS: "linux", LabelArch: "arm64", "node-role.kubernetes.io/gateway": ""}
	if fmt.Sprint(r.Labels) != fmt.Sprint(want) {
		t.Errorf("labels %v, want %v", r.Labels, want)
	}
	if r := registration("n", a, ""); len(r.Labels) != 3 {
		t.Errorf("no role label asked: %v", r.Labels)
	}
}

// The API server dials the first address of the first type it prefers (Hostname first by default):
// the bridge's InternalIP must be the only way in, the device's own InternalIPs after it, and no
// address type a cluster could prefer to InternalIP (ExternalIP included).
func TestWithKubeletEndpoint(t *testing.T) {
	st := v1.NodeStatus{Addresses: []v1.NodeAddress{
		{Type: v1.NodeHostName, Address: "edge-1"}, {Type: v1.NodeInternalIP, Address: "192.168.1.5"},
		{Type: v1.NodeInternalDNS, Address: "edge-1.lan"}, {Type: v1.NodeExternalIP, Address: "203.0.113.9"},
		{Type: v1.NodeInternalIP, Address: "10.1.2.3"},
	}}
	withKubeletEndpoint(&st, "10.1.2.3", 10301)
	want := []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.1.2.3"}, {Type: v1.NodeInternalIP, Address: "192.168.1.5"}}
	if !reflect.DeepEqual(st.Addresses, want) || st.DaemonEndpoints.KubeletEndpoint.Port != 10301 {
		t.Errorf("addresses %v port %d, want %v 10301", st.Addresses, st.DaemonEndpoints.KubeletEndpoint.Port, want)
	}
}
