package runtime

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

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
// reason, unless it is a ConfigError too (a missing ConfigMap or Secret behind an object volume);
// anything else is a CreateContainerConfigError.
func startErr(err error) *StartError {
	if _, ok := errors.AsType[*ConfigError](err); ok {
		return &StartError{"CreateContainerConfigError", err}
	}
	if _, ok := errors.AsType[*MountError](err); ok {
		return &StartError{ReasonFailedMount, err}
	}
	return &StartError{"CreateContainerConfigError", err}
}

// hostPathSource checks (and for the *OrCreate types makes) the host path of volume v as kubelet's
// hostPath plugin does before every mount, and returns it as the bind mount's source.
//
//   - "" (unset): no check; a missing path is made a directory (0755), as containerd's CRI does
//     for kubelet, rather than failing in runc.
//   - DirectoryOrCreate: a missing path becomes a directory (0755, parents too); then as Directory.
//   - FileOrCreate: a missing path becomes an empty file (0644); its parent must exist (kubelet
//     does not make it); then as File.
//   - Directory, File, Socket, CharDevice, BlockDevice: the path must exist and be of that type,
//     symlinks followed.
func hostPathSource(v v1.Volume) (string, error) {
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
		return "", configErr("volume %q: hostPath type %q is not one of \"\", DirectoryOrCreate, Directory, FileOrCreate, File, Socket, CharDevice, BlockDevice", v.Name, typ)
	}
	fi, err := os.Stat(path)
	missing := errors.Is(err, fs.ErrNotExist)
	if err != nil && !missing {
		return "", fail("hostPath %s (type %q): %v", path, typ, err)
	}
	if missing {
		switch typ {
		case v1.HostPathUnset, v1.HostPathDirectoryOrCreate:
			if err := os.MkdirAll(path, 0o755); err != nil {
				return "", fail("hostPath %s (type %q): create directory: %v", path, typ, err)
			}
			return path, nil
		case v1.HostPathFileOrCreate:
			f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o644)
			if err != nil {
				return "", fail("hostPath %s (type FileOrCreate): create file: %v", path, err)
			}
			f.Close()
			return path, nil
		}
		return "", fail("hostPath type check failed: %s does not exist (type %s expects an existing %s)", path, typ, what)
	}
	if typ == v1.HostPathUnset {
		return path, nil
	}
	if got := fileKind(fi.Mode()); got != kind {
		return "", fail("hostPath type check failed: %s is not a %s (type %s), it is a %s", path, what, typ, got)
	}
	return path, nil
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
