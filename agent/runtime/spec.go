package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/mqlet/mqlet/agent/qos"
	"github.com/mqlet/mqlet/agent/runtime/beneath"
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

func configErr(format string, a ...any) error { return &ConfigError{fmt.Errorf(format, a...)} }

// specOpts turns a Kubernetes container into OCI spec options, with kubelet's semantics for
// command/args, env expansion and resources. The stage the hostPath and subPath mounts come from
// (volumeMounts) is returned: runc copies its mounts when it creates the container, so the caller
// releases it once the task exists, or failed to.
func (r *Runtime) specOpts(pod *v1.Pod, sb *Sandbox, c *v1.Container, img containerd.Image, id string) (_ []oci.SpecOpts, stage *mountStage, err error) {
	defer func() {
		if err != nil {
			stage.Release()
		}
	}()
	env, skipped, err := containerEnvWith(pod, c, r.objectsOrNone())
	if err != nil {
		return nil, nil, err
	}
	if len(skipped) > 0 {
		r.log.Warn(skippedMessage(c, skipped), "pod", pod.Namespace+"/"+pod.Name)
	}
	// Read once here for the command and the security options (the image's user).
	ic, err := img.Spec(context.Background())
	if err != nil {
		return nil, nil, fmt.Errorf("image config of %s: %w", img.Name(), err)
	}
	opts := []oci.SpecOpts{oci.WithImageConfig(img)}

	// Kubernetes: command replaces the image entrypoint, args replace its cmd; with only args the
	// entrypoint stays. $(VAR) in either is expanded from the container's env.
	if len(c.Command) > 0 || len(c.Args) > 0 {
		args := expandAll(c.Command, env)
		if len(c.Command) == 0 {
			args = append([]string(nil), ic.Config.Entrypoint...)
		}
		if len(c.Args) > 0 {
			args = append(args, expandAll(c.Args, env)...)
		} else if len(c.Command) == 0 {
			args = append(args, ic.Config.Cmd...)
		}
		if len(args) == 0 {
			return nil, nil, configErr("container %q: no command: the image has no entrypoint or cmd and the pod gives none", c.Name)
		}
		opts = append(opts, oci.WithProcessArgs(args...))
	}
	if len(env) > 0 {
		kv := make([]string, len(env))
		for i, e := range env {
			kv[i] = e.Name + "=" + e.Value
		}
		opts = append(opts, oci.WithEnv(kv))
	}
	if c.WorkingDir != "" {
		opts = append(opts, oci.WithProcessCwd(c.WorkingDir))
	}

	nsOpts, err := namespaceOpts(pod, sb)
	if err != nil {
		return nil, nil, err
	}
	opts = append(opts, nsOpts...)
	files, err := podFileMounts(pod, sb, c) // hosts, resolv.conf, hostname (dns.go)
	if err != nil {
		return nil, nil, err
	}
	opts = append(opts, files)

	mounts, stage, err := r.volumeMounts(pod, sb, c, env, id)
	if err != nil {
		return nil, nil, err
	}
	if len(mounts) > 0 {
		opts = append(opts, oci.WithMounts(mounts))
	}
	opts = append(opts, resourceOpts(c, r.cg)...)
	opts = append(opts, withOOMScoreAdj(r.oomScoreAdj(pod, c)))
	secOpts, err := r.securityOpts(pod, c, ic.Config.User)
	if err != nil {
		return nil, nil, err
	}
	opts = append(opts, secOpts...)
	opts = append(opts, oci.WithCgroup(filepath.Join(sb.CgroupParent, id)))
	return opts, stage, nil
}

func podHostname(pod *v1.Pod) string {
	if pod.Spec.Hostname != "" {
		return pod.Spec.Hostname
	}
	n := pod.Name
	if len(n) > 63 {
		n = n[:63]
	}
	return strings.TrimRight(n, "-.")
}

