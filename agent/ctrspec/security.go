package ctrspec

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/mqlet/mqlet/agent/sysctl"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
)

// SeccompDir is where Localhost seccomp profiles are read from, below the state dir (kubelet's is
// <root-dir>/seccomp): a pod's localhostProfile names a file below it.
const SeccompDir = "seccomp"

// SecurityInputs is what the security options need besides the pod: facts about the image and the node.
type SecurityInputs struct {
	ImageUser   string // the image config's User: "", "uid", "name", "uid:gid", "name:group"...
	SeccompRoot string // the directory Localhost seccomp profiles live in
}

func SecurityOpts(pod *v1.Pod, c *v1.Container, in SecurityInputs) ([]oci.SpecOpts, error) {
	sc := effectiveSecurity(pod, c)
	if err := checkRunAsNonRoot(pod, c, sc, in.ImageUser); err != nil {
		return nil, err
	}
	privileged := sc.Privileged != nil && *sc.Privileged
	var opts []oci.SpecOpts
	if u := userOpt(pod, sc, in.ImageUser); u != nil {
		opts = append(opts, u)
	}
	// Masked and read-only /proc paths first: a privileged container clears them below.
	opts = append(opts, procMountOpt(sc.ProcMount))
	if sc.Capabilities != nil {
		opts = append(opts, capabilityOpts(sc.Capabilities)...)
	}
	if privileged {
		// Every capability whatever the drop list says, every host device, nothing masked: CRI.
		opts = append(opts, oci.WithPrivileged, oci.WithAllDevicesAllowed, oci.WithHostDevices)
	}
	if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		opts = append(opts, oci.WithRootFSReadonly())
	}
	// Kubernetes allows privilege escalation unless told otherwise; containerd's default spec does not.
	opts = append(opts, noNewPrivs(sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation))
	if s := sysctlOpt(pod); s != nil {
		opts = append(opts, s)
	}
	seccompOpt, err := seccompOpt(pod, c, privileged, in.SeccompRoot)
	if err != nil {
		return nil, err
	}
	// Last: containerd's default profile allows some syscalls by the capabilities set above.
	return append(opts, seccompOpt), nil
}

// effectiveSecurity merges the pod's security context into the container's, the container's
// fields winning, as kubelet does. Only fields both levels have are merged; seccomp and AppArmor
// profiles are looked up separately.
func effectiveSecurity(pod *v1.Pod, c *v1.Container) v1.SecurityContext {
	var out v1.SecurityContext
	if p := pod.Spec.SecurityContext; p != nil {
		out.SELinuxOptions, out.WindowsOptions = p.SELinuxOptions, p.WindowsOptions
		out.RunAsUser, out.RunAsGroup, out.RunAsNonRoot = p.RunAsUser, p.RunAsGroup, p.RunAsNonRoot
	}
	cs := c.SecurityContext
	if cs == nil {
		return out
	}
	pick := func(dst **int64, src *int64) {
		if src != nil {
			*dst = src
		}
	}
	pick(&out.RunAsUser, cs.RunAsUser)
	pick(&out.RunAsGroup, cs.RunAsGroup)
	if cs.RunAsNonRoot != nil {
		out.RunAsNonRoot = cs.RunAsNonRoot
	}
	if cs.SELinuxOptions != nil {
		out.SELinuxOptions = cs.SELinuxOptions
	}
	if cs.WindowsOptions != nil {
		out.WindowsOptions = cs.WindowsOptions
	}
	out.Capabilities, out.Privileged = cs.Capabilities, cs.Privileged
	out.ReadOnlyRootFilesystem, out.AllowPrivilegeEscalation, out.ProcMount = cs.ReadOnlyRootFilesystem, cs.AllowPrivilegeEscalation, cs.ProcMount
	return out
}

// imageUID reads an image config's User as CRI's image status does: a numeric user (before any
// ":group") is a uid, anything else a user name; neither for an empty User.
func imageUID(user string) (uid *int64, name string) {
	if user == "" {
		return nil, ""
	}
	u, _, _ := strings.Cut(user, ":")
	if n, err := strconv.ParseInt(u, 10, 64); err == nil {
		return &n, ""
	}
	return nil, u
}

// podRef formats a pod as kubelet's messages do: name_namespace(uid).
func podRef(pod *v1.Pod) string { return fmt.Sprintf("%s_%s(%s)", pod.Name, pod.Namespace, pod.UID) }

