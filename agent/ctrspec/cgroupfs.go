package ctrspec

import (
	"context"
	"path"
	"slices"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
)

// CgroupFSOpts gives container c the cgroup file system at /sys/fs/cgroup as containerd's CRI
// does, so runtimes that size themselves from it (the JVM, Go's GOMAXPROCS/GOMEMLIMIT helpers)
// read the container's own limits: read-only ("cgroup" type: runc mounts cgroup2 on a v2 host and a
// tmpfs with each v1 hierarchy's container cgroup bound in on v1), read-write for a privileged
// container (oci.WithPrivileged, applied later, turns ro into rw). On cgroup v2 a non-privileged
// container gets a private cgroup namespace, so its cgroup is the root of what it sees; CRI keeps
// v1 and privileged containers in the host's for compatibility, and so does this. hostNetwork and
// hostPID change none of it, as in CRI. A volumeMount at /sys/fs/cgroup replaces the mount.
func CgroupFSOpts(c *v1.Container, privileged bool, cg CgroupFeatures) []oci.SpecOpts {
	if slices.ContainsFunc(c.VolumeMounts, func(m v1.VolumeMount) bool { return path.Clean(m.MountPath) == "/sys/fs/cgroup" }) {
		return nil
	}
	var opts []oci.SpecOpts
	options := []string{"nosuid", "noexec", "nodev", "relatime", "ro"}
	if cg.V2 && !privileged {
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.CgroupNamespace}))
	} else {
		// In the host's cgroup namespace a cgroup2 mount shares the host's superblock, and mounting
		// it without these options would strip them from the host's mount too (CRI copies them).
		options = append(options, cg.HostMountOptions...)
	}
	opts = append(opts, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Mounts = slices.DeleteFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == "/sys/fs/cgroup" })
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: options})
		return nil
	})
	return opts
}

// Privileged reports whether container c runs privileged.
func Privileged(pod *v1.Pod, c *v1.Container) bool {
	sc := effectiveSecurity(pod, c)
	return sc.Privileged != nil && *sc.Privileged
}
