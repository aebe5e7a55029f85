package ctlclient

import (
	"crypto/tls"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The attestation binds a key to the node name in the status object, so ctl must check that
// object's name against the node it writes to (it did not at first). The broker publishes
// on edge-1's status topic an envelope for edge-1 whose object is edge-2's genuine status (edge-2's
// key, edge-2's attestation): ctl, verifying against the fleet's CA, seals edge-1's Secret to
// edge-2's key. Whoever holds edge-2 (one compromised node) and the broker reads edge-1's Secrets;
// by the same move every node's. The bridge is not affected: bridge/nodes refuses a status whose
// metadata.name is not the topic's node.
func TestSealingKeyOfAnotherNodeUnderThisNodesTopic(t *testing.T) {
	mqtttest.Require(t)
	b := mqtttest.Start(t, mqtttest.Options{Identities: []string{"edge-1", "edge-2"}})
	ctx := testCtx(t)
	c := verifyingClient(t, b)

	// edge-2's genuine status, as edge-2 publishes it with its certificate.
	edge2Key, _ := sealing.Generate()
	certFile, keyFile := b.ClientCert("edge-2")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	a, err := sealing.Attest(cert, "edge-2", edge2Key)
	if err != nil {
		t.Fatal(err)
	}
	edge2 := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-2", Annotations: map[string]string{sealing.AnnotationKey: edge2Key.Public(), sealing.AttestationKey: a}}}
	// The broker retains it under edge-1's status topic, in an envelope for edge-1.
	pub(t, rawClient(t, b.Plain), tp.NodeStatus("edge-1"), &protocol.NodeStatus{Node: "edge-1", Object: edge2}, true)

	secret := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "default"}, Data: map[string][]byte{"password": []byte("edge-1-only")}}
	if _, err := c.Apply(ctx, "edge-1", []any{secret}); err != nil {
		if !strings.Contains(err.Error(), `its object is node "edge-2"`) {
			t.Errorf("Apply = %v, want a refusal naming the other node's status", err)
		}
		if d := desired(t, dial(t, b), "edge-1"); len(d) != 0 {
			t.Errorf("desired state after a refused apply: %v", d)
		}
		return
	}
	o := desired(t, dial(t, b), "edge-1")[protocol.ObjectKey(protocol.KindSecret, "default", "db")]
	if o == nil || o.Sealed == nil {
		t.Fatalf("no sealed secret on edge-1's topic: %+v", o)
	}
	opened := o.Secret.DeepCopy()
	if err := edge2Key.Open("edge-1", opened, o.Sealed); err != nil {
		t.Fatalf("sealed, but not to edge-2's key: %v", err)
	}
	t.Errorf("broke: edge-1's Secret was sealed to edge-2's attested key, and edge-2's key opens it: %q", opened.Data["password"])
}
