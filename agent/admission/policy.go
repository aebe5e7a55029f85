package admission

import (
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Policy limits what pods from the control plane (source.MQTT) may ask of the node. Manifest-dir
// pods are not checked: whoever can write /etc/mqlet/pods is root on the node already, like
// kubelet's static pods. A broker account is not, so by default an MQTT pod gets nothing that
// reaches outside its containers.
type Policy struct {
	// AllowPrivileged allows privileged containers, allowPrivilegeEscalation: true and added
	// capabilities beyond the Pod Security Standards' baseline set.
	AllowPrivileged bool
	// AllowHostNamespaces allows hostNetwork, hostPID and hostIPC.
	AllowHostNamespaces bool
	// AllowDebugPtrace lets ephemeral containers (kubectl debug) add SYS_PTRACE, which kubectl's
	// default debug profile (general) asks for, and nothing more: the debugger can trace the
	// processes of the pod it is in (the target's, with --target), not the host's.
	AllowDebugPtrace bool
	// AllowedHostPaths are absolute, clean path prefixes; a hostPath volume is allowed when its path
	// equals one or lies below one, segment by segment (/data allows /data/x, not /database).
	// Empty: no hostPath volume at all.
	AllowedHostPaths []string
}

// The setting that would allow each kind of refusal, as the agent's config file names it, so a
// refusal tells the operator what to change if the pod is meant to run.
const (
	settingPrivileged     = "mqttPolicy.allowPrivileged"
	settingHostNamespaces = "mqttPolicy.allowHostNamespaces"
	settingHostPaths      = "mqttPolicy.allowedHostPaths"
	settingDebugPtrace    = "mqttPolicy.allowDebugPtrace or mqttPolicy.allowPrivileged"
)

// baselineCapabilities are the capabilities the Pod Security Standards' baseline profile lets a pod
// add (they are in containerd's default set anyway). Anything else, NET_ADMIN, SYS_ADMIN, ALL...,
// is a way out of the container.
var baselineCapabilities = []string{
	"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
	"SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}

// Violation is one thing a pod asks for that the policy does not allow.
type Violation struct {
	Field   string // e.g. spec.containers[0].securityContext.privileged
	Detail  string // what it asks for and why that is refused
	Setting string // the policy setting that would allow it, e.g. mqttPolicy.allowPrivileged
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: %s (allowed only with %s)", v.Field, v.Detail, v.Setting)
}

// PolicyError is a pod refused by Policy alone: it passed validation. The agent tells it apart
// from other refusals (errors.As) to emit a PolicyDenied event.
type PolicyError struct {
	Pod        string // namespace/name
	Source     string // the source kind the policy applies to, e.g. "mqtt"
	Violations []Violation
}

func (e *PolicyError) Error() string {
	msgs := make([]string, len(e.Violations))
	for i, v := range e.Violations {
		msgs[i] = v.String()
	}
	return fmt.Sprintf("pod %s refused by the node's policy for %s pods: %s", e.Pod, e.Source, strings.Join(msgs, "; "))
}

// Check returns what spec asks for that p does not allow, in field order; nil when it is allowed.
func (p Policy) Check(spec *v1.PodSpec) []Violation {
	var out []Violation
	s := field.NewPath("spec")
	if !p.AllowHostNamespaces {
		for _, ns := range []struct {
			on   bool
			name string
		}{{spec.HostNetwork, "hostNetwork"}, {spec.HostPID, "hostPID"}, {spec.HostIPC, "hostIPC"}} {
			if ns.on {
				out = append(out, Violation{s.Child(ns.name).String(), "the host's namespace is not allowed", settingHostNamespaces})
			}
		}
	}
	for i, v := range spec.Volumes {
		if v.HostPath == nil {
			continue
		}
		fp := s.Child("volumes").Index(i).Child("hostPath", "path").String()
		if why := p.hostPathRefused(v.HostPath.Path); why != "" {
			out = append(out, Violation{fp, fmt.Sprintf("%q %s", v.HostPath.Path, why), settingHostPaths})
		}
	}
	if !p.AllowPrivileged {
		for i := range spec.InitContainers {
			out = append(out, privileges(s.Child("initContainers").Index(i), spec.InitContainers[i].SecurityContext, nil)...)
		}
		for i := range spec.Containers {
			out = append(out, privileges(s.Child("containers").Index(i), spec.Containers[i].SecurityContext, nil)...)
		}
		debug := &debugCaps{allowed: p.AllowDebugPtrace}
		for i := range spec.EphemeralContainers {
			out = append(out, privileges(s.Child("ephemeralContainers").Index(i), spec.EphemeralContainers[i].SecurityContext, debug)...)
		}
	}
	return out
}

// debugCaps is what an ephemeral container may add beyond the baseline set: SYS_PTRACE, when
// allowed (Policy.AllowDebugPtrace).
type debugCaps struct{ allowed bool }

// privileges lists what a container's securityContext asks beyond an unprivileged container; debug
// is set for an ephemeral container.
func privileges(c *field.Path, sc *v1.SecurityContext, debug *debugCaps) []Violation {
	if sc == nil {
		return nil
	}
	var out []Violation
	p := c.Child("securityContext")
	if sc.Privileged != nil && *sc.Privileged {
		out = append(out, Violation{p.Child("privileged").String(), "a privileged container has every device and capability of the host", settingPrivileged})
	}
	if sc.AllowPrivilegeEscalation != nil && *sc.AllowPrivilegeEscalation {
		out = append(out, Violation{p.Child("allowPrivilegeEscalation").String(), "setuid binaries could gain privileges the container was not given", settingPrivileged})
	}
	if sc.Capabilities != nil {
		for i, cp := range sc.Capabilities.Add {
			// The runtime accepts "net_admin" and "CAP_NET_ADMIN" alike (capNames); so must the check.
			name := strings.TrimPrefix(strings.ToUpper(string(cp)), "CAP_")
			if debug != nil && name == "SYS_PTRACE" {
				if !debug.allowed {
					out = append(out, Violation{p.Child("capabilities", "add").Index(i).String(),
						fmt.Sprintf("capability %q (kubectl debug's general profile; --profile=baseline does without) is not one of the baseline capabilities a pod may add", cp), settingDebugPtrace})
				}
				continue
			}
			if !slices.Contains(baselineCapabilities, name) {
				out = append(out, Violation{p.Child("capabilities", "add").Index(i).String(),
					fmt.Sprintf("capability %q is not one of the baseline capabilities a pod may add", cp), settingPrivileged})
			}
		}
	}
	return out
}

// AnnotationHostPathRoots records, on a pod from a source the policy applies to (MQTT), the allowed
// host path each of its hostPath volumes was admitted under: JSON, volume name -> root, e.g.
// {"data":"/data"}. Admission judges the path as written; a pod that can write below an allowed
// path can make that path lead anywhere with a symlink (ln -s / /data/escape), so the runtime opens
// the volume's path beneath this root, at mount time, and refuses it if it leads out. Admission
// sets it and drops whatever a source sent under this key, for every source: a pod cannot name its
// own root.
const AnnotationHostPathRoots = "mqlet.io/hostpath-roots"

// HostPathRoots reads AnnotationHostPathRoots; nil when the pod has none.
func HostPathRoots(pod *v1.Pod) (map[string]string, error) {
	s, ok := pod.Annotations[AnnotationHostPathRoots]
	if !ok {
		return nil, nil
	}
	var roots map[string]string
	if err := json.Unmarshal([]byte(s), &roots); err != nil {
		return nil, fmt.Errorf("annotation %s %q: %w", AnnotationHostPathRoots, s, err)
	}
	return roots, nil
}

// hostPathRoots is what AnnotationHostPathRoots records for an admitted spec: for each hostPath
// volume, the outermost allowed path it lies under. The outermost, because a pod allowed an outer
// path could have made an inner allowed path a symlink: the inner one is no safe root.
func (p Policy) hostPathRoots(spec *v1.PodSpec) map[string]string {
	roots := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath == nil {
			continue
		}
		clean := path.Clean(v.HostPath.Path)
		best := ""
		for _, allowed := range p.AllowedHostPaths {
			if under(clean, allowed) && (best == "" || len(allowed) < len(best)) {
				best = allowed
			}
		}
		if best != "" {
			roots[v.Name] = best
		}
	}
	return roots
}

// hostPathRefused says why a hostPath is not allowed, or "" when it is. The path is judged as
// written: a relative path or one with ".." could mean anything once resolved, so it is refused
// rather than cleaned into something that happens to match. What it resolves to is checked again
// when it is mounted (AnnotationHostPathRoots).
func (p Policy) hostPathRefused(hp string) string {
	if !path.IsAbs(hp) {
		return "is not an absolute path"
	}
	if slices.Contains(strings.Split(hp, "/"), "..") {
		return "contains '..'"
	}
	if len(p.AllowedHostPaths) == 0 {
		return "is not allowed: no hostPath is"
	}
	clean := path.Clean(hp)
	for _, allowed := range p.AllowedHostPaths {
		if under(clean, allowed) {
			return ""
		}
	}
	return fmt.Sprintf("is not under an allowed path (%s)", strings.Join(p.AllowedHostPaths, ", "))
}

// under reports whether the clean absolute path p equals prefix or lies below it, by whole path
// segments. A prefix that is not absolute and clean matches nothing: config validation refuses
// such prefixes, and a mistake must not widen what is allowed.
func under(p, prefix string) bool {
	if !path.IsAbs(prefix) || path.Clean(prefix) != prefix {
		return false
	}
	if prefix == "/" {
		return true
	}
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}
