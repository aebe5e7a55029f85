package ctrd

import (
	"context"
	"fmt"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	v1 "k8s.io/api/core/v1"
)

// PodCgroups places pods in a QoS cgroup hierarchy; agent/cgroup.Manager implements it. With none
// (Options.Cgroups nil) every pod's containers go below /mqlet/<namespace>/pod<uid> with no
// pod-level limits, as before the hierarchy existed.
type PodCgroups interface {
	// EnsurePod makes or updates the pod's cgroup in its QoS tier and returns its path, the
	// containers' cgroup parent.
	EnsurePod(pod *v1.Pod) (string, error)
	// PodPath is the cgroup EnsurePod puts the pod in (its QoS tier's), without touching it.
	PodPath(pod *v1.Pod) string
	// RemovePod removes the pod's cgroup from every tier; missing ones are fine.
	RemovePod(uid string) error
	// PodUIDs lists the pods with a cgroup in any tier.
	PodUIDs() ([]string, error)
	// Tidy removes the pod's emptied cgroups in tiers it left and retries a failed limit update;
	// called after one of its containers is removed.
	Tidy(uid string)
	// OOMKilled reads the OOM counters of the cgroup at path, a container's.
	OOMKilled(path string, exitCode int32) (bool, error)
}

// legacyPodCgroup is where pods went before the QoS hierarchy (and still go without one). With the
// hierarchy at its default root it is also the Guaranteed tier's path; under another cgroupRoot,
// pods an older release started are still found and removed here.
func legacyPodCgroup(namespace, podUID string) (string, error) {
	if err := checkPathElem("pod UID", podUID); err != nil {
		return "", err
	}
	return joinUnder("/mqlet", namespace, "pod"+podUID)
}

// OOMKilled reports whether the kernel's OOM killer killed a process of container c, from the
// counters of its cgroup, which exists until the task is deleted. This is how an OOM kill whose
// event nobody saw (the agent was down) is recognised. Without a cgroup manager it reports false.
func (r *Runtime) OOMKilled(ctx context.Context, c Container) (bool, error) {
	if r.opts.Cgroups == nil {
		return false, nil
	}
	ctx = r.ctx(ctx)
	ctr, err := r.client.LoadContainer(ctx, c.ID)
	if err != nil {
		return false, fmt.Errorf("oom check of %s: %w", c.ID, err)
	}
	spec, err := ctr.Spec(ctx)
	if err != nil {
		return false, fmt.Errorf("oom check of %s: spec: %w", c.ID, err)
	}
	if spec.Linux == nil || spec.Linux.CgroupsPath == "" {
		return false, fmt.Errorf("oom check of %s: the spec names no cgroup", c.ID)
	}
	return r.opts.Cgroups.OOMKilled(spec.Linux.CgroupsPath, c.ExitCode)
}

// tidyAfterRemove lets the cgroup manager drop the pod's cgroup in a tier it left, now that one
// container fewer may be holding it. The labels come from the record LoadContainer already read.
func (r *Runtime) tidyAfterRemove(ctx context.Context, ctr containerd.Container) {
	if r.opts.Cgroups == nil {
		return
	}
	info, err := ctr.Info(ctx, containerd.WithoutRefreshedMetadata)
	if err != nil && !errdefs.IsNotFound(err) {
		return
	}
	if uid := info.Labels[LabelPodUID]; uid != "" {
		r.opts.Cgroups.Tidy(uid)
	}
}
