package ctlclient

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Snapshot returns the retained messages matching filters, by topic.
//
// MQTT has no "end of retained messages": Snapshot subscribes to filters, then to the client's
// marker topic (<prefix>/ctl/<identity>/marker), and publishes a fresh random value there, not
// retained. The broker sends, in order on this connection, every retained message matching the
// earlier subscriptions before the marker, so the marker's arrival means the broker sent all it
// was going to; Options.Timeout is only a safety net, and reaching it is an error, never a
// partial result.
//
// A message published live to a matching topic while the snapshot is taken updates the topic's
// entry (an empty one removes it), since it is also the broker's new retained message there; live
// messages to topics that hold no retained message are left out.
//
// The broker must be able to queue the whole answer for this client: mosquitto drops what is
// over max_inflight_messages + max_queued_messages without telling anyone, and the marker still
// comes back, so a snapshot larger than that is silently partial. Readers that can tell how much
// to expect check it (Pods and Nodes cross-check each node's status summary); the broker settings are
// sized in configs/mosquitto/mosquitto.conf.
func (c *Client) Snapshot(ctx context.Context, filters ...string) (map[string][]byte, error) {
	if len(filters) == 0 {
		return nil, errors.New("snapshot: no topic filter")
	}
	return c.snapshot(ctx, filters)
}

// snapshot is Snapshot with the filters in groups, each group one SUBSCRIBE, sent in order. The
// broker queues a SUBSCRIBE's retained messages when it handles it, and it handles one
// connection's packets in order, so an earlier group's messages are queued before a later
// group's: a small group put first (one summary per node) is not what the broker drops when a
// large one after it overflows the client's queue.
func (c *Client) snapshot(ctx context.Context, groups ...[]string) (map[string][]byte, error) {
	var filters []string
	for _, g := range groups {
		filters = append(filters, g...)
	}
	what := "snapshot of " + strings.Join(filters, ", ")
	if len(filters) == 0 {
		return nil, errors.New("snapshot: no topic filter")
	}
	c.snapMu.Lock()
	defer c.snapMu.Unlock()

	c.mu.Lock()
	c.markerN++
	nonce := fmt.Sprintf("%d-%s", c.markerN, randomHex(4))
	c.mu.Unlock()

	var (
		mu      sync.Mutex
		got     = map[string][]byte{}
		arrived = make(chan struct{})
		once    sync.Once
		done    bool // set once got is handed to the caller: a late message must not touch it
	)
	// Called by paho in arrival order (OrderMatters), one message at a time; it must not block.
	handle := func(_ mqtt.Client, m mqtt.Message) {
		if m.Topic() == c.marker {
			if string(m.Payload()) == nonce {
				once.Do(func() { close(arrived) })
			}
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		switch _, known := got[m.Topic()]; {
		case m.Retained() && len(m.Payload()) > 0:
			got[m.Topic()] = m.Payload()
		case !m.Retained() && len(m.Payload()) == 0:
			delete(got, m.Topic())
		case !m.Retained() && known:
			got[m.Topic()] = m.Payload()
		}
	}

	// Unsubscribe whatever happens, so that the next snapshot's subscribe delivers the retained
	// messages afresh and nothing live keeps arriving; bounded, and its failure changes nothing
	// already read.
	defer func() {
		all := append(append([]string(nil), filters...), c.marker)
		c.wait(context.WithoutCancel(ctx), c.mc.Unsubscribe(all...), "unsubscribe")
	}()
	// Every SUBSCRIBE is sent before any SUBACK is awaited (paho sends in call order), so the
	// groups are read as close together in time as the broker allows.
	toks := make([]mqtt.Token, 0, len(groups))
	for _, g := range groups {
		if len(g) == 0 {
			continue
		}
		subs := make(map[string]byte, len(g))
		for _, f := range g {
			subs[f] = qos
		}
		toks = append(toks, c.mc.SubscribeMultiple(subs, handle))
	}
	for _, tok := range toks {
		if err := c.wait(ctx, tok, what+": subscribe"); err != nil {
			return nil, err
		}
	}
	if err := c.wait(ctx, c.mc.Subscribe(c.marker, qos, handle), what+": subscribe to the marker topic"); err != nil {
		return nil, err
	}
	if err := c.publish(ctx, c.marker, []byte(nonce), false); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}

	tctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	defer cancel()
	select {
	case <-arrived:
	case <-c.lost:
		return nil, fmt.Errorf("%s: %w", what, c.lostErr)
	case <-tctx.Done():
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %w", what, ctx.Err())
		}
		return nil, fmt.Errorf("%s: the marker message on %s did not come back within %s (may this client read and write %s?)",
			what, c.marker, c.o.Timeout, c.marker)
	}
	mu.Lock()
	defer mu.Unlock()
	done = true
	return got, nil
}
