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
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
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
	tmpl := &x509.Certificate{SerialNumber: serial(t), Subject: pkix.Name{CommonName: c.CN},
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
