package ctrd

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"

	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/agent/podspec"
)

// targetPIDOpts puts ephemeral container c (kubectl debug --target) in the PID namespace of its
// target container's running task, as the CRI's NamespaceMode TARGET does: it sees the target's
// processes (ps, /proc/1/root) while sharing the pod's network, IPC and UTS namespaces like any
// container. A pod with hostPID or one shared process namespace already gives every container the
// same PID namespace, so nothing changes there; nor for a container that is not ephemeral or names
// no target. A target with no running task is kubelet's CreateContainerConfigError ("unable to find
// target container"), retried with back-off.
//
// containerd's CRI hands runc /proc/<pid>/ns/pid of the target's task, read before the container
// is created: were the target to exit and its pid be reused by then, the debug container would
// join whatever process has that pid now, another pod's included. Here the namespace is held open
// instead (the caller calls release once runc has created the task) and runc is given that open
// file, through /proc/<agent pid>/fd/<n>; it is proved to be the target's by the task's pid and the
// process's start time, the same before and after it was opened, with containerd still reporting
// that pid running.
func (r *Runtime) targetPIDOpts(ctx context.Context, pod *v1.Pod, c *v1.Container) (_ []oci.SpecOpts, release func(), _ error) {
	release = func() {}
	ec := podspec.Ephemeral(&pod.Spec, c.Name)
	if ec == nil || ec.TargetContainerName == "" || pod.Spec.HostPID || ctrspec.SharesPIDNS(pod) {
		return nil, release, nil
	}
	fail := func(reason string, err error) ([]oci.SpecOpts, func(), error) {
		return nil, release, &StartError{reason, fmt.Errorf("ephemeral container %q of pod %s/%s, target container %q: %w", c.Name, pod.Namespace, pod.Name, ec.TargetContainerName, err)}
	}
	pid, err := r.runningPid(ctx, pod, ec.TargetContainerName)
	if err != nil {
		return fail("CreateContainerError", err)
	} else if pid == 0 {
		return fail("CreateContainerConfigError", errors.New("unable to find target container: it runs no task"))
	}
	_, start, err := procStat(int(pid))
	if err != nil {
		return fail("CreateContainerConfigError", fmt.Errorf("unable to find target container: its task pid %d: %w", pid, err))
	}
	nsPath := fmt.Sprintf("/proc/%d/ns/pid", pid)
	f, err := os.Open(nsPath)
	if err != nil {
		return fail("CreateContainerConfigError", fmt.Errorf("open %s: %w", nsPath, err))
	}
	_, again, serr := procStat(int(pid))
	still, lerr := r.runningPid(ctx, pod, ec.TargetContainerName)
	if serr != nil || lerr != nil || again != start || still != pid {
		f.Close()
		return fail("CreateContainerConfigError", fmt.Errorf("unable to find target container: its task pid %d exited while its PID namespace was opened", pid))
	}
	held := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd())
	return []oci.SpecOpts{oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.PIDNamespace, Path: held})}, func() { f.Close() }, nil
}

// runningPid is the host pid of the task of the newest attempt of the pod's container name; 0 when
// it runs none.
func (r *Runtime) runningPid(ctx context.Context, pod *v1.Pod, name string) (uint32, error) {
	ctrs, err := r.ListContainers(ctx, string(pod.UID))
	if err != nil {
		return 0, err
	}
	var newest *Container
	for i := range ctrs {
		if t := &ctrs[i]; t.Name == name && (newest == nil || t.RestartCount > newest.RestartCount) {
			newest = t
		}
	}
	if newest == nil || newest.State != StateRunning {
		return 0, nil
	}
	return newest.Pid, nil
}
