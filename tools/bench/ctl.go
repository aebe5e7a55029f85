package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/mqlet/mqlet/sync/ctlclient"
	"github.com/mqlet/mqlet/sync/protocol"
)

// Protocol v2 (sync/protocol): a node refuses an index whose revision is below the one it holds, so
// a control plane that starts on a fresh broker (every MQTT step of the harness starts its own,
// while the agent's state keeps what earlier steps' control planes wrote) must first learn where the
// node stands. The node's retained acks say it (the revision of the index it runs and every entry's
// generation and digest), and the node publishes them on connecting to a broker that lacks them.
// ctlclient builds on them when the broker holds no index, but only once they are on the broker:
// an apply that reads the broker before they arrive finds neither index nor acks and starts the
// node's counter again at 1, an index the node refuses as stale. So every harness write waits for
// the node's acks first (waitNodeAcks).

// ctlConnect connects the real control-plane writer to br's harness listener (not counted).
func (b *bench) ctlConnect(ctx context.Context, br *broker, role string) (*ctlclient.Client, error) {
	cl, err := ctlclient.Connect(ctx, ctlclient.Options{Broker: br.harnessURL(), ClientID: "bench-" + role, Timeout: b.cfg.step / 2})
	if err != nil {
		return nil, fmt.Errorf("connect the %s control plane: %w", role, err)
	}
	return cl, nil
}

// waitNodeAcks waits (bounded) until br holds node's retained acks and returns them. The downlink
// acks at every start (an empty set before its first index), and the uplink publishes them on a
// connection to a broker that lacks them, so they always come.
func (b *bench) waitNodeAcks(ctx context.Context, cl *ctlclient.Client, node string) (*protocol.Acks, error) {
	wctx, cancel := b.stepCtx(ctx)
	defer cancel()
	a, err := cl.WatchAcks(wctx, node, func(*protocol.Acks) bool { return true })
	if err != nil {
		return nil, errors.Join(fmt.Errorf("the node's retained acks did not reach the broker within %v: %w", b.cfg.step, err), b.agentAlive())
	}
	return a, nil
}

// newControlPlane connects the bare writer of the apply figure to br and starts it where the node
// stands: above the revision of the broker's index and of everything the node's acks mention,
// building on the broker's index, or on the node's acks when the broker's index is older than
// the one the node runs (or missing), as ctlclient does.
func (b *bench) newControlPlane(ctx context.Context, br *broker, role string) (*controlPlane, error) {
	cl, err := b.ctlConnect(ctx, br, role+"-read")
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	acks, err := b.waitNodeAcks(ctx, cl, nodeName)
	if err != nil {
		return nil, err
	}
	idx, err := cl.Index(ctx, nodeName)
	if err != nil {
		return nil, err
	}
	cp := &controlPlane{rev: max(idx.Revision, acks.Top()), objects: maps.Clone(idx.Objects)}
	if cp.objects == nil || acks.IndexRevision > idx.Revision {
		if acks.Compact {
			// Only the exceptions: rebuilding from them would drop what the node applied.
			return nil, fmt.Errorf("node %s: compact acks of index revision %d, which the broker (at %d) does not hold: cannot rebuild its desired set", nodeName, acks.IndexRevision, idx.Revision)
		}
		cp.objects = map[string]protocol.IndexEntry{}
		maps.Copy(cp.objects, acks.Missing)
		maps.Copy(cp.objects, acks.Applied)
		for k, r := range acks.Refused {
			cp.objects[k] = protocol.IndexEntry{Generation: r.Generation, Digest: r.Digest}
		}
	}
	c, err := mqttClient(br.harnessURL(), role)
	if err != nil {
		return nil, err
	}
	cp.c = c
	return cp, nil
}

// acksFollower keeps the latest retained acks of a node, from a subscription on br's harness
// listener that lasts across many waits (WatchAcks subscribes anew each time).
type acksFollower struct {
	c      mqtt.Client
	node   string
	notify chan struct{}

	mu      sync.Mutex
	latest  []byte
	largest int // the largest acks payload seen
}

func followAcks(br *broker, role, node string) (*acksFollower, error) {
	c, err := orderedClient(br.harnessURL(), role)
	if err != nil {
		return nil, err
	}
	f := &acksFollower{c: c, node: node, notify: make(chan struct{}, 1)}
	tok := c.Subscribe(mqttTopics.Acks(node), 1, func(_ mqtt.Client, m mqtt.Message) {
		if len(m.Payload()) == 0 {
			return
		}
		f.mu.Lock()
		f.latest = m.Payload()
		f.largest = max(f.largest, len(m.Payload()))
		f.mu.Unlock()
		select {
		case f.notify <- struct{}{}:
		default:
		}
	})
	if err := waitTok(tok, "subscribe "+mqttTopics.Acks(node)); err != nil {
		c.Disconnect(100)
		return nil, err
	}
	return f, nil
}

func (f *acksFollower) close() { f.c.Disconnect(100) }

// wait waits (bounded by the step timeout) until the node's latest acks satisfy ok, and returns
// them with their payload.
func (f *acksFollower) wait(ctx context.Context, b *bench, what string, ok func(*protocol.Acks) bool) (*protocol.Acks, []byte, error) {
	ctx, cancel := b.stepCtx(ctx)
	defer cancel()
	var last *protocol.Acks
	for {
		f.mu.Lock()
		p := f.latest
		f.mu.Unlock()
		if p != nil {
			a, err := protocol.DecodeAcks(p, protocol.DefaultMaxPayload)
			if err == nil && a.Node == f.node {
				last = a
				if ok(a) {
					return a, p, nil
				}
			}
		}
		select {
		case <-f.notify:
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("the node's acks: %s not within %v (last acks: %+v)", what, b.cfg.step, last)
		}
	}
}

// orderedClient is mqttClient with paho's in-order delivery: the harness's other readers let paho
// run each handler in a goroutine of its own, so two publishes of one topic can reach them in either
// order, and a reader keeping "the latest" acks could keep an older one.
func orderedClient(url, role string) (mqtt.Client, error) {
	id := make([]byte, 4)
	rand.Read(id)
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(url).SetClientID("bench-" + role + "-" + hex.EncodeToString(id)).
		SetProtocolVersion(4).SetCleanSession(true).SetAutoReconnect(false).SetConnectTimeout(5 * time.Second).SetOrderMatters(true))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return nil, fmt.Errorf("connect the bench's %s client to %s: %v", role, url, tok.Error())
	}
	return c, nil
}
