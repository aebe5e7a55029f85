package ctrd

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// procFixture writes a /proc with the given processes: pid -> (parent pid, argv).
func procFixture(t *testing.T, procs map[int]struct {
	ppid int
	argv []string
}) string {
	t.Helper()
	root := t.TempDir()
	for pid, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		cmdline := strings.Join(p.argv, "\x00") + "\x00"
		stat := strconv.Itoa(pid) + " (odd (name)) S " + strconv.Itoa(p.ppid) + " 1 1 0 -1\n"
		if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(cmdline), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// Only shims of the namespace and of the containerd given are picked, with their children; other
// namespaces, another containerd with the same namespace name and other programs are not.
func TestReadShims(t *testing.T) {
	type proc = struct {
		ppid int
		argv []string
	}
	shim := func(ns, id, addr string) []string {
		return []string{"/usr/bin/containerd-shim-runc-v2", "-namespace", ns, "-id", id, "-address", addr}
	}
	root := procFixture(t, map[int]proc{
		100: {1, shim("mqlet", "abc-main-0", "/run/containerd/containerd.sock")},
		101: {100, []string{"sleep", "3600"}},
		200: {1, shim("k8s.io", "other", "/run/containerd/containerd.sock")},
		300: {1, shim("mqlet", "elsewhere", "/run/other/containerd.sock")},
		400: {1, []string{"/usr/bin/containerd", "-namespace", "mqlet", "-id", "x", "-address", "/run/containerd/containerd.sock"}},
		500: {1, shim("mqlet", "abc-main-1", "unix:///run/containerd/containerd.sock")},
	})
	shims, children, err := readShims(root, "mqlet", "/run/containerd/containerd.sock")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range shims {
		got = append(got, strconv.Itoa(s.pid)+"="+s.id)
	}
	slices.Sort(got)
	if want := []string{"100=abc-main-0", "500=abc-main-1"}; !slices.Equal(got, want) {
		t.Errorf("shims %v, want %v", got, want)
	}
	if !slices.Equal(children[100], []int{101}) {
		t.Errorf("children of 100: %v, want [101]", children[100])
	}
}
