package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/ctlclient"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// applyObjects publishes ConfigMaps and Secrets at the next revision, then the index.
func (cp *controlPlane) applyObjects(objs ...any) {
	cp.t.Helper()
	cp.rev++
	for _, o := range objs {
		d, err := protocol.NewDesired(e2eNode, cp.rev, o)
		if err != nil {
			cp.t.Fatal(err)
		}
		payload := cp.encode(d)
		cp.raw(topics.Desired(e2eNode, d.Kind, d.Namespace, d.Name), payload, true)
		cp.objects[d.Key()] = protocol.IndexEntry{Generation: cp.rev, Digest: protocol.Digest(payload)}
	}
	cp.publishIndex()
}

// ConfigMaps and Secrets from the control plane reach pods as the manifest dir's do: env, a volume
// updated in place when the ConfigMap changes over MQTT; the Secret's value is nowhere in the state
// dir (store, outbox) or the log; a manifest-dir ConfigMap of the same name is refused.
func TestMQTTObjectsReachPodsAndSecretsStaySealed(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	h.unmountObjectVolumesAtCleanup()
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	cp := newControlPlane(t, b.Plain)
	h.startMQTTAgent(b.Plain)

	value := fmt.Sprintf("Mqtt-S3cret-%d", time.Now().UnixNano())
	cm := func(v string) *v1.ConfigMap {
		return &v1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "mq-cm"}, Data: map[string]string{"greeting": v}}
	}
	cp.applyObjects(cm("v1"), &v1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "mq-secret"}, Data: map[string][]byte{"pw": []byte(value)}})
	cp.applyYAML(`apiVersion: v1
kind: Pod
metadata: {name: mqobj}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "[ \"$PW\" = \"$(cat /etc/s/pw)\" ] && echo match; while true; do echo \"now=$(cat /etc/cfg/greeting)\"; sleep 0.2; done"]
    env: [{name: PW, valueFrom: {secretKeyRef: {name: mq-secret, key: pw}}}]
    volumeMounts: [{name: cfg, mountPath: /etc/cfg}, {name: s, mountPath: /etc/s}]
  volumes:
  - {name: cfg, configMap: {name: mq-cm}}
  - {name: s, secret: {secretName: mq-secret}}
`)
	p := h.waitPod("mqobj", "running", allRunning)
	h.waitContainerLog("mqobj", "c", "match")
	h.waitContainerLog("mqobj", "c", "now=v1")
	id := containerStatus(p, "c").ContainerID

	cp.applyObjects(cm("v2"))
	h.waitContainerLog("mqobj", "c", "now=v2")
	if p, _ = h.getPod("mqobj"); containerStatus(p, "c").ContainerID != id {
		t.Errorf("the container was replaced for a ConfigMap change")
	}

	h.writeManifest("clash.yaml", configMapYAML("mq-cm", map[string]string{"greeting": "from-file"}))
	h.waitLog("the manifest ConfigMap refused", `msg="manifest object refused"`, "ConfigMap default/mq-cm is already defined by mqtt")

	h.stopAgent() // the outbox and store are complete on disk now
	db, err := store.Open(filepath.Join(h.state, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	r, found, err := db.GetObject(store.KindConfigMap, "default", "mq-cm")
	db.Close()
	if err != nil || !found || r.Source.Kind != "mqtt" || r.ConfigMap.Data["greeting"] != "v2" {
		t.Errorf("stored ConfigMap mq-cm: %+v found=%v err=%v; want the control plane's v2", r.Source, found, err)
	}
	err = filepath.Walk(h.state, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.IsDir() {
			if path != h.state && isTmpfs(path) {
				return filepath.SkipDir
			}
			return nil
		}
		if !info.Mode().IsRegular() || isNsfs(path) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err == nil && strings.Contains(string(b), value) {
			t.Errorf("the secret's value is in clear in %s", path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(h.agentLog.String(), value) {
		t.Errorf("the secret's value is in the agent's log")
	}
}

// A Secret applied with mqlet ctl crosses the broker only sealed to the node's key. Over the TLS
// listener with the ACL (the node and ctl each with their own certificate), the broker's admin
// identity subscribed to the whole tree sees neither the value nor its base64 in any message,
// retained or live, while the pod on the node gets it. ctl verifies the node's sealing key
// against the fleet's CA, so a broker could not have substituted its own.
func TestMQTTSecretsCrossTheBrokerSealed(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	h.unmountObjectVolumesAtCleanup()
	b := mqtttest.Start(t, mqtttest.Options{Identities: []string{e2eNode}})
	var mu sync.Mutex
	var seen [][]byte
	admin := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(b.TLS).SetClientID("admin-watcher").
		SetTLSConfig(b.TLSConfig(mqtttest.Admin)).SetAutoReconnect(false))
	if tok := admin.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect as admin: %v", tok.Error())
	}
	defer admin.Disconnect(100)
	if tok := admin.Subscribe(topics.Prefix()+"/#", 1, func(_ mqtt.Client, m mqtt.Message) {
		mu.Lock()
		seen = append(seen, append([]byte(m.Topic()+" "), m.Payload()...))
		mu.Unlock()
	}); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe to the tree: %v", tok.Error())
	}
	nodeCert, nodeKey := b.ClientCert(e2eNode)
	h.startMQTTAgent(b.TLS, "--mqtt-ca-file", b.CAFile, "--mqtt-cert-file", nodeCert, "--mqtt-key-file", nodeKey)
	// The node publishes its sealing key in its status; ctl refuses to send a Secret before.
	waitRetained(t, b.Plain, topics.NodeStatus(e2eNode), "the node's sealing key", func(p []byte) bool {
		s, err := protocol.DecodeNodeStatus(p, 0)
		return err == nil && s.Object != nil && s.Object.Annotations[sealing.AnnotationKey] != ""
	})

	value := fmt.Sprintf("Sealed-S3cret-%d", time.Now().UnixNano())
	secret := &v1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sealed"}, StringData: map[string]string{"pw": value}}
	pod := mustPod(t, `apiVersion: v1
kind: Pod
metadata: {name: usesecret}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "printf %s \"$PW\" | sha256sum; sleep 3600"]
    env: [{name: PW, valueFrom: {secretKeyRef: {name: sealed, key: pw}}}]
`)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// ctl seals only to a key the node's certificate vouches for (the fleet's CA as node CA), so
	// this also shows the agent attests its sealing key with its MQTT certificate.
	ctlCert, ctlKey := b.ClientCert(mqtttest.Admin)
	// The default of ctl with a client certificate: the CA in its CA file that issued its own.
	nodes, err := sealing.LoadNodeTrust("", "", b.CAFile, ctlCert)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ctlclient.Connect(ctx, ctlclient.Options{Broker: b.TLS, CAFile: b.CAFile, CertFile: ctlCert, KeyFile: ctlKey, Timeout: 10 * time.Second, NodeTrust: nodes})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Apply(ctx, e2eNode, []any{secret, pod})
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	for _, w := range res.Warnings {
		if strings.Contains(w, "sealing key") {
			t.Errorf("apply warned about the sealing key: %s", w)
		}
	}
	h.waitPod("usesecret", "running", allRunning)
	// The container proves it got the value without the value (or its base64) being in its spec
	// or status, which cross the broker too.
	sum := sha256.Sum256([]byte(value))
	h.waitContainerLog("usesecret", "c", hex.EncodeToString(sum[:]))

	clear, encoded := []byte(value), []byte(base64.StdEncoding.EncodeToString([]byte(value)))
	mu.Lock()
	defer mu.Unlock()
	sealedSeen := false
	for _, m := range seen {
		if bytes.Contains(m, clear) || bytes.Contains(m, encoded) {
			t.Errorf("the secret's value crossed the broker readable: %.200s", m)
		}
		sealedSeen = sealedSeen || bytes.HasPrefix(m, []byte(topics.Desired(e2eNode, protocol.KindSecret, "default", "sealed")+" "))
	}
	if !sealedSeen {
		t.Error("the admin subscriber never saw the secret's desired message: the test proves nothing")
	}
}
