package ctrd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/agent/ctrd/beneath"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// ReasonFailedMount is the waiting reason of a container whose volume cannot be set up yet (a
// hostPath of the wrong type, or missing): kubelet reports it with a FailedMount event and keeps
// trying, and so the pod waits, and starts once the path is right.
const ReasonFailedMount = "FailedMount"

// MountError is a volume that cannot be mounted now but may be later (the host path may appear):
// the container waits with ReasonFailedMount and is retried with back-off.
type MountError struct {
	Volume string
	Err    error
}

func (e *MountError) Error() string {
	return fmt.Sprintf("MountVolume.SetUp failed for volume %q: %v", e.Volume, e.Err)
}
func (e *MountError) Unwrap() error { return e.Err }

// startErr is the StartError for an error building a container's spec: a MountError keeps its own
// reason, unless it is a ctrspec.ConfigError too (a missing ConfigMap or Secret behind an object volume);
// anything else is a CreateContainerConfigError.
func startErr(err error) *StartError {
	if se, ok := err.(*StartError); ok {
		return se
	}
	if _, ok := errors.AsType[*ctrspec.ConfigError](err); ok {
		return &StartError{"CreateContainerConfigError", err}
	}
	if _, ok := errors.AsType[*MountError](err); ok {
		return &StartError{ReasonFailedMount, err}
	}
	return &StartError{"CreateContainerConfigError", err}
}

// hostPathScope is where a hostPath volume's path is opened from: the directory it must lie
// beneath, and whether symlinks on the way may be followed (while they stay beneath it).
type hostPathScope struct {
	root       string
	noSymlinks bool
	trusted    bool   // any link is followed, by the kernel's lookup (root is "/")
	what       string // how messages name the root
}

// hostPathScopeOf decides, from what admission recorded on the pod, how v's path is opened:
//
//   - a manifest-dir pod is trusted (whoever writes the manifest dir is root on the node): beneath
//     "/", symlinks followed as the kernel would. It still gets the type check and the mount from
//     one open file, so nothing changes between the two.
//   - a pod admitted under the policy (MQTT) beneath the allowed host path admission recorded for
//     the volume (admission.AnnotationHostPathRoots): symlinks are followed only while they stay
//     beneath it. A pod that can write there can plant `ln -s / escape`; that link is refused.
//   - any other pod (one admitted before the roots were recorded) beneath "/" with no symlink
//     followed at all: with no root known, no link can be judged.
func hostPathScopeOf(pod *v1.Pod, v v1.Volume) (hostPathScope, error) {
	if pod.Annotations[admission.AnnotationConfigSource] == admission.ConfigSourceFile {
		return hostPathScope{root: "/", trusted: true, what: "the host (manifest-dir pod)"}, nil
	}
	roots, err := admission.HostPathRoots(pod)
	if err != nil {
		return hostPathScope{}, err
	}
	if root, ok := roots[v.Name]; ok {
		if !filepath.IsAbs(root) || filepath.Clean(root) != root {
			return hostPathScope{}, fmt.Errorf("allowed host path %q recorded at admission is not absolute and clean", root)
		}
		return hostPathScope{root: root, what: "the allowed host path " + root}, nil
	}
	return hostPathScope{root: "/", noSymlinks: true, what: "the host, with no symlink followed (no allowed host path recorded for this pod)"}, nil
}

