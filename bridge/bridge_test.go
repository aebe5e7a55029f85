package bridge

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/bridge/mq"
	"github.com/mqlet/mqlet/internal/loopback"
	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/sync/protocol"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

const wait = 15 * time.Second

type podPart struct {
	mu     sync.Mutex
	msgs   map[protocol.Class][]protocol.Topic
	served []string
}

func (p *podPart) handle(t protocol.Topic, _ []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs[t.Class] = append(p.msgs[t.Class], t)
}

func (p *podPart) onServed(n string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.served = append(p.served, n)
}

func (p *podPart) count(c protocol.Class) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.msgs[c])
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func httpGet(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The leader's wiring: uplink classes reach the nodes controller or the pods part, OnServed
// reaches the part, and /readyz follows the MQTT connection.
func TestRoutingAndReadiness(t *testing.T) {
	broker := mqtttest.Start(t, mqtttest.Options{})
	kube := fake.NewClientset()
	part := &podPart{msgs: map[protocol.Class][]protocol.Topic{}}
	var deps Deps
	ports, err := loopback.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	b, err := New(Options{
		Kube:        kube,
		MQTT:        mq.Options{Broker: broker.Plain, ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond},
		MetricsAddr: addr,
		Log:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		Pods: func(d Deps) (*Part, error) {
			deps = d
			return &Part{PodHandler: part.handle, OnServed: part.onServed}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if deps.Conn != b.Conn() || deps.Nodes != b.Nodes() || deps.Informers == nil || deps.Kube != kube {
		t.Fatal("Pods did not get the bridge's clients")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(wait):
			t.Error("Run did not return")
		}
	}()
	eventually(t, "ready as leader", func() bool {
		code, body := httpGet("http://" + addr + "/readyz")
		return code == 200 && strings.Contains(body, "ready: leader")
	})

	cl := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(broker.Plain).SetClientID("node-sim"))
	if tok := cl.Connect(); !tok.WaitTimeout(wait) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	defer cl.Disconnect(100)
	tp := b.Conn().Topics()
	pub := func(topic string, v any) {
		p, err := protocol.Encode(v)
		if err != nil {
			t.Fatal(err)
		}
		if tok := cl.Publish(topic, 1, true, p); !tok.WaitTimeout(wait) || tok.Error() != nil {
			t.Fatal(tok.Error())
		}
	}
	pub(tp.Liveness("n1"), &protocol.Liveness{Node: "n1", Online: true, Session: 1})
	pub(tp.NodeStatus("n1"), &protocol.NodeStatus{Node: "n1", Object: &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}}}})
	pub(tp.PodStatus("n1", "default", "web"), &protocol.PodStatus{Node: "n1", Namespace: "default", Name: "web", Source: "mqtt"})
	pub(tp.Acks("n1"), &protocol.Acks{Node: "n1", Session: 1})
	pub(tp.Events("n1"), &protocol.Event{Node: "n1", Type: "Normal", Reason: "Started"})
	pub(tp.Resync("n1"), &protocol.ResyncRequest{Node: "n1", Session: 1})

	for _, c := range []protocol.Class{protocol.ClassPodStatus, protocol.ClassAcks, protocol.ClassEvents, protocol.ClassResync} {
		eventually(t, string(c)+" routed to the pods part", func() bool { return part.count(c) > 0 })
	}
	eventually(t, "node registered from its status", func() bool {
		_, err := kube.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		return err == nil
	})
	eventually(t, "OnServed reached the pods part", func() bool {
		part.mu.Lock()
		defer part.mu.Unlock()
		return len(part.served) == 1 && part.served[0] == "n1"
	})
	if part.count(protocol.ClassLiveness) != 0 || part.count(protocol.ClassNodeStatus) != 0 {
		t.Error("liveness or node status reached the pods part")
	}
	if !b.Nodes().Online("n1") {
		t.Error("liveness did not reach the nodes controller")
	}
	_, m := httpGet("http://" + addr + "/metrics")
	for _, want := range []string{"bridge_mqtt_connected 1", "bridge_nodes_online 1", "bridge_leader 1", `bridge_mqtt_messages_total{class="status/pods"} 1`, "process_cpu_seconds_total"} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	broker.Stop(t)
	eventually(t, "not ready once the broker is gone", func() bool {
		code, body := httpGet("http://" + addr + "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "MQTT not connected")
	})
	if b.Nodes().Online("n1") {
		t.Error("the bridge still vouches for a node after losing the broker")
	}
	if code, body := httpGet("http://" + addr + "/healthz"); code != 200 {
		t.Errorf("/healthz %d %q while the process runs", code, body)
	}
}
