package main

import (
	"fmt"
	"log/slog"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/link"
	"github.com/mqlet/mqlet/sync/logserve"
	"github.com/mqlet/mqlet/sync/nodesync"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
)

// newChannel builds the MQTT channel from the validated config. The agent is handed over lazily
// because the agent needs the channel's source and reporter to be built first. The node status
// reaches it from the node status manager (wire_nodestatus.go), on real changes only.
func newChannel(cfg config.Config, db store.State, sealKey *sealing.Key, log *slog.Logger, agentOf func() *agent.Agent) (*nodesync.Sync, error) {
	o, err := channelOptions(cfg, db, log, lazyLogs(agentOf))
	if err != nil {
		return nil, err
	}
	o.Sealing = sealKey
	return nodesync.New(o)
}

// channelOptions are the MQTT channel's options from the validated config; the agent and the
// fleet simulator (which finds logs its own way) share them.
func channelOptions(cfg config.Config, db store.State, log *slog.Logger, logs logserve.LogFinder) (nodesync.Options, error) {
	topics, err := protocol.NewTopics(cfg.MQTTTopicPrefix)
	if err != nil {
		return nodesync.Options{}, fmt.Errorf("--mqtt-topic-prefix: %w", err)
	}
	password, err := cfg.MQTTPassword()
	if err != nil {
		return nodesync.Options{}, err
	}
	trusted, err := cfg.MQTTTrustAnchors()
	if err != nil {
		return nodesync.Options{}, err
	}
	if len(trusted) == 0 {
		log.Warn("mqtt: no trusted keys (--mqtt-trusted-key): any index published for this node is applied, so whoever can write its topics on the broker can run pods here; see docs/security.md")
	}
	return nodesync.Options{
		Node:   cfg.NodeName,
		Topics: topics,
		Link: link.Options{
			Broker: cfg.MQTTBrokerURL(), CAFile: cfg.MQTTCAFile, CertFile: cfg.MQTTCertFile, KeyFile: cfg.MQTTKeyFile,
			Username: cfg.MQTTUsername, Password: password,
			Keepalive: cfg.MQTTKeepalive.Duration, ReconnectMax: cfg.MQTTReconnectMax.Duration,
			// A packet too large for this payload limit is never read: the link drops the
			// connection at its header (docs/security.md).
			MaxPayload: int(cfg.MQTTMaxPayload),
		},
		Store:      db,
		MaxPayload: int(cfg.MQTTMaxPayload),
		Outbox:     store.OutboxLimits{MaxBytes: cfg.OutboxMaxBytes},
		Trusted:    trusted,
		Logs:       logs,
		Version:    version,
		Log:        log,
	}, nil
}

// lazyLogs finds logs through the agent once it exists (the channel is built before it).
type lazyLogs func() *agent.Agent

func (f lazyLogs) LogPath(namespace, name, container string, previous bool) (string, error) {
	a := f()
	if a == nil {
		return "", fmt.Errorf("the agent is starting")
	}
	return a.LogPath(namespace, name, container, previous)
}
