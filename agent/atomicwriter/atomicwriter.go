// Package atomicwriter writes the files of a configMap, secret, downwardAPI or projected volume so
// that a container reading them never sees a mix of old and new content, the way kubelet's atomic
// writer does. The directory holds:
//
//	..2024_05_01_10_00_00.123456789/   the current data, in a hidden directory named for its time
//	..data -> ..2024_05_01_10_00_00.123456789
//	<name> -> ..data/<name>            one link per top-level name of the payload
//
// An update writes a new timestamped directory, swaps ..data to it with one rename (atomic), fixes
// the top-level links and removes the old directory. A bind mount of the whole directory follows
// the swap; a bind mount of one file (a subPath) keeps the file it was made from.
package atomicwriter

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// File is one file of a payload.
type File struct {
	Data []byte
	Mode os.FileMode // permission bits; 0 is taken as written (no access)
}

const (
	dataLink    = "..data"
	dataLinkTmp = "..data_tmp"
	// maxPathLength and maxNameLength are Linux's PATH_MAX and NAME_MAX.
	maxPathLength = 4096
	maxNameLength = 255
)

// ValidatePath checks a payload path (a key or an item's path): relative, clean, no '..'
// element, not starting with '..' (those names are the writer's own), within Linux's limits.
// It is the check every path from a manifest passes before it reaches the filesystem.
func ValidatePath(p string) error {
	switch {
	case p == "":
		return errors.New("must not be empty")
	case len(p) > maxPathLength:
		return fmt.Errorf("is longer than %d bytes", maxPathLength)
	case strings.HasPrefix(p, "/"):
		return errors.New("must be a relative path")
	case strings.ContainsRune(p, 0):
		return errors.New("must not contain NUL")
	}
	parts := strings.Split(p, "/")
	for i, part := range parts {
		switch {
		case part == "..":
			return errors.New("must not contain '..'")
		case part == "" || part == ".":
			return errors.New("must be a clean path (no empty or '.' elements, no trailing '/')")
		case len(part) > maxNameLength:
			return fmt.Errorf("element %q is longer than %d bytes", part[:16]+"...", maxNameLength)
		case i == 0 && strings.HasPrefix(part, ".."):
			return errors.New("must not start with '..'")
		}
	}
	return nil
}

// checkPayload validates every path and refuses a path that is also the directory of another.
func checkPayload(payload map[string]File) error {
	for p := range payload {
		if err := ValidatePath(p); err != nil {
			return fmt.Errorf("path %q: %w", p, err)
		}
	}
	for p := range payload {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, clash := payload[d]; clash {
				return fmt.Errorf("path %q is a file and also the directory of %q", d, p)
			}
		}
	}
	return nil
}

// Options say how the files are owned.
type Options struct {
	// GID, when >= 0, is the group given to every file and directory written (the pod's fsGroup),
	// with group read (and search, for directories) added and setgid set on directories, as
	// kubelet does for a read-only volume.
	GID int
}

// Write makes dir (which must exist) show exactly payload, atomically for a reader that goes
// through ..data or the top-level links. It does nothing and reports false when dir shows payload
// already. Every path is validated first; nothing is written when one is bad.
func Write(dir string, payload map[string]File, o Options) (changed bool, err error) {
	if err := checkPayload(payload); err != nil {
		return false, err
	}
	old, err := os.Readlink(filepath.Join(dir, dataLink))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("read %s: %w", filepath.Join(dir, dataLink), err)
	}
	if old != "" && !strings.HasPrefix(old, "..") || strings.Contains(old, "/") {
		return false, fmt.Errorf("%s points at %q, not at a data directory of this writer", filepath.Join(dir, dataLink), old)
	}
	if old != "" && same(filepath.Join(dir, old), payload, o) {
		return false, links(dir, payload)
	}

	ts, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		return false, err
	}
	if err := fill(ts, payload, o); err != nil {
		os.RemoveAll(ts)
		return false, err
	}
	tmp := filepath.Join(dir, dataLinkTmp)
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		os.RemoveAll(ts)
		return false, err
	}
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		os.RemoveAll(ts)
		return false, err
	}
	if err := os.Rename(tmp, filepath.Join(dir, dataLink)); err != nil {
		os.Remove(tmp)
		os.RemoveAll(ts)
		return false, fmt.Errorf("swap %s: %w", filepath.Join(dir, dataLink), err)
	}
	if err := links(dir, payload); err != nil {
		return true, err
	}
	return true, removeStale(dir, filepath.Base(ts))
}

