package sealing

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/testpki"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// trust is a NodeTrust of roots without a CRL.
func trust(t *testing.T, roots *x509.CertPool) *NodeTrust {
	t.Helper()
	nt, err := NewNodeTrust(roots, "")
	if err != nil {
		t.Fatal(err)
	}
	return nt
}

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
		pub, err := trust(t, ca.Pool).Attested(n, time.Now())
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
		_, err := trust(t, ca.Pool).Attested(c.node(), time.Now())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Attested = %v, want an error containing %q", c.name, err, c.want)
		}
	}
	if _, err := trust(t, ca.Pool).Attested(valid, time.Now()); err != nil {
		t.Fatalf("the node's own attested key: %v", err)
	}
}

func FuzzAttested(f *testing.F) {
	k, _ := FromNodeKey(make([]byte, 32))
	f.Add(k.Public(), "v1.e30")
	f.Add(k.Public(), "v1.eyJjaGFpbiI6WyJBQT09Il0sInNpZyI6IkFBPT0ifQ")
	empty, err := NewNodeTrust(x509.NewCertPool(), "")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, key, att string) {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1", Annotations: map[string]string{AnnotationKey: key, AttestationKey: att}}}
		if pub, err := empty.Attested(n, time.Now()); err == nil {
			t.Fatalf("an attestation verified against an empty pool: %v", pub)
		}
	})
}

// With the fleet CA's CRL (the broker's crlfile), a revoked certificate vouches for nothing: the
// case of a node whose disk (node key, TLS key) was stolen, revoked and set up again, while a
// broker replays its old status. A CRL past its next update refuses every certificate, as the
// broker does; a revocation written to the file later is read without a restart; a CRL file
// without the issuer's CRL, or without any, is an error naming it.
func TestAttestedRefusesARevokedCertificate(t *testing.T) {
	ca := testpki.NewCA(t)
	oldCert := ca.Issue(t, testpki.Cert{CN: "edge-1"})
	oldKey, _ := Generate()
	replayed := attestedNode(t, "edge-1", oldKey, oldCert)
	newKey, _ := Generate()
	reinstalled := attestedNode(t, "edge-1", newKey, ca.Issue(t, testpki.Cert{CN: "edge-1", NotAfter: time.Now().Add(30 * 24 * time.Hour)}))

	crlFile := filepath.Join(t.TempDir(), "ca.crl")
	write := func(b []byte) {
		t.Helper()
		if err := os.WriteFile(crlFile, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(ca.CRL(t, time.Now().Add(24*time.Hour))) // revokes nothing yet
	nt, err := NewNodeTrust(ca.Pool, crlFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nt.Attested(replayed, time.Now()); err != nil {
		t.Fatalf("before the revocation: %v", err)
	}
	// Revoked: the file changes under a running writer (a bridge reads it again).
	write(append(ca.CRL(t, time.Now().Add(24*time.Hour), oldCert), '\n'))
	if _, err := nt.Attested(replayed, time.Now()); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("a revoked certificate's attestation = %v, want a refusal naming the revocation", err)
	}
	if _, err := nt.Attested(reinstalled, time.Now()); err != nil {
		t.Errorf("the reinstalled node's new certificate: %v", err)
	}
	// Past its next update: nobody, as on the broker.
	if _, err := nt.Attested(reinstalled, time.Now().Add(48*time.Hour)); err == nil || !strings.Contains(err.Error(), "due for renewal") {
		t.Errorf("with a CRL past its next update = %v, want a refusal", err)
	}
	// Another CA's CRL says nothing about this CA's certificates.
	write(testpki.NewCA(t).CRL(t, time.Now().Add(24*time.Hour)))
	if _, err := nt.Attested(reinstalled, time.Now()); err == nil || !strings.Contains(err.Error(), "holds no CRL of") {
		t.Errorf("without the issuer's CRL = %v, want a refusal", err)
	}
	write([]byte("not a CRL\n"))
	if _, err := NewNodeTrust(ca.Pool, crlFile); err == nil || !strings.Contains(err.Error(), crlFile) {
		t.Errorf("NewNodeTrust with a file holding no CRL = %v, want an error naming it", err)
	}
}
