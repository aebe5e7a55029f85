package main

import "github.com/mqlet/mqlet/bridge"

// podsPart builds the pods part of the bridge (bridge/pods): desired pods, configMaps and secrets
// per node, pod status and events. nil until bridge/pods is wired in here; the lead plugs it in as
//
//	func podsPart(d bridge.Deps) (*bridge.Part, error) {
//		c, err := pods.New(pods.Options{Kube: d.Kube, Informers: d.Informers, Broker: d.Conn, Served: d.Nodes.Served, ...})
//		if err != nil {
//			return nil, err
//		}
//		return &bridge.Part{PodHandler: c.Handle, OnServed: c.NodeServed, Run: c.Run}, nil
//	}
var podsPart func(bridge.Deps) (*bridge.Part, error)
