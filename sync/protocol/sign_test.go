package protocol

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
)

func TestSignAndVerifyIndex(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	other, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	x := &Index{Node: "n1", Revision: 7, Objects: map[string]IndexEntry{
		"pods/default/a": {Generation: 7, Digest: Digest([]byte("a"))},
		"pods/default/b": {Generation: 3, Digest: Digest([]byte("b"))},
	}}
	SignIndex(x, priv)
	if err := VerifyIndex(x, []ed25519.PublicKey{other, pub}); err != nil {
		t.Fatalf("a good signature: %v", err)
	}
	// It survives the wire: encoded and decoded strictly.
	b, _ := Encode(x)
	got, err := DecodeIndex(Topic{Class: ClassIndex, Node: "n1"}, b, 0)
	if err != nil || VerifyIndex(got, []ed25519.PublicKey{pub}) != nil {
		t.Fatalf("decoded signed index: %v / %v", err, VerifyIndex(got, []ed25519.PublicKey{pub}))
	}
	tamper := map[string]func(y *Index){
		"entry digest": func(y *Index) {
			y.Objects["pods/default/a"] = IndexEntry{Generation: 7, Digest: Digest([]byte("evil"))}
		},
		"entry generation": func(y *Index) { y.Objects["pods/default/b"] = IndexEntry{Generation: 4, Digest: Digest([]byte("b"))} },
		"entry added":      func(y *Index) { y.Objects["pods/default/c"] = IndexEntry{Generation: 1, Digest: Digest([]byte("c"))} },
		"entry removed":    func(y *Index) { delete(y.Objects, "pods/default/b") },
		"revision":         func(y *Index) { y.Revision = 8 },
		"node":             func(y *Index) { y.Node = "n2" },
	}
	for name, f := range tamper {
		y := &Index{Node: x.Node, Revision: x.Revision, Objects: map[string]IndexEntry{}, Signature: x.Signature}
		for k, e := range x.Objects {
			y.Objects[k] = e
		}
		f(y)
		if err := VerifyIndex(y, []ed25519.PublicKey{pub}); err == nil || !strings.Contains(err.Error(), "does not verify") {
			t.Errorf("%s changed: VerifyIndex = %v, want a forged signature", name, err)
		}
	}
	if err := VerifyIndex(x, []ed25519.PublicKey{other}); err == nil || !strings.Contains(err.Error(), "does not trust") {
		t.Errorf("unknown key: %v", err)
	}
	SignIndex(x, otherPriv)
	if err := VerifyIndex(x, []ed25519.PublicKey{pub}); err == nil {
		t.Error("a signature by another key verified")
	}
	x.Signature = nil
	if err := VerifyIndex(x, []ed25519.PublicKey{pub}); !errors.Is(err, ErrUnsigned) {
		t.Errorf("unsigned: %v", err)
	}
	// Malformed signatures are refused by the decoder, before any key is tried.
	for _, bad := range []string{`{"keyID":"zz","value":"AA=="}`, `{"keyID":"0123456789abcdef","value":"AA=="}`, `{"keyID":"0123456789ABCDEF","value":""}`} {
		payload := []byte(`{"apiVersion":"mqlet.io/v2","node":"n1","revision":1,"objects":{},"signature":` + bad + `}`)
		if _, err := DecodeIndex(Topic{Class: ClassIndex, Node: "n1"}, payload, 0); err == nil {
			t.Errorf("signature %s accepted by the decoder", bad)
		}
	}
}
