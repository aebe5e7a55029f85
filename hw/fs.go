package hw

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// FsStats is the space and inodes of the file system that holds a path, as kubelet's nodefs and
// imagefs signals see it.
type FsStats struct {
	Capacity  int64 // bytes
	Available int64 // bytes an unprivileged writer may still use (f_bavail): what pods can fill
	Free      int64 // bytes free, root's reserve included (f_bfree)
	// Inodes is 0 on file systems that do not count them (btrfs, some FUSE mounts); InodesFree is
	// then meaningless and inode signals are not observed.
	Inodes     int64
	InodesFree int64
}

// StatfsFunc is statfs(2); tests pass a fake.
type StatfsFunc func(path string, st *unix.Statfs_t) error

// Filesystem reads the usage of the file system holding path with statfs(2).
func Filesystem(path string) (FsStats, error) { return FilesystemWith(unix.Statfs, path) }

// FilesystemWith is Filesystem with statfs injected.
func FilesystemWith(statfs StatfsFunc, path string) (FsStats, error) {
	var st unix.Statfs_t
	if err := statfs(path, &st); err != nil {
		return FsStats{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	// Block counts are in fragment-size units; f_frsize is 0 on old kernels, where f_bsize is it.
	unit := int64(st.Frsize)
	if unit <= 0 {
		unit = int64(st.Bsize)
	}
	return FsStats{
		Capacity:   int64(st.Blocks) * unit,
		Available:  int64(st.Bavail) * unit,
		Free:       int64(st.Bfree) * unit,
		Inodes:     int64(st.Files),
		InodesFree: int64(st.Ffree),
	}, nil
}

// SameFilesystem reports whether a and b live on the same mounted file system (same device), as
// kubelet decides whether the image file system is a dedicated one.
func SameFilesystem(a, b string) (bool, error) {
	da, err := deviceOf(a)
	if err != nil {
		return false, err
	}
	db, err := deviceOf(b)
	if err != nil {
		return false, err
	}
	return da == db, nil
}

func deviceOf(path string) (uint64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, fmt.Errorf("stat %s: no device number", path)
	}
	return uint64(st.Dev), nil
}

// DiskUsage is the space the files below dir take on its own file system (allocated blocks, as du
// counts them) and how many inodes they use. Mounts below dir (a pod's /dev/shm tmpfs, a bind
// mount) are not entered: they are not on dir's file system. A dir that does not exist uses nothing.
// It walks the tree: call it outside any lock.
func DiskUsage(dir string) (bytes, inodes int64, err error) {
	bytes, inodes, _, err = diskUsage(dir, -1)
	return bytes, inodes, err
}

// DiskUsageOver is DiskUsage that stops as soon as the sum passes limit, saying so: a pod that
// writes a million files into a small volume costs one short walk, not a full one each period.
// bytes is then what was counted, at least limit.
func DiskUsageOver(dir string, limit int64) (bytes int64, over bool, err error) {
	bytes, _, over, err = diskUsage(dir, limit)
	return bytes, over, err
}

// diskUsage walks dir; a negative limit means none.
func diskUsage(dir string, limit int64) (bytes, inodes int64, over bool, err error) {
	root, err := deviceOf(dir)
	if err != nil {
		if os.IsNotExist(err) {
			return 0, 0, false, nil
		}
		return 0, 0, false, err
	}
	errOver := errors.New("over")
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			// Files come and go while a pod runs; what vanished uses nothing.
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		fi, err := d.Info()
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		if uint64(st.Dev) != root {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		bytes += st.Blocks * 512 // st_blocks is in 512-byte units whatever the block size
		inodes++
		if limit >= 0 && bytes > limit {
			return errOver
		}
		return nil
	})
	if errors.Is(err, errOver) {
		return bytes, inodes, true, nil
	}
	if err != nil {
		return bytes, inodes, false, fmt.Errorf("disk usage of %s: %w", dir, err)
	}
	return bytes, inodes, false, nil
}
