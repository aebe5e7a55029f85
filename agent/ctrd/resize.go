package ctrd

import (
	"context"
	"encoding/json"
	"fmt"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/agent/qos"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
)

// In-place resize, as kubelet does it for containers whose resizePolicy is NotRequired: a running
// container whose spec changed only in its cpu and memory requests and limits keeps running and
// gets the new values written into its cgroup (containerd's task update: the memory limit, the CFS
// quota, the shares). The labels say what the container was made with (resizeLabels), so a
// restarted agent knows what it runs with; the pod's own cgroup follows the new spec when the
// worker sets the sandbox up for it (cgroup.Manager.EnsurePod).

// resizeLabels are the labels an in-place resize reads: the spec hash without the resources, the
// resources the container's cgroup is given, and the pod's QoS class (a resize never changes it:
// the pod's cgroup sits in the class's tier).
func resizeLabels(pod *v1.Pod, c *v1.Container) map[string]string {
	res, err := json.Marshal(c.Resources)
	if err != nil {
		return nil // no in-place resize for this container: a change of resources replaces it
	}
	return map[string]string{
		LabelResizeBase: ctrspec.ResizeBase(pod, c),
		LabelResources:  string(res),
		LabelQOSClass:   string(qos.Class(&pod.Spec)),
	}
}

// ResizeContainer writes container c's resources from pod's spec into the cgroup of its running
// attempt id and records them in its labels, with the spec hash of the new spec, so the worker
// (and a restarted agent) matches the container to it. The caller checks that the change is one
// a running container can take (pod.CanResizeInPlace).
func (r *Runtime) ResizeContainer(ctx context.Context, pod *v1.Pod, c *v1.Container, id string) error {
	ctx = r.ctx(ctx)
	ctr, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return fmt.Errorf("resize %s: %w", id, err)
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		return fmt.Errorf("resize %s: %w", id, err)
	}
	spec := &oci.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}}
	for _, opt := range ctrspec.ResourceOpts(c, r.cg) {
		if err := opt(ctx, nil, nil, spec); err != nil {
			return fmt.Errorf("resize %s: %w", id, err)
		}
	}
	res := spec.Linux.Resources
	if res == nil {
		res = &specs.LinuxResources{}
	}
	if err := task.Update(ctx, containerd.WithResources(res)); err != nil {
		return fmt.Errorf("resize %s: update the task's cgroup: %w", id, err)
	}
	labels := resizeLabels(pod, c)
	labels[LabelSpecHash] = ctrspec.SpecHash(pod, c)
	if _, err := ctr.SetLabels(ctx, labels); err != nil {
		return fmt.Errorf("resize %s: record the new resources: %w", id, err)
	}
	return nil
}
