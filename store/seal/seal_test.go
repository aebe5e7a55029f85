package seal

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func testBox(t *testing.T) *Box {
	t.Helper()
	b, err := New(bytes.Repeat([]byte{7}, KeySize))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSealOpen(t *testing.T) {
	b := testBox(t)
	plain := []byte("hunter2-distinctive-plaintext")
	ad := []byte("objects/Secret/default/db")
	sealed := b.Seal(plain, ad)
	if len(sealed) != len(plain)+Overhead {
		t.Errorf("sealed is %d bytes, want %d", len(sealed), len(plain)+Overhead)
	}
	if bytes.Contains(sealed, plain) || bytes.Contains(sealed, plain[:8]) {
		t.Fatalf("sealed value holds the plaintext")
	}
	if again := b.Seal(plain, ad); bytes.Equal(again, sealed) {
		t.Errorf("two seals of one value are equal: the nonce is not fresh")
	}
	got, err := b.Open(sealed, ad)
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("Open = %q, %v; want the plaintext", got, err)
	}
	// Nothing in plain is shared with what Seal returned.
	plain[0] = 'X'
	if got, _ := b.Open(sealed, ad); got[0] != 'h' {
		t.Errorf("sealed value aliases the plaintext")
	}
	if got, err := b.Open(b.Seal(nil, ad), ad); err != nil || len(got) != 0 {
		t.Errorf("empty value: Open = %q, %v", got, err)
	}
}

func TestOpenRefuses(t *testing.T) {
	b := testBox(t)
	ad := []byte("objects/Secret/default/db")
	sealed := b.Seal([]byte("value"), ad)
	other, err := New(bytes.Repeat([]byte{8}, KeySize))
	if err != nil {
		t.Fatal(err)
	}
	flip := func(i int) []byte {
		c := bytes.Clone(sealed)
		c[i] ^= 1
		return c
	}
	for name, tc := range map[string]struct {
		box    *Box
		sealed []byte
		ad     []byte
	}{
		"other key":             {other, sealed, ad},
		"other additional data": {b, sealed, []byte("objects/Secret/default/other")},
		"no additional data":    {b, sealed, nil},
		"flipped version":       {b, flip(0), ad},
		"flipped nonce":         {b, flip(3), ad},
		"flipped ciphertext":    {b, flip(14), ad},
		"flipped tag":           {b, flip(len(sealed) - 1), ad},
		"truncated":             {b, sealed[:Overhead-1], ad},
		"clear text":            {b, []byte(`{"data":{"password":"aHVudGVyMg=="}}`), ad},
	} {
		got, err := tc.box.Open(tc.sealed, tc.ad)
		if err == nil || !errors.Is(err, ErrOpen) || got != nil {
			t.Errorf("%s: Open = %q, %v; want nil and an ErrOpen", name, got, err)
		}
	}
}

func TestNewRefusesWrongKeySize(t *testing.T) {
	for _, n := range []int{0, 16, 24, 31, 33} {
		if _, err := New(make([]byte, n)); err == nil || !strings.Contains(err.Error(), "32") {
			t.Errorf("New(%d-byte key) = %v, want an error naming the size", n, err)
		}
	}
}

func TestLoadOrCreateKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys", "nested")
	path := filepath.Join(dir, "node.key")
	key, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if len(key) != KeySize || bytes.Equal(key, make([]byte, KeySize)) {
		t.Fatalf("key %x: want %d random bytes", key, KeySize)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v, %v; want 0600", st.Mode(), err)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("key dir mode %v, %v; want 0700", st.Mode(), err)
	}
	again, err := LoadOrCreateKey(path)
	if err != nil || !bytes.Equal(again, key) {
		t.Errorf("second load = %x, %v; want the same key", again, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("key dir holds %d entries, want only the key (no temporary files)", len(entries))
	}
	other, err := LoadOrCreateKey(filepath.Join(dir, "other.key"))
	if err != nil || bytes.Equal(other, key) {
		t.Errorf("a second key file gave %x, %v; want a different key", other, err)
	}
}

// Processes that start together must end up with one key, not each their own.
func TestLoadOrCreateKeyConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.key")
	const n = 16
	keys := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { keys[i], errs[i] = LoadOrCreateKey(path) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || !bytes.Equal(keys[i], keys[0]) {
			t.Errorf("caller %d: key %x, %v; want the same key as caller 0 (%x)", i, keys[i], errs[i], keys[0])
		}
	}
}

func TestLoadOrCreateKeyRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		setup func(t *testing.T, path string)
		want  []string
	}{
		"readable by group": {func(t *testing.T, path string) {
			writeKey(t, path, make([]byte, KeySize), 0o640)
		}, []string{"0640", "chmod 600"}},
		"readable by others": {func(t *testing.T, path string) {
			writeKey(t, path, make([]byte, KeySize), 0o604)
		}, []string{"0604", "chmod 600"}},
		"too short": {func(t *testing.T, path string) {
			writeKey(t, path, make([]byte, 16), 0o600)
		}, []string{"16 bytes", "want 32", "mv "}},
		"empty": {func(t *testing.T, path string) {
			writeKey(t, path, nil, 0o600)
		}, []string{"0 bytes", "mv "}},
		"too long": {func(t *testing.T, path string) {
			writeKey(t, path, make([]byte, 64), 0o600)
		}, []string{"64 bytes"}},
		"a directory": {func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}, []string{"not a regular file"}},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "node.key")
			tc.setup(t, path)
			before, _ := os.ReadFile(path)
			key, err := LoadOrCreateKey(path)
			if err == nil || key != nil {
				t.Fatalf("LoadOrCreateKey = %x, %v; want a refusal", key, err)
			}
			for _, w := range append(tc.want, path) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
				t.Errorf("a refused key file was changed")
			}
		})
	}
	if _, err := LoadOrCreateKey(""); err == nil {
		t.Errorf("LoadOrCreateKey(\"\") succeeded")
	}
}

func writeKey(t *testing.T, path string, b []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}
