package ctrd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// logDirHook owns <state>/logs/<ns>_<name>_<uid>, kubelet's /var/log/pods naming.
type logDirHook struct{ dirs stateDir }

func (logDirHook) Name() string { return "log dir" }

func (h logDirHook) Prerun(_ context.Context, pod *v1.Pod, sb *Sandbox) error {
	dir, err := h.dirs.podLogDir(pod)
	if err != nil {
		return err
	}
	if err := mkPrivateDir(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := mkPrivateDir(dir); err != nil {
		return err
	}
	sb.LogDir = dir
	return nil
}

// Destroy finds the log dir by UID, so an orphan whose name is unknown loses its logs too.
func (h logDirHook) Destroy(_ context.Context, ref PodRef) error {
	root := filepath.Join(string(h.dirs), "logs")
	names, err := dirNames(root)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		if got, ok := parseLogDirName(n); ok && got.UID == ref.UID {
			errs = append(errs, os.RemoveAll(filepath.Join(root, n)))
		}
	}
	return errors.Join(errs...)
}

func (h logDirHook) List() ([]PodRef, error) {
	names, err := dirNames(filepath.Join(string(h.dirs), "logs"))
	var out []PodRef
	for _, n := range names {
		if ref, ok := parseLogDirName(n); ok {
			out = append(out, ref)
		}
	}
	return out, err
}

// parseLogDirName reads "<ns>_<name>_<uid>"; Kubernetes namespaces and names hold no '_'.
func parseLogDirName(n string) (PodRef, bool) {
	parts := strings.SplitN(n, "_", 3)
	if len(parts) != 3 || parts[2] == "" {
		return PodRef{}, false
	}
	return PodRef{Namespace: parts[0], Name: parts[1], UID: types.UID(parts[2])}, true
}
