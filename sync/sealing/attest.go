package sealing

import (
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/asn1"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

// AttestationKey is the node annotation that binds the sealing key to the node's identity: the
// node's MQTT client certificate (CN = node name, issued by the fleet's CA) and a signature over
// the node name and the sealing key made with that certificate's private key.
//
// Without it a writer learns the sealing key from the broker, and a broker operator who replaced
// it in the retained status before a Secret was sealed could read the Secret. The broker holds
// neither the node's certificate key nor the CA's, so it cannot make an attestation for a key of
// its own; a writer that verifies attestations against the fleet's CA (Attested) refuses to seal to
// any other key.
const AttestationKey = "mqlet.io/sealing-key-attestation"

const attestationPrefix = "v1."

// oidCommonName is the subject attribute CN.
var oidCommonName = asn1.ObjectIdentifier{2, 5, 4, 3}

// attestation is the annotation's payload (JSON, base64url after attestationPrefix).
type attestation struct {
	// Chain is the node's certificate and any intermediates, DER, leaf first.
	Chain [][]byte `json:"chain"`
	Sig   []byte   `json:"sig"`
}

// attestedMessage is what the certificate's key signs: a label no other signature of that key can
// share, the node name and the annotation form of the sealing key.
func attestedMessage(node, public string) []byte {
	return []byte("mqlet.io sealing key attestation v1\x00" + node + "\x00" + public)
}

// Attest signs the sealing key k of node with the node's client certificate cert (its MQTT
// identity) and returns the AttestationKey annotation value. The certificate's CN should be the
// node's name: writers that verify check it.
func Attest(cert tls.Certificate, node string, k *Key) (string, error) {
	if len(cert.Certificate) == 0 {
		return "", errors.New("attest the sealing key: the certificate has no certificate data")
	}
	signer, ok := cert.PrivateKey.(crypto.Signer)
	if !ok {
		return "", fmt.Errorf("attest the sealing key: a %T private key cannot sign", cert.PrivateKey)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return "", fmt.Errorf("attest the sealing key: parse the certificate: %w", err)
	}
	msg := attestedMessage(node, k.Public())
	var sig []byte
	switch leaf.PublicKey.(type) {
	case ed25519.PublicKey:
		sig, err = signer.Sign(rand.Reader, msg, crypto.Hash(0))
	case *ecdsa.PublicKey, *rsa.PublicKey:
		sum := sha256.Sum256(msg)
		sig, err = signer.Sign(rand.Reader, sum[:], crypto.SHA256)
	default:
		return "", fmt.Errorf("attest the sealing key: a certificate with a %T key is not supported (ECDSA, RSA or Ed25519)", leaf.PublicKey)
	}
	if err != nil {
		return "", fmt.Errorf("attest the sealing key with the certificate of %q: %w", leaf.Subject.CommonName, err)
	}
	b, err := json.Marshal(attestation{Chain: cert.Certificate, Sig: sig})
	if err != nil {
		return "", fmt.Errorf("attest the sealing key: %w", err)
	}
	return attestationPrefix + base64.RawURLEncoding.EncodeToString(b), nil
}

// signatureAlgorithm is the algorithm Attest signs with for a certificate's key.
func signatureAlgorithm(pub any) (x509.SignatureAlgorithm, error) {
	switch pub.(type) {
	case ed25519.PublicKey:
		return x509.PureEd25519, nil
	case *ecdsa.PublicKey:
		return x509.ECDSAWithSHA256, nil
	case *rsa.PublicKey:
		return x509.SHA256WithRSA, nil
	}
	return 0, fmt.Errorf("a certificate with a %T key is not supported (ECDSA, RSA or Ed25519)", pub)
}

// Attested reads a node's sealing key from its status and checks that the node's certificate
// vouches for it: the attestation's certificate chains to roots (the fleet's CA) at now, is valid
// for client authentication, has the node's name as its CN (its identity on the broker), and its
// key signed this node name and this sealing key. Any other key is refused with the reason: a
// writer must not seal to it.
func Attested(n *v1.Node, roots *x509.CertPool, now time.Time) (*ecdh.PublicKey, error) {
	pub, err := NodePublic(n)
	if err != nil {
		return nil, err
	}
	fail := func(format string, a ...any) error {
		return fmt.Errorf("node %s: its sealing key is not vouched for by its certificate, so it may not be the node's own (a broker that replaced it could read what is sealed to it): %s",
			n.Name, fmt.Sprintf(format, a...))
	}
	s, ok := n.Annotations[AttestationKey]
	if !ok {
		return nil, fail("no annotation %s (a node without a client certificate, or an older version)", AttestationKey)
	}
	rest, ok := strings.CutPrefix(s, attestationPrefix)
	if !ok {
		return nil, fail("annotation %s does not start with %q", AttestationKey, attestationPrefix)
	}
	raw, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return nil, fail("annotation %s: %v", AttestationKey, err)
	}
	var a attestation
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, fail("annotation %s: %v", AttestationKey, err)
	}
	if len(a.Chain) == 0 || len(a.Chain) > 8 {
		return nil, fail("annotation %s carries %d certificates, want 1 to 8", AttestationKey, len(a.Chain))
	}
	leaf, err := x509.ParseCertificate(a.Chain[0])
	if err != nil {
		return nil, fail("its certificate: %v", err)
	}
	inter := x509.NewCertPool()
	for i, der := range a.Chain[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fail("intermediate certificate %d: %v", i+1, err)
		}
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fail("certificate %q (serial %s): %v", leaf.Subject.CommonName, leaf.SerialNumber, err)
	}
	// mosquitto's identity is the subject's first CN, Go's CommonName its last: a subject with
	// two would be one node on the broker and another here.
	cns := 0
	for _, atv := range leaf.Subject.Names {
		if atv.Type.Equal(oidCommonName) {
			cns++
		}
	}
	if cns != 1 {
		return nil, fail("certificate %q (serial %s) has %d CNs in its subject, want exactly one (the broker knows a client by the first)", leaf.Subject.CommonName, leaf.SerialNumber, cns)
	}
	if leaf.Subject.CommonName != n.Name {
		return nil, fail("the certificate is %q's (its CN), not this node's", leaf.Subject.CommonName)
	}
	algo, err := signatureAlgorithm(leaf.PublicKey)
	if err != nil {
		return nil, fail("%v", err)
	}
	if err := leaf.CheckSignature(algo, attestedMessage(n.Name, FormatPublic(pub)), a.Sig); err != nil {
		return nil, fail("the certificate's key did not sign this sealing key for this node: %v", err)
	}
	return pub, nil
}

// LoadRoots reads the fleet's CA certificates (PEM) that Attested verifies node certificates with.
func LoadRoots(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("node CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("node CA %s: no PEM certificate in it", file)
	}
	return pool, nil
}