// checkRunAsNonRoot is kubelet's check, message for message: runAsUser decides when set; otherwise
// the image's user, which must be numeric to be checked (a name could map to uid 0 in the image's
// /etc/passwd, and kubelet does not look), and an image without a user runs as root.
func checkRunAsNonRoot(pod *v1.Pod, c *v1.Container, sc v1.SecurityContext, imageUser string) error {
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		return nil
	}
	if sc.RunAsUser != nil {
		if *sc.RunAsUser == 0 {
			return ConfigErrorf("container's runAsUser breaks non-root policy (pod: %q, container: %s)", podRef(pod), c.Name)
		}
		return nil
	}
	uid, name := imageUID(imageUser)
	switch {
	case uid == nil && name != "":
		return ConfigErrorf("container has runAsNonRoot and image has non-numeric user (%s), cannot verify user is non-root (pod: %q, container: %s)", name, podRef(pod), c.Name)
	case uid == nil || *uid == 0:
		return ConfigErrorf("container has runAsNonRoot and image will run as root (pod: %q, container: %s)", podRef(pod), c.Name)
	}
	return nil
}

// userOpt sets the process's uid, gid and supplementary groups from runAsUser, runAsGroup,
// supplementalGroups, fsGroup and supplementalGroupsPolicy, resolving names and group memberships
// in the image's /etc/passwd and /etc/group as containerd's CRI plugin does. nil when none of them
// is set: the image config (oci.WithImageConfig) has then already given the same result.
//
// One deliberate difference: an image user "uid:gid" keeps its gid unless runAsGroup is set.
// kubelet hands CRI the uid alone, so there the gid comes from the image's /etc/passwd (or is 0),
// which surprises every image author who wrote USER 1000:1000.
func userOpt(pod *v1.Pod, sc v1.SecurityContext, imageUser string) oci.SpecOpts {
	psc := pod.Spec.SecurityContext
	var extra []uint32
	strict := false
	if psc != nil {
		for _, g := range psc.SupplementalGroups {
			extra = append(extra, uint32(g))
		}
		if psc.FSGroup != nil {
			// Processes must be in the volume's group to use what fsGroup made theirs.
			extra = append(extra, uint32(*psc.FSGroup))
		}
		strict = psc.SupplementalGroupsPolicy != nil && *psc.SupplementalGroupsPolicy == v1.SupplementalGroupsPolicyStrict
	}
	if sc.RunAsUser == nil && sc.RunAsGroup == nil && len(extra) == 0 && !strict {
		return nil
	}
	user := imageUser
	if sc.RunAsUser != nil {
		user = strconv.FormatInt(*sc.RunAsUser, 10)
	}
	if user == "" {
		user = "0"
	}
	if sc.RunAsGroup != nil {
		u, _, _ := strings.Cut(user, ":")
		user = u + ":" + strconv.FormatInt(*sc.RunAsGroup, 10)
	}
	member, _, _ := strings.Cut(user, ":") // whose /etc/group memberships Merge adds
	return func(ctx context.Context, cl oci.Client, ctr *containers.Container, s *oci.Spec) error {
		if err := oci.WithUser(user)(ctx, cl, ctr, s); err != nil {
			return fmt.Errorf("user %q: %w", user, err)
		}
		gids := []uint32{s.Process.User.GID}
		if !strict {
			if err := oci.WithAdditionalGIDs(member)(ctx, cl, ctr, s); err != nil {
				return fmt.Errorf("groups of user %q: %w", member, err)
			}
			gids = append(gids, s.Process.User.AdditionalGids...)
		}
		gids = append(gids, extra...)
		slices.Sort(gids)
		s.Process.User.AdditionalGids = slices.Compact(gids)
		return nil
	}
}

// Kubelet's masked and read-only paths for procMount: Default (moby's list, which kubelet copies).
var (
	defaultMaskedPaths = []string{
		"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
		"/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
	}
	defaultReadonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// procMountOpt masks /proc as kubelet asks CRI to: its default lists, or nothing with Unmasked
// (which admission allows only with hostUsers: false).
func procMountOpt(pm *v1.ProcMountType) oci.SpecOpts {
	masked, ro := defaultMaskedPaths, defaultReadonlyPaths
	if pm != nil && *pm == v1.UnmaskedProcMount {
		masked, ro = []string{}, []string{}
	}
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		s.Linux.MaskedPaths = slices.Clone(masked)
		s.Linux.ReadonlyPaths = slices.Clone(ro)
		return nil
	}
}

// sysctlOpt sets the pod's sysctls in each of its containers: runc writes them in the pod's
// network and IPC namespaces (shared by all its containers, so writing them again at each start
// changes nothing). Admission has checked them against the node's allowlist.
func sysctlOpt(pod *v1.Pod) oci.SpecOpts {
	psc := pod.Spec.SecurityContext
	if psc == nil || len(psc.Sysctls) == 0 {
		return nil
	}
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		if s.Linux.Sysctl == nil {
			s.Linux.Sysctl = map[string]string{}
		}
		for _, sc := range psc.Sysctls {
			s.Linux.Sysctl[sysctl.Normalize(sc.Name)] = sc.Value
		}
		return nil
	}
}

