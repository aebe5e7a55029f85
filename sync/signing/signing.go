// Package signing reads and writes the Ed25519 keys that sign desired state (docs/protocol.md,
// "Signed desired state"): a control plane's private key (PKCS #8 PEM, mode 0600) and the public
// keys a node trusts (PKIX PEM). The signing itself is protocol.SignIndex and protocol.VerifyIndex.
package signing

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
)

// looseMode are the permission bits a private key file must not have: readable or writable by
// anyone but its owner.
const looseMode = 0o077

// GenerateKeyPair writes a new key pair to prefix+".key" (mode 0600) and prefix+".pub". It refuses
// to overwrite either file: replacing a signing key by accident locks every node that trusts only
// the old one out of new desired state.
func GenerateKeyPair(prefix string) (ed25519.PublicKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate a key pair: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("encode the private key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("encode the public key: %w", err)
	}
	keyFile, pubFile := prefix+".key", prefix+".pub"
	for _, f := range []string{keyFile, pubFile} {
		if _, err := os.Lstat(f); err == nil {
			return nil, fmt.Errorf("%s exists already; move it away first (a replaced signing key locks out the nodes that trust the old one)", f)
		}
	}
	if err := writeNew(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, err
	}
	if err := writeNew(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		os.Remove(keyFile)
		return nil, err
	}
	return pub, nil
}

func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// LoadPrivateKey reads a signing key. A file others may read is refused: whoever reads it can
// run anything on every node that trusts it.
func LoadPrivateKey(path string) (ed25519.PrivateKey, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&looseMode != 0 {
		return nil, fmt.Errorf("signing key %s has mode %04o: it must be readable by its owner only (chmod 600)", path, st.Mode().Perm())
	}
	block, err := readPEM(path, "PRIVATE KEY")
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", path, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("signing key %s: a %T, want an Ed25519 key (mqlet ctl keygen makes one)", path, k)
	}
	return priv, nil
}

// LoadPublicKey reads a trusted public key.
func LoadPublicKey(path string) (ed25519.PublicKey, error) {
	block, err := readPEM(path, "PUBLIC KEY")
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("public key %s: %w", path, err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("public key %s: a %T, want an Ed25519 key (mqlet ctl keygen makes one)", path, k)
	}
	return pub, nil
}

// LoadPublicKeys reads every file of paths; the first problem is the error.
func LoadPublicKeys(paths []string) ([]ed25519.PublicKey, error) {
	var out []ed25519.PublicKey
	for _, p := range paths {
		k, err := LoadPublicKey(p)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, nil
}

func readPEM(path, want string) (*pem.Block, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("%s: no PEM block (want %q)", path, want)
	}
	if block.Type != want {
		return nil, fmt.Errorf("%s: a PEM %q block, want %q", path, block.Type, want)
	}
	if extra, _ := pem.Decode(rest); extra != nil {
		return nil, errors.New(path + ": more than one PEM block")
	}
	return block, nil
}
