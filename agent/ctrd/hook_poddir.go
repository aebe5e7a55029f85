package ctrd

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
)

// Pod dirs and log dirs are private: they hold what the pod's containers share (emptyDirs, hosts)
// and its output, readable by root (and the group, for log shippers) only.
const privateDirMode = 0o750

// mkPrivateDir makes dir (and missing parents) 0750, and tightens a dir an older mqlet made 0755.
func mkPrivateDir(dir string) error {
	if err := os.MkdirAll(dir, privateDirMode); err != nil {
		return err
	}
	return os.Chmod(dir, privateDirMode)
}

// podDirHook owns <state>/pods/<uid>; everything else the pod keeps on disk lives below it.
type podDirHook struct{ dirs stateDir }

func (podDirHook) Name() string { return "pod dir" }

func (h podDirHook) Prerun(_ context.Context, pod *v1.Pod, sb *Sandbox) error {
	dir, err := h.dirs.podDir(pod.UID)
	if err != nil {
		return err
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		sb.Created = true
	}
	if err := mkPrivateDir(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := mkPrivateDir(dir); err != nil {
		return err
	}
	sb.Dir = dir
	return nil
}

func (h podDirHook) Destroy(_ context.Context, ref PodRef) error {
	dir, err := h.dirs.podDir(ref.UID)
	if err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

func (h podDirHook) List() ([]PodRef, error) {
	names, err := dirNames(filepath.Join(string(h.dirs), "pods"))
	return uidRefs(names), err
}
