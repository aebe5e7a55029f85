package ctrd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A hostPath or subPath is opened beneath its root (beneath.Open) and must reach the container as
// that open file, not as a path that a container could have turned into a symlink since. runc cannot
// mount the agent's /proc/<pid>/fd/<n> itself: it makes bind mounts inside the container's new mount
// namespace, and the kernel refuses (EINVAL) a bind whose source mount belongs to another namespace.
// So the agent binds each open file to a staging path first, in its own namespace, and gives runc
// that path, as kubelet does for subPaths. Following the /proc link in mount(2) is not a path
// lookup: the kernel takes the file itself. runc copies the staged mount into the container when it
// creates it, after which the stage goes.
//
// A container's stage is <state>/volume-mounts/<agent pid>-<container id>: a small private tmpfs
// holding one bind mount per staged file. Private, so the binds do not propagate into other mount
// namespaces while they exist; a tmpfs, so one lazy unmount takes the binds and their mount points
// at once. It lives only while the container is created (StartContainer releases it once NewTask
// returns), and a stage an agent left behind (killed meanwhile) is unmounted at the next start:
// the pid in the name says whose it is. It is never removed recursively: a bind mount in it is a
// host directory.

// mountStagesDir is below the state dir; nothing else lives there.
const mountStagesDir = "volume-mounts"

// mountStage is one container's stage. The zero of *mountStage (nil) stages nothing and releases
// nothing.
type mountStage struct {
	dir string
	n   int
}

// newMountStage makes the stage of container id (a private tmpfs), to be released with Release.
func (r *Runtime) newMountStage(id string) (*mountStage, error) {
	if r.opts.StateDir == "" {
		return nil, errors.New("no state dir to stage volume mounts in")
	}
	if err := checkPathElem("container id", id); err != nil {
		return nil, err
	}
	root := filepath.Join(r.opts.StateDir, mountStagesDir)
	if err := mkPrivateDir(root); err != nil {
		return nil, fmt.Errorf("stage volume mounts: %w", err)
	}
	dir := filepath.Join(root, strconv.Itoa(os.Getpid())+"-"+id)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("stage volume mounts: %w", err)
	}
	// A stage left by an earlier attempt of the same container (this agent did not get to release
	// it) goes first, with whatever it held.
	unmount(dir)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700,size=64k,nr_inodes=1024"); err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("stage volume mounts: mount tmpfs at %s: %w", dir, err)
	}
	s := &mountStage{dir: dir}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		s.Release()
		return nil, fmt.Errorf("stage volume mounts: make %s private: %w", dir, err)
	}
	return s, nil
}

// add binds the open file f (a directory or any other file) to a new path in the stage, recursively
// (mounts below a host directory come along, as with runc's rbind of a path) and private (the
// container's copy follows no later mount on the host: volumeMounts' propagation is None), and
// returns the path, for runc. f may be closed once add returns: the mount holds the file.
func (s *mountStage) add(f *os.File) (string, error) {
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("stage %s: %w", f.Name(), err)
	}
	target := filepath.Join(s.dir, strconv.Itoa(s.n))
	s.n++
	if fi.IsDir() {
		err = os.Mkdir(target, 0o700)
	} else {
		var t *os.File
		if t, err = os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o600); err == nil {
			t.Close()
		}
	}
	if err != nil {
		return "", fmt.Errorf("stage %s: %w", f.Name(), err)
	}
	src := "/proc/self/fd/" + strconv.Itoa(int(f.Fd()))
	if err := unix.Mount(src, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return "", fmt.Errorf("stage %s: bind mount at %s: %w", f.Name(), target, err)
	}
	if err := unix.Mount("", target, "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		return "", fmt.Errorf("stage %s: make %s private: %w", f.Name(), target, err)
	}
	return target, nil
}

// Release unmounts the stage with everything staged in it and removes its (then empty) directory.
// Containers made from it keep their own copies of the mounts. It may be called again.
func (s *mountStage) Release() error {
	if s == nil || s.dir == "" {
		return nil
	}
	dir := s.dir
	if err := unmount(dir); err != nil {
		return fmt.Errorf("release volume mount stage: %w", err)
	}
	s.dir = ""
	// Not RemoveAll: were the unmount not what it seems, this must not descend into a host path.
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("release volume mount stage: %w", err)
	}
	return nil
}

// sweepMountStages releases the stages that agents no longer running left behind (killed while a
// container was being created). Those of running processes are theirs (a second Runtime on the
// same state dir, or this one).
func (r *Runtime) sweepMountStages() {
	if r.opts.StateDir == "" {
		return
	}
	root := filepath.Join(r.opts.StateDir, mountStagesDir)
	names, err := dirNames(root)
	if err != nil {
		r.log.Warn("volume mount stages unreadable; any left by a killed agent stay", "dir", root, "err", err)
		return
	}
	for _, n := range names {
		pidStr, _, ok := strings.Cut(n, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 {
			continue
		}
		if pid == os.Getpid() || !errors.Is(unix.Kill(pid, 0), unix.ESRCH) {
			continue
		}
		s := &mountStage{dir: filepath.Join(root, n)}
		if err := s.Release(); err != nil {
			r.log.Warn("volume mount stage left by a killed agent not released", "dir", s.dir, "err", err)
		}
	}
}
