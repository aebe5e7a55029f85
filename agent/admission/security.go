package admission

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"github.com/mqlet/mqlet/agent/podspec"
	"github.com/mqlet/mqlet/agent/sysctl"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// AppArmor annotations older manifests use instead of appArmorProfile (kubelet still reads them).
const (
	appArmorAnnotationPrefix = "container.apparmor.security.beta.kubernetes.io/"
	appArmorPodAnnotation    = "apparmor.security.beta.kubernetes.io/pod"
)

// validateSecurity checks the pod's and its containers' security contexts: the API server's rules,
// then what this node can honour. Sysctls are checked against allow (kubelet's SysctlForbidden);
// a nil allow is the node's safe set alone.
func validateSecurity(pod *v1.Pod, allow *sysctl.Allowlist) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	if pod.Spec.HostUsers != nil && !*pod.Spec.HostUsers {
		errs = append(errs, field.Forbidden(spec.Child("hostUsers"),
			"user namespaces (hostUsers: false) are not supported by this node: the pod's root filesystem and volumes would need id-mapped mounts, "+
				"which mqlet does not set up and which runc before 1.2 (Debian 12 ships 1.1) cannot make; remove hostUsers or set it to true"))
	}
	if psc := pod.Spec.SecurityContext; psc != nil {
		p := spec.Child("securityContext")
		errs = append(errs, validateIDs(p, psc.RunAsUser, psc.RunAsGroup)...)
		if psc.FSGroup != nil && !validID(*psc.FSGroup) {
			errs = append(errs, field.Invalid(p.Child("fsGroup"), *psc.FSGroup, idRange))
		}
		for i, g := range psc.SupplementalGroups {
			if !validID(g) {
				errs = append(errs, field.Invalid(p.Child("supplementalGroups").Index(i), g, idRange))
			}
		}
		if fp := psc.FSGroupChangePolicy; fp != nil && *fp != v1.FSGroupChangeOnRootMismatch && *fp != v1.FSGroupChangeAlways {
			errs = append(errs, field.NotSupported(p.Child("fsGroupChangePolicy"), *fp,
				[]v1.PodFSGroupChangePolicy{v1.FSGroupChangeOnRootMismatch, v1.FSGroupChangeAlways}))
		}
		if sp := psc.SupplementalGroupsPolicy; sp != nil && *sp != v1.SupplementalGroupsPolicyMerge && *sp != v1.SupplementalGroupsPolicyStrict {
			errs = append(errs, field.NotSupported(p.Child("supplementalGroupsPolicy"), *sp,
				[]v1.SupplementalGroupsPolicy{v1.SupplementalGroupsPolicyMerge, v1.SupplementalGroupsPolicyStrict}))
		}
		errs = append(errs, validateSeccomp(p.Child("seccompProfile"), psc.SeccompProfile)...)
		errs = append(errs, validateAppArmor(p.Child("appArmorProfile"), psc.AppArmorProfile)...)
		errs = append(errs, validateSysctls(p.Child("sysctls"), pod, allow)...)
	}
	for _, a := range sortedKeys(pod.Annotations) {
		if a == appArmorPodAnnotation || strings.HasPrefix(a, appArmorAnnotationPrefix) {
			if v := pod.Annotations[a]; v != "unconfined" {
				errs = append(errs, field.Forbidden(field.NewPath("metadata", "annotations").Key(a),
					fmt.Sprintf("AppArmor profile %q cannot be enforced: mqlet does not apply AppArmor profiles (only unconfined is accepted)", v)))
			}
		}
	}
	each := func(cs []v1.Container, p *field.Path) {
		for i := range cs {
			errs = append(errs, validateContainerSecurity(pod, cs[i].SecurityContext, p.Index(i).Child("securityContext"))...)
		}
	}
	each(pod.Spec.InitContainers, spec.Child("initContainers"))
	each(pod.Spec.Containers, spec.Child("containers"))
	each(podspec.EphemeralContainers(&pod.Spec), spec.Child("ephemeralContainers"))
	return errs
}

