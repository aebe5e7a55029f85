package sealing

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// testCA issues client certificates as a fleet's CA would.
type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pool *x509.CertPool
}

var serial int64

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "fleet CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// issue makes a client certificate for cn with a key of kind "ecdsa", "rsa" or "ed25519".
func (ca *testCA) issue(t *testing.T, cn, kind string, eku x509.ExtKeyUsage, notAfter time.Time) tls.Certificate {
	t.Helper()
	var key crypto.Signer
	var err error
	switch kind {
	case "ecdsa":
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case "rsa":
		key, err = rsa.GenerateKey(rand.Reader, 2048)
	case "ed25519":
		_, key, err = ed25519.GenerateKey(rand.Reader)
	}
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{eku}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
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
	ca := newTestCA(t)
	for _, kind := range []string{"ecdsa", "rsa", "ed25519"} {
		k, _ := Generate()
		n := attestedNode(t, "edge-1", k, ca.issue(t, "edge-1", kind, x509.ExtKeyUsageClientAuth, time.Now().Add(time.Hour)))
		pub, err := Attested(n, ca.pool, time.Now())
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
	ca, other := newTestCA(t), newTestCA(t)
	nodeKey, _ := Generate()
	brokerKey, _ := Generate()
	good := ca.issue(t, "edge-1", "ecdsa", x509.ExtKeyUsageClientAuth, time.Now().Add(time.Hour))
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
			return attestedNode(t, "edge-1", brokerKey, other.issue(t, "edge-1", "ecdsa", x509.ExtKeyUsageClientAuth, time.Now().Add(time.Hour)))
		}, "unknown authority"},
		{"attested by another identity of the fleet (a site gateway's certificate)", func() *v1.Node {
			return attestedNode(t, "edge-1", brokerKey, ca.issue(t, "site-factory1", "ecdsa", x509.ExtKeyUsageClientAuth, time.Now().Add(time.Hour)))
		}, `the certificate is "site-factory1"'s`},
		{"another node's attestation copied", func() *v1.Node {
			n := attestedNode(t, "edge-2", brokerKey, ca.issue(t, "edge-2", "ecdsa", x509.ExtKeyUsageClientAuth, time.Now().Add(time.Hour)))
			n.Name = "edge-1"
			return n
		}, `the certificate is "edge-2"'s`},
		{"a server certificate", func() *v1.Node {
			return attestedNode(t, "edge-1", brokerKey, ca.issue(t, "edge-1", "ecdsa", x509.ExtKeyUsageServerAuth, time.Now().Add(time.Hour)))
		}, "incompatible key usage"},
		{"an expired certificate", func() *v1.Node {
			return attestedNode(t, "edge-1", brokerKey, ca.issue(t, "edge-1", "ecdsa", x509.ExtKeyUsageClientAuth, time.Now().Add(-time.Minute)))
		}, "expired"},
		{"garbled", func() *v1.Node {
			n := valid.DeepCopy()
			n.Annotations[AttestationKey] = "v1.!!"
			return n
		}, "illegal base64"},
	}
	for _, c := range cases {
		_, err := Attested(c.node(), ca.pool, time.Now())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Attested = %v, want an error containing %q", c.name, err, c.want)
		}
	}
	if _, err := Attested(valid, ca.pool, time.Now()); err != nil {
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
