// Package beneath opens a path below a directory so that nothing a container can write (a symlink,
// a "..", a directory swapped for a link at the wrong moment) leads the open out of that directory.
//
// A hostPath or a subPath names a place by a path string, but a container that can write below the
// volume can turn any component of that path into a symlink. Checking the string and then handing it
// to runc leaves a window (kubelet's CVE-2017-1002101). Open closes it in two steps:
//
//  1. It follows the path on the host as the kernel would, symlinks included, only reading (lstat,
//     readlink), and checks that the place it reaches lies below the root. A symlink that stays
//     inside (data/current -> v2, or an absolute one into the root) is fine; one that leads out is
//     refused, naming where it leads.
//  2. It opens what step 1 found, relative to the root's file descriptor, refusing every symlink
//     and every ".." on the way: openat2 with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, or, on a kernel
//     without openat2, one O_PATH|O_NOFOLLOW openat per component. If anything was swapped since
//     step 1, this open fails; it never follows the new link.
//
// Only the file step 2 returns is trusted: the caller mounts that file (by its /proc fd path), never
// the path string again. Missing parts are made (Options.Create) relative to the file descriptor of
// their parent, never through a link.
package beneath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Create says what Open makes when the path does not exist.
type Create int

const (
	// CreateNothing: a missing path is an error wrapping fs.ErrNotExist.
	CreateNothing Create = iota
	// CreateDirs: every missing component is made a directory (parents too, like os.MkdirAll).
	CreateDirs
	// CreateFile: a missing last component is made an empty regular file; its parent must exist,
	// as kubelet's FileOrCreate does not make parents.
	CreateFile
)

// Options tune Open.
type Options struct {
	Create Create
	// Perm is the permission bits of what Create makes, set exactly (whatever the umask); 0 means
	// 0755 for a directory and 0644 for a file, less the umask, as os.MkdirAll and os.Create do.
	Perm os.FileMode
	// NoSymlinks refuses every symlink on the way, even one that would stay below the root: for a
	// path whose root is "/" only because no narrower one is known.
	NoSymlinks bool

	// noOpenat2 takes the per-component walk, as on a kernel without openat2 (tests).
	noOpenat2 bool
	// afterResolve runs between the two steps (tests: a container changing the tree then).
	afterResolve func()
}

// maxSymlinks is the kernel's limit on symlinks followed in one lookup (MAXSYMLINKS).
const maxSymlinks = 40

// EscapeError is a path that leads out of its root through a symlink (or a ".." in a link's target).
type EscapeError struct {
	Path   string // the path as asked, on the host: root + rel
	Target string // where following it leads, on the host
	Root   string // the root's real path
}

func (e *EscapeError) Error() string {
	return fmt.Sprintf("%s resolves to %s, outside %s", e.Path, e.Target, e.Root)
}

// SymlinkError is a symlink met on the way when none may be followed (Options.NoSymlinks), or one
// that appeared after the path was resolved (a component swapped for a link while Open ran).
type SymlinkError struct {
	Path string // the path as asked, on the host
	Link string // the component found to be a symlink, when known
}

func (e *SymlinkError) Error() string {
	if e.Link != "" {
		return fmt.Sprintf("%s: %s is a symlink, and no symlink is followed here", e.Path, e.Link)
	}
	return fmt.Sprintf("%s: a symlink appeared on the way while it was opened (changed under us); not followed", e.Path)
}

// Open opens rel below the directory root with O_PATH (O_RDONLY for a file it created) and returns
// the file, named by the host path it was found at. rel must be relative and hold no ".."; symlinks
// on the way are followed while they stay below root (none with Options.NoSymlinks). root stays
// open and the caller's.
func Open(root *os.File, rel string, o Options) (*os.File, error) {
	rootPath, err := fdPath(root)
	if err != nil {
		return nil, err
	}
	asked := filepath.Join(rootPath, rel)
	if filepath.IsAbs(rel) || slices.Contains(strings.Split(filepath.ToSlash(rel), "/"), "..") {
		return nil, fmt.Errorf("%q must be a relative path without '..' (below %s)", rel, rootPath)
	}
	have, missing, err := resolve(rootPath, rel, !o.NoSymlinks)
	if err != nil {
		return nil, err
	}
	if o.afterResolve != nil {
		o.afterResolve()
	}
	f, err := openNoSymlinks(root, have, filepath.Join(rootPath, have), asked, o.noOpenat2)
	if err != nil {
		return nil, err
	}
	if len(missing) == 0 {
		return f, nil
	}
	defer f.Close()
	return create(f, missing, asked, o)
}

