package signing

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestKeyPairRoundTripAndRefusals(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "k")
	pub, err := GenerateKeyPair(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(prefix + ".key"); st.Mode().Perm() != 0o600 {
		t.Errorf("private key mode %04o, want 0600", st.Mode().Perm())
	}
	priv, err := LoadPrivateKey(prefix + ".key")
	if err != nil || !pub.Equal(priv.Public()) {
		t.Fatalf("LoadPrivateKey: %v", err)
	}
	got, err := LoadPublicKey(prefix + ".pub")
	if err != nil || !got.Equal(pub) {
		t.Fatalf("LoadPublicKey: %v", err)
	}
	if _, err := GenerateKeyPair(prefix); err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Errorf("a second keygen over the same prefix = %v, want a refusal", err)
	}
	os.Chmod(prefix+".key", 0o644)
	if _, err := LoadPrivateKey(prefix + ".key"); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a world-readable key = %v, want a refusal", err)
	}
	// The wrong kind of file is named, not misread.
	if _, err := LoadPublicKey(prefix + ".key"); err == nil || !strings.Contains(err.Error(), `want "PUBLIC KEY"`) {
		t.Errorf("a private key as a public one = %v", err)
	}
	os.WriteFile(filepath.Join(dir, "junk"), []byte("not pem"), 0o600)
	if _, err := LoadPublicKeys([]string{prefix + ".pub", filepath.Join(dir, "junk")}); err == nil || !strings.Contains(err.Error(), "no PEM block") {
		t.Errorf("junk key file = %v", err)
	}
}