// openHostPath checks (and for the *OrCreate types makes) the host path of volume v as kubelet's
// hostPath plugin does before every mount, and returns it open (O_PATH) as the bind mount's source:
// the container gets exactly the file checked here, whatever is renamed or linked afterwards.
//
//   - "" (unset): no check; a missing path is made a directory (0755), as containerd's CRI does
//     for kubelet, rather than failing in runc.
//   - DirectoryOrCreate: a missing path becomes a directory (0755, parents too); then as Directory.
//   - FileOrCreate: a missing path becomes an empty file (0644); its parent must exist (kubelet
//     does not make it); then as File.
//   - Directory, File, Socket, CharDevice, BlockDevice: the path must exist and be of that type,
//     symlinks followed as hostPathScopeOf allows.
//
// The path is opened beneath its scope's root (beneath.Open): a symlink that leads out of it, one
// swapped in while the path is opened, or anything made through a link is refused with a
// MountError naming the path and the reason, and the container waits and is tried again.
func openHostPath(pod *v1.Pod, v v1.Volume) (*os.File, error) {
	hp := v.HostPath
	path := hp.Path
	fail := func(format string, a ...any) error {
		return &MountError{Volume: v.Name, Err: fmt.Errorf(format, a...)}
	}
	typ := v1.HostPathUnset
	if hp.Type != nil {
		typ = *hp.Type
	}
	kind, what, ok := hostPathWant(typ)
	if !ok {
		return nil, ctrspec.ConfigErrorf("volume %q: hostPath type %q is not one of \"\", DirectoryOrCreate, Directory, FileOrCreate, File, Socket, CharDevice, BlockDevice", v.Name, typ)
	}
	scope, err := hostPathScopeOf(pod, v)
	if err != nil {
		return nil, fail("hostPath %s: %v", path, err)
	}
	if !filepath.IsAbs(path) {
		return nil, fail("hostPath %s (type %q): not an absolute path", path, typ)
	}
	clean := filepath.Clean(path)
	if !pathBelow(clean, scope.root) {
		return nil, fail("hostPath %s (type %q) is not beneath %s", path, typ, scope.what)
	}
	if !scope.trusted && clean == scope.root && clean != "/" {
		// The path is the allowed host path itself, which may be a file the operator allows
		// (/etc/hosts): opened as named, its last element not followed if it is a link (the
		// operator's own path, above anything a pod may write).
		if fd, err := unix.Open(clean, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
			f := os.NewFile(uintptr(fd), clean)
			if fi, err := f.Stat(); err == nil && !fi.IsDir() {
				if fi.Mode()&fs.ModeSymlink != 0 {
					f.Close()
					return nil, fail("hostPath %s (type %q): the allowed host path is a symlink; allow what it leads to", path, typ)
				}
				return checkHostPathKind(f, fi, kind, what, path, typ, fail)
			}
			f.Close() // a directory: opened beneath itself, as below
		}
	}
	create := beneath.CreateNothing
	switch typ {
	case v1.HostPathUnset, v1.HostPathDirectoryOrCreate:
		create = beneath.CreateDirs
	case v1.HostPathFileOrCreate:
		create = beneath.CreateFile
	}
	root, err := beneath.OpenDir(scope.root)
	if errors.Is(err, fs.ErrNotExist) && create == beneath.CreateDirs {
		// The allowed host path itself is missing. It is the operator's, not the pod's (no pod may
		// write above it), so it is made as the path would be.
		if err := os.MkdirAll(scope.root, 0o755); err != nil {
			return nil, fail("hostPath %s (type %q): create directory: %v", path, typ, err)
		}
		root, err = beneath.OpenDir(scope.root)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fail("hostPath type check failed: %s does not exist (type %s expects an existing %s)", path, typ, what)
	}
	if err != nil {
		return nil, fail("hostPath %s (type %q): %v", path, typ, err)
	}
	defer root.Close()
	rel := strings.TrimPrefix(strings.TrimPrefix(clean, scope.root), "/")
	var f *os.File
	if scope.trusted {
		// The kernel's own lookup, /proc magic links included (a namespace file), exactly as runc
		// followed the path before; only what is missing is made beneath "/".
		var fd int
		if fd, err = unix.Open(clean, unix.O_PATH|unix.O_CLOEXEC, 0); err == nil {
			f = os.NewFile(uintptr(fd), clean)
		} else {
			err = &fs.PathError{Op: "open", Path: clean, Err: err}
		}
	}
	if f == nil && (!scope.trusted || errors.Is(err, fs.ErrNotExist) && create != beneath.CreateNothing) {
		f, err = beneath.Open(root, rel, beneath.Options{Create: create, NoSymlinks: scope.noSymlinks})
	}
	if err != nil {
		var esc *beneath.EscapeError
		var link *beneath.SymlinkError
		switch {
		case errors.As(err, &esc) || errors.As(err, &link):
			return nil, fail("hostPath %s (type %q) refused: it must stay beneath %s: %v", path, typ, scope.what, err)
		case create == beneath.CreateFile:
			return nil, fail("hostPath %s (type FileOrCreate): %v", path, err)
		case errors.Is(err, fs.ErrNotExist):
			return nil, fail("hostPath type check failed: %s does not exist (type %s expects an existing %s)", path, typ, what)
		case create == beneath.CreateDirs:
			return nil, fail("hostPath %s (type %q): create directory: %v", path, typ, err)
		}
		return nil, fail("hostPath %s (type %q): %v", path, typ, err)
	}
	if typ == v1.HostPathUnset {
		return f, nil
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fail("hostPath %s (type %q): %v", path, typ, err)
	}
	return checkHostPathKind(f, fi, kind, what, path, typ, fail)
}

// checkHostPathKind returns f if it is the kind of file the hostPath type asks for ("" any), and
// closes it with the type check's error otherwise.
func checkHostPathKind(f *os.File, fi fs.FileInfo, kind, what, path string, typ v1.HostPathType, fail func(string, ...any) error) (*os.File, error) {
	if kind == "" {
		return f, nil
	}
	if got := fileKind(fi.Mode()); got != kind {
		f.Close()
		return nil, fail("hostPath type check failed: %s is not a %s (type %s), it is a %s", path, what, typ, got)
	}
	return f, nil
}

// pathBelow reports whether the clean absolute path p is root or lies below it, by whole segments.
func pathBelow(p, root string) bool {
	return root == "/" || p == root || strings.HasPrefix(p, root+"/")
}

// hostPathWant is the kind of file a hostPath type asks for (fileKind's names, "" for any) and how
// a message names it; ok is false for an unknown type.
func hostPathWant(typ v1.HostPathType) (kind, what string, ok bool) {
	switch typ {
	case v1.HostPathUnset:
		return "", "path", true
	case v1.HostPathDirectoryOrCreate, v1.HostPathDirectory:
		return "directory", "directory", true
	case v1.HostPathFileOrCreate, v1.HostPathFile:
		return "file", "file", true
	case v1.HostPathSocket:
		return "socket", "socket", true
	case v1.HostPathCharDev:
		return "character device", "character device", true
	case v1.HostPathBlockDev:
		return "block device", "block device", true
	}
	return "", "", false
}

// fileKind names what kind of file mode describes.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m.IsRegular():
		return "file"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0 && m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	}
	return "file of another kind"
}
