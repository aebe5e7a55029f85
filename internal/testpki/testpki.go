// Package testpki issues certificates for tests, as a fleet's CA would: client certificates
// whose CN is an identity (a node, a site gateway), of any key type, with a chosen key usage
// and lifetime. It is for tests only; internal/mqtttest has its own files for mosquitto.
package testpki

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
	"encoding/pem"
	"fmt"
	"math/big"
	"testing"
	"time"
)

// CA is a certificate authority held in memory.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
	// Pool holds the CA's certificate only: the roots a verifier of its certificates uses.
	Pool *x509.CertPool
}

// Cert describes a certificate to issue; the zero value is a client certificate with an ECDSA
// P-256 key valid for an hour either side of now.
type Cert struct {
	CN string
	// Subject, when it has names, replaces the subject CN would make (for subjects of any shape).
	Subject pkix.Name
	// Key is "ecdsa" (default), "rsa" or "ed25519".
	Key string
	// Usage defaults to client authentication.
	Usage x509.ExtKeyUsage
	// NotAfter defaults to an hour from now.
	NotAfter time.Time
}

// NewCA makes a CA.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial(t), Subject: pkix.Name{CommonName: "test fleet CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(10 * 365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{cert: cert, key: key, Pool: pool}
}

// Issue signs a certificate as c describes and returns it with its private key.
func (ca *CA) Issue(t testing.TB, c Cert) tls.Certificate {
	t.Helper()
	var key crypto.Signer
	var err error
	switch c.Key {
	case "", "ecdsa":
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case "rsa":
		key, err = rsa.GenerateKey(rand.Reader, 2048)
	case "ed25519":
		_, key, err = ed25519.GenerateKey(rand.Reader)
	default:
		err = fmt.Errorf("testpki: key type %q: want ecdsa, rsa or ed25519", c.Key)
	}
	if err != nil {
		t.Fatal(err)
	}
	usage := c.Usage
	if usage == 0 {
		usage = x509.ExtKeyUsageClientAuth
	}
	notAfter := c.NotAfter
	if notAfter.IsZero() {
		notAfter = time.Now().Add(time.Hour)
	}
	subject := pkix.Name{CommonName: c.CN}
	if len(c.Subject.Names) > 0 || len(c.Subject.ExtraNames) > 0 {
		subject = c.Subject
	}
	tmpl := &x509.Certificate{SerialNumber: serial(t), Subject: subject,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// serial is a random 64-bit serial number: certificates of one CA must not share one.
func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// CertPEM is the CA's certificate, PEM: what a CA file holds.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
}

// PEM is c's certificate chain, PEM.
func PEM(c tls.Certificate) []byte {
	var out []byte
	for _, der := range c.Certificate {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	return out
}

// CRL is a revocation list of the CA revoking the certificates (leaf first) of revoked, due for
// renewal at nextUpdate, PEM.
func (ca *CA) CRL(t testing.TB, nextUpdate time.Time, revoked ...tls.Certificate) []byte {
	t.Helper()
	var entries []x509.RevocationListEntry
	for _, c := range revoked {
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, x509.RevocationListEntry{SerialNumber: leaf.SerialNumber, RevocationTime: time.Now().Add(-time.Minute)})
	}
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{Number: serial(t),
		ThisUpdate: time.Now().Add(-time.Hour), NextUpdate: nextUpdate, RevokedCertificateEntries: entries}, ca.cert, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der})
}