// fdPath is the host path the kernel has for an open file.
func fdPath(f *os.File) (string, error) {
	p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(f.Fd())))
	if err != nil {
		return "", fmt.Errorf("path of open directory %s: %w", f.Name(), err)
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("open directory %s is not on a path of this mount namespace (%s)", f.Name(), p)
	}
	return p, nil
}

// resolve is step 1: it follows rel from rootPath through the host's file system as path lookup
// would, reading only, and returns the part that exists (relative to rootPath, symlink-free) and the
// missing rest. Where it leads must lie below rootPath. It proves nothing by itself (the tree may
// change right after); it finds what step 2 then opens without following anything.
func resolve(rootPath, rel string, follow bool) (have string, missing []string, err error) {
	asked := filepath.Join(rootPath, rel)
	cur := rootPath
	queue := splitPath(rel)
	links := 0
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		if name == ".." { // only from a link's target: rel itself holds none
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, name)
		fi, err := os.Lstat(next)
		if errors.Is(err, fs.ErrNotExist) {
			missing = append([]string{name}, queue...)
			break
		}
		if err != nil {
			return "", nil, fmt.Errorf("resolve %s: %w", asked, err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			if !follow {
				return "", nil, &SymlinkError{Path: asked, Link: next}
			}
			if links++; links > maxSymlinks {
				return "", nil, fmt.Errorf("resolve %s: more than %d symlinks on the way (a loop?): %w", asked, maxSymlinks, unix.ELOOP)
			}
			target, err := os.Readlink(next)
			if err != nil {
				return "", nil, fmt.Errorf("resolve %s: %w", asked, err)
			}
			if filepath.IsAbs(target) {
				cur = "/"
			}
			queue = append(splitPath(target), queue...)
			continue
		}
		if !fi.IsDir() && len(queue) > 0 {
			return "", nil, fmt.Errorf("resolve %s: %s is not a directory: %w", asked, next, unix.ENOTDIR)
		}
		cur = next
	}
	if !below(cur, rootPath) {
		target := cur
		if len(missing) > 0 {
			target = filepath.Join(append([]string{cur}, missing...)...)
		}
		return "", nil, &EscapeError{Path: asked, Target: target, Root: rootPath}
	}
	if slices.Contains(missing, "..") {
		// The kernel fails on the missing component before it gets to "..": so does Open.
		return "", nil, &fs.PathError{Op: "resolve", Path: asked, Err: fs.ErrNotExist}
	}
	have, err = filepath.Rel(rootPath, cur)
	if err != nil {
		return "", nil, fmt.Errorf("resolve %s: %w", asked, err)
	}
	return have, missing, nil
}

// splitPath splits p into its components without the empty and "." ones.
func splitPath(p string) []string {
	return slices.DeleteFunc(strings.Split(p, "/"), func(s string) bool { return s == "" || s == "." })
}

// below reports whether the clean absolute path p is root or lies below it.
func below(p, root string) bool {
	return root == "/" || p == root || strings.HasPrefix(p, root+"/")
}

// openHow is step 2's lookup: relative to the root's descriptor, never above it, no symlink (nor
// /proc magic link) followed, not even as the last component (no O_NOFOLLOW: with O_PATH it would
// return the link itself rather than fail).
var openHow = unix.OpenHow{
	Flags:   unix.O_PATH | unix.O_CLOEXEC,
	Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
}

// openNoSymlinks is step 2: it opens rel (symlink-free, no "..") below root, failing on any
// symlink. name is the file's host path; asked names the path in errors.
func openNoSymlinks(root *os.File, rel, name, asked string, noOpenat2 bool) (*os.File, error) {
	if rel == "" {
		rel = "."
	}
	if !noOpenat2 {
		for range 8 {
			how := openHow
			fd, err := unix.Openat2(int(root.Fd()), rel, &how)
			if err == nil {
				return checkNotLink(os.NewFile(uintptr(fd), name), asked)
			}
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue // a rename raced the lookup: the kernel asks to try again
			}
			if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
				// No openat2 (before Linux 5.6), or a seccomp filter that refuses it with EPERM:
				// walk instead, which is as strict and only slower.
				break
			}
			return nil, lookupErr(asked, err)
		}
	}
	return walkNoSymlinks(root, rel, asked, name)
}

