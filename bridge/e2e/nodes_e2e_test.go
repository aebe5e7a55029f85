// Package e2e tests mqlet-bridge against a real control plane (internal/kubetest: etcd,
// kube-apiserver, kube-controller-manager with its node lifecycle controller, kube-scheduler) and a
// real mosquitto with TLS identities and the fleet ACL, the bridge running with the RBAC of
// configs/bridge.
package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/bridge"
	"github.com/mqlet/mqlet/bridge/mq"
	"github.com/mqlet/mqlet/internal/kubetest"
	"github.com/mqlet/mqlet/internal/loopback"
	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/sync/protocol"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

const (
	node = "edge-1"
	// readyWait bounds registration and Ready; unknownWait the node lifecycle controller's
	// reaction to a Lease that stopped (kubetest's grace period is 20 s, its period 2 s).
	readyWait   = 60 * time.Second
	unknownWait = 90 * time.Second
)

var topics = protocol.MustTopics("")

func TestNodeRegistersTurnsReadyAndUnknownWhenOffline(t *testing.T) {
	cluster := kubetest.Start(t, kubetest.Options{})
	broker := mqtttest.Start(t, mqtttest.Options{Identities: []string{node}, UsernameAsClientID: true})
	admin, err := kubernetes.NewForConfig(cluster.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	applyManifestFiles(t, admin, "namespace.yaml", "rbac.yaml")
	b, addr := startBridge(t, cluster.ServiceAccountKubeconfig("mqlet-system", "mqlet-bridge"), broker)

	// The node, as the agent speaks: a Will, then online and its status, retained.
	n := connectNode(t, broker, 1)
	publish(t, n, topics.NodeStatus(node), nodeStatus(), true)

	ctx := context.Background()
	var got *v1.Node
	waitFor(t, readyWait, "Node registered and Ready", func() bool {
		got, err = admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && ready(got) == v1.ConditionTrue
	})
	for k, v := range map[string]string{"kubernetes.io/hostname": node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "arm64",
		"node-role.kubernetes.io/edge": "", "site": "plant-7"} {
		if got.Labels[k] != v {
			t.Errorf("label %s = %q, want %q (labels %v)", k, got.Labels[k], v, got.Labels)
		}
	}
	// The agent's taint; the node lifecycle controller may add its own (not-ready) beside it.
	if !slices.ContainsFunc(got.Spec.Taints, func(x v1.Taint) bool { return x.Key == "mqlet.io/edge" && x.Effect == v1.TaintEffectPreferNoSchedule }) {
		t.Errorf("taints %v, want the agent's mqlet.io/edge", got.Spec.Taints)
	}
	lease, err := admin.CoordinationV1().Leases("kube-node-lease").Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node Lease: %v", err)
	}
	first := lease.Spec.RenewTime.Time
	waitFor(t, 30*time.Second, "node Lease renewed", func() bool {
		l, err := admin.CoordinationV1().Leases("kube-node-lease").Get(ctx, node, metav1.GetOptions{})
		return err == nil && l.Spec.RenewTime.Time.After(first) && *l.Spec.HolderIdentity == node
	})
	if body := get(t, "http://"+addr+"/readyz"); !strings.Contains(body, "ready: leader") {
		t.Errorf("/readyz: %q, want the leader ready", body)
	}
	if m := get(t, "http://"+addr+"/metrics"); !regexp.MustCompile(`(?m)^bridge_nodes_online 1$`).MatchString(m) ||
		!regexp.MustCompile(`(?m)^bridge_mqtt_connected 1$`).MatchString(m) {
		t.Errorf("/metrics lacks bridge_nodes_online 1 or bridge_mqtt_connected 1")
	}

	// The node stops (a clean stop publishes its offline; a crash makes the broker publish the
	// Will): the Lease is no longer renewed and the node lifecycle controller marks it Unknown.
	publish(t, n, topics.Liveness(node), liveness(false, 1), true)
	n.Disconnect(100)
	waitFor(t, 10*time.Second, "the bridge sees the node offline", func() bool { return !b.Nodes().Online(node) })
	stopped, err := admin.CoordinationV1().Leases("kube-node-lease").Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, unknownWait, "Ready Unknown after the node went offline", func() bool {
		got, err = admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && ready(got) == v1.ConditionUnknown
	})
	l, err := admin.CoordinationV1().Leases("kube-node-lease").Get(ctx, node, metav1.GetOptions{})
	if err != nil || l.Spec.RenewTime.Time.After(stopped.Spec.RenewTime.Time) {
		t.Errorf("node Lease renewed while the node was offline: %v -> %v (%v)", stopped.Spec.RenewTime, l.Spec.RenewTime, err)
	}

	// Back with a new session; the retained status is unchanged: Ready again.
	n = connectNode(t, broker, 2)
	defer n.Disconnect(100)
	waitFor(t, readyWait, "Ready True again after the node came back", func() bool {
		got, err = admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && ready(got) == v1.ConditionTrue
	})
}

