package ctrd

import (
	"context"
	"fmt"
	"path/filepath"
)

// ContainerCgroup is the cgroup of container id, as its OCI spec names it (below each hierarchy's
// root), where its CPU and memory use are read. The path is fixed for the container's life, so a
// caller may keep it.
func (r *Runtime) ContainerCgroup(ctx context.Context, id string) (string, error) {
	ctx = r.ctx(ctx)
	ctr, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return "", fmt.Errorf("cgroup of container %s: %w", id, err)
	}
	spec, err := ctr.Spec(ctx)
	if err != nil {
		return "", fmt.Errorf("cgroup of container %s: spec: %w", id, err)
	}
	if spec.Linux == nil || spec.Linux.CgroupsPath == "" {
		return "", fmt.Errorf("cgroup of container %s: the spec names no cgroup", id)
	}
	p := spec.Linux.CgroupsPath
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return "", fmt.Errorf("cgroup of container %s: %q is not an absolute, clean cgroup path", id, p)
	}
	return p, nil
}
