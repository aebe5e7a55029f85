package ctlclient

import (
	"context"
	"io"

	"github.com/mqlet/mqlet/sync/logsclient"
	"github.com/mqlet/mqlet/sync/protocol"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// RenewInterval is how often Logs renews a followed stream (see logsclient.RenewInterval).
const RenewInterval = logsclient.RenewInterval

// Logs asks node for a container's log and copies it to w until the node's last chunk (EOF), as
// logsclient.Stream does, over this client's connection and signed with its signing key.
func (c *Client) Logs(ctx context.Context, node string, req protocol.LogsRequest, w io.Writer) error {
	return logsclient.Stream(ctx, requests{c}, logsclient.Options{
		Topics:     c.topics,
		Timeout:    c.o.Timeout,
		SigningKey: c.o.SigningKey,
		IDPrefix:   "ctl-",
		Lost:       c.lost,
		LostErr:    func() error { return c.lostErr },
	}, node, req, w)
}

// requests is the client as a logsclient.Broker: non-retained publishes and reply subscriptions,
// each bounded by Options.Timeout.
type requests struct{ c *Client }

func (r requests) Publish(ctx context.Context, topic string, payload []byte) error {
	return r.c.publish(ctx, topic, payload, false)
}

func (r requests) Subscribe(ctx context.Context, topic string, h func([]byte)) (func(), error) {
	handle := func(_ mqtt.Client, m mqtt.Message) { h(m.Payload()) }
	if err := r.c.wait(ctx, r.c.mc.Subscribe(topic, qos, handle), "subscribe to "+topic); err != nil {
		return nil, err
	}
	return func() {
		r.c.wait(context.WithoutCancel(ctx), r.c.mc.Unsubscribe(topic), "unsubscribe")
	}, nil
}
