package main

import (
	"context"
	"time"

	"github.com/mqlet/mqlet/bridge"
	"github.com/mqlet/mqlet/bridge/pods"
)

// podsPart builds the pods part of the bridge (bridge/pods): desired pods, configMaps and secrets
// per node, pod status and events.
func podsPart(d bridge.Deps) (*bridge.Part, error) {
	c, err := pods.New(pods.Options{
		Kube:    d.Kube,
		Factory: d.Informers,
		Broker:  d.Conn,
		Topics:  d.Topics,
		Served:  d.Nodes.Served,
		Metrics: d.Metrics,
		Log:     d.Log,
	})
	if err != nil {
		return nil, err
	}
	run := func(ctx context.Context) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		// Every node's first sync reads the broker's retained state: started before the
		// connection is up, each would fail and wait out a back-off.
		first, ok := waitConnected(ctx, d)
		if !ok {
			return nil // stopped before the broker answered
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			watchReconnects(ctx, d, first, c.Reconnected)
		}()
		err := c.Run(ctx)
		cancel()
		<-done
		return err
	}
	return &bridge.Part{PodHandler: c.Handle, OnServed: c.NodeServed, Run: run}, nil
}

// watchReconnects calls reconnected after every new broker connection but the first: the retained
// state may have changed while the bridge was away (a broker restart without persistence, another
// writer), so the pods part reads it again before its next write. The connection's session number
// tells one connection from the next; a second's delay is harmless because every write of the pods
// part goes through the node's counter, which only moves up.
func watchReconnects(ctx context.Context, d bridge.Deps, last int64, reconnected func()) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s, ok := d.Conn.Connected()
		if !ok || s == last {
			continue
		}
		reconnected()
		last = s
	}
}

// waitConnected waits for the bridge's first broker connection and returns its session; ok is
// false when ctx ended first.
func waitConnected(ctx context.Context, d bridge.Deps) (int64, bool) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if s, ok := d.Conn.Connected(); ok {
			return s, true
		}
		select {
		case <-ctx.Done():
			return 0, false
		case <-t.C:
		}
	}
}
