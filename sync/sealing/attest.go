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
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
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

// NodeTrust is what a writer checks node attestations with: the fleet's CA, and optionally the
// CA's certificate revocation list. Safe for concurrent use.
type NodeTrust struct {
	roots   *x509.CertPool
	crlFile string

	mu    sync.Mutex
	crls  []*x509.RevocationList
	stamp crlStamp // of the file the crls were read from
}

type crlStamp struct {
	mod  time.Time
	size int64
}

// NewNodeTrust trusts the node certificates roots issue. crlFile, when not "", is a PEM file of
// CRLs (the one the broker's crlfile names): a certificate it revokes vouches for nothing, and a
// certificate whose issuer has no CRL there, or whose CRL is past its next update, is refused,
// as the broker refuses such a client. The file is read again when it changes.
func NewNodeTrust(roots *x509.CertPool, crlFile string) (*NodeTrust, error) {
	t := &NodeTrust{roots: roots, crlFile: crlFile}
	if crlFile != "" {
		if _, err := t.revocations(); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// revocations are the CRLs of the file, read again when its size or time changed.
func (t *NodeTrust) revocations() ([]*x509.RevocationList, error) {
	fi, err := os.Stat(t.crlFile)
	if err != nil {
		return nil, fmt.Errorf("node CRL: %w", err)
	}
	st := crlStamp{mod: fi.ModTime(), size: fi.Size()}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.crls != nil && st == t.stamp {
		return t.crls, nil
	}
	data, err := os.ReadFile(t.crlFile)
	if err != nil {
		return nil, fmt.Errorf("node CRL: %w", err)
	}
	var crls []*x509.RevocationList
	for rest := data; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type != "X509 CRL" {
			continue
		}
		crl, err := x509.ParseRevocationList(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("node CRL %s: %w", t.crlFile, err)
		}
		crls = append(crls, crl)
	}
	if len(crls) == 0 {
		return nil, fmt.Errorf("node CRL %s: no PEM block \"X509 CRL\" in it", t.crlFile)
	}
	t.crls, t.stamp = crls, st
	return crls, nil
}

// revoked checks leaf, issued by issuer, against the CRLs: nil when a current CRL of that issuer
// does not list it.
func (t *NodeTrust) revoked(leaf, issuer *x509.Certificate, now time.Time) error {
	crls, err := t.revocations()
	if err != nil {
		return err
	}
	for _, crl := range crls {
		if crl.CheckSignatureFrom(issuer) != nil {
			continue
		}
		if !crl.NextUpdate.IsZero() && now.After(crl.NextUpdate) {
			return fmt.Errorf("the CRL of %q in %s was due for renewal at %s (the broker refuses every client with it too)", issuer.Subject.CommonName, t.crlFile, crl.NextUpdate.Format(time.RFC3339))
		}
		for _, e := range crl.RevokedCertificateEntries {
			if e.SerialNumber.Cmp(leaf.SerialNumber) == 0 {
				return fmt.Errorf("certificate %q (serial %s) was revoked at %s (%s)", leaf.Subject.CommonName, leaf.SerialNumber, e.RevocationTime.Format(time.RFC3339), t.crlFile)
			}
		}
		return nil
	}
	return fmt.Errorf("%s holds no CRL of %q, which issued certificate %q", t.crlFile, issuer.Subject.CommonName, leaf.Subject.CommonName)
}

// NodeKey is the key to seal to for n: the one its certificate vouches for (Attested) when t is
// set, else the one n carries (NodePublic), for a bridge run without the fleet's CA.
func (t *NodeTrust) NodeKey(n *v1.Node, now time.Time) (*ecdh.PublicKey, error) {
	if t == nil {
		return NodePublic(n)
	}
	return t.Attested(n, now)
}

// Attested reads a node's sealing key from its status and checks that the node's certificate
// vouches for it: the attestation's certificate chains to the fleet's CA at now, is valid for
// client authentication and not revoked (with a CRL), has the node's name as its one CN (its
// identity on the broker), and its key signed this node name and this sealing key. Any other key
// is refused with the reason: a writer must not seal to it.
func (t *NodeTrust) Attested(n *v1.Node, now time.Time) (*ecdh.PublicKey, error) {
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
	chains, err := leaf.Verify(x509.VerifyOptions{Roots: t.roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		return nil, fail("certificate %q (serial %s): %v", leaf.Subject.CommonName, leaf.SerialNumber, err)
	}
	if t.crlFile != "" {
		// The leaf's issuer is the second certificate of any chain (a leaf that is itself a
		// root has none: it cannot be revoked by a CRL, and is refused).
		if len(chains[0]) < 2 {
			return nil, fail("certificate %q is itself a trusted root: no CRL can revoke it", leaf.Subject.CommonName)
		}
		if err := t.revoked(leaf, chains[0][1], now); err != nil {
			return nil, fail("%v", err)
		}
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

// IssuerRoots reads from caFile (PEM) the CA certificates that issued the client certificate in
// certFile: a writer's own identity comes from the fleet's CA, which is then the CA that vouches
// for the nodes. A CA file may also hold CAs that only vouch for the broker (a public or separate
// server CA): those are left out. An error says when none issued the certificate.
func IssuerRoots(caFile, certFile string) (*x509.CertPool, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("node CA from the client certificate: %w", err)
	}
	b, _ := pem.Decode(certPEM)
	if b == nil {
		return nil, fmt.Errorf("node CA from the client certificate: no PEM block in %s", certFile)
	}
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("node CA from the client certificate %s: %w", certFile, err)
	}
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("node CA: %w", err)
	}
	pool := x509.NewCertPool()
	found := false
	for rest := data; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		ca, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("node CA %s: %w", caFile, err)
		}
		if leaf.CheckSignatureFrom(ca) == nil {
			pool.AddCert(ca)
			found = true
		}
	}
	if !found {
		return nil, fmt.Errorf("no CA in %s issued the client certificate %s, so the fleet's CA that vouches for nodes' sealing keys is unknown: name it (node CA), or opt out with none", caFile, certFile)
	}
	return pool, nil
}

// LoadNodeTrust is what vouches for the nodes' sealing keys for a writer (nil: nothing does),
// from its settings: nodeCA, nodeCRL, and its own TLS files. With a client certificate, a writer
// (ctl, the bridge) is in a fleet whose identities come from a CA: the CA in caFile that issued
// its own certificate is the default (not the whole file, which may hold a CA that only vouches
// for the broker). nodeCA names another; "none" opts out.
func LoadNodeTrust(nodeCA, nodeCRL, caFile, certFile string) (*NodeTrust, error) {
	var roots *x509.CertPool
	var err error
	switch {
	case nodeCA == "none":
		if nodeCRL != "" {
			return nil, fmt.Errorf("node CRL %s given with node CA none: a CRL needs the CA it is checked against", nodeCRL)
		}
		return nil, nil
	case nodeCA != "":
		roots, err = LoadRoots(nodeCA)
	case certFile != "" && caFile != "":
		roots, err = IssuerRoots(caFile, certFile)
	case nodeCRL != "":
		return nil, fmt.Errorf("node CRL %s given without a node CA (and no client certificate to take it from)", nodeCRL)
	default:
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return NewNodeTrust(roots, nodeCRL)
}