// seccompProfile is the container's profile, else the pod's. kubelet's default (seccompDefault off)
// is Unconfined.
func seccompProfile(pod *v1.Pod, c *v1.Container) *v1.SeccompProfile {
	if c.SecurityContext != nil && c.SecurityContext.SeccompProfile != nil {
		return c.SecurityContext.SeccompProfile
	}
	if pod.Spec.SecurityContext != nil {
		return pod.Spec.SecurityContext.SeccompProfile
	}
	return nil
}

// seccompOpt sets the seccomp filter: none for Unconfined and for privileged containers (as CRI),
// containerd's default profile for RuntimeDefault, a file below root for Localhost.
func seccompOpt(pod *v1.Pod, c *v1.Container, privileged bool, root string) (oci.SpecOpts, error) {
	p := seccompProfile(pod, c)
	none := func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux != nil {
			s.Linux.Seccomp = nil
		}
		return nil
	}
	if privileged || p == nil || p.Type == v1.SeccompProfileTypeUnconfined {
		return none, nil
	}
	if !seccompSupported() {
		return nil, ConfigErrorf("container %q: seccompProfile %s: this kernel has no seccomp", c.Name, p.Type)
	}
	switch p.Type {
	case v1.SeccompProfileTypeRuntimeDefault:
		return seccomp.WithDefaultProfile(), nil
	case v1.SeccompProfileTypeLocalhost:
		if p.LocalhostProfile == nil || *p.LocalhostProfile == "" {
			return nil, ConfigErrorf("container %q: seccompProfile Localhost needs localhostProfile", c.Name)
		}
		rel := *p.LocalhostProfile
		return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			prof, err := readLocalhostProfile(root, rel)
			if err != nil {
				return fmt.Errorf("container %q: seccomp localhostProfile %q: %w", c.Name, rel, err)
			}
			if s.Linux == nil {
				s.Linux = &specs.Linux{}
			}
			s.Linux.Seccomp = prof
			return nil
		}, nil
	}
	return nil, ConfigErrorf("container %q: seccompProfile type %q is not RuntimeDefault, Localhost or Unconfined", c.Name, p.Type)
}

// readLocalhostProfile reads an OCI seccomp profile (JSON) at rel below root. rel comes from a
// manifest: it must stay below root, symlinks included.
func readLocalhostProfile(root, rel string) (*specs.LinuxSeccomp, error) {
	if filepath.IsAbs(rel) || slices.Contains(strings.Split(filepath.ToSlash(rel), "/"), "..") {
		return nil, fmt.Errorf("must be a relative path without '..' (below %s)", root)
	}
	path, err := securejoin.SecureJoin(root, rel)
	if err != nil {
		return nil, fmt.Errorf("resolve below %s: %w", root, err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var prof specs.LinuxSeccomp
	if err := json.Unmarshal(b, &prof); err != nil {
		return nil, fmt.Errorf("%s is not a seccomp profile: %w", path, err)
	}
	if prof.DefaultAction == "" {
		return nil, fmt.Errorf("%s is not a seccomp profile: no defaultAction", path)
	}
	return &prof, nil
}

// seccompSupported reports whether the kernel has seccomp, as /proc/self/status shows it; read
// once, the kernel does not change under a running agent.
var seccompSupported = sync.OnceValue(func() bool {
	b, err := os.ReadFile("/proc/self/status")
	return err == nil && strings.Contains(string(b), "\nSeccomp:")
})

func noNewPrivs(v bool) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Process.NoNewPrivileges = v
		return nil
	}
}

// capabilityOpts applies add/drop the way CRI does, on containerd's default set: "ALL" is not a
// capability containerd knows, so add ALL starts from every known capability and drop ALL from
// none, before the named ones.
func capabilityOpts(c *v1.Capabilities) []oci.SpecOpts {
	add, drop := capNames(c.Add), capNames(c.Drop)
	var opts []oci.SpecOpts
	if slices.Contains(add, "ALL") {
		opts = append(opts, oci.WithAllKnownCapabilities)
	}
	if slices.Contains(drop, "ALL") {
		opts = append(opts, oci.WithCapabilities(nil))
	}
	add = slices.DeleteFunc(add, func(n string) bool { return n == "ALL" })
	drop = slices.DeleteFunc(drop, func(n string) bool { return n == "ALL" })
	return append(opts, oci.WithAddedCapabilities(add), oci.WithDroppedCapabilities(drop))
}

func capNames(cs []v1.Capability) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		n := strings.ToUpper(string(c))
		if n == "ALL" {
			out = append(out, "ALL")
			continue
		}
		if !strings.HasPrefix(n, "CAP_") {
			n = "CAP_" + n
		}
		out = append(out, n)
	}
	return out
}