// namespaceOpts puts the container in the pod's namespaces: the sandbox's network and IPC
// namespaces (or the host's with hostNetwork/hostIPC), and the host's PID namespace with hostPID or
// the pod's shared one with shareProcessNamespace.
func namespaceOpts(pod *v1.Pod, sb *Sandbox) ([]oci.SpecOpts, error) {
	var opts []oci.SpecOpts
	if sharesPIDNS(pod) && sb.PIDNS == "" {
		// The sandbox starts no holder when the runtime does not know the mqlet binary (see
		// Options.Executable). Refusing is better than running the containers apart, silently.
		return nil, configErr("pod %s/%s: shareProcessNamespace: true needs a PID-1 holder, and this runtime was given no mqlet executable to run one", pod.Namespace, pod.Name)
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
		opts = append(opts, withShm(sb.Shm))
	}
	if pod.Spec.HostPID {
		opts = append(opts, oci.WithHostNamespace(specs.PIDNamespace))
	} else if sharesPIDNS(pod) {
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.PIDNamespace, Path: sb.PIDNS}))
	}
	return opts, nil
}

// withShm replaces the default spec's private /dev/shm tmpfs with the pod's shared one (or the
// host's), so POSIX shared memory is shared like the IPC namespace is.
func withShm(src string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Mounts = slices.DeleteFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == "/dev/shm" })
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/dev/shm", Type: "bind", Source: src, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}})
		return nil
	}
}

// volumeMounts supports emptyDir (made by the sandbox), hostPath, and configMap, secret,
// downwardAPI and projected volumes (written when the container starts, objvolumes.go); other
// volume kinds are refused clearly rather than silently skipped. env expands subPathExpr.
//
// A hostPath, and a subPath of any volume, is opened here beneath its root (openHostPath,
// openSubPath) and mounted from the open file, not from its path, through container id's mount
// stage (mountstage.go): nothing a container renames or links afterwards changes what is mounted.
// The caller releases the stage once runc has created the container (NewTask).
func (r *Runtime) volumeMounts(pod *v1.Pod, sb *Sandbox, c *v1.Container, env []v1.EnvVar, id string) (_ []specs.Mount, stage *mountStage, err error) {
	vols := map[string]v1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	var out []specs.Mount
	defer func() {
		if err != nil {
			stage.Release()
		}
	}()
	for _, m := range c.VolumeMounts {
		v, ok := vols[m.Name]
		if !ok {
			return nil, nil, configErr("container %q: volumeMount %q names no volume of the pod", c.Name, m.Name)
		}
		var src string    // a directory the agent made and owns: mounted by its path
		var file *os.File // or a file opened beneath its root: mounted from the open file
		subCreate := beneath.CreateDirs
		switch {
		case v.EmptyDir != nil:
			if src = sb.Volumes[v.Name]; src == "" {
				return nil, nil, fmt.Errorf("emptyDir %q: not set up by the pod's sandbox", v.Name)
			}
		case v.HostPath != nil:
			if file, err = openHostPath(pod, v); err != nil { // hostpath.go
				return nil, nil, err
			}
		default:
			var handled bool
			if src, handled, err = r.setUpObjectVolume(pod, sb.Dir, &v); err != nil {
				return nil, nil, err
			} else if !handled {
				return nil, nil, configErr("volume %q: only emptyDir, hostPath, configMap, secret, downwardAPI and projected volumes are supported", v.Name)
			}
			// A missing key is not made: the volume is the object's, rewritten whole on each update.
			subCreate = beneath.CreateNothing
		}
		if src, err = r.stageMount(&stage, id, c, m, env, src, file, subCreate); err != nil {
			return nil, nil, err
		}
		opt := "rw"
		if m.ReadOnly || objectVolumeReadOnly(&v) {
			opt = "ro"
		}
		out = append(out, specs.Mount{Destination: m.MountPath, Type: "bind", Source: src, Options: []string{"rbind", opt}})
	}
	return out, stage, nil
}

// stageMount returns the source of mount m of a volume that is the directory src or the open file
// (which it closes): the volume's subPath opened beneath it, if m has one, and anything open staged
// in *stage (made at first use).
func (r *Runtime) stageMount(stage **mountStage, id string, c *v1.Container, m v1.VolumeMount, env []v1.EnvVar, src string, file *os.File, subCreate beneath.Create) (string, error) {
	if file != nil {
		defer func() { file.Close() }()
	}
	subPath, err := mountSubPath(c, m, env)
	if err != nil {
		return "", err
	}
	if subPath != "" {
		sub, err := openSubPath(src, file, subPath, subCreate)
		if err != nil {
			return "", configErr("container %q volumeMount %q: subPath %q: %v", c.Name, m.Name, subPath, err)
		}
		if file != nil {
			file.Close()
		}
		file = sub
	}
	if file == nil {
		return src, nil
	}
	if *stage == nil {
		if *stage, err = r.newMountStage(id); err != nil {
			return "", &StartError{"CreateContainerError", fmt.Errorf("container %q volumeMount %q: %w", c.Name, m.Name, err)}
		}
	}
	staged, err := (*stage).add(file)
	if err != nil {
		return "", &StartError{"CreateContainerError", fmt.Errorf("container %q volumeMount %q: %w", c.Name, m.Name, err)}
	}
	return staged, nil
}