// fill writes payload into the fresh directory ts.
func fill(ts string, payload map[string]File, o Options) error {
	if err := setPerm(ts, 0o755, true, o); err != nil {
		return err
	}
	for _, p := range slices.Sorted(maps.Keys(payload)) {
		f := payload[p]
		full := filepath.Join(ts, filepath.FromSlash(p))
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			// Parents first, each owned and moded like the top.
			if err := mkdirOwned(ts, d, o); err != nil {
				return err
			}
		}
		fd, err := os.OpenFile(full, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return err
		}
		_, werr := fd.Write(f.Data)
		cerr := fd.Close()
		if err := errors.Join(werr, cerr); err != nil {
			return fmt.Errorf("write %s: %w", full, err)
		}
		if err := setPerm(full, f.Mode, false, o); err != nil {
			return err
		}
	}
	return nil
}

func mkdirOwned(ts, rel string, o Options) error {
	full := filepath.Join(ts, filepath.FromSlash(rel))
	if err := os.Mkdir(full, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil
		}
		return err
	}
	return setPerm(full, 0o755, true, o)
}

// finalMode is the mode a file or directory ends up with.
func finalMode(mode os.FileMode, dir bool, o Options) os.FileMode {
	mode &= os.ModePerm
	if o.GID >= 0 {
		mode |= 0o040
		if dir {
			mode |= 0o010 | os.ModeSetgid
		}
	}
	return mode
}

func setPerm(p string, mode os.FileMode, dir bool, o Options) error {
	if o.GID >= 0 {
		if err := os.Lchown(p, -1, o.GID); err != nil {
			return err
		}
	}
	// Chmod after chown: chown clears setgid.
	return os.Chmod(p, finalMode(mode, dir, o))
}

// same reports whether the data directory ts holds exactly payload, with its modes and group.
func same(ts string, payload map[string]File, o Options) bool {
	seen := 0
	ok := true
	err := filepath.WalkDir(ts, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !ok {
			ok = false
			return filepath.SkipAll
		}
		if d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(ts, p)
		f, want := payload[filepath.ToSlash(rel)]
		info, ierr := d.Info()
		if !want || ierr != nil || !d.Type().IsRegular() || info.Mode() != finalMode(f.Mode, false, o) || !groupIs(info, o.GID) {
			ok = false
			return filepath.SkipAll
		}
		b, rerr := os.ReadFile(p)
		if rerr != nil || !bytes.Equal(b, f.Data) {
			ok = false
			return filepath.SkipAll
		}
		seen++
		return nil
	})
	return err == nil && ok && seen == len(payload)
}

func groupIs(info fs.FileInfo, gid int) bool {
	if gid < 0 {
		return true
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	return ok && int(st.Gid) == gid
}

// links makes a link "<name> -> ..data/<name>" for every top-level name of payload, and removes
// links of names the payload no longer has. Only symlinks are removed: nothing else is ours.
func links(dir string, payload map[string]File) error {
	top := map[string]bool{}
	for p := range payload {
		top[strings.SplitN(p, "/", 2)[0]] = true
	}
	for _, name := range slices.Sorted(maps.Keys(top)) {
		target := dataLink + "/" + name
		link := filepath.Join(dir, name)
		cur, err := os.Readlink(link)
		if err == nil && cur == target {
			continue
		}
		if err == nil || !errors.Is(err, fs.ErrNotExist) {
			if rerr := os.Remove(link); rerr != nil {
				return fmt.Errorf("replace %s: %w", link, rerr)
			}
		}
		if err := os.Symlink(target, link); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "..") || top[e.Name()] || e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// removeStale removes every data directory but the current one (the previous, and any a crash
// left half-written).
func removeStale(dir, current string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		n := e.Name()
		if !strings.HasPrefix(n, "..") || n == current || n == dataLink || !e.IsDir() {
			continue
		}
		errs = append(errs, os.RemoveAll(filepath.Join(dir, n)))
	}
	return errors.Join(errs...)
}

// Read returns what dir shows (for tests and for a comparison before writing): path -> content.
func Read(dir string) (map[string][]byte, error) {
	out := map[string][]byte{}
	root := filepath.Join(dir, dataLink)
	err := filepath.WalkDir(root+"/", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		b, err := os.ReadFile(p)
		out[filepath.ToSlash(rel)] = b
		return err
	})
	return out, err
}

// IsSetUp reports whether dir holds data written by Write.
func IsSetUp(dir string) bool {
	_, err := os.Readlink(filepath.Join(dir, dataLink))
	return err == nil
}
