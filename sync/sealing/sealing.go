// Package sealing encrypts a Secret's data end to end, from a control plane (mqlet ctl, the bridge)
// to the one node it is for, so that the broker, a site gateway and every other node only ever hold
// ciphertext (docs/protocol.md, section 4.5; docs/security.md).
//
// Each node has an X25519 key pair derived from its node key (the key that already seals Secrets in
// its state file, created at first start), so nothing new needs storing or backing up, and a node
// that keeps its node key keeps its sealing key. The public key travels in the node status as the
// annotation AnnotationKey. A Secret's data is sealed with HPKE (RFC 9180: DHKEM(X25519),
// HKDF-SHA256, ChaCha20-Poly1305, which is fast without AES instructions, as on most ARM boards),
// with the node, namespace and name in the HPKE info: a ciphertext copied to another node's or
// another Secret's topic does not open.
package sealing

import (
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/hpke"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"

	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
)

// AnnotationKey is the node annotation that carries the node's sealing public key
// ("x25519:" + unpadded base64url of the 32-byte key).
const AnnotationKey = "mqlet.io/sealing-key"

const keyPrefix = "x25519:"

// derivation labels the HKDF that turns the node key into the sealing key: another use of the
// node key can never yield the same bytes.
const derivation = "mqlet.io sealing key x25519 v1"

var (
	kdf  = hpke.HKDFSHA256()
	aead = hpke.ChaCha20Poly1305()
)

// Key is a node's sealing key pair.
type Key struct {
	priv *ecdh.PrivateKey
	hpke hpke.PrivateKey
}

// FromNodeKey derives the node's sealing key from its node key (32 random bytes).
func FromNodeKey(nodeKey []byte) (*Key, error) {
	if len(nodeKey) < 32 {
		return nil, fmt.Errorf("sealing key: the node key has %d bytes, want at least 32", len(nodeKey))
	}
	seed, err := hkdf.Key(sha256.New, nodeKey, nil, derivation, 32)
	if err != nil {
		return nil, fmt.Errorf("sealing key: derive: %w", err)
	}
	priv, err := ecdh.X25519().NewPrivateKey(seed)
	if err != nil {
		return nil, fmt.Errorf("sealing key: %w", err)
	}
	hk, err := hpke.NewDHKEMPrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("sealing key: %w", err)
	}
	return &Key{priv: priv, hpke: hk}, nil
}

// Public is the public key as the node status carries it.
func (k *Key) Public() string { return FormatPublic(k.priv.PublicKey()) }

// ID is KeyID of the public key.
func (k *Key) ID() string { return KeyID(k.priv.PublicKey()) }

// FormatPublic is the annotation form of a public key.
func FormatPublic(pub *ecdh.PublicKey) string {
	return keyPrefix + base64.RawURLEncoding.EncodeToString(pub.Bytes())
}

// ParsePublic reads the annotation form of a public key.
func ParsePublic(s string) (*ecdh.PublicKey, error) {
	rest, ok := strings.CutPrefix(s, keyPrefix)
	if !ok {
		return nil, fmt.Errorf("sealing key %q: want %q followed by base64url", s, keyPrefix)
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return nil, fmt.Errorf("sealing key %q: %w", s, err)
	}
	pub, err := ecdh.X25519().NewPublicKey(b)
	if err != nil {
		return nil, fmt.Errorf("sealing key %q: %w", s, err)
	}
	return pub, nil
}

// KeyID is a short name for a public key: the first 8 bytes of its SHA-256, hex.
func KeyID(pub *ecdh.PublicKey) string {
	sum := sha256.Sum256(pub.Bytes())
	return hex.EncodeToString(sum[:8])
}

// NodePublic reads a node's sealing key from its status; an error says why there is none.
func NodePublic(n *v1.Node) (*ecdh.PublicKey, error) {
	if n == nil {
		return nil, errors.New("the node has not reported its status")
	}
	s, ok := n.Annotations[AnnotationKey]
	if !ok {
		return nil, fmt.Errorf("node %s does not publish a sealing key (annotation %s): a version without sealed secrets", n.Name, AnnotationKey)
	}
	return ParsePublic(s)
}

