package e2e

import (
	"context"
	"crypto/ed25519"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/sync/ctlclient"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/signing"
	v1 "k8s.io/api/core/v1"
)

// The orders that hurt the MQTT channel, with the real agent on the test containerd, a real
// mosquitto and `sync/ctlclient` as the control plane (what `mqlet ctl` runs).

func dialCtl(t *testing.T, broker string) *ctlclient.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := ctlclient.Connect(ctx, ctlclient.Options{Broker: broker, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("connect %s: %v", broker, err)
	}
	t.Cleanup(c.Close)
	return c
}

func ctlApply(t *testing.T, c *ctlclient.Client, docs ...string) *ctlclient.ApplyResult {
	t.Helper()
	var objs []any
	for _, d := range docs {
		objs = append(objs, mustPod(t, d))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := c.Apply(ctx, e2eNode, objs)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	return res
}

// waitAcksE2E waits until the node's retained acks satisfy ok.
func waitAcksE2E(t *testing.T, broker, what string, ok func(a *protocol.Acks, applied map[string]protocol.IndexEntry) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := ctlclient.Connect(ctx, ctlclient.Options{Broker: broker, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("connect %s: %v", broker, err)
	}
	defer c.Close()
	var last *protocol.Acks
	for ctx.Err() == nil {
		// Compact acks name the index they answer: what was applied is read against the
		// broker's index (complete acks list it themselves).
		a, err := c.Acks(ctx, e2eNode)
		idx, err2 := c.Index(ctx, e2eNode)
		if err == nil && err2 == nil && a != nil {
			last = a
			applied, _ := a.AppliedIn(idx)
			if ok(a, applied) {
				return
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(300 * time.Millisecond):
		}
	}
	t.Fatalf("%s: the node's acks never matched within 60s; last: %+v", what, last)
}

// The reproduction, end to end: pods a, b and c run; the broker is killed -9 and comes back
// without its state (its save file gone, as after a crash inside the autosave window); `ctl get`
// would show nothing, and one more apply used to make the node delete a, b and c. Now the writer
// rebuilds the index from what the node reports, and nothing running is touched.
func TestChannelBrokerLostItsStateThenAnApplyKeepsEveryPod(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	h.startMQTTAgent(b.Plain)
	c := dialCtl(t, b.Plain)
	ctlApply(t, c, sleeper("a", "3600"), sleeper("b", "3600"), sleeper("c", "3600"))
	for _, n := range []string{"a", "b", "c"} {
		h.waitPod(n, n+" running", allRunning)
	}
	before := h.tasks()

	b.Kill(t)
	if err := os.Remove(filepath.Join(b.Dir, "mosquitto.db")); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	b.Start(t)
	// The node reconnects, finds its status summary gone, and reports again what it runs.
	waitAcksE2E(t, b.Plain, "the node reports its pods to the empty broker", func(a *protocol.Acks, applied map[string]protocol.IndexEntry) bool { return len(applied) == 3 })

	c = dialCtl(t, b.Plain)
	res := ctlApply(t, c, sleeper("d", "3600"))
	if len(res.Warnings) == 0 || !strings.Contains(res.Warnings[0], "rebuilt from what the node reports") {
		t.Errorf("apply warnings %q, want one saying the index was rebuilt from the node", res.Warnings)
	}
	h.waitPod("d", "d running", allRunning)
	waitAcksE2E(t, b.Plain, "all four applied", func(a *protocol.Acks, applied map[string]protocol.IndexEntry) bool {
		return len(applied) == 4 && len(a.Missing) == 0
	})
	after := h.tasks()
	for id, pid := range before {
		if after[id] != pid {
			t.Errorf("task %s changed from pid %d to %d: a pod was restarted or deleted", id, pid, after[id])
		}
	}
	if strings.Contains(h.agentLog.String(), "no longer lists an object") {
		t.Errorf("the node deleted something:\n%s", h.agentLog.String())
	}
}

// kill -9 of the agent between the index and an object it lists: the node stored the index, ran a,
// and died before b arrived. b is applied after the restart (it used to be taken for deleted), and
// a is not restarted.
func TestChannelKill9BetweenIndexAndObject(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	h.startMQTTAgent(b.Plain)
	raw := connectMQTT(t, b.Plain)
	encode := func(name string, gen int64) (string, []byte) {
		d, err := protocol.NewDesired(e2eNode, gen, mustPod(t, sleeper(name, "3600")))
		if err != nil {
			t.Fatal(err)
		}
		p, _ := protocol.Encode(d)
		return topics.Desired(e2eNode, protocol.KindPod, "default", name), p
	}
	ta, pa := encode("a", 1)
	tb, pb := encode("b", 1)
	idx, _ := protocol.Encode(&protocol.Index{Node: e2eNode, Revision: 1, Objects: map[string]protocol.IndexEntry{
		"pods/default/a": {Generation: 1, Digest: protocol.Digest(pa)},
		"pods/default/b": {Generation: 1, Digest: protocol.Digest(pb)},
	}})
	publishRaw := func(topic string, p []byte) {
		t.Helper()
		if tok := raw.Publish(topic, 1, true, p); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish %s: %v", topic, tok.Error())
		}
	}
	publishRaw(ta, pa)
	publishRaw(topics.Index(e2eNode), idx)
	h.waitPod("a", "a running", allRunning)
	waitAcksE2E(t, b.Plain, "b missing", func(a *protocol.Acks, applied map[string]protocol.IndexEntry) bool {
		return a.Missing["pods/default/b"].Generation == 1
	})
	before := h.tasks()
	h.kill9Agent()

	publishRaw(tb, pb) // arrives after the restart, at a generation at or below the stored revision
	h.startMQTTAgent(b.Plain)
	h.waitPod("b", "b running after the restart", allRunning)
	if p, _ := h.getPod("a"); p == nil || !allRunning(p) {
		t.Fatalf("a is not running after the restart: %+v", p)
	}
	after := h.tasks()
	for id, pid := range before {
		if after[id] != pid {
			t.Errorf("task %s changed from pid %d to %d", id, pid, after[id])
		}
	}
}

// A pod the node refuses, and an object it cannot decode (a field from a newer API), end as
// refusals at their generation in the retained acks: a reader connected later learns why, and the
// node does not ask for them again.
func TestChannelRefusalsAreInTheAcksWithoutAReader(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	h.startMQTTAgent(b.Plain)
	priv := mustPod(t, sleeper("priv", "3600"))
	yes := true
	priv.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: &yes}
	d, _ := protocol.NewDesired(e2eNode, 1, priv)
	pp, _ := protocol.Encode(d)
	newer := []byte(`{"apiVersion":"mqlet.io/v2","kind":"Pod","node":"` + e2eNode + `","namespace":"default","name":"newer","generation":1,` +
		`"object":{"metadata":{"name":"newer"},"spec":{"containers":[{"name":"c","image":"mqlet.test/busybox:1"}],"fieldFromANewerAPI":true}}}`)
	idx, _ := protocol.Encode(&protocol.Index{Node: e2eNode, Revision: 1, Objects: map[string]protocol.IndexEntry{
		"pods/default/priv":  {Generation: 1, Digest: protocol.Digest(pp)},
		"pods/default/newer": {Generation: 1, Digest: protocol.Digest(newer)},
	}})
	raw := connectMQTT(t, b.Plain)
	for _, m := range []struct {
		topic string
		p     []byte
	}{{topics.Desired(e2eNode, protocol.KindPod, "default", "priv"), pp}, {topics.Desired(e2eNode, protocol.KindPod, "default", "newer"), newer}, {topics.Index(e2eNode), idx}} {
		if tok := raw.Publish(m.topic, 1, true, m.p); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish %s: %v", m.topic, tok.Error())
		}
	}
	raw.Disconnect(100) // no reader is connected while the node judges
	waitAcksE2E(t, b.Plain, "both refused at generation 1", func(a *protocol.Acks, applied map[string]protocol.IndexEntry) bool {
		return len(applied) == 0 && len(a.Missing) == 0 &&
			a.Refused["pods/default/priv"].Generation == 1 && strings.Contains(a.Refused["pods/default/priv"].Reason, "privileged") &&
			a.Refused["pods/default/newer"].Generation == 1 && strings.Contains(a.Refused["pods/default/newer"].Reason, "fieldFromANewerAPI")
	})
	if _, err := h.getPod("priv"); err == nil {
		t.Errorf("the refused pod runs")
	}
}

