package protocol

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Signature is an Ed25519 signature over an index's signing bytes (IndexSigningBytes), by the key
// KeyID names. A node configured with trust anchors takes only an index signed by one of them, and
// through the index's digests every object it lists is covered too.
type Signature struct {
	KeyID string `json:"keyID"` // KeyID of the public key
	Value string `json:"value"` // the 64-byte signature, standard base64
}

// signingDomain starts the signed bytes, so a signature over an index can never be taken for a
// signature over anything else this key signs.
const signingDomain = "mqlet.io/v2 index\n"

// KeyID names a public key: the first 8 bytes of its SHA-256, in hex. It only picks the key to try;
// the signature is what proves.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// IndexSigningBytes are the bytes an index signature covers: the node, the revision and every
// entry's key, generation and digest, one per line, sorted by key. Keys, node names and digests
// hold no space or newline (the decoder checks them), so the lines cannot be confused.
func IndexSigningBytes(x *Index) []byte {
	var b strings.Builder
	b.WriteString(signingDomain)
	b.WriteString("node " + x.Node + "\n")
	b.WriteString("revision " + strconv.FormatInt(x.Revision, 10) + "\n")
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range x.Objects {
			if !yield(k) {
				return
			}
		}
	}) {
		e := x.Objects[k]
		b.WriteString("object " + k + " " + strconv.FormatInt(e.Generation, 10) + " " + e.Digest + "\n")
	}
	return []byte(b.String())
}

// SignIndex signs x with key, replacing any signature it had.
func SignIndex(x *Index, key ed25519.PrivateKey) {
	x.Signature = nil
	sig := ed25519.Sign(key, IndexSigningBytes(x))
	x.Signature = &Signature{KeyID: KeyID(key.Public().(ed25519.PublicKey)), Value: base64.StdEncoding.EncodeToString(sig)}
}

// ErrUnsigned is wrapped by VerifyIndex when the index carries no signature.
var ErrUnsigned = errors.New("the index is not signed")

// VerifyIndex checks that x is signed by one of anchors.
func VerifyIndex(x *Index, anchors []ed25519.PublicKey) error {
	if x.Signature == nil {
		return fmt.Errorf("index revision %d: %w, and this node takes only signed ones", x.Revision, ErrUnsigned)
	}
	sig, err := base64.StdEncoding.DecodeString(x.Signature.Value)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return fmt.Errorf("index revision %d: the signature is not %d bytes of base64", x.Revision, ed25519.SignatureSize)
	}
	msg := IndexSigningBytes(x)
	known := false
	for _, pub := range anchors {
		if KeyID(pub) != x.Signature.KeyID {
			continue
		}
		known = true
		if ed25519.Verify(pub, msg, sig) {
			return nil
		}
	}
	if !known {
		return fmt.Errorf("index revision %d: signed by key %s, which this node does not trust", x.Revision, x.Signature.KeyID)
	}
	return fmt.Errorf("index revision %d: the signature by key %s does not verify (forged or altered)", x.Revision, x.Signature.KeyID)
}

// validSignatureShape checks what the decoder can check without keys.
func validSignatureShape(s *Signature) error {
	if len(s.KeyID) != 16 {
		return fmt.Errorf("signature keyID %q: want 16 hex digits", s.KeyID)
	}
	if _, err := hex.DecodeString(s.KeyID); err != nil || strings.ToLower(s.KeyID) != s.KeyID {
		return fmt.Errorf("signature keyID %q: want 16 lowercase hex digits", s.KeyID)
	}
	if sig, err := base64.StdEncoding.DecodeString(s.Value); err != nil || len(sig) != ed25519.SignatureSize {
		return fmt.Errorf("signature value: want %d bytes in standard base64", ed25519.SignatureSize)
	}
	return nil
}

// logsDomain starts the bytes a logs request signature covers.
const logsDomain = "mqlet.io/v2 logs request\n"

// MaxLogsRequestLife bounds how far ahead a signed logs request may expire: a captured request
// can be replayed only that long (and the node also refuses an ID it has seen).
const MaxLogsRequestLife = 10 * time.Minute

// LogsRequestSigningBytes are the bytes a logs request signature covers: the node it is for and
// the request's fields (its JSON encoding without the signature).
func LogsRequestSigningBytes(node string, r *LogsRequest) []byte {
	c := *r
	c.Signature = nil
	b, _ := json.Marshal(&c) // plain fields: cannot fail
	return append([]byte(logsDomain+"node "+node+"\n"), b...)
}

// SignLogsRequest signs r for node with key, valid until r.Expires (set it first).
func SignLogsRequest(node string, r *LogsRequest, key ed25519.PrivateKey) {
	r.Signature = nil
	r.Signature = signRequest(key, LogsRequestSigningBytes(node, r))
}

// VerifyLogsRequest checks that r is for node, signed by one of anchors, and not expired at now.
func VerifyLogsRequest(node string, r *LogsRequest, anchors []ed25519.PublicKey, now time.Time) error {
	if r.Signature == nil {
		return fmt.Errorf("logs request %s: %w, and this node serves only signed ones", r.ID, errUnsignedRequest)
	}
	return verifyRequest("logs request "+r.ID, r.Signature, r.Expires, LogsRequestSigningBytes(node, r), anchors, now)
}

// signRequest is the signature of a request's signing bytes msg (logs, exec).
func signRequest(key ed25519.PrivateKey, msg []byte) *Signature {
	return &Signature{KeyID: KeyID(key.Public().(ed25519.PublicKey)), Value: base64.StdEncoding.EncodeToString(ed25519.Sign(key, msg))}
}

// verifyRequest checks a signed request (what names it in errors): an expiry after now and at most
// MaxLogsRequestLife ahead, and sig a signature of msg by one of anchors.
func verifyRequest(what string, sig *Signature, expires time.Time, msg []byte, anchors []ed25519.PublicKey, now time.Time) error {
	switch {
	case expires.IsZero():
		return fmt.Errorf("%s: no expiry", what)
	case !now.Before(expires):
		return fmt.Errorf("%s: expired at %s", what, expires.UTC().Format(time.RFC3339))
	case expires.Sub(now) > MaxLogsRequestLife:
		return fmt.Errorf("%s: expires %s, more than %s ahead", what, expires.UTC().Format(time.RFC3339), MaxLogsRequestLife)
	}
	raw, err := base64.StdEncoding.DecodeString(sig.Value)
	if err != nil || len(raw) != ed25519.SignatureSize {
		return fmt.Errorf("%s: the signature is not %d bytes of base64", what, ed25519.SignatureSize)
	}
	for _, pub := range anchors {
		if KeyID(pub) == sig.KeyID && ed25519.Verify(pub, msg, raw) {
			return nil
		}
	}
	return fmt.Errorf("%s: not signed by a key this node trusts (key %s)", what, sig.KeyID)
}

var errUnsignedRequest = errors.New("the request is not signed")
