package link

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/mqlet/mqlet/internal/mqtttest"
)

// An oversized retained message on a desired topic the node subscribes to (as it does to fetch an
// object its index lists), published by another client on a real mosquitto whose
// message_size_limit lets it through (the harness sets none): each connection is dropped at the
// packet's header, the link's heap does not take the packet in
// (TotalAlloc, which counts every allocation of the process, grows by far less than the packet),
// and the link keeps reconnecting; once the message is replaced it connects and receives again.
// Over TLS (how nodes connect), plain TCP and websockets: the guard sits above TLS and websockets.
func TestOversizedPacketDropsConnection(t *testing.T) {
	checkGoroutines(t)
	const (
		node       = "node-a"
		topic      = "mqlet/v2/nodes/" + node + "/desired/pods/default/web"
		maxPayload = 64 << 10
		packet     = 16 << 20 // the oversized payload
	)
	b := mqtttest.Start(t, mqtttest.Options{Identities: []string{node}})
	certFile, keyFile := b.ClientCert(node)
	for _, tc := range []struct{ name, broker string }{{"tls", b.TLS}, {"tcp", b.Plain}, {"ws", b.WS}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.broker == "" {
				t.Skip("this mosquitto has no websockets listener")
			}
			publishAs(t, b, mqtt.NewClientOptions().SetTLSConfig(b.TLSConfig(mqtttest.Admin)).AddBroker(b.TLS),
				topic, bytes.Repeat([]byte("x"), packet))

			o := testOptions(t, tc.broker, node)
			if tc.broker == b.TLS {
				o.CAFile, o.CertFile, o.KeyFile = b.CAFile, certFile, keyFile
			}
			o.Subscriptions = []string{topic}
			o.MaxPayload = maxPayload
			l, err := New(o)
			if err != nil {
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			r := startLinkFrom(t, l)
			// Two drops: the link came back and met the packet again.
			waitUntil(t, "two connections dropped at the oversized packet", func() bool { return l.Oversized() >= 2 })
			runtime.ReadMemStats(&after)
			grew := after.TotalAlloc - before.TotalAlloc
			t.Logf("allocated %d KiB in all while %d connections met a %d MiB packet", grew>>10, l.Oversized(), packet>>20)
			if grew > packet/4 {
				t.Errorf("the process allocated %d bytes while the link met the %d-byte packet: it was read", grew, packet)
			}
			if got := l.Dropped(); got != 0 {
				t.Errorf("inbox dropped %d messages", got)
			}
			select {
			case m := <-l.Inbox():
				t.Fatalf("a message of %d bytes on %s got through", len(m.Payload), m.Topic)
			default:
			}

			// The oversized message is replaced: the link connects, stays and receives.
			publishAs(t, b, mqtt.NewClientOptions().SetTLSConfig(b.TLSConfig(mqtttest.Admin)).AddBroker(b.TLS), topic, []byte("small"))
			for {
				m := receive(t, l, topic)[topic]
				if string(m.Payload) == "small" {
					break
				}
			}
			r.stop(t)
		})
	}
}

// The error a dropped connection ends with names the packet and the limit.
func TestOversizedPacketError(t *testing.T) {
	checkGoroutines(t)
	b := mqtttest.Start(t, mqtttest.Options{})
	const topic = "big/one"
	publishAs(t, b, mqtt.NewClientOptions().AddBroker(b.Plain), topic, bytes.Repeat([]byte("x"), 70000))
	o := testOptions(t, b.Plain, "node-a")
	o.Subscriptions = []string{topic}
	o.MaxPayload = 1024
	l, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	c := l.newConn(1)
	c.client = mqtt.NewClient(l.clientOptions(c))
	if tok := c.client.Connect(); !tok.WaitTimeout(ackWait) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	select {
	case <-c.lost:
	case <-time.After(ackWait):
		t.Fatal("the connection survived the oversized packet")
	}
	var tl *TooLargeError
	if !errors.As(c.lostErr, &tl) || tl.Limit != 1024+PublishOverhead || tl.Length != 2+len(topic)+2+70000 || tl.Type != 3 {
		t.Fatalf("lost with %v, want a TooLargeError for the %d-byte PUBLISH", c.lostErr, 2+len(topic)+2+70000)
	}
	c.close()
	if l.Oversized() != 1 {
		t.Errorf("Oversized() = %d", l.Oversized())
	}
}

// publishAs publishes payload retained on topic with a client of its own (QoS 1, acknowledged),
// then disconnects it.
func publishAs(t *testing.T, b *mqtttest.Broker, o *mqtt.ClientOptions, topic string, payload []byte) {
	t.Helper()
	o.SetClientID(randomID("publisher-")).SetAutoReconnect(false).SetConnectTimeout(5 * time.Second)
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(ackWait) || tok.Error() != nil {
		t.Fatalf("publisher connect: %v", tok.Error())
	}
	defer c.Disconnect(100)
	if tok := c.Publish(topic, 1, true, payload); !tok.WaitTimeout(ackWait) || tok.Error() != nil {
		t.Fatalf("publish %d bytes on %s: %v", len(payload), topic, tok.Error())
	}
}

// startLinkFrom is startLink for a Link the test built.
func startLinkFrom(t *testing.T, l *Link) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Link: l, cancel: cancel, done: make(chan error, 1)}
	go func() {
		r.done <- l.Run(ctx)
		close(r.done)
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// waitUntil polls cond (bounded by connectWait, generous) until it holds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(connectWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", connectWait, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
