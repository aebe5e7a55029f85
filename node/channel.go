package node

import (
	"fmt"
	"log/slog"

	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/link"
	"github.com/mqlet/mqlet/sync/logserve"
	"github.com/mqlet/mqlet/sync/nodesync"
	"github.com/mqlet/mqlet/sync/protocol"
)

// channelOptions are the MQTT channel's options from the validated config; logs finds containers'
// logs for `mqlet ctl logs` (the agent's, through the view; a simulated node's own way).
func channelOptions(cfg config.Config, db store.State, log *slog.Logger, logs logserve.LogFinder, version string) (nodesync.Options, error) {
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
