package ctrd

import (
	"context"
	"os"
	"path/filepath"

	containerd "github.com/containerd/containerd/v2/client"
	"k8s.io/apimachinery/pkg/types"
)

// SetTaskStatus replaces how r reads a task's status, for tests of a status read that fails.
func SetTaskStatus(r *Runtime, f func(context.Context, containerd.Task) (containerd.Status, error)) {
	r.taskStatus = f
}

// HolderPID is the pid of the holder of the pod's shared PID namespace, from its record; 0 if none.
func HolderPID(r *Runtime, uid string) int {
	dir, err := r.dirs().podDir(types.UID(uid))
	if err != nil {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(dir, holderFile))
	if err != nil {
		return 0
	}
	hd, err := parseHolder(b)
	if err != nil {
		return 0
	}
	return hd.pid
}
