package ctrd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/agent/devices"
	"github.com/mqlet/mqlet/internal/atomicfile"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// devicesFile is the pod's device allocation in its pod dir: the hook state that gives the pod the
// same devices after an agent restart.
const devicesFile = "devices.json"

// devicesRecord is devicesFile's content.
type devicesRecord struct {
	Version    int                `json:"version"`
	Containers devices.Allocation `json:"containers"`
}

// devicesHook allocates the host devices the pod's containers ask for in resources.limits and
// records them in the pod dir. A pod the node cannot serve now (its devices are held by other pods
// or unplugged) still gets its sandbox: the containers asking for devices fail to start with the
// reason, and every start attempt asks again, so a freed or re-plugged device is picked up.
type devicesHook struct {
	dirs    stateDir
	devices *devices.Manager // nil refuses every container that asks for an extended resource
}

func (devicesHook) Name() string { return "devices" }

func (h devicesHook) Prerun(_ context.Context, pod *v1.Pod, sb *Sandbox) error {
	return h.allocateDevices(pod, sb)
}

// Destroy removes the record, then frees the devices: a record left behind (an I/O error) keeps
// them held, so a restarted agent never gives a device to two pods over its share.
func (h devicesHook) Destroy(_ context.Context, ref PodRef) error {
	dir, err := h.dirs.podDir(ref.UID)
	if err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(dir, devicesFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if m := h.devices; m != nil {
		m.Release(ref.UID)
	}
	return nil
}

// List reports the pods holding devices, so an allocation whose pod is gone is swept.
func (h devicesHook) List() ([]PodRef, error) {
	if h.devices == nil {
		return nil, nil
	}
	var out []PodRef
	for _, uid := range h.devices.Pods() {
		out = append(out, PodRef{UID: uid})
	}
	return out, nil
}

// allocateDevices allocates the pod's devices into sb. Only a failure to record the allocation is
// an error; a pod that cannot have its devices keeps the reason in sb for StartContainer to report.
func (h devicesHook) allocateDevices(pod *v1.Pod, sb *Sandbox) error {
	sb.Devices, sb.devicesErr = nil, nil
	reqs, err := devices.Requests(pod)
	if err != nil {
		sb.devicesErr = &ctrspec.ConfigError{Err: err}
		return nil
	}
	m := h.devices
	if m == nil {
		return nil // deviceOpts refuses the containers that ask for devices
	}
	if _, had := m.Lookup(pod.UID); len(reqs) == 0 && !had {
		return nil // the common case: no device, no file
	}
	alloc, err := m.Allocate(pod.UID, reqs)
	if err != nil {
		sb.devicesErr = err
		return nil
	}
	path := filepath.Join(sb.Dir, devicesFile)
	if len(alloc) == 0 { // a new spec asks for no devices any more
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	b, err := json.Marshal(devicesRecord{Version: 1, Containers: alloc})
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if old, err := os.ReadFile(path); err != nil || !bytes.Equal(old, b) {
		if err := atomicfile.Write(path, b, 0o640); err != nil {
			return fmt.Errorf("record device allocation: %w", err)
		}
	}
	sb.Devices = alloc
	return nil
}

// restoreDevices gives the device manager every pod's recorded allocation, before any pod is
// allocated anew. A record that cannot be read is skipped with a warning: its pod gets devices
// again at its next start.
func (r *Runtime) restoreDevices() {
	m := r.opts.Devices
	refs, err := podDirHook{r.dirs()}.List()
	if err != nil {
		r.log.Warn("device allocations: list pod dirs", "err", err)
	}
	for _, ref := range refs {
		dir, err := r.dirs().podDir(ref.UID)
		if err != nil {
			continue
		}
		path := filepath.Join(dir, devicesFile)
		rec, err := readDevicesRecord(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err == nil {
			err = m.Restore(ref.UID, rec.Containers)
		}
		if err != nil {
			r.log.Warn("device allocation not restored; the pod is allocated again when it starts", "file", path, "err", err)
		}
	}
}

func readDevicesRecord(path string) (devicesRecord, error) {
	var rec devicesRecord
	b, err := os.ReadFile(path)
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("parse %s: %w", path, err)
	}
	if rec.Version != 1 {
		return rec, fmt.Errorf("%s: unknown version %d", path, rec.Version)
	}
	return rec, nil
}

// deviceOpts gives container c the device nodes allocated to it, each with a cgroup rule allowing
// it, and no other (runc's default rules stay). A container that asks for no device gets nothing.
func (r *Runtime) deviceOpts(pod *v1.Pod, sb *Sandbox, c *v1.Container) ([]oci.SpecOpts, error) {
	counts, err := devices.ContainerCounts(c)
	if err != nil {
		return nil, &StartError{"CreateContainerConfigError", err}
	}
	if len(counts) == 0 {
		return nil, nil
	}
	if r.opts.Devices == nil {
		return nil, &StartError{"CreateContainerConfigError", fmt.Errorf("container %q requests %s, but this runtime was given no device manager (no devices are offered)",
			c.Name, deviceNames(counts))}
	}
	devs, ok := sb.Devices.For(c.Name)
	if !ok {
		// Refused when the sandbox was set up, or the devices were freed since: ask again.
		if err := r.devicesHook().allocateDevices(pod, sb); err != nil {
			return nil, &StartError{"CreateContainerError", err}
		}
		if devs, ok = sb.Devices.For(c.Name); !ok {
			return nil, deviceStartError(c, sb.devicesErr)
		}
	}
	nodes := make([]devices.Node, 0, len(devs))
	for _, d := range devs {
		n, err := r.opts.Devices.Node(d.Path)
		if err != nil {
			return nil, &StartError{"CreateContainerError", fmt.Errorf("container %q: %s: %w", c.Name, d.Resource, err)}
		}
		nodes = append(nodes, n)
	}
	return []oci.SpecOpts{withDeviceNodes(nodes)}, nil
}

// deviceStartError names why container c has no devices. kubelet rejects a pod its device manager
// cannot serve with UnexpectedAdmissionError; here the pod waits and retries, so the reason is the
// same and the container is waiting rather than the pod failed.
func deviceStartError(c *v1.Container, err error) *StartError {
	var ce *ctrspec.ConfigError
	var ue *devices.UnknownResourceError
	switch {
	case err == nil:
		return &StartError{"UnexpectedAdmissionError", fmt.Errorf("container %q: no devices allocated", c.Name)}
	case errors.As(err, &ce), errors.As(err, &ue):
		return &StartError{"CreateContainerConfigError", err}
	}
	return &StartError{"UnexpectedAdmissionError", fmt.Errorf("device allocation: %w", err)}
}

// withDeviceNodes adds each node at its path in the container, as the host node is now, and a cgroup
// rule allowing read, write and mknod of it. A node already in the spec at that path (a privileged
// container gets every host device) is replaced rather than doubled.
func withDeviceNodes(nodes []devices.Node) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		if s.Linux.Resources == nil {
			s.Linux.Resources = &specs.LinuxResources{}
		}
		for _, n := range nodes {
			mode, uid, gid := n.Mode, n.UID, n.GID
			major, minor := n.Major, n.Minor
			s.Linux.Devices = slices.DeleteFunc(s.Linux.Devices, func(d specs.LinuxDevice) bool { return d.Path == n.Path })
			s.Linux.Devices = append(s.Linux.Devices, specs.LinuxDevice{Path: n.Path, Type: n.Type, Major: major, Minor: minor,
				FileMode: &mode, UID: &uid, GID: &gid})
			s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, specs.LinuxDeviceCgroup{Allow: true, Type: n.Type,
				Major: &major, Minor: &minor, Access: "rwm"})
		}
		return nil
	}
}

// DeviceAllocation is the pod's device allocation as recorded in its pod dir (for tests and tools).
func (r *Runtime) DeviceAllocation(uid types.UID) (devices.Allocation, error) {
	dir, err := r.dirs().podDir(uid)
	if err != nil {
		return nil, err
	}
	rec, err := readDevicesRecord(filepath.Join(dir, devicesFile))
	return rec.Containers, err
}

// deviceNames lists the resources in counts, for messages.
func deviceNames(counts map[v1.ResourceName]int64) string {
	var names []string
	for n := range counts {
		names = append(names, string(n))
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
