package main

import (
	"context"
	"crypto/ed25519"

	"github.com/mqlet/mqlet/bridge"
	"github.com/mqlet/mqlet/bridge/mq"
	"github.com/mqlet/mqlet/bridge/pods"
	"github.com/mqlet/mqlet/sync/sealing"
)

// podsPart builds the pods part of the bridge (bridge/pods): desired pods, configMaps and secrets
// per node, pod status and events; indexes signed with key when it is set, Secrets sealed only to
// keys nodes vouches for when it is set.
func podsPart(key ed25519.PrivateKey, nodes *sealing.NodeTrust) func(d bridge.Deps) (*bridge.Part, error) {
	return func(d bridge.Deps) (*bridge.Part, error) { return buildPods(d, key, nodes) }
}

func buildPods(d bridge.Deps, key ed25519.PrivateKey, nodes *sealing.NodeTrust) (*bridge.Part, error) {
	c, err := pods.New(pods.Options{
		Kube:       d.Kube,
		Factory:    d.Informers,
		Broker:     d.Conn,
		Topics:     d.Topics,
		Served:     d.Nodes.Served,
		Metrics:    d.Metrics,
		Log:        d.Log,
		SigningKey: key,
		NodeTrust:  nodes,
	})
	if err != nil {
		return nil, err
	}
	run := func(ctx context.Context) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		// Every node's first sync reads the broker's retained state: started before the
		// connection is up, each would fail and wait out a back-off.
		first, lost, err := d.Conn.WaitConnected(ctx)
		if err != nil {
			return nil // stopped before the broker answered
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			watchReconnects(ctx, d.Conn, first, lost, c.Reconnected)
		}()
		err = c.Run(ctx)
		cancel()
		<-done
		return err
	}
	return &bridge.Part{PodHandler: c.Handle, OnServed: c.NodeServed, Run: run}, nil
}

// watchReconnects calls reconnected after every new broker connection but the first: the retained
// state may have changed while the bridge was away (a broker restart without persistence, another
// writer), so the pods part reads it again before its next write. The connection's session number
// tells one connection from the next.
func watchReconnects(ctx context.Context, conn *mq.Conn, last int64, lost <-chan struct{}, reconnected func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-lost:
		}
		s, l, err := conn.WaitConnected(ctx)
		if err != nil {
			return
		}
		lost = l
		if s != last {
			reconnected()
			last = s
		}
	}
}
