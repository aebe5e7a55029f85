package ctrd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/agent/qos"
	"github.com/mqlet/mqlet/hw"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
)

// In-place resize, as kubelet does it for containers whose resizePolicy is NotRequired: a running
// container whose spec changed only in its cpu and memory requests and limits keeps running and
// gets the new values written into its cgroup (containerd's task update: the memory limit, the CFS
// quota, the shares). A limit may be added (written like any other value) or removed (written as
// unlimited: -1, as runc takes it). The labels say what the container runs with (resizeLabels), so
// the status reports it and a restarted agent knows it; the pod's own cgroup follows the new spec
// when the worker sets the sandbox up for it (cgroup.Manager.EnsurePod).

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

// decodeResources reads a LabelResources value.
func decodeResources(label string) (v1.ResourceRequirements, error) {
	var r v1.ResourceRequirements
	err := json.Unmarshal([]byte(label), &r)
	return r, err
}

// RecordedResources are the resources the container was made or last resized with, as its
// LabelResources records them; false for a container without a readable label (made before
// mqlet resized in place).
func (c Container) RecordedResources() (v1.ResourceRequirements, bool) {
	if c.Resources == "" {
		return v1.ResourceRequirements{}, false
	}
	r, err := decodeResources(c.Resources)
	return r, err == nil
}

// ErrBelowUsage marks a resize refused because a new memory limit is below what the container
// uses now: the kernel would reclaim and then OOM-kill it (v2) or refuse the write (v1). kubelet
// refuses such a resize the same way and keeps it in progress with the error until it can be done.
var ErrBelowUsage = errors.New("memory limit below current usage")

// ResizeContainer writes container c's resources from pod's spec into the cgroup of its running
// attempt id and records them in its labels, with the spec hash of the new spec, so the worker
// (and a restarted agent) matches the container to it. The caller checks that the change is one
// a running container can take (pod.CanResizeInPlace). A memory limit that is added or lowered is
// first checked against the container's memory usage, with kubelet's check and message: a limit
// at or below the usage is refused (ErrBelowUsage) and nothing is changed.
func (r *Runtime) ResizeContainer(ctx context.Context, pod *v1.Pod, c *v1.Container, id string) error {
	ctx = r.ctx(ctx)
	ctr, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return fmt.Errorf("resize %s: %w", id, err)
	}
	info, err := ctr.Info(ctx)
	if err != nil {
		return fmt.Errorf("resize %s: %w", id, err)
	}
	var old v1.ResourceRequirements
	if s := info.Labels[LabelResources]; s != "" {
		if old, err = decodeResources(s); err != nil {
			return fmt.Errorf("resize %s: its recorded resources %q: %w", id, s, err)
		}
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		return fmt.Errorf("resize %s: %w", id, err)
	}
	if err := r.checkMemoryUsage(ctx, c, old, id); err != nil {
		return err
	}
	res, err := resizeResources(ctx, c, r.cg)
	if err != nil {
		return fmt.Errorf("resize %s: %w", id, err)
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

// resizeResources is the cgroup update for container c's resources: what the container would be
// made with (ctrspec.ResourceOpts), and, for a limit it does not set, the value that lifts a limit
// set before (a task update leaves whatever it does not name as it was).
func resizeResources(ctx context.Context, c *v1.Container, cg ctrspec.CgroupFeatures) (*specs.LinuxResources, error) {
	spec := &oci.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}}
	for _, opt := range ctrspec.ResourceOpts(c, cg) {
		if err := opt(ctx, nil, nil, spec); err != nil {
			return nil, err
		}
	}
	res := spec.Linux.Resources
	if res == nil {
		res = &specs.LinuxResources{}
	}
	unlimited := int64(-1)
	if m, ok := c.Resources.Limits[v1.ResourceMemory]; !ok || m.Value() <= 0 {
		if res.Memory == nil {
			res.Memory = &specs.LinuxMemory{}
		}
		res.Memory.Limit = &unlimited
		if cg.Swap && !cg.V2 {
			// v1's memory+swap limit was set with the memory limit and may not be below it.
			res.Memory.Swap = &unlimited
		}
	}
	if q, ok := c.Resources.Limits[v1.ResourceCPU]; !ok || q.MilliValue() <= 0 {
		if res.CPU == nil {
			res.CPU = &specs.LinuxCPU{}
		}
		res.CPU.Quota = &unlimited
	}
	return res, nil
}

// checkMemoryUsage refuses a memory limit that is added or lowered to at or below what container
// id uses now (kubelet's validateMemoryResizeAction, with its message).
func (r *Runtime) checkMemoryUsage(ctx context.Context, c *v1.Container, old v1.ResourceRequirements, id string) error {
	m, ok := c.Resources.Limits[v1.ResourceMemory]
	if !ok || m.Value() <= 0 {
		return nil
	}
	if o, had := old.Limits[v1.ResourceMemory]; had && o.Value() > 0 && m.Value() >= o.Value() {
		return nil // not lowered
	}
	path, err := r.ContainerCgroup(ctx, id)
	if err != nil {
		return fmt.Errorf("resize %s: read its memory usage: %w", id, err)
	}
	st, err := hw.CgroupMemory("/", path)
	if err != nil {
		return fmt.Errorf("resize %s: read its memory usage: %w", id, err)
	}
	if st.Usage >= m.Value() {
		return fmt.Errorf("cannot decrease memory limits: attempting to set container %q memory limit (%d) below current usage (%d): %w",
			c.Name, m.Value(), st.Usage, ErrBelowUsage)
	}
	return nil
}
