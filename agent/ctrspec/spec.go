package ctrspec

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
)

// SpecHash identifies what a running container was made from. A pod edit that leaves a container's
// hash unchanged leaves that container alone, so it covers only what needs a new container: the
// container's fields except those read while it runs (probes, lifecycle hooks, which the worker
// takes from the current spec), and the pod fields that shape it (host network, hostname, pod
// security context, the volumes it mounts). ConfigMap and Secret contents are not in it: their
// volumes change in place.
func SpecHash(pod *v1.Pod, c *v1.Container) string {
	cc := *c
	cc.LivenessProbe, cc.ReadinessProbe, cc.StartupProbe, cc.Lifecycle = nil, nil, nil, nil
	mounted := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounted[m.Name] = true
	}
	var vols []v1.Volume
	for _, v := range pod.Spec.Volumes {
		if mounted[v.Name] {
			vols = append(vols, v)
		}
	}
	return specHash(pod, &cc, vols)
}

// ResizeBase is SpecHash without the container's resources: two specs with the same ResizeBase
// differ at most in resources, which a running container may take in place (an in-place resize).
func ResizeBase(pod *v1.Pod, c *v1.Container) string {
	cc := *c
	cc.Resources = v1.ResourceRequirements{}
	return SpecHash(pod, &cc)
}

// SpecHashMatches reports whether a container labelled with hash was made from c's current spec:
// by SpecHash, or by the hash an older mqlet wrote (the whole container and every pod volume), so
// an upgrade restarts nothing.
func SpecHashMatches(hash string, pod *v1.Pod, c *v1.Container) bool {
	return hash == SpecHash(pod, c) || hash == specHash(pod, c, pod.Spec.Volumes)
}

func specHash(pod *v1.Pod, c *v1.Container, vols []v1.Volume) string {
	h := sha256.New()
	enc := json.NewEncoder(h)
	enc.Encode(c)
	enc.Encode(struct {
		HostNetwork bool
		Hostname    string
		Security    *v1.PodSecurityContext
		Volumes     []v1.Volume
	}{pod.Spec.HostNetwork, pod.Spec.Hostname, pod.Spec.SecurityContext, vols})
	// Encoded only when set, so the hash of every container made before these fields were honoured
	// stays the same and an upgrade restarts nothing.
	if pod.Spec.HostPID || pod.Spec.HostIPC || pod.Spec.ShareProcessNamespace != nil {
		enc.Encode(struct {
			HostPID, HostIPC bool
			SharePID         *bool
		}{pod.Spec.HostPID, pod.Spec.HostIPC, pod.Spec.ShareProcessNamespace})
	}
	// The kernel hostname is the FQDN then, so the subdomain shapes the container. Other DNS fields
	// (dnsPolicy, dnsConfig, hostAliases, a plain subdomain) only change files the sandbox
	// rewrites in place: the running containers see them without a restart.
	if fqdn := pod.Spec.SetHostnameAsFQDN; fqdn != nil && *fqdn {
		enc.Encode(struct{ FQDNSubdomain string }{pod.Spec.Subdomain})
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// ConfigError is a container that cannot be built from its spec (kubelet's
// CreateContainerConfigError): retrying will not help until the pod changes.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }

func (e *ConfigError) Unwrap() error { return e.Err }

func ConfigErrorf(format string, a ...any) error { return &ConfigError{fmt.Errorf(format, a...)} }

func PodHostname(pod *v1.Pod) string {
	if pod.Spec.Hostname != "" {
		return pod.Spec.Hostname
	}
	n := pod.Name
	if len(n) > 63 {
		n = n[:63]
	}
	return strings.TrimRight(n, "-.")
}

// Namespaces is what of a pod's sandbox its containers join: pinned namespaces, the /dev/shm source
// and the hostname.
type Namespaces struct {
	NetNS    string // pinned network namespace; "" with hostNetwork
	IPCNS    string // pinned IPC namespace; "" with hostIPC
	PIDNS    string // pinned shared PID namespace (shareProcessNamespace); "" otherwise
	Shm      string // what is mounted at /dev/shm
	Hostname string // the pod's hostname
}

// NamespaceOpts puts the container in the pod's namespaces: the sandbox's network and IPC
// namespaces (or the host's with hostNetwork/hostIPC), and the host's PID namespace with hostPID or
// the pod's shared one with shareProcessNamespace.
func NamespaceOpts(pod *v1.Pod, sb Namespaces) ([]oci.SpecOpts, error) {
	var opts []oci.SpecOpts
	if SharesPIDNS(pod) && sb.PIDNS == "" {
		// The sandbox starts no holder when the runtime does not know the mqlet binary (see
		// Options.Executable). Refusing is better than running the containers apart, silently.
		return nil, ConfigErrorf("pod %s/%s: shareProcessNamespace: true needs a PID-1 holder, and this runtime was given no mqlet executable to run one", pod.Namespace, pod.Name)
	}
	if pod.Spec.HostNetwork {
		opts = append(opts,
			oci.WithHostNamespace(specs.NetworkNamespace),
			oci.WithHostNamespace(specs.UTSNamespace))
	} else {
		if sb.NetNS == "" || sb.Hostname == "" {
			return nil, fmt.Errorf("pod %s/%s: the sandbox has no network namespace or hostname", pod.Namespace, pod.Name)
		}
		opts = append(opts,
			oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: sb.NetNS}),
			oci.WithHostname(sb.Hostname))
	}
	if pod.Spec.HostIPC {
		opts = append(opts, oci.WithHostNamespace(specs.IPCNamespace))
	} else {
		if sb.IPCNS == "" {
			return nil, fmt.Errorf("pod %s/%s: the sandbox has no IPC namespace", pod.Namespace, pod.Name)
		}
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.IPCNamespace, Path: sb.IPCNS}))
	}
	if sb.Shm != "" {
		opts = append(opts, WithShm(sb.Shm))
	}
	if pod.Spec.HostPID {
		opts = append(opts, oci.WithHostNamespace(specs.PIDNamespace))
	} else if SharesPIDNS(pod) {
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.PIDNamespace, Path: sb.PIDNS}))
	}
	return opts, nil
}