// startBridge runs the bridge with leader election, as the Deployment does, with the admin MQTT
// identity on the broker's TLS listener; it returns its metrics address.
func startBridge(t *testing.T, kubeconfig string, broker *mqtttest.Broker) (*bridge.Bridge, string) {
	t.Helper()
	ports, err := loopback.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	cert, key := broker.ClientCert(mqtttest.Admin)
	b, err := bridge.New(bridge.Options{
		Kubeconfig:           kubeconfig,
		LeaderElect:          true,
		LeaderElectNamespace: "mqlet-system",
		MQTT:                 mq.Options{Broker: broker.TLS, CAFile: broker.CAFile, CertFile: cert, KeyFile: key},
		MetricsAddr:          addr,
		Version:              "e2e",
		Log:                  slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatalf("bridge.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("bridge Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("bridge Run did not return within 30s of its context ending")
		}
	})
	return b, addr
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// connectNode connects as the node over TLS with its own certificate, with the Will of session,
// and publishes online for it, as the agent's link does.
func connectNode(t *testing.T, broker *mqtttest.Broker, session int64) mqtt.Client {
	t.Helper()
	o := mqtt.NewClientOptions().AddBroker(broker.TLS).SetClientID(node).SetCleanSession(true).
		SetTLSConfig(broker.TLSConfig(node)).SetAutoReconnect(false).
		SetBinaryWill(topics.Liveness(node), liveness(false, session), 1, true)
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(15*time.Second) || tok.Error() != nil {
		t.Fatalf("node connect: %v", tok.Error())
	}
	publish(t, c, topics.Liveness(node), liveness(true, session), true)
	return c
}

func liveness(online bool, session int64) []byte {
	p, err := protocol.Encode(&protocol.Liveness{Node: node, Online: online, Session: session})
	if err != nil {
		panic(err)
	}
	return p
}

func publish(t *testing.T, c mqtt.Client, topic string, payload []byte, retained bool) {
	t.Helper()
	if tok := c.Publish(topic, 1, retained, payload); !tok.WaitTimeout(15*time.Second) || tok.Error() != nil {
		t.Fatalf("publish %s: %v", topic, tok.Error())
	}
}

func nodeStatus() []byte {
	now := metav1.Now()
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{
			"kubernetes.io/hostname": node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "arm64", "site": "plant-7"}},
		Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "mqlet.io/edge", Value: "true", Effect: v1.TaintEffectPreferNoSchedule}}},
		Status: v1.NodeStatus{
			Capacity:    v1.ResourceList{v1.ResourceCPU: resource.MustParse("4"), v1.ResourceMemory: resource.MustParse("3882Mi"), v1.ResourcePods: resource.MustParse("110")},
			Allocatable: v1.ResourceList{v1.ResourceCPU: resource.MustParse("4"), v1.ResourceMemory: resource.MustParse("3682Mi"), v1.ResourcePods: resource.MustParse("110")},
			Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady",
				Message: "mqlet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now}},
			Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.10.21"}, {Type: v1.NodeHostName, Address: node}},
			NodeInfo: v1.NodeSystemInfo{MachineID: "3f2a9c0e", BootID: "b0e1d2c3", KernelVersion: "6.6.31", OSImage: "Debian GNU/Linux 12",
				ContainerRuntimeVersion: "containerd://1.7.24", KubeletVersion: "mqlet-e2e", OperatingSystem: "linux", Architecture: "arm64"},
		},
	}
	p, err := protocol.Encode(&protocol.NodeStatus{Node: node, Object: n})
	if err != nil {
		panic(err)
	}
	return p
}