// Signed desired state end to end: a node with a trust anchor refuses a pod the broker's admin
// publishes (unsigned index), runs what a signing ctl applies, refuses a replayed older signed
// index, and goes through a key rotation (add the new anchor, switch the writer, remove the old)
// without restarting a pod.
func TestChannelSignedDesiredStateAndKeyRotation(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	// The node and the control plane reach the broker over its TLS listener with the ACL, each
	// with its own certificate; the forger is the broker's admin identity.
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true, Identities: []string{e2eNode}})
	nodeCert, nodeKey := b.ClientCert(e2eNode)
	overTLS := []string{"--mqtt-ca-file", b.CAFile, "--mqtt-cert-file", nodeCert, "--mqtt-key-file", nodeKey}
	adminCert, adminKey := b.ClientCert(mqtttest.Admin)
	keys := t.TempDir()
	pub1, err := signing.GenerateKeyPair(filepath.Join(keys, "k1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := signing.GenerateKeyPair(filepath.Join(keys, "k2")); err != nil {
		t.Fatal(err)
	}
	k1, _ := signing.LoadPrivateKey(filepath.Join(keys, "k1.key"))
	k2, _ := signing.LoadPrivateKey(filepath.Join(keys, "k2.key"))
	h.startMQTTAgent(b.TLS, append(slices.Clone(overTLS), "--mqtt-trusted-key", filepath.Join(keys, "k1.pub"))...)

	// The broker's admin forges a pod and an index listing it, with mosquitto_pub over TLS.
	d, _ := protocol.NewDesired(e2eNode, 1, mustPod(t, sleeper("evil", "3600")))
	evil, _ := protocol.Encode(d)
	forged, _ := protocol.Encode(&protocol.Index{Node: e2eNode, Revision: 1, Objects: map[string]protocol.IndexEntry{
		"pods/default/evil": {Generation: 1, Digest: protocol.Digest(evil)}}})
	tlsPort := b.TLS[strings.LastIndex(b.TLS, ":")+1:]
	for _, m := range []struct {
		topic string
		p     []byte
	}{{topics.Desired(e2eNode, protocol.KindPod, "default", "evil"), evil}, {topics.Index(e2eNode), forged}} {
		f := filepath.Join(t.TempDir(), "payload")
		if err := os.WriteFile(f, m.p, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("mosquitto_pub", "-h", "localhost", "-p", tlsPort, "--cafile", b.CAFile, "--cert", adminCert, "--key", adminKey,
			"-q", "1", "-r", "-t", m.topic, "-f", f)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("mosquitto_pub %s as the broker's admin: %v\n%s", m.topic, err, out)
		}
	}
	raw := connectMQTT(t, b.Plain)
	waitAcksE2E(t, b.Plain, "the forged index refused", func(a *protocol.Acks, applied map[string]protocol.IndexEntry) bool {
		return a.IndexRefused != nil && strings.Contains(a.IndexRefused.Reason, "not signed") && len(applied) == 0
	})

	connect := func(key ed25519.PrivateKey, trusted ...ed25519.PublicKey) *ctlclient.Client {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := ctlclient.Connect(ctx, ctlclient.Options{Broker: b.TLS, CAFile: b.CAFile, CertFile: adminCert, KeyFile: adminKey,
			Timeout: 10 * time.Second, SigningKey: key, TrustedKeys: trusted})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	c1 := connect(k1)
	res := ctlApply(t, c1, sleeper("a", "3600"))
	if len(res.Warnings) == 0 || !strings.Contains(strings.Join(res.Warnings, " "), "not built on") {
		t.Errorf("warnings %q, want the forged index named as not built on", res.Warnings)
	}
	h.waitPod("a", "a running", allRunning)
	idx, _ := c1.Snapshot(context.Background(), topics.Index(e2eNode))
	oldSigned := idx[topics.Index(e2eNode)]
	ctlApply(t, c1, sleeper("b", "3600"))
	h.waitPod("b", "b running", allRunning)

	// logs/req: the signing client is served; anyone else who can publish there is refused.
	lctx, lcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer lcancel()
	var logs strings.Builder
	if err := c1.Logs(lctx, e2eNode, protocol.LogsRequest{Pod: "b"}, &logs); err != nil {
		t.Errorf("a signed logs request: %v", err)
	}
	if err := dialCtl(t, b.Plain).Logs(lctx, e2eNode, protocol.LogsRequest{Pod: "b"}, &logs); err == nil || !strings.Contains(err.Error(), "not signed") {
		t.Errorf("an unsigned logs request to a node with trust anchors: %v, want it refused as not signed", err)
	}
	if _, err := h.getPod("evil"); err == nil {
		t.Fatal("the forged pod runs")
	}

	// A replay of the older signed index changes nothing.
	if tok := raw.Publish(topics.Index(e2eNode), 1, true, oldSigned); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	waitAcksE2E(t, b.Plain, "the replay refused as stale", func(a *protocol.Acks, applied map[string]protocol.IndexEntry) bool {
		return a.IndexRefused != nil && strings.Contains(a.IndexRefused.Reason, "stale") && len(applied) == 2
	})
	before := h.tasks()

	// Rotation: the node trusts both keys, the writer switches to k2, the node drops k1.
	h.stopAgent()
	h.startMQTTAgent(b.TLS, append(slices.Clone(overTLS), "--mqtt-trusted-key", filepath.Join(keys, "k1.pub"), "--mqtt-trusted-key", filepath.Join(keys, "k2.pub"))...)
	c2 := connect(k2, pub1)
	ctlApply(t, c2, sleeper("c", "3600"))
	h.waitPod("c", "c running under the new key", allRunning)
	h.stopAgent()
	h.startMQTTAgent(b.TLS, append(slices.Clone(overTLS), "--mqtt-trusted-key", filepath.Join(keys, "k2.pub"))...)
	waitAcksE2E(t, b.Plain, "a, b and c in force under k2 alone", func(a *protocol.Acks, applied map[string]protocol.IndexEntry) bool {
		return len(applied) == 3 && a.IndexRefused == nil
	})
	after := h.tasks()
	for id, pid := range before {
		if after[id] != pid {
			t.Errorf("task %s changed from pid %d to %d across the rotation", id, pid, after[id])
		}
	}
}
