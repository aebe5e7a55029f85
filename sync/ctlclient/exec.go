package ctlclient

import (
	"context"
	"fmt"
	"io"

	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/stream"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Publish publishes payload on topic at QoS 1, not retained, and waits for the broker's PUBACK
// (stream.Transport).
func (c *Client) Publish(ctx context.Context, topic string, payload []byte) error {
	return c.publish(ctx, topic, payload, false)
}

// Subscribe subscribes to topic at QoS 1 and calls h with each message's payload, on paho's
// reader: h must not block (stream.Transport). unsubscribe is bounded by the client's timeout.
func (c *Client) Subscribe(ctx context.Context, topic string, h func(payload []byte)) (func(), error) {
	if err := c.wait(ctx, c.mc.Subscribe(topic, qos, func(_ mqtt.Client, m mqtt.Message) { h(m.Payload()) }), "subscribe to "+topic); err != nil {
		return nil, err
	}
	return func() { c.wait(context.WithoutCancel(ctx), c.mc.Unsubscribe(topic), "unsubscribe "+topic) }, nil
}

var _ stream.Transport = (*Client)(nil)

// Exec runs req.Command in a pod's container on node over MQTT (sync/stream), sealed to the
// node's sealing key as read from its status (attested with NodeTrust), signed with the client's
// signing key. A node the broker holds as offline fails at once.
func (c *Client) Exec(ctx context.Context, node string, req protocol.ExecRequest, stdin io.Reader, stdout, stderr io.Writer, resize <-chan protocol.TermSize) (int, error) {
	if err := protocol.ValidateNodeName(node); err != nil {
		return -1, err
	}
	n, _, err := c.Node(ctx, node)
	if err == nil && n.State == StateOffline {
		return -1, fmt.Errorf("exec on node %s: the node is offline (since %s)", node, n.Since.Format("2006-01-02 15:04:05Z07:00"))
	}
	pub, err := c.nodeKey(ctx, node, "exec sessions are sealed to it")
	if err != nil {
		return -1, fmt.Errorf("exec on node %s: %w", node, err)
	}
	return stream.Exec(ctx, c, c.topics, c.o.SigningKey, node, pub, req, stdin, stdout, stderr, resize)
}
