package ctlclient

import (
	"context"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/sync/protocol"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// testTimeout bounds every wait of these tests.
const testTimeout = 10 * time.Second

var tp = protocol.MustTopics(protocol.DefaultPrefix)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// dial connects a Client to the broker's plain listener; it is closed when the test ends.
func dial(t *testing.T, b *mqtttest.Broker) *Client {
	t.Helper()
	c, err := Connect(testCtx(t), Options{Broker: b.Plain, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// rawClient is a plain paho client playing a node or another party.
func rawClient(t *testing.T, broker string) mqtt.Client {
	t.Helper()
	o := mqtt.NewClientOptions().AddBroker(broker).SetClientID("test-" + randomHex(4)).
		SetCleanSession(true).SetAutoReconnect(false).SetConnectTimeout(testTimeout)
	cl := mqtt.NewClient(o)
	if tok := cl.Connect(); !tok.WaitTimeout(testTimeout) || tok.Error() != nil {
		t.Fatalf("raw connect %s: %v", broker, tok.Error())
	}
	t.Cleanup(func() { cl.Disconnect(100) })
	return cl
}

// pub publishes payload (bytes, or a protocol value to encode) at QoS 1 and waits for the PUBACK.
func pub(t *testing.T, cl mqtt.Client, topic string, v any, retained bool) {
	t.Helper()
	var payload []byte
	switch x := v.(type) {
	case []byte:
		payload = x
	case string:
		payload = []byte(x)
	default:
		var err error
		if payload, err = protocol.Encode(v); err != nil {
			t.Fatalf("encode %T: %v", v, err)
		}
	}
	tok := cl.Publish(topic, 1, retained, payload)
	if !tok.WaitTimeout(testTimeout) || tok.Error() != nil {
		t.Fatalf("publish %s: %v", topic, tok.Error())
	}
}

func pod(name string) *v1.Pod {
	return &v1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "busybox"}}},
	}
}
