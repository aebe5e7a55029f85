package kubetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

// authority is the cluster's one throwaway CA: it signs the apiserver's serving certificate and
// every client certificate (the apiserver's --client-ca-file), and the controller-manager signs
// approved CSRs with it. Keys are ECDSA P-256: generating RSA keys would cost start-up time.
type authority struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey
	keyPEM  []byte
}

func newAuthority() (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	tmpl, err := certTemplate(pkix.Name{CommonName: "kubetest-ca"})
	if err != nil {
		return nil, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("self-sign CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &authority{cert: cert, certPEM: encodeCert(der), key: key, keyPEM: keyPEM}, nil
}

// certTemplate returns what every certificate here shares: a random serial, the subject, and a
// validity from an hour ago (clock skew) for a week (a long fleet bench stays inside it).
func certTemplate(subject pkix.Name) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial for %q: %w", subject.CommonName, err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      subject,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
	}, nil
}

// keyPair is a PEM certificate and its PEM private key.
type keyPair struct {
	certPEM, keyPEM []byte
}

// serving issues the apiserver's serving certificate: loopback, plus the in-cluster names and
// the first service IP, so a client configured the in-cluster way would verify it too.
func (ca *authority) serving(serviceIP net.IP) (keyPair, error) {
	tmpl, err := certTemplate(pkix.Name{CommonName: "kube-apiserver"})
	if err != nil {
		return keyPair{}, err
	}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, serviceIP}
	tmpl.DNSNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc.cluster.local"}
	return ca.issue(tmpl)
}

// client issues a client certificate: the apiserver takes the common name as the user name and
// each organization as a group.
func (ca *authority) client(user string, groups ...string) (keyPair, error) {
	tmpl, err := certTemplate(pkix.Name{CommonName: user, Organization: groups})
	if err != nil {
		return keyPair{}, err
	}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return ca.issue(tmpl)
}

func (ca *authority) issue(tmpl *x509.Certificate) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, fmt.Errorf("generate key for %q: %w", tmpl.Subject.CommonName, err)
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return keyPair{}, fmt.Errorf("sign certificate for %q: %w", tmpl.Subject.CommonName, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return keyPair{}, err
	}
	return keyPair{certPEM: encodeCert(der), keyPEM: keyPEM}, nil
}

// newSigningKey makes the service-account token signing key (ES256); the apiserver verifies with
// it and signs with it, the controller-manager signs legacy tokens with it.
func newSigningKey() ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate service-account signing key: %w", err)
	}
	return encodeKey(key)
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// encodeKey writes the SEC 1 form ("EC PRIVATE KEY"), which every Kubernetes component's key
// loader accepts.
func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func writeSecret(file string, data []byte) error {
	if err := os.WriteFile(file, data, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", file, err)
	}
	return nil
}
