package runtime

import (
	"context"

	containerd "github.com/containerd/containerd/v2/client"
)

// SetTaskStatus replaces how r reads a task's status, for tests of a status read that fails.
func SetTaskStatus(r *Runtime, f func(context.Context, containerd.Task) (containerd.Status, error)) {
	r.taskStatus = f
}
