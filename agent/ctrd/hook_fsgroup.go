package ctrd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"syscall"

	v1 "k8s.io/api/core/v1"
)

// fsGroupHook gives the pod's emptyDir volumes to its fsGroup, as kubelet does when it sets an
// emptyDir up: group fsGroup, group read-write, and setgid on directories so that what the
// containers create there is in the group too. The containers' processes get fsGroup as a
// supplementary group (userOpt), so a non-root container can use the volume.
//
// Only emptyDirs: kubelet manages no ownership of hostPath volumes. Volume kinds that write their
// own files (configMap, secret, downwardAPI, projected) apply the same rule themselves when they
// write: each file's group is fsGroup and its mode gains g+r (g+rw where writable), directories
// gain g+x and setgid. fsGroupChangePolicy changes nothing for these kinds, in kubelet as here:
// it only matters for persistent volumes.
//
// kubelet does this once, on the empty volume. The hook runs at every sandbox set-up, so it checks
// the volume's root first (kubelet's OnRootMismatch test) and walks the volume only when the
// root is not as fsGroup wants: a new volume, or a pod whose fsGroup changed. The walk stays inside
// the volume whatever a container planted there (os.Root; symlinks are not followed).
type fsGroupHook struct{ log *slog.Logger }

func (fsGroupHook) Name() string { return "fsGroup ownership" }

func (h fsGroupHook) Prerun(_ context.Context, pod *v1.Pod, sb *Sandbox) error {
	psc := pod.Spec.SecurityContext
	if psc == nil || psc.FSGroup == nil {
		return nil
	}
	gid := int(*psc.FSGroup)
	for _, v := range pod.Spec.Volumes {
		dir := sb.Volumes[v.Name]
		if v.EmptyDir == nil || dir == "" {
			continue
		}
		skipped, err := setVolumeGroup(dir, gid, false)
		if err != nil {
			return fmt.Errorf("emptyDir %q: fsGroup %d: %w", v.Name, gid, err)
		}
		if skipped != nil {
			h.log.Warn("fsGroup not applied to some files of a volume", "pod", sb.Ref.String(), "volume", v.Name, "fsGroup", gid, "err", skipped)
		}
	}
	return nil
}

const (
	groupRW   fs.FileMode = 0o060
	groupR    fs.FileMode = 0o040
	groupExec fs.FileMode = 0o010
)

// setVolumeGroup makes the volume at dir fsGroup's (see fsGroupHook), unless its root already is.
// err is a failure on the volume's root; skipped lists the files below it that could not be
// changed, which kubelet only logs: one file a container made odd must not keep the pod from
// starting.
func setVolumeGroup(dir string, gid int, readOnly bool) (skipped, err error) {
	want := groupRW
	if readOnly {
		want = groupR
	}
	if fi, err := os.Stat(dir); err != nil {
		return nil, err
	} else if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Gid) == gid &&
		fi.IsDir() && fi.Mode().Perm()&(want|groupExec) == want|groupExec && fi.Mode()&fs.ModeSetgid != 0 {
		return nil, nil
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	var errs []error
	var rootErr error
	walkErr := fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			errs = append(errs, err)
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil // its target is either outside the volume or visited on its own
		}
		fi, err := d.Info()
		if err != nil {
			errs = append(errs, err)
			return nil
		}
		mode := fi.Mode().Perm() | fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) | want
		if d.IsDir() {
			mode |= groupExec | fs.ModeSetgid
		}
		err = errors.Join(root.Lchown(name, -1, gid), root.Chmod(name, mode))
		if err != nil && name == "." {
			rootErr = err // the root is what tells the next set-up that the work is done
		} else if err != nil {
			errs = append(errs, err)
		}
		return nil
	})
	if walkErr != nil {
		errs = append(errs, walkErr)
	}
	return errors.Join(errs...), rootErr
}