// walkNoSymlinks opens rel below root one component at a time, each with O_PATH|O_NOFOLLOW relative
// to the directory before it, refusing any symlink: the fallback for kernels without openat2.
func walkNoSymlinks(root *os.File, rel, asked, name string) (*os.File, error) {
	fd, err := unix.Openat(int(root.Fd()), ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, lookupErr(asked, err)
	}
	parts := splitPath(rel)
	for i, p := range parts {
		if p == ".." { // RESOLVE_BENEATH's rule: step 1 never yields one; nothing goes above root
			unix.Close(fd)
			return nil, lookupErr(asked, unix.EXDEV)
		}
		next, err := unix.Openat(fd, p, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return nil, lookupErr(asked, err)
		}
		fd = next
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return nil, lookupErr(asked, err)
		}
		switch {
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			unix.Close(fd)
			return nil, &SymlinkError{Path: asked}
		case i < len(parts)-1 && st.Mode&unix.S_IFMT != unix.S_IFDIR:
			unix.Close(fd)
			return nil, lookupErr(asked, unix.ENOTDIR)
		}
	}
	return os.NewFile(uintptr(fd), name), nil
}

// lookupErr words a failed step-2 lookup: a symlink or an escape there means the tree changed after
// step 1 resolved it.
func lookupErr(asked string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return &SymlinkError{Path: asked}
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("open %s: the path left its root while it was opened (changed under us): %w", asked, err)
	}
	return &fs.PathError{Op: "open", Path: asked, Err: err}
}

// checkNotLink makes sure f is not a symlink itself; it closes f if it is.
func checkNotLink(f *os.File, asked string) (*os.File, error) {
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, &fs.PathError{Op: "stat", Path: asked, Err: err}
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		f.Close()
		return nil, &SymlinkError{Path: asked}
	}
	return f, nil
}

// create makes the missing components below dir (an open directory) as o.Create asks, each relative
// to the descriptor of its parent and opened without following a link, so a symlink planted between
// two steps is refused rather than followed.
func create(dir *os.File, missing []string, asked string, o Options) (*os.File, error) {
	notExist := &fs.PathError{Op: "open", Path: asked, Err: fs.ErrNotExist}
	switch o.Create {
	case CreateNothing:
		return nil, notExist
	case CreateFile:
		if len(missing) > 1 {
			return nil, fmt.Errorf("create file %s: its parent %s does not exist: %w", asked,
				filepath.Join(dir.Name(), missing[0]), fs.ErrNotExist)
		}
		perm := o.Perm
		if perm == 0 {
			perm = 0o644
		}
		return createFile(dir, missing[0], asked, perm, o.Perm != 0)
	}
	perm := o.Perm
	if perm == 0 {
		perm = 0o755
	}
	cur := dir
	for _, name := range missing {
		next, err := mkdirOpen(cur, name, asked, perm, o.Perm != 0)
		if cur != dir {
			cur.Close()
		}
		if err != nil {
			return nil, err
		}
		cur = next
	}
	return cur, nil
}

// createFile makes name in dir an empty regular file and returns it open (O_RDONLY). When something
// appeared there meanwhile, that is opened instead, never through a symlink.
func createFile(dir *os.File, name, asked string, perm os.FileMode, exact bool) (*os.File, error) {
	path := filepath.Join(dir.Name(), name)
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err == nil {
		f := os.NewFile(uintptr(fd), path)
		if exact {
			if err := f.Chmod(perm.Perm()); err != nil {
				f.Close()
				return nil, fmt.Errorf("create file %s: %w", asked, err)
			}
		}
		return f, nil
	}
	if !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("create file %s: %w", asked, err)
	}
	fd, err = unix.Openat(int(dir.Fd()), name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, lookupErr(asked, err)
	}
	return checkNotLink(os.NewFile(uintptr(fd), path), asked)
}

// mkdirOpen makes name a directory in dir (or finds one there) and opens it without following a
// symlink: if a link was put in its place, the open fails.
func mkdirOpen(dir *os.File, name, asked string, perm os.FileMode, exact bool) (*os.File, error) {
	made := true
	if err := unix.Mkdirat(int(dir.Fd()), name, uint32(perm.Perm())); errors.Is(err, unix.EEXIST) {
		made = false
	} else if err != nil {
		return nil, fmt.Errorf("create directory %s: %w", filepath.Join(dir.Name(), name), err)
	}
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("create directory %s: something else than a directory is there (%w); not followed",
				filepath.Join(dir.Name(), name), err)
		}
		return nil, lookupErr(asked, err)
	}
	f, err := checkNotLink(os.NewFile(uintptr(fd), filepath.Join(dir.Name(), name)), asked)
	if err != nil || !made || !exact {
		return f, err
	}
	// fchmod refuses an O_PATH descriptor; chmod of its /proc link reaches exactly this directory.
	if err := os.Chmod("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), perm.Perm()); err != nil {
		f.Close()
		return nil, fmt.Errorf("create directory %s: %w", f.Name(), err)
	}
	return f, nil
}

// OpenDir opens the directory at path (following symlinks: it names a root the caller trusts, such
// as an allowed host path from the agent's config or a volume directory the agent made) with O_PATH.
func OpenDir(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open directory", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}
