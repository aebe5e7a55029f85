package ctlclient

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// RenewInterval is how often Logs renews a followed stream. A node ends a stream that is not renewed
// within its renew timeout (logserve's default is 60s), so two renews in a row may be lost before it
// gives up.
const RenewInterval = 20 * time.Second

// cancelTimeout bounds the publish of a cancel once the caller's context has ended.
const cancelTimeout = 2 * time.Second

// maxQueuedLog bounds the log bytes held in memory while the output (a paused pager, a slow
// pipe) does not take them; the stream is given up beyond it rather than stalling the client.
const maxQueuedLog = 8 << 20

// Logs asks node for a container's log and copies it to w until the node's last chunk (EOF).
// req names the pod, container, Follow, Tail and Previous; its ID is made up when empty and its Op
// is set to open. The reply topic is subscribed to before the request is published, so no chunk
// can be missed; chunks are written in Seq order, and a missing Seq is an error (the rest of the
// stream would be garbled). The node must answer within Options.Timeout, and without Follow every
// further chunk must come within it too. A followed stream is renewed every RenewInterval and
// cancelled when ctx ends; Logs then returns ctx's error.
func (c *Client) Logs(ctx context.Context, node string, req protocol.LogsRequest, w io.Writer) error {
	if err := protocol.ValidateNodeName(node); err != nil {
		return err
	}
	if req.ID == "" {
		req.ID = "ctl-" + randomHex(8)
	}
	req.APIVersion, req.Op = protocol.APIVersion, protocol.LogsOpen
	if req.Namespace == "" {
		req.Namespace = "default"
	}
	what := fmt.Sprintf("logs of pod %s/%s on node %s", req.Namespace, req.Pod, node)
	c.signLogs(node, &req)
	open, err := protocol.Encode(&req)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	// The node decodes with the same function: a request it would refuse is refused here, with
	// the same words, without a round trip.
	if _, err := protocol.DecodeLogsRequest(open, protocol.DefaultMaxPayload); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}

	// The handler must never block: paho runs it on the goroutine that also reads PUBACKs and
	// PINGRESPs, so a slow writer would stall our own renew and cancel publishes. Chunks queue in
	// memory instead, bounded by maxQueuedLog bytes; past that the stream is given up.
	var (
		qmu     sync.Mutex
		queue   []mqtt.Message
		queued  int
		overrun bool
	)
	ready := make(chan struct{}, 1)
	reply := c.topics.LogsReply(node, req.ID)
	handle := func(_ mqtt.Client, m mqtt.Message) {
		qmu.Lock()
		if queued+len(m.Payload()) > maxQueuedLog {
			overrun = true
		} else {
			queue = append(queue, m)
			queued += len(m.Payload())
		}
		qmu.Unlock()
		select {
		case ready <- struct{}{}:
		default:
		}
	}
	// take returns the queued chunks, or an error once the writer fell too far behind.
	take := func() ([]mqtt.Message, bool) {
		qmu.Lock()
		defer qmu.Unlock()
		out := queue
		queue, queued = nil, 0
		return out, overrun
	}
	if err := c.wait(ctx, c.mc.Subscribe(reply, qos, handle), what+": subscribe to "+reply); err != nil {
		return err
	}
	defer func() {
		c.wait(context.WithoutCancel(ctx), c.mc.Unsubscribe(reply), "unsubscribe")
	}()
	reqTopic := c.topics.LogsRequest(node)
	if err := c.publish(ctx, reqTopic, open, false); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	// control publishes renew or cancel for the stream.
	control := func(ctx context.Context, op string) error {
		m := protocol.LogsRequest{APIVersion: protocol.APIVersion, ID: req.ID, Op: op}
		c.signLogs(node, &m)
		payload, err := protocol.Encode(&m)
		if err != nil {
			return err
		}
		return c.publish(ctx, reqTopic, payload, false)
	}
	cancelStream := func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelTimeout)
		defer cancel()
		control(ctx, protocol.LogsCancel) // best effort: the node's renew timeout is the backstop
	}

	var renew <-chan time.Time
	if req.Follow {
		t := time.NewTicker(RenewInterval)
		defer t.Stop()
		renew = t.C
	}
	idle := time.NewTimer(c.o.Timeout)
	defer idle.Stop()
	next := int64(0)
	for {
		select {
		case <-ctx.Done():
			cancelStream()
			return ctx.Err()
		case <-c.lost:
			return fmt.Errorf("%s: %w", what, c.lostErr)
		case <-idle.C:
			cancelStream()
			if next == 0 {
				return fmt.Errorf("%s: no answer within %s (is the node online?)", what, c.o.Timeout)
			}
			return fmt.Errorf("%s: no chunk after #%d within %s", what, next-1, c.o.Timeout)
		case <-renew:
			if err := control(ctx, protocol.LogsRenew); err != nil {
				return fmt.Errorf("%s: renew: %w", what, err)
			}
		case <-ready:
			ms, over := take()
			if over {
				cancelStream()
				return fmt.Errorf("%s: the output is not keeping up: more than %d bytes of log queued", what, maxQueuedLog)
			}
			for _, m := range ms {
				ch, err := protocol.DecodeLogsChunk(m.Payload(), protocol.DefaultMaxPayload)
				if err != nil {
					cancelStream()
					return fmt.Errorf("%s: %w", what, err)
				}
				switch {
				case ch.ID != req.ID:
					cancelStream()
					return fmt.Errorf("%s: a chunk on %s is for request %q", what, reply, ch.ID)
				case ch.Seq < next:
					continue // a QoS 1 duplicate
				case ch.Seq > next:
					cancelStream()
					return fmt.Errorf("%s: chunk #%d is missing (the next to arrive was #%d): the log would have a hole", what, next, ch.Seq)
				}
				next++
				if len(ch.Data) > 0 {
					if _, err := w.Write(ch.Data); err != nil {
						cancelStream()
						return fmt.Errorf("%s: write: %w", what, err)
					}
				}
				if ch.EOF {
					if ch.Error != "" {
						return fmt.Errorf("%s: the node says: %s", what, ch.Error)
					}
					return nil
				}
				if !req.Follow {
					idle.Reset(c.o.Timeout)
				} else {
					idle.Stop() // the node answered; a followed log may then be silent for as long as it likes
				}
			}
		}
	}
}

// logsRequestLife is how long a signed logs request stays valid: long enough for a slow link,
// short enough that a captured one is soon useless (the node also opens an ID once).
const logsRequestLife = 2 * time.Minute

// signLogs signs a logs request for node with the client's signing key, if it has one: a node with
// trust anchors serves only signed requests.
func (c *Client) signLogs(node string, r *protocol.LogsRequest) {
	if c.o.SigningKey == nil {
		return
	}
	// Whole seconds in UTC: the node re-encodes the decoded request to check the signature.
	r.Expires = time.Now().UTC().Add(logsRequestLife).Truncate(time.Second)
	protocol.SignLogsRequest(node, r, c.o.SigningKey)
}