func ready(n *v1.Node) v1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status
		}
	}
	return ""
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return fmt.Sprintf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// Two replicas: one leads (connects to MQTT, ready as leader), the other stands by (ready as
// standby, not connected); when the leader stops, the standby takes over; a leader whose Lease is
// taken from it stops with an error (the process exits non-zero and is restarted).
func TestTwoReplicasOneLeader(t *testing.T) {
	cluster := kubetest.Start(t, kubetest.Options{})
	broker := mqtttest.Start(t, mqtttest.Options{})
	admin, err := kubernetes.NewForConfig(cluster.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	applyManifestFiles(t, admin, "namespace.yaml", "rbac.yaml")
	kc := cluster.ServiceAccountKubeconfig("mqlet-system", "mqlet-bridge")
	a := runReplica(t, kc, broker, "replica-a")
	waitFor(t, 30*time.Second, "replica-a leads", func() bool { return strings.Contains(get(t, a.url), "ready: leader") })
	b := runReplica(t, kc, broker, "replica-b")
	waitFor(t, 30*time.Second, "replica-b stands by", func() bool { return strings.Contains(get(t, b.url), "ready: standby") })
	if _, ok := b.b.Conn().Connected(); ok {
		t.Error("the standby is connected to MQTT: only the leader may be")
	}
	time.Sleep(2 * time.Second) // several retry periods: the standby must stay a standby
	if body := get(t, b.url); !strings.Contains(body, "standby") || !strings.Contains(body, "replica-a") {
		t.Errorf("standby /readyz %q, want standby naming the leader replica-a", body)
	}

	// The leader stops (SIGTERM): it gives the Lease up and the standby takes over.
	a.cancel()
	<-a.done
	if a.err != nil {
		t.Errorf("stopped leader's Run: %v, want nil", a.err)
	}
	waitFor(t, 30*time.Second, "replica-b leads", func() bool { return strings.Contains(get(t, b.url), "ready: leader") })

	// The Lease is taken from the leader (e.g. it could not reach the API long enough): it stops
	// with an error instead of writing on as a second leader.
	// The leader renews the Lease every few seconds, so the theft may meet a conflict: read it
	// again and retry, as any writer of a Lease must.
	ctx := context.Background()
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := admin.CoordinationV1().Leases("mqlet-system").Get(ctx, bridge.LeaderLeaseName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		thief := "thief"
		l.Spec.HolderIdentity = &thief
		l.Spec.LeaseDurationSeconds = ptrTo(int32(3600))
		now := metav1.NewMicroTime(time.Now())
		l.Spec.RenewTime, l.Spec.AcquireTime = &now, &now
		_, err = admin.CoordinationV1().Leases("mqlet-system").Update(ctx, l, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("taking the Lease from the leader: %v", err)
	}
	select {
	case <-b.done:
		if b.err == nil || !strings.Contains(b.err.Error(), "lost the leader lease") {
			t.Errorf("Run after losing the Lease: %v, want an error saying so", b.err)
		}
	case <-time.After(30 * time.Second):
		var buf strings.Builder
		pprof.Lookup("goroutine").WriteTo(&buf, 1)
		t.Fatalf("the leader kept running 30s after its Lease was taken; goroutines:\n%s", buf.String())
	}
	if _, ok := b.b.Conn().Connected(); ok {
		t.Error("still connected to MQTT after losing the leadership")
	}
}

type replica struct {
	b      *bridge.Bridge
	url    string
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned, with its error in err
	err    error
}

func runReplica(t *testing.T, kubeconfig string, broker *mqtttest.Broker, id string) *replica {
	t.Helper()
	ports, err := loopback.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	b, err := bridge.New(bridge.Options{
		Kubeconfig:           kubeconfig,
		LeaderElect:          true,
		LeaderElectNamespace: "mqlet-system",
		Identity:             id,
		LeaseDuration:        4 * time.Second,
		RenewDeadline:        3 * time.Second,
		RetryPeriod:          500 * time.Millisecond,
		MQTT:                 mq.Options{Broker: broker.Plain, ClientID: "bridge-" + id},
		MetricsAddr:          addr,
		Log:                  slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})).With("replica", id),
	})
	if err != nil {
		t.Fatalf("bridge.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{b: b, url: "http://" + addr + "/readyz", cancel: cancel, done: make(chan struct{})}
	go func() { r.err = b.Run(ctx); close(r.done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Errorf("replica %s did not stop within 30s", id)
		}
	})
	return r
}

func ptrTo[T any](v T) *T { return &v }
