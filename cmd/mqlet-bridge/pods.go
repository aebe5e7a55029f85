package main

import (
	"context"

	"github.com/mqlet/mqlet/bridge"
	"github.com/mqlet/mqlet/bridge/mq"
	"github.com/mqlet/mqlet/bridge/pods"
)

// podsPart builds the pods part of the bridge (bridge/pods): desired pods, configMaps and secrets
// per node, pod status and events. o holds what the flags set (the signing key, the nodes' CA,
// service account tokens); the clients and the connection come from the bridge's Deps.
func podsPart(o pods.Options) func(d bridge.Deps) (*bridge.Part, error) {
	return func(d bridge.Deps) (*bridge.Part, error) { return buildPods(d, o) }
}

func buildPods(d bridge.Deps, o pods.Options) (*bridge.Part, error) {
	o.Kube, o.Factory, o.Broker, o.Topics = d.Kube, d.Informers, d.Conn, d.Topics
	o.Served, o.Metrics, o.Log = d.Nodes.Served, d.Metrics, d.Log
	c, err := pods.New(o)
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
	return &bridge.Part{PodHandler: c.Handle, OnServed: c.NodeServed, NodePods: c.NodePods, Run: run}, nil
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
