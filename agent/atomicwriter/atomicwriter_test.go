package atomicwriter

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestValidatePath(t *testing.T) {
	for _, ok := range []string{"a", "a/b/c", ".hidden", "a..b", "key.txt"} {
		if err := ValidatePath(ok); err != nil {
			t.Errorf("ValidatePath(%q) = %v, want nil", ok, err)
		}
	}
	for p, want := range map[string]string{
		"":                       "empty",
		"../x":                   "'..'",
		"a/../../b":              "'..'",
		"/etc/x":                 "relative",
		"..data":                 "start with '..'",
		"..x/y":                  "start with '..'",
		"a//b":                   "clean",
		"a/./b":                  "clean",
		"a/":                     "clean",
		strings.Repeat("n", 256): "longer than 255",
	} {
		if err := ValidatePath(p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidatePath(%q) = %v, want an error with %q", p, err, want)
		}
	}
}

func read(t *testing.T, dir string) map[string]string {
	t.Helper()
	got, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for k, v := range got {
		out[k] = string(v)
	}
	return out
}

func TestWriteSwapsAtomicallyAndCleansUp(t *testing.T) {
	dir := t.TempDir()
	none := Options{GID: -1}
	changed, err := Write(dir, map[string]File{"a": {Data: []byte("1"), Mode: 0o644}, "sub/b": {Data: []byte("2"), Mode: 0o600}}, none)
	if err != nil || !changed {
		t.Fatalf("first write: %v, %v", changed, err)
	}
	first, _ := os.Readlink(filepath.Join(dir, "..data"))
	if b, err := os.ReadFile(filepath.Join(dir, "sub", "b")); err != nil || string(b) != "2" {
		t.Fatalf("sub/b through the top-level link: %q %v", b, err)
	}
	if l, _ := os.Readlink(filepath.Join(dir, "a")); l != "..data/a" {
		t.Errorf("a links to %q, want ..data/a (relative, so it resolves inside a container)", l)
	}
	if st, _ := os.Stat(filepath.Join(dir, "sub", "b")); st.Mode().Perm() != 0o600 {
		t.Errorf("sub/b mode %v, want 0600", st.Mode())
	}

	if changed, err := Write(dir, map[string]File{"a": {Data: []byte("1"), Mode: 0o644}, "sub/b": {Data: []byte("2"), Mode: 0o600}}, none); err != nil || changed {
		t.Errorf("same payload again: changed=%v err=%v, want no write", changed, err)
	}
	if changed, _ := Write(dir, map[string]File{"a": {Data: []byte("1"), Mode: 0o640}, "sub/b": {Data: []byte("2"), Mode: 0o600}}, none); !changed {
		t.Errorf("a mode change was not written")
	}

	if _, err := Write(dir, map[string]File{"c": {Data: []byte("3"), Mode: 0o644}}, none); err != nil {
		t.Fatal(err)
	}
	if got := read(t, dir); len(got) != 1 || got["c"] != "3" {
		t.Errorf("after update: %v, want only c=3", got)
	}
	for _, gone := range []string{"a", "sub", first} {
		if _, err := os.Lstat(filepath.Join(dir, gone)); err == nil {
			t.Errorf("%s is left after the update", gone)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 3 { // ..data, the data dir, c
		t.Errorf("dir holds %d entries, want 3", len(entries))
	}
}

func TestWriteRefusesBadPathsWritingNothing(t *testing.T) {
	dir := t.TempDir()
	for _, payload := range []map[string]File{
		{"ok": {Data: []byte("x")}, "../escape": {Data: []byte("x")}},
		{"a": {Data: []byte("x")}, "a/b": {Data: []byte("y")}},
	} {
		if _, err := Write(dir, payload, Options{GID: -1}); err == nil {
			t.Errorf("Write(%v) succeeded", payload)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a refused payload left %d entries", len(entries))
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "escape")); err == nil {
		t.Errorf("a file was written outside the volume")
	}
}

func TestWriteGroup(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("chown to another group needs root")
	}
	dir := t.TempDir()
	if _, err := Write(dir, map[string]File{"d/f": {Data: []byte("x"), Mode: 0o400}}, Options{GID: 4321}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"d/f", "d"} {
		st, err := os.Stat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if gid := st.Sys().(*syscall.Stat_t).Gid; gid != 4321 {
			t.Errorf("%s: group %d, want 4321", p, gid)
		}
		if st.Mode().Perm()&0o040 == 0 {
			t.Errorf("%s: mode %v lacks group read", p, st.Mode())
		}
	}
	if st, _ := os.Stat(filepath.Join(dir, "d")); st.Mode()&os.ModeSetgid == 0 {
		t.Errorf("d: mode %v lacks setgid", st.Mode())
	}
	// Same content, other group: rewritten.
	if changed, _ := Write(dir, map[string]File{"d/f": {Data: []byte("x"), Mode: 0o400}}, Options{GID: 4322}); !changed {
		t.Errorf("a group change was not written")
	}
}
