package sealing

import (
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/testpki"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func attestedNode(t *testing.T, name string, k *Key, cert tls.Certificate) *v1.Node {
	t.Helper()
	a, err := Attest(cert, name, k)
	if err != nil {
		t.Fatal(err)
	}
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
		AnnotationKey: k.Public(), AttestationKey: a}}}
}

func TestAttestedKeyVerifiesForEachKeyType(t *testing.T) {
	ca := testpki.NewCA(t)
	for _, kind := range []string{"ecdsa", "rsa", "ed25519"} {
		k, _ := Generate()
		n := attestedNode(t, "edge-1", k, ca.Issue(t, testpki.Cert{CN: "edge-1", Key: kind}))
		pub, err := Attested(n, ca.Pool, time.Now())
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if KeyID(pub) != k.ID() {
			t.Fatalf("%s: Attested returned key %s, want %s", kind, KeyID(pub), k.ID())
		}
	}
}

// Each way a broker (or anyone between the node and the writer) could hand a writer a key that is
// not the node's is refused, and the error says why.
func TestAttestedRefusesAKeyTheNodeDidNotVouchFor(t *testing.T) {
	ca, other := testpki.NewCA(t), testpki.NewCA(t)
	nodeKey, _ := Generate()
	brokerKey, _ := Generate()
	good := ca.Issue(t, testpki.Cert{CN: "edge-1"})
	valid := attestedNode(t, "edge-1", nodeKey, good)

	cases := []struct {
		name string
		node func() *v1.Node
		want string
	}{
		{"key substituted, node's attestation kept", func() *v1.Node {
			n := valid.DeepCopy()
			n.Annotations[AnnotationKey] = brokerKey.Public()
			return n
		}, "did not sign this sealing key"},
		{"no attestation", func() *v1.Node {
			n := valid.DeepCopy()
			delete(n.Annotations, AttestationKey)
			return n
		}, "no annotation " + AttestationKey},
		{"attested by a certificate of another CA", func() *v1.Node {
			return attestedNode(t, "edge-1", brokerKey, other.Issue(t, testpki.Cert{CN: "edge-1"}))
		}, "unknown authority"},
		{"attested by another identity of the fleet (a site gateway's certificate)", func() *v1.Node {
			return attestedNode(t, "edge-1", brokerKey, ca.Issue(t, testpki.Cert{CN: "site-factory1"}))
		}, `the certificate is "site-factory1"'s`},
		{"another node's attestation copied", func() *v1.Node {
			n := attestedNode(t, "edge-2", brokerKey, ca.Issue(t, testpki.Cert{CN: "edge-2"}))
			n.Name = "edge-1"
			return n
		}, `the certificate is "edge-2"'s`},
		{"a server certificate", func() *v1.Node {
			return attestedNode(t, "edge-1", brokerKey, ca.Issue(t, testpki.Cert{CN: "edge-1", Usage: x509.ExtKeyUsageServerAuth}))
		}, "incompatible key usage"},
		{"an expired certificate", func() *v1.Node {
			return attestedNode(t, "edge-1", brokerKey, ca.Issue(t, testpki.Cert{CN: "edge-1", NotAfter: time.Now().Add(-time.Minute)}))
		}, "expired"},
		{"garbled", func() *v1.Node {
			n := valid.DeepCopy()
			n.Annotations[AttestationKey] = "v1.!!"
			return n
		}, "illegal base64"},
	}
	for _, c := range cases {
		_, err := Attested(c.node(), ca.Pool, time.Now())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Attested = %v, want an error containing %q", c.name, err, c.want)
		}
	}
	if _, err := Attested(valid, ca.Pool, time.Now()); err != nil {
		t.Fatalf("the node's own attested key: %v", err)
	}
}

func FuzzAttested(f *testing.F) {
	k, _ := FromNodeKey(make([]byte, 32))
	f.Add(k.Public(), "v1.e30")
	f.Add(k.Public(), "v1.eyJjaGFpbiI6WyJBQT09Il0sInNpZyI6IkFBPT0ifQ")
	roots := x509.NewCertPool()
	f.Fuzz(func(t *testing.T, key, att string) {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1", Annotations: map[string]string{AnnotationKey: key, AttestationKey: att}}}
		if pub, err := Attested(n, roots, time.Now()); err == nil {
			t.Fatalf("an attestation verified against an empty pool: %v", pub)
		}
	})
}
