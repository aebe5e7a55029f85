package beneath

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// tree makes <tmp>/root and, beside it, <tmp>/outside/secret: what a path below root must never
// reach. Inside root: data/f, and symlinks that stay in (relative, absolute, through "..") or lead
// out (to /, to the outside dir, up past the root), loops, dangling links.
func tree(t *testing.T) (root, outside string) {
	t.Helper()
	tmp := t.TempDir()
	root = filepath.Join(tmp, "root")
	outside = filepath.Join(tmp, "outside")
	for _, d := range []string{root, outside, filepath.Join(root, "data", "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(root, "data", "f"), "inside")
	write(t, filepath.Join(outside, "secret"), "secret")
	links := map[string]string{
		"rel-in":       "data",
		"abs-in":       filepath.Join(root, "data"),
		"dotdot-in":    "data/sub/../../data",
		"chain":        "rel-in",
		"data/sub/up":  "../f",
		"root-link":    "/",
		"up-out":       "../outside",
		"abs-out":      outside,
		"deep-out":     "data/../../outside",
		"loop-a":       "loop-b",
		"loop-b":       "loop-a",
		"self":         "self",
		"dangling-in":  "data/new",
		"dangling-out": filepath.Join(outside, "new"),
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	return root, outside
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func openRoot(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// sameFile reports whether the open file f is the file at path.
func sameFile(t *testing.T, f *os.File, path string) bool {
	t.Helper()
	got, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return os.SameFile(got, want)
}

// realPath is where the open file f really is, and closes it.
func realPath(t *testing.T, f *os.File) string {
	t.Helper()
	defer f.Close()
	p, err := fdPath(f)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// both runs a test with openat2 and with the per-component walk of kernels without it.
func both(t *testing.T, f func(t *testing.T, o Options)) {
	t.Run("openat2", func(t *testing.T) { f(t, Options{}) })
	t.Run("walk", func(t *testing.T) { f(t, Options{noOpenat2: true}) })
}

// Symlinks that stay below the root are followed, whatever their form; the file opened is the one
// they lead to.
func TestOpenFollowsSymlinksThatStayInside(t *testing.T) {
	both(t, func(t *testing.T, o Options) {
		root, _ := tree(t)
		r := openRoot(t, root)
		for rel, want := range map[string]string{
			"":                 "",
			"data":             "data",
			"data/f":           "data/f",
			"rel-in/f":         "data/f",
			"abs-in/f":         "data/f",
			"dotdot-in/f":      "data/f",
			"chain/f":          "data/f",
			"data/sub/up":      "data/f",
			"rel-in/sub/up":    "data/f",
			"./data//sub/./":   "data/sub",
			"dotdot-in/sub/up": "data/f",
		} {
			f, err := Open(r, rel, o)
			if err != nil {
				t.Errorf("Open %q: %v", rel, err)
				continue
			}
			if !sameFile(t, f, filepath.Join(root, want)) {
				t.Errorf("Open %q opened %s, want %s", rel, f.Name(), want)
			}
			f.Close()
		}
	})
}

// Every way out of the root is refused before anything is opened, naming where it leads: a link to
// /, an absolute or relative link outside, ".." in a link's target past the root, a link planted
// in the middle of the path; loops are an error; ".." and absolute paths in rel are refused as
// written.
func TestOpenRefusesEscapes(t *testing.T) {
	both(t, func(t *testing.T, o Options) {
		root, outside := tree(t)
		r := openRoot(t, root)
		for rel, target := range map[string]string{
			"root-link":         "/",
			"root-link/etc":     "/etc",
			"up-out/secret":     filepath.Join(outside, "secret"),
			"abs-out/secret":    filepath.Join(outside, "secret"),
			"deep-out/secret":   filepath.Join(outside, "secret"),
			"rel-in/../up-out":  "", // ".." in rel: refused as written
			"dangling-out":      filepath.Join(outside, "new"),
			"up-out":            outside,
			"chain/sub/../../x": "",
		} {
			f, err := Open(r, rel, Options{Create: CreateDirs, noOpenat2: o.noOpenat2})
			if err == nil {
				t.Errorf("Open %q opened %s; want it refused", rel, f.Name())
				f.Close()
				continue
			}
			var esc *EscapeError
			if target != "" && (!errors.As(err, &esc) || esc.Target != target || esc.Root != root) {
				t.Errorf("Open %q: %v; want an EscapeError to %s", rel, err, target)
			}
			if target == "" && !strings.Contains(err.Error(), "without '..'") {
				t.Errorf("Open %q: %v; want '..' refused", rel, err)
			}
		}
		for _, rel := range []string{"/etc", "/" + root} {
			if f, err := Open(r, rel, o); err == nil {
				t.Errorf("absolute %q opened %s", rel, f.Name())
				f.Close()
			}
		}
		for _, rel := range []string{"loop-a", "self/x", "loop-b/f"} {
			if _, err := Open(r, rel, o); !errors.Is(err, syscall.ELOOP) {
				t.Errorf("Open %q: %v; want ELOOP", rel, err)
			}
		}
		if _, err := os.Stat(filepath.Join(outside, "new")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a refused create made %s outside the root: %v", filepath.Join(outside, "new"), err)
		}
	})
}

// With NoSymlinks, any symlink on the way is refused, naming it, even one that stays inside.
func TestOpenNoSymlinks(t *testing.T) {
	both(t, func(t *testing.T, o Options) {
		root, _ := tree(t)
		r := openRoot(t, root)
		o.NoSymlinks = true
		f, err := Open(r, "data/f", o)
		if err != nil || !sameFile(t, f, filepath.Join(root, "data", "f")) {
			t.Fatalf("Open data/f without symlinks: %v", err)
		}
		f.Close()
		for _, rel := range []string{"rel-in/f", "data/sub/up", "root-link"} {
			var se *SymlinkError
			if _, err := Open(r, rel, o); !errors.As(err, &se) || se.Link == "" {
				t.Errorf("Open %q: %v; want a SymlinkError naming the link", rel, err)
			}
		}
	})
}

// The race the two steps exist for: a directory on the way is swapped for a symlink (to the outside,
// or even to a place inside) after step 1 resolved the path. Step 2 must fail rather than follow it.
func TestOpenComponentSwappedForSymlink(t *testing.T) {
	for _, target := range []string{"OUTSIDE", "../outside", "/", "sub2"} {
		both(t, func(t *testing.T, o Options) {
			root, outside := tree(t)
			os.MkdirAll(filepath.Join(root, "sub2"), 0o755)
			write(t, filepath.Join(outside, "f"), "outside")
			write(t, filepath.Join(root, "sub2", "f"), "inside-other")
			tgt := strings.ReplaceAll(target, "OUTSIDE", outside)
			r := openRoot(t, root)
			o.afterResolve = func() {
				if err := os.Rename(filepath.Join(root, "data"), filepath.Join(root, "data.old")); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(tgt, filepath.Join(root, "data")); err != nil {
					t.Fatal(err)
				}
			}
			f, err := Open(r, "data/f", o)
			if err == nil {
				t.Fatalf("data swapped for a link to %s after resolving: opened %s", tgt, realPath(t, f))
			}
			var se *SymlinkError
			if !errors.As(err, &se) {
				t.Errorf("swapped to %s: %v; want a SymlinkError", tgt, err)
			}
		})
	}
	// The last component swapped for a link, too.
	both(t, func(t *testing.T, o Options) {
		root, outside := tree(t)
		r := openRoot(t, root)
		o.afterResolve = func() {
			os.Remove(filepath.Join(root, "data", "f"))
			os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "data", "f"))
		}
		if f, err := Open(r, "data/f", o); err == nil {
			t.Errorf("last component swapped for a link: opened %s", realPath(t, f))
			f.Close()
		}
	})
}

// Create makes what is missing below the root, through links that stay inside, and never through
// one planted where it is about to create (mkdirat/openat relative to the parent, O_NOFOLLOW).
func TestOpenCreate(t *testing.T) {
	both(t, func(t *testing.T, o Options) {
		root, outside := tree(t)
		r := openRoot(t, root)

		o.Create = CreateDirs
		f, err := Open(r, "rel-in/a/b/c", o)
		if err != nil {
			t.Fatalf("CreateDirs rel-in/a/b/c: %v", err)
		}
		if fi, _ := f.Stat(); !fi.IsDir() || !sameFile(t, f, filepath.Join(root, "data", "a", "b", "c")) {
			t.Errorf("CreateDirs made %s", f.Name())
		}
		f.Close()

		o.Create = CreateFile
		f, err = Open(r, "dangling-in", o) // the link's missing target is made, inside
		if err != nil {
			t.Fatalf("CreateFile through dangling-in: %v", err)
		}
		if fi, _ := f.Stat(); !fi.Mode().IsRegular() || !sameFile(t, f, filepath.Join(root, "data", "new")) {
			t.Errorf("CreateFile made %s", f.Name())
		}
		f.Close()
		if _, err := Open(r, "data/no-parent/f", o); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "parent") {
			t.Errorf("CreateFile without its parent: %v; want not-exist naming the parent", err)
		}
		o.Create = CreateNothing
		if _, err := Open(r, "data/missing", o); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("missing without Create: %v; want fs.ErrNotExist", err)
		}

		// A link planted where a directory or file is about to be made.
		for _, c := range []Create{CreateDirs, CreateFile} {
			name := "planted" + string(rune('0'+c))
			o.Create = c
			o.afterResolve = func() { os.Symlink(outside, filepath.Join(root, "data", name)) }
			f, err := Open(r, "data/"+name, o)
			if err == nil {
				t.Errorf("create %d: followed a link planted at data/%s to %s", c, name, realPath(t, f))
				f.Close()
			}
			o.afterResolve = nil
		}
		if ents, _ := os.ReadDir(outside); len(ents) != 1 {
			t.Errorf("something was made outside the root: %v", ents)
		}
	})
}

// resolve follows ".." in a link's target from the link's directory, as the kernel does, and a
// missing tail after a link is judged where the link leads.
func TestResolve(t *testing.T) {
	root, outside := tree(t)
	for rel, want := range map[string]string{
		"abs-in/sub/../f":   "data/f",
		"chain/../data/sub": "data/sub",
		"rel-in/x/y":        "data +[x y]",
	} {
		have, missing, err := resolve(root, rel, true)
		got := have
		if len(missing) > 0 {
			got += " +[" + strings.Join(missing, " ") + "]"
		}
		if err != nil || got != want {
			t.Errorf("resolve %q = %q, %v; want %q", rel, got, err, want)
		}
	}
	var esc *EscapeError
	if _, _, err := resolve(root, "abs-out/new/deeper", true); !errors.As(err, &esc) || esc.Target != filepath.Join(outside, "new", "deeper") {
		t.Errorf("missing tail outside: %v", err)
	}
}