func validateContainerSecurity(pod *v1.Pod, sc *v1.SecurityContext, p *field.Path) field.ErrorList {
	if sc == nil {
		return nil
	}
	errs := validateIDs(p, sc.RunAsUser, sc.RunAsGroup)
	if pm := sc.ProcMount; pm != nil {
		switch *pm {
		case v1.DefaultProcMount:
		case v1.UnmaskedProcMount:
			if pod.Spec.HostUsers == nil || *pod.Spec.HostUsers {
				errs = append(errs, field.Invalid(p.Child("procMount"), *pm,
					"`hostUsers` must be false to use `Unmasked` (an unmasked /proc is safe only inside a user namespace), and this node does not support hostUsers: false"))
			}
		default:
			errs = append(errs, field.NotSupported(p.Child("procMount"), *pm, []v1.ProcMountType{v1.DefaultProcMount, v1.UnmaskedProcMount}))
		}
	}
	// The API server's rule: a container that may not escalate cannot be one that has everything.
	if ape := sc.AllowPrivilegeEscalation; ape != nil && !*ape {
		if sc.Privileged != nil && *sc.Privileged {
			errs = append(errs, field.Invalid(p, "allowPrivilegeEscalation: false",
				"cannot set `allowPrivilegeEscalation` to false and `privileged` to true"))
		}
		if sc.Capabilities != nil {
			for _, c := range sc.Capabilities.Add {
				if n := strings.ToUpper(string(c)); n == "SYS_ADMIN" || n == "CAP_SYS_ADMIN" {
					errs = append(errs, field.Invalid(p, "allowPrivilegeEscalation: false",
						"cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN"))
				}
			}
		}
	}
	errs = append(errs, validateSeccomp(p.Child("seccompProfile"), sc.SeccompProfile)...)
	return append(errs, validateAppArmor(p.Child("appArmorProfile"), sc.AppArmorProfile)...)
}

const idRange = "must be between 0 and 2147483647, inclusive"

// validID is a uid or gid runc accepts.
func validID(v int64) bool { return v >= 0 && v <= math.MaxInt32 }

func validateIDs(p *field.Path, user, group *int64) field.ErrorList {
	var errs field.ErrorList
	if user != nil && !validID(*user) {
		errs = append(errs, field.Invalid(p.Child("runAsUser"), *user, idRange))
	}
	if group != nil && !validID(*group) {
		errs = append(errs, field.Invalid(p.Child("runAsGroup"), *group, idRange))
	}
	return errs
}

// validateSeccomp is the API server's check. The profile file of a Localhost profile is read when
// the container is created (a missing file is kubelet's CreateContainerError, not a refusal).
func validateSeccomp(p *field.Path, sp *v1.SeccompProfile) field.ErrorList {
	if sp == nil {
		return nil
	}
	var errs field.ErrorList
	switch sp.Type {
	case v1.SeccompProfileTypeLocalhost:
		if sp.LocalhostProfile == nil || *sp.LocalhostProfile == "" {
			return append(errs, field.Required(p.Child("localhostProfile"), "must be set when seccomp type is Localhost"))
		}
		lp := *sp.LocalhostProfile
		if filepath.IsAbs(lp) || strings.HasPrefix(lp, "/") || slices.Contains(strings.Split(filepath.ToSlash(lp), "/"), "..") {
			errs = append(errs, field.Invalid(p.Child("localhostProfile"), lp,
				"must be a relative path without '..': a file below the node's seccomp directory (<stateDir>/seccomp)"))
		}
	case v1.SeccompProfileTypeRuntimeDefault, v1.SeccompProfileTypeUnconfined:
		if sp.LocalhostProfile != nil {
			errs = append(errs, field.Invalid(p.Child("localhostProfile"), *sp.LocalhostProfile, "can only be set when seccomp type is Localhost"))
		}
	default:
		errs = append(errs, field.NotSupported(p.Child("type"), sp.Type,
			[]v1.SeccompProfileType{v1.SeccompProfileTypeRuntimeDefault, v1.SeccompProfileTypeLocalhost, v1.SeccompProfileTypeUnconfined}))
	}
	return errs
}