// WithShm replaces the default spec's private /dev/shm tmpfs with the pod's shared one (or the
// host's), so POSIX shared memory is shared like the IPC namespace is.
func WithShm(src string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Mounts = slices.DeleteFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == "/dev/shm" })
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/dev/shm", Type: "bind", Source: src, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}})
		return nil
	}
}

// withSwappiness sets the container's cgroup v1 memory.swappiness.
func withSwappiness(v uint64) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		if s.Linux.Resources == nil {
			s.Linux.Resources = &specs.LinuxResources{}
		}
		if s.Linux.Resources.Memory == nil {
			s.Linux.Resources.Memory = &specs.LinuxMemory{}
		}
		s.Linux.Resources.Memory.Swappiness = &v
		return nil
	}
}

// withUnified adds cgroup v2 settings runc writes into the container's cgroup as they are.
func withUnified(kv map[string]string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		if s.Linux.Resources == nil {
			s.Linux.Resources = &specs.LinuxResources{}
		}
		if s.Linux.Resources.Unified == nil {
			s.Linux.Resources.Unified = map[string]string{}
		}
		for k, v := range kv {
			s.Linux.Resources.Unified[k] = v
		}
		return nil
	}
}

func WithOOMScoreAdj(adj int) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Process.OOMScoreAdj = &adj
		return nil
	}
}

const cpuPeriod = 100000

// ResourceOpts applies limits and requests to the container's cgroup the way kubelet does:
// memory limit -> memory.limit, cpu limit -> CFS quota, cpu request -> shares (2 when none); no
// swap (kubelet's NoSwap default); on cgroup v2, memory.oom.group=1 unless singleProcessOOMKill.
func ResourceOpts(c *v1.Container, cg CgroupFeatures) []oci.SpecOpts {
	var opts []oci.SpecOpts
	unified := map[string]string{}
	m, limited := c.Resources.Limits[v1.ResourceMemory]
	limited = limited && m.Value() > 0
	if limited {
		opts = append(opts, oci.WithMemoryLimit(uint64(m.Value())))
		if cg.Swap {
			// memory+swap = memory: no swap, as CRI does. Otherwise, on a board with swap on
			// (Raspberry Pi OS), a container swaps past its limit instead of being OOM-killed.
			opts = append(opts, oci.WithMemorySwap(m.Value()))
		}
	}
	switch {
	case cg.V2 && cg.Swap:
		// Every container, BestEffort ones too (kubelet's NoSwap): v2 limits swap apart from
		// memory, so a container without a memory limit gets none either.
		unified["memory.swap.max"] = "0"
	case !cg.V2 && !limited:
		// v1 has no swap limit apart from memory+swap, which cannot be below an unlimited memory
		// limit: swappiness 0 keeps the kernel from swapping the cgroup's memory out instead.
		opts = append(opts, withSwappiness(0))
	}
	if cg.V2 && cg.OOMGroup {
		// An OOM kill ends every process of the container, as kubelet has it on v2: the kernel
		// otherwise kills the one process it picks (a worker) and the container stays Running,
		// half broken, never restarted.
		unified["memory.oom.group"] = "1"
	}
	if len(unified) > 0 {
		opts = append(opts, withUnified(unified))
	}
	if cpu, ok := c.Resources.Limits[v1.ResourceCPU]; ok && cpu.MilliValue() > 0 {
		quota := cpu.MilliValue() * cpuPeriod / 1000
		if quota < 1000 {
			quota = 1000 // the kernel's minimum quota
		}
		opts = append(opts, oci.WithCPUCFS(quota, cpuPeriod))
	}
	req, ok := c.Resources.Requests[v1.ResourceCPU]
	if !ok {
		req, ok = c.Resources.Limits[v1.ResourceCPU]
	}
	shares := uint64(2)
	if ok {
		if s := uint64(req.MilliValue()) * 1024 / 1000; s > 2 {
			shares = s
		}
	}
	opts = append(opts, oci.WithCPUShares(shares))
	return opts
}

// CgroupFeatures is what a container's cgroup settings may use on this host.
type CgroupFeatures struct {
	V2       bool // runc manages cgroup v2 (/sys/fs/cgroup is cgroup2)
	Swap     bool // the kernel accounts swap (see swapAccounting)
	OOMGroup bool // memory.oom.group=1 on v2 (not singleProcessOOMKill)
	// HostMountOptions are the super options of the host's cgroup2 /sys/fs/cgroup a container
	// sharing the host's cgroup namespace must mount it with too (nsdelegate, memory_recursiveprot).
	HostMountOptions []string
}

func SharesPIDNS(pod *v1.Pod) bool {
	return pod.Spec.ShareProcessNamespace != nil && *pod.Spec.ShareProcessNamespace && !pod.Spec.HostPID
}