// openSubPath opens subPath beneath the volume's root (the directory dir, or the open file root of a
// hostPath volume) and returns it: a subPath that leads out of the volume, through a symlink planted
// by a container writing to it (kubelet's CVE-2017-1002101) or one swapped in while it is opened, is
// refused; one staying inside works. What is missing is made as create says, relative to the
// descriptors of its parents, with the volume root's permissions, as kubelet makes subPaths.
func openSubPath(dir string, root *os.File, subPath string, create beneath.Create) (*os.File, error) {
	if filepath.IsAbs(subPath) || slices.Contains(strings.Split(filepath.ToSlash(subPath), "/"), "..") {
		return nil, fmt.Errorf("must be a relative path without '..'")
	}
	if root == nil {
		var err error
		if root, err = beneath.OpenDir(dir); err != nil {
			return nil, fmt.Errorf("volume root: %w", err)
		}
		defer root.Close()
	}
	fi, err := root.Stat()
	if err != nil {
		return nil, fmt.Errorf("volume root %s: %w", root.Name(), err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("the volume %s is not a directory", root.Name())
	}
	f, err := beneath.Open(root, subPath, beneath.Options{Create: create, Perm: fi.Mode().Perm()})
	var esc *beneath.EscapeError
	if errors.As(err, &esc) {
		return nil, fmt.Errorf("leads out of the volume: %w", err)
	}
	return f, err
}

// oomScoreAdj is kubelet's score for the container's QoS class, raised to the floor this machine
// allows (see oomScoreFloor) with a warning, never failing the pod for it.
func (r *Runtime) oomScoreAdj(pod *v1.Pod, c *v1.Container) int {
	class := qos.Class(&pod.Spec)
	adj := qos.OOMScoreAdj(class, c, r.memCapacity)
	if adj < r.oomFloor {
		r.oomWarned.Do(func() {
			r.log.Warn("oom_score_adj raised to what this node allows: mqlet has no CAP_SYS_RESOURCE, so containers cannot score below containerd's shim (the same clamp as containerd's restrict_oom_score_adj)",
				"pod", pod.Namespace+"/"+pod.Name, "container", c.Name, "qos", class, "wanted", adj, "applied", r.oomFloor)
		})
		adj = r.oomFloor
	}
	return adj
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

func withOOMScoreAdj(adj int) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Process.OOMScoreAdj = &adj
		return nil
	}
}

const cpuPeriod = 100000

// resourceOpts applies limits and requests to the container's cgroup the way kubelet does:
// memory limit -> memory.limit, cpu limit -> CFS quota, cpu request -> shares (2 when none); no
// swap (kubelet's NoSwap default); on cgroup v2, memory.oom.group=1 unless singleProcessOOMKill.
func resourceOpts(c *v1.Container, cg cgroupFeatures) []oci.SpecOpts {
	var opts []oci.SpecOpts
	unified := map[string]string{}
	m, limited := c.Resources.Limits[v1.ResourceMemory]
	limited = limited && m.Value() > 0
	if limited {
		opts = append(opts, oci.WithMemoryLimit(uint64(m.Value())))
		if cg.swap {
			// memory+swap = memory: no swap, as CRI does. Otherwise, on a board with swap on
			// (Raspberry Pi OS), a container swaps past its limit instead of being OOM-killed.
			opts = append(opts, oci.WithMemorySwap(m.Value()))
		}
	}
	switch {
	case cg.v2 && cg.swap:
		// Every container, BestEffort ones too (kubelet's NoSwap): v2 limits swap apart from
		// memory, so a container without a memory limit gets none either.
		unified["memory.swap.max"] = "0"
	case !cg.v2 && !limited:
		// v1 has no swap limit apart from memory+swap, which cannot be below an unlimited memory
		// limit: swappiness 0 keeps the kernel from swapping the cgroup's memory out instead.
		opts = append(opts, withSwappiness(0))
	}
	if cg.v2 && cg.oomGroup {
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