// info binds a ciphertext to its node and Secret.
func info(node, namespace, name string) []byte {
	return []byte("mqlet.io/v2 secret\x00" + node + "\x00" + namespace + "\x00" + name)
}

// sealedData is the plaintext: the Secret's data with stringData merged in, as the API server
// would store it.
type sealedData struct {
	Data map[string][]byte `json:"data"`
}

// Seal returns a copy of s without its data, and its data sealed to the node's key pub.
func Seal(pub *ecdh.PublicKey, node string, s *v1.Secret) (*v1.Secret, *protocol.Sealed, error) {
	pk, err := hpke.NewDHKEMPublicKey(pub)
	if err != nil {
		return nil, nil, fmt.Errorf("seal secret %s/%s for node %s: %w", s.Namespace, s.Name, node, err)
	}
	data := maps.Clone(s.Data)
	if data == nil {
		data = map[string][]byte{}
	}
	for k, v := range s.StringData {
		data[k] = []byte(v)
	}
	plain, err := json.Marshal(sealedData{Data: data})
	if err != nil {
		return nil, nil, fmt.Errorf("seal secret %s/%s for node %s: %w", s.Namespace, s.Name, node, err)
	}
	ns := s.Namespace
	if ns == "" {
		ns = "default"
	}
	ct, err := hpke.Seal(pk, kdf, aead, info(node, ns, s.Name), plain)
	if err != nil {
		return nil, nil, fmt.Errorf("seal secret %s/%s for node %s: %w", ns, s.Name, node, err)
	}
	bare := s.DeepCopy()
	bare.Data, bare.StringData = nil, nil
	return bare, &protocol.Sealed{KeyID: KeyID(pub), Ciphertext: ct}, nil
}

// Open fills s.Data from sealed, which must be sealed to k for this node and Secret.
func (k *Key) Open(node string, s *v1.Secret, sealed *protocol.Sealed) error {
	ns := s.Namespace
	if ns == "" {
		ns = "default"
	}
	if sealed.KeyID != k.ID() {
		return fmt.Errorf("secret %s/%s is sealed to key %s, this node's key is %s (the writer used an old or another node's key)", ns, s.Name, sealed.KeyID, k.ID())
	}
	plain, err := hpke.Open(k.hpke, kdf, aead, info(node, ns, s.Name), sealed.Ciphertext)
	if err != nil {
		return fmt.Errorf("secret %s/%s: the sealed data does not open (altered, or sealed for another node or secret): %w", ns, s.Name, err)
	}
	var d sealedData
	if err := json.Unmarshal(plain, &d); err != nil {
		return fmt.Errorf("secret %s/%s: the sealed data is not a secret's data: %w", ns, s.Name, err)
	}
	s.Data, s.StringData = d.Data, nil
	return nil
}

// Generate makes a sealing key from a fresh random node key: for tools and tests that stand in
// for a node.
func Generate() (*Key, error) {
	nodeKey := make([]byte, 32)
	if _, err := rand.Read(nodeKey); err != nil {
		return nil, fmt.Errorf("sealing key: %w", err)
	}
	return FromNodeKey(nodeKey)
}

// Agree is the X25519 shared secret of the node's sealing key and peer's public key: an exec
// session (sync/stream) derives its keys from it, so that only this node and the holder of peer's
// private key can read the session.
func (k *Key) Agree(peer *ecdh.PublicKey) ([]byte, error) {
	s, err := k.priv.ECDH(peer)
	if err != nil {
		return nil, fmt.Errorf("sealing key: agree with %s: %w", KeyID(peer), err)
	}
	return s, nil
}

// PublicKey is the node's public sealing key.
func (k *Key) PublicKey() *ecdh.PublicKey { return k.priv.PublicKey() }
