package node

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/agent/objects"
	"github.com/mqlet/mqlet/agent/regauth"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/store/seal"
	"github.com/mqlet/mqlet/sync/sealing"
)

// nodeKey loads (or creates, 0600, at first start) the node key that seals Secrets in the state
// store. Both sources may deliver Secrets, so every node has one. A node with no broker that
// cannot make its key (a read-only /etc) still runs: only manifest-dir Secrets are refused then,
// since they are never stored in clear.
func nodeKey(cfg config.Config, log *slog.Logger) ([]byte, error) {
	key, err := seal.LoadOrCreateKey(cfg.SecretKeyFile)
	if err == nil {
		return key, nil
	}
	if cfg.MQTTBroker != "" {
		return nil, fmt.Errorf("node key (--secret-key-file): %w", err)
	}
	log.Warn("no node key: Secrets in the manifest dir will be refused (they are never stored in clear)",
		"secretKeyFile", cfg.SecretKeyFile, "err", err)
	return nil, nil
}

// nodeSealingKey is the key Secrets from the control plane are sealed to (nil without a node key:
// sealed Secrets are then refused, each with the reason).
func nodeSealingKey(nodeKey []byte) (*sealing.Key, error) {
	if nodeKey == nil {
		return nil, nil
	}
	return sealing.FromNodeKey(nodeKey)
}

// sealingAttestation vouches for the sealing key with the node's MQTT client certificate (the
// identity the broker knows it by), so that writers verifying against the fleet's CA can tell the
// node's key from one a broker put in its place (sync/sealing.Attested). It is "" without a
// client certificate; a certificate whose CN is not the node's name is reported, since verifying
// writers will refuse to seal Secrets to this node.
func sealingAttestation(cfg config.Config, k *sealing.Key, log *slog.Logger) (string, error) {
	if k == nil || cfg.MQTTCertFile == "" || cfg.MQTTKeyFile == "" {
		return "", nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.MQTTCertFile, cfg.MQTTKeyFile)
	if err != nil {
		return "", fmt.Errorf("sealing key attestation: load the MQTT client certificate %s: %w", cfg.MQTTCertFile, err)
	}
	if leaf, err := x509.ParseCertificate(cert.Certificate[0]); err == nil && leaf.Subject.CommonName != cfg.NodeName {
		log.Warn("the MQTT client certificate's CN is not the node name: control planes that verify sealing keys against the fleet's CA will not send this node Secrets",
			"certFile", cfg.MQTTCertFile, "cn", leaf.Subject.CommonName, "node", cfg.NodeName)
	}
	a, err := sealing.Attest(cert, cfg.NodeName, k)
	if err != nil {
		return "", fmt.Errorf("%s: %w", cfg.MQTTCertFile, err)
	}
	return a, nil
}

// newObjects makes the store of ConfigMaps and Secrets that pods use: the runtime reads env and
// volumes from it, the manifest dir's objects are synced into it before the pods that use them.
// The MQTT downlink writes through objs.Guard.
func newObjects(state store.State, rt *ctrd.Runtime, dir *manifest.Dir, log *slog.Logger) *objects.Store {
	objs := objects.New(state, log)
	rt.SetObjects(objs)
	dir.OnObjects(func(s manifest.Snapshot) error {
		_, err := objs.SyncFiles(manifestRecords(s.Objects), s.KeptFiles())
		return err
	})
	return objs
}

// connectObjects has every change of an object nudge the pods that use it, and refusals reported.
func connectObjects(objs *objects.Store, a *agent.Agent, events event.Sink) {
	objs.Connect(events, func(k objects.Key) { a.ObjectChanged(string(k.Kind), k.Namespace, k.Name) })
}

func manifestRecords(in []manifest.Object) []store.ObjectRecord {
	out := make([]store.ObjectRecord, 0, len(in))
	for _, o := range in {
		r := store.ObjectRecord{Source: o.Ref(), ConfigMap: o.ConfigMap, Secret: o.Secret}
		if o.Secret != nil {
			r.Kind, r.Namespace, r.Name = store.KindSecret, o.Secret.Namespace, o.Secret.Name
		} else {
			r.Kind, r.Namespace, r.Name = store.KindConfigMap, o.ConfigMap.Namespace, o.ConfigMap.Name
		}
		out = append(out, r)
	}
	return out
}

// loadRegistryAuth gives the runtime the node-wide registry credentials (registryAuthFile). A
// file that other users may read, or that is not a docker config.json, stops the agent at start
// with a message naming it: pulls would otherwise fail later, far from the cause.
func loadRegistryAuth(cfg config.Config, rt *ctrd.Runtime) error {
	if cfg.RegistryAuthFile == "" {
		return nil
	}
	k, err := regauth.LoadFile(cfg.RegistryAuthFile)
	if err != nil {
		return err
	}
	rt.SetNodeCredentials(k)
	return nil
}
