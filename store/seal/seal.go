// Package seal encrypts small values (a Secret record in the state file) under a node key with
// AES-256-GCM, so that what reaches the flash is never the secret in clear.
//
// The key is 32 random bytes in a file of its own (LoadOrCreateKey), apart from the state file:
// a copied or imaged state file alone does not give the secrets away. Losing the key loses the
// sealed values, which is acceptable because every one of them can be delivered again by its
// source.
//
// A sealed value is
//
//	version (1 byte, 1) || nonce (12 bytes, random) || ciphertext || GCM tag (16 bytes)
//
// and the version byte and the caller's additional data are both authenticated: a value opens
// only under the key and additional data it was sealed with (the store passes the record's key,
// so a sealed value copied to another record does not open there).
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// KeySize is the size of a node key: AES-256.
const KeySize = 32

// version is the first byte of every sealed value, so that another layout (a key id, another
// cipher) can be told apart later instead of failing as "damaged".
const version = 1

// Overhead is how many bytes Seal adds to a value: version, nonce and tag.
const Overhead = 1 + 12 + 16

// ErrOpen is what Open wraps when a value does not open: sealed under another key or other
// additional data, damaged, or not a sealed value at all.
var ErrOpen = errors.New("cannot open sealed value")

// Box seals and opens values under one key. It is safe for concurrent use.
type Box struct {
	aead cipher.AEAD
}

// New returns a Box for key, which must be KeySize bytes.
func New(key []byte) (*Box, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("seal: key is %d bytes, want %d (AES-256)", len(key), KeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	// Random nonces rather than a counter: a counter would have to be stored and could go back
	// with a restored backup, and reusing a GCM nonce under one key gives the plaintexts away.
	// The 2^32-messages limit of random 96-bit nonces is far above what a node seals.
	aead, err := cipher.NewGCMWithRandomNonce(block)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	return &Box{aead: aead}, nil
}

// Seal encrypts plain and authenticates it together with additionalData, which is not stored:
// Open needs the same additionalData.
func (b *Box) Seal(plain, additionalData []byte) []byte {
	out := make([]byte, 1, Overhead+len(plain))
	out[0] = version
	return b.aead.Seal(out, nil, plain, withVersion(additionalData))
}

// Open decrypts a value made by Seal with the same key and additionalData. Any mismatch is an
// error wrapping ErrOpen; nothing of the plaintext is returned then.
func (b *Box) Open(sealed, additionalData []byte) ([]byte, error) {
	if len(sealed) < Overhead {
		return nil, fmt.Errorf("%w: %d bytes, shorter than any sealed value (%d)", ErrOpen, len(sealed), Overhead)
	}
	if sealed[0] != version {
		return nil, fmt.Errorf("%w: format version %d, this binary knows %d", ErrOpen, sealed[0], version)
	}
	plain, err := b.aead.Open(nil, nil, sealed[1:], withVersion(additionalData))
	if err != nil {
		return nil, fmt.Errorf("%w: sealed under another node key or for another record, or damaged: %w", ErrOpen, err)
	}
	return plain, nil
}

// withVersion puts the version byte in front of the additional data, so that the byte is
// authenticated: a value cannot be passed off as another format.
func withVersion(ad []byte) []byte {
	out := make([]byte, 0, 1+len(ad))
	return append(append(out, version), ad...)
}

// LoadOrCreateKey reads the node key at path, creating it (KeySize random bytes, mode 0600, and
// the parent directory with mode 0700 if it is missing) when there is no file yet. An existing
// file of the wrong size, or one that group or others may read or write, is refused with an
// error that names the path and the fix: such a key is either not the node's key or no longer
// secret, and carrying on with it would seal secrets that cannot be opened or are not protected.
func LoadOrCreateKey(path string) ([]byte, error) {
	if path == "" {
		return nil, errors.New("node key: empty path")
	}
	key, err := readKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	if err := createKey(path); err != nil {
		return nil, err
	}
	// Read back what is on disk: another process may have created the file first, and its key
	// is the one that counts.
	return readKey(path)
}

func readKey(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("read node key %s: %w", path, err)
	}
	defer f.Close()
	// Checked on the open file, not on the path, so the file read is the file checked.
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read node key %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("read node key %s: not a regular file (%s); move it aside so that a new key is created", path, st.Mode().Type())
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("read node key %s: mode %04o lets group or others at it, refusing a key that may no longer be secret: "+
			"chmod 600 %s (and consider the secrets sealed under it exposed)", path, perm, path)
	}
	if st.Size() != KeySize {
		return nil, fmt.Errorf("read node key %s: file is %d bytes, want %d: it is not a node key or it was damaged; "+
			"restore this node's key, or move it aside (mv %s %s.bad) to create a new one "+
			"(secrets stored under the old key then read as record errors until their sources deliver them again)",
			path, st.Size(), KeySize, path, path)
	}
	key := make([]byte, KeySize)
	if _, err := io.ReadFull(f, key); err != nil {
		return nil, fmt.Errorf("read node key %s: %w", path, err)
	}
	return key, nil
}

// createKey writes a new key under a temporary name and links it to path, so that path is
// either absent or a whole, synced key: a power cut while writing must not leave a short key
// file, which would then be refused at every start. Link, unlike rename, fails if path appeared
// meanwhile, so a key another process just created is never replaced.
func createKey(path string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create node key %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".new-*") // mode 0600
	if err != nil {
		return fmt.Errorf("create node key %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	key := make([]byte, KeySize)
	rand.Read(key) // never fails (it crashes the program instead)
	_, err = tmp.Write(key)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("create node key %s: write %s: %w", path, tmp.Name(), err)
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create node key %s: %w", path, err)
	}
	// The new directory entry must be on disk before anything is sealed under the key.
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("create node key %s: sync directory: %w", path, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("create node key %s: sync directory %s: %w", path, dir, err)
	}
	return nil
}
