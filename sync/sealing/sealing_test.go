package sealing

import (
	"bytes"
	"crypto/rand"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func newKey(t *testing.T) *Key {
	t.Helper()
	nodeKey := make([]byte, 32)
	rand.Read(nodeKey)
	k, err := FromNodeKey(nodeKey)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func secret(name string) *v1.Secret {
	return &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Data: map[string][]byte{"password": []byte("hunter2")}, StringData: map[string]string{"user": "admin"}}
}

// What is sealed for a node opens there, with stringData merged into data, and the sealed copy
// carries nothing in clear; it opens nowhere else: not on another node, not under another name,
// not with a flipped bit, not with another key.
func TestSealOpensOnlyForItsNodeAndSecret(t *testing.T) {
	k := newKey(t)
	pub, err := ParsePublic(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	bare, sealed, err := Seal(pub, "edge-1", secret("db"))
	if err != nil {
		t.Fatal(err)
	}
	if len(bare.Data) != 0 || len(bare.StringData) != 0 || bytes.Contains(sealed.Ciphertext, []byte("hunter2")) {
		t.Fatalf("sealed copy still carries data: %+v", bare)
	}
	got := bare.DeepCopy()
	if err := k.Open("edge-1", got, sealed); err != nil {
		t.Fatal(err)
	}
	if string(got.Data["password"]) != "hunter2" || string(got.Data["user"]) != "admin" || len(got.Data) != 2 {
		t.Fatalf("opened data %q", got.Data)
	}

	fail := func(what, want string, open func() error) {
		t.Helper()
		if err := open(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", what, err, want)
		}
	}
	fail("another node", "does not open", func() error { return k.Open("edge-2", bare.DeepCopy(), sealed) })
	fail("another name", "does not open", func() error {
		s := bare.DeepCopy()
		s.Name = "other"
		return k.Open("edge-1", s, sealed)
	})
	flipped := *sealed
	flipped.Ciphertext = bytes.Clone(sealed.Ciphertext)
	flipped.Ciphertext[len(flipped.Ciphertext)-1] ^= 1
	fail("a flipped bit", "does not open", func() error { return k.Open("edge-1", bare.DeepCopy(), &flipped) })
	fail("another node's key", "sealed to key", func() error { return newKey(t).Open("edge-1", bare.DeepCopy(), sealed) })
}

// The key is derived from the node key: the same node key gives the same sealing key (a restart
// keeps it), another gives another.
func TestKeyFollowsTheNodeKey(t *testing.T) {
	nodeKey := bytes.Repeat([]byte{7}, 32)
	a, _ := FromNodeKey(nodeKey)
	b, _ := FromNodeKey(nodeKey)
	if a.Public() != b.Public() {
		t.Fatal("one node key gave two sealing keys")
	}
	if c, _ := FromNodeKey(bytes.Repeat([]byte{8}, 32)); c.Public() == a.Public() {
		t.Fatal("two node keys gave one sealing key")
	}
	if _, err := FromNodeKey(make([]byte, 16)); err == nil {
		t.Fatal("a 16-byte node key was taken")
	}
	for _, bad := range []string{"", "x25519:", "ed25519:AAAA", "x25519:!!!", "x25519:AAAA"} {
		if _, err := ParsePublic(bad); err == nil {
			t.Errorf("ParsePublic(%q) took it", bad)
		}
	}
}
