package ctlclient

import (
	"context"
	"io"

	"github.com/mqlet/mqlet/sync/logsclient"
	"github.com/mqlet/mqlet/sync/protocol"
)

// RenewInterval is how often Logs renews a followed stream (see logsclient.RenewInterval).
const RenewInterval = logsclient.RenewInterval

// Logs asks node for a container's log and copies it to w until the node's last chunk (EOF), as
// logsclient.Stream does, over this client's connection (its Publish and Subscribe) and signed
// with its signing key.
func (c *Client) Logs(ctx context.Context, node string, req protocol.LogsRequest, w io.Writer) error {
	return logsclient.Stream(ctx, c, logsclient.Options{
		Topics:     c.topics,
		Timeout:    c.o.Timeout,
		SigningKey: c.o.SigningKey,
		IDPrefix:   "ctl-",
		Lost:       c.lost,
		LostErr:    func() error { return c.lostErr },
	}, node, req, w)
}

var _ logsclient.Broker = (*Client)(nil)