// validateAppArmor accepts Unconfined only. kubelet refuses a pod that asks for a profile on a host
// without AppArmor; mqlet loads no AppArmor profile anywhere, so it refuses the same on every host.
func validateAppArmor(p *field.Path, ap *v1.AppArmorProfile) field.ErrorList {
	if ap == nil {
		return nil
	}
	switch ap.Type {
	case v1.AppArmorProfileTypeUnconfined:
		return nil
	case v1.AppArmorProfileTypeRuntimeDefault, v1.AppArmorProfileTypeLocalhost:
		return field.ErrorList{field.Forbidden(p.Child("type"),
			fmt.Sprintf("AppArmor profile %s cannot be enforced: mqlet does not apply AppArmor profiles (only Unconfined is accepted)", ap.Type))}
	}
	return field.ErrorList{field.NotSupported(p.Child("type"), ap.Type,
		[]v1.AppArmorProfileType{v1.AppArmorProfileTypeRuntimeDefault, v1.AppArmorProfileTypeLocalhost, v1.AppArmorProfileTypeUnconfined})}
}

// validateSysctls: valid, distinct names (API server), then kubelet's admission: each one in the
// node's allowlist and not in a namespace the pod shares with the host.
func validateSysctls(p *field.Path, pod *v1.Pod, allow *sysctl.Allowlist) field.ErrorList {
	scs := pod.Spec.SecurityContext.Sysctls
	if len(scs) == 0 {
		return nil
	}
	var errs field.ErrorList
	if allow == nil {
		var err error
		if allow, err = sysctl.NodeAllowlist(nil); err != nil {
			return field.ErrorList{field.InternalError(p, err)}
		}
	}
	seen := map[string]bool{}
	for i, s := range scs {
		np := p.Index(i).Child("name")
		switch {
		case s.Name == "":
			errs = append(errs, field.Required(np, ""))
			continue
		case !sysctl.ValidName(s.Name):
			errs = append(errs, field.Invalid(np, s.Name, fmt.Sprintf("must have at most %d characters and be dot- or slash-separated lowercase words (such as net.ipv4.tcp_syncookies)", sysctl.MaxLength)))
			continue
		}
		n := sysctl.Normalize(s.Name)
		if seen[n] {
			errs = append(errs, field.Duplicate(np, s.Name))
			continue
		}
		seen[n] = true
		if err := allow.Check(s.Name, pod.Spec.HostNetwork, pod.Spec.HostIPC); err != nil {
			errs = append(errs, field.Forbidden(np, "forbidden sysctl: "+err.Error()))
		}
	}
	return errs
}

// SecurityWarnings lists the security fields of pod that this node accepts and ignores, as kubelet
// and containerd do on a Linux node without SELinux: each names the field and why. The agent emits
// them as warning events (issue 11, "no silently ignored field").
func SecurityWarnings(pod *v1.Pod) []string {
	var out []string
	spec := field.NewPath("spec")
	if psc := pod.Spec.SecurityContext; psc != nil {
		p := spec.Child("securityContext")
		if psc.SELinuxOptions != nil {
			out = append(out, p.Child("seLinuxOptions").String()+": ignored: mqlet applies no SELinux labels")
		}
		if psc.SELinuxChangePolicy != nil {
			out = append(out, p.Child("seLinuxChangePolicy").String()+": ignored: mqlet applies no SELinux labels")
		}
		if psc.WindowsOptions != nil {
			out = append(out, p.Child("windowsOptions").String()+": ignored on a Linux node")
		}
	}
	each := func(cs []v1.Container, path *field.Path) {
		for i := range cs {
			sc := cs[i].SecurityContext
			if sc == nil {
				continue
			}
			p := path.Index(i).Child("securityContext")
			if sc.SELinuxOptions != nil {
				out = append(out, p.Child("seLinuxOptions").String()+": ignored: mqlet applies no SELinux labels")
			}
			if sc.WindowsOptions != nil {
				out = append(out, p.Child("windowsOptions").String()+": ignored on a Linux node")
			}
		}
	}
	each(pod.Spec.InitContainers, spec.Child("initContainers"))
	each(pod.Spec.Containers, spec.Child("containers"))
	each(podspec.EphemeralContainers(&pod.Spec), spec.Child("ephemeralContainers"))
	return out
}
