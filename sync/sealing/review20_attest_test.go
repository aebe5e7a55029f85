package sealing

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"math/big"
	"strings"
	"testing"
	"time"
)

// reviewCA is a fleet CA for these review tests, with what testpki does not expose: a CRL and
// subjects of any shape.
type reviewCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newReviewCA(t *testing.T) *reviewCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fleet CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &reviewCA{cert: cert, key: key, pool: pool}
}

func (ca *reviewCA) issue(t *testing.T, serial int64, subject pkix.Name) (tls.Certificate, *x509.Certificate) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: subject,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, leaf
}

// Review of issue 20: an attestation carries no time and no revocation is checked, so one made
// with a node's previous certificate vouches for that certificate's sealing key for as long as
// the certificate is valid, revoked or not. The case: edge-1's disk (node key, TLS key) is stolen
// or discarded; the operator revokes its certificate (docs/security.md, "Revoking a node") and
// sets the node up again with a new node key and certificate. The thief cannot reach the broker
// any more, but a broker operator holding the old status (or in league with the thief) republishes
// it: writers that verify against the fleet's CA seal the node's next Secrets to the old key,
// which the thief holds. The same goes for a thief with only the TLS key: it attests a key of its
// own with the revoked certificate.
func TestReviewRevokedCertificateStillVouches(t *testing.T) {
	ca := newReviewCA(t)
	oldCert, oldLeaf := ca.issue(t, 100, pkix.Name{CommonName: "edge-1"})
	oldKey, _ := Generate() // from the stolen node key
	replayed := attestedNode(t, "edge-1", oldKey, oldCert)

	// Revoked, as docs/security.md says; the node is set up again with a new certificate.
	crlDER, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{Number: big.NewInt(2),
		ThisUpdate: time.Now().Add(-time.Minute), NextUpdate: time.Now().Add(30 * 24 * time.Hour),
		RevokedCertificateEntries: []x509.RevocationListEntry{{SerialNumber: oldLeaf.SerialNumber, RevocationTime: time.Now()}}},
		ca.cert, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	crl, _ := x509.ParseRevocationList(crlDER)
	newCert, _ := ca.issue(t, 101, pkix.Name{CommonName: "edge-1"})
	newKey, _ := Generate()
	if _, err := Attested(attestedNode(t, "edge-1", newKey, newCert), ca.pool, time.Now()); err != nil {
		t.Fatalf("the reinstalled node's own attestation: %v", err)
	}

	pub, err := Attested(replayed, ca.pool, time.Now())
	revoked := false
	for _, e := range crl.RevokedCertificateEntries {
		revoked = revoked || e.SerialNumber.Cmp(oldLeaf.SerialNumber) == 0
	}
	if err == nil && revoked && FormatPublic(pub) == oldKey.Public() {
		t.Errorf("broke: the replayed status of a revoked certificate (serial %s, on the fleet CA's CRL) still vouches for the retired sealing key %s until %s: Attested checks no revocation list, so writers seal to the stolen key",
			oldLeaf.SerialNumber, oldKey.ID(), oldLeaf.NotAfter.Format(time.DateOnly))
	}
}

// Review of issue 20: which CN is "the" CN. Go's pkix.Name keeps the last CommonName of a subject,
// mosquitto's use_identity_as_username takes the first (X509_NAME_get_index_by_NID(..., -1)). A
// certificate whose subject is CN=edge-2, CN=edge-1 logs in to the broker as edge-2 (confined to
// edge-2's subtree) and vouches, for writers, for edge-1's sealing key. It takes a CA that signs
// such a subject (one that copies a CSR's subject as it is); then the holder of edge-2 and the
// broker read edge-1's Secrets.
func TestReviewTwoCommonNames(t *testing.T) {
	ca := newReviewCA(t)
	cn := asn1.ObjectIdentifier{2, 5, 4, 3}
	cert, leaf := ca.issue(t, 200, pkix.Name{ExtraNames: []pkix.AttributeTypeAndValue{{Type: cn, Value: "edge-2"}, {Type: cn, Value: "edge-1"}}})
	k, _ := Generate()
	_, err := Attested(attestedNode(t, "edge-1", k, cert), ca.pool, time.Now())
	if err != nil && !strings.Contains(err.Error(), "2 CNs") {
		t.Errorf("Attested = %v, want a refusal naming the two CNs", err)
	}
	if err == nil {
		var cns []any
		for _, atv := range leaf.Subject.Names {
			if atv.Type.Equal(cn) {
				cns = append(cns, atv.Value)
			}
		}
		t.Errorf("broke: a certificate whose subject has the CNs %v (mosquitto's identity: the first) vouches for edge-1's sealing key (Go reads CN %q)", cns, leaf.Subject.CommonName)
	}
}
