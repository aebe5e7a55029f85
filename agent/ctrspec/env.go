package ctrspec

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/mqlet/mqlet/agent/podspec"
	"github.com/mqlet/mqlet/core/svcenv"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// containerEnv resolves a container's env list in order, the way kubelet does: envFrom sources
// first (later ones win), then env, whose values may refer to variables defined before them with
// $(NAME); valueFrom reads pod fields, resources, and ConfigMap and Secret keys. It is
// ContainerEnvWith without a ConfigMap/Secret store: references to one are refused.
func containerEnv(pod *v1.Pod, c *v1.Container) ([]v1.EnvVar, error) {
	env, _, err := ContainerEnvWith(pod, c, NoObjects{})
	return env, err
}

// ContainerEnvWith is containerEnv reading ConfigMaps and Secrets from objs. skipped lists envFrom
// keys that are not valid variable names (kubelet leaves them out with a warning). A missing
// object or key that is not optional is a *ConfigError naming them (never a value).
//
// The pod's service variables (svcenv.Annotation, which the bridge fills for enableServiceLinks)
// come as kubelet's do: $(NAME) in env values falls back to them where the container defines no
// NAME before, and those the container does not define (by envFrom or env) follow its own.
func ContainerEnvWith(pod *v1.Pod, c *v1.Container, objs Objects) (env []v1.EnvVar, skipped []string, err error) {
	objs = ForPod(objs, pod)
	services, err := svcenv.FromPod(pod)
	if err != nil {
		return nil, nil, ConfigErrorf("container %q: %v", c.Name, err)
	}
	out := make([]v1.EnvVar, 0, len(c.Env)+len(services))
	seen := map[string]string{}
	lookup := func(name string) (string, bool) {
		if v, ok := seen[name]; ok {
			return v, true
		}
		v, ok := services[name]
		return v, ok
	}
	// A name defined twice is listed twice; the later one wins (oci.WithEnv replaces).
	set := func(name, val string) {
		seen[name] = val
		out = append(out, v1.EnvVar{Name: name, Value: val})
	}
	for i, src := range c.EnvFrom {
		vars, skip, err := envFromVars(pod, objs, src)
		if err != nil {
			return nil, nil, ConfigErrorf("container %q envFrom[%d] (%s): %v", c.Name, i, envFromName(src), err)
		}
		skipped = append(skipped, skip...)
		for _, v := range vars {
			set(v.Name, v.Value)
		}
	}
	for _, e := range c.Env {
		val := e.Value
		if e.ValueFrom != nil {
			vf := e.ValueFrom
			if vf.ConfigMapKeyRef != nil || vf.SecretKeyRef != nil {
				v, ok, err := keyRefValue(pod, objs, vf)
				if err != nil {
					return nil, nil, ConfigErrorf("container %q env %s: %v", c.Name, e.Name, err)
				}
				if !ok {
					continue // optional and missing: the variable is not set
				}
				val = v
			} else if val, err = envFrom(pod, c, e); err != nil {
				return nil, nil, ConfigErrorf("container %q env %s: %v", c.Name, e.Name, err)
			}
		} else {
			val = ExpandFunc(val, lookup)
		}
		set(e.Name, val)
	}
	names := make([]string, 0, len(services))
	for n := range services {
		if _, ok := seen[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		out = append(out, v1.EnvVar{Name: n, Value: services[n]})
	}
	return out, skipped, nil
}

func envFrom(pod *v1.Pod, c *v1.Container, e v1.EnvVar) (string, error) {
	vf := e.ValueFrom
	switch {
	case vf.FieldRef != nil:
		return PodField(pod, vf.FieldRef.FieldPath)
	case vf.ResourceFieldRef != nil:
		return ResourceFieldValue(pod, c.Name, vf.ResourceFieldRef)
	}
	return "", fmt.Errorf("valueFrom has no source")
}

// WithDownwardLimits is pod as the downward API reads it: each container without a cpu, memory
// or ephemeral-storage limit gets the node's allocatable amount (kubelet's
// defaultPodLimitsForDownwardAPI), so limits.cpu of an unlimited container says what it may use,
// not 0. pod itself is not changed; with nothing to default it is returned as it is.
func WithDownwardLimits(pod *v1.Pod, allocatable v1.ResourceList) *v1.Pod {
	if len(allocatable) == 0 {
		return pod
	}
	var out *v1.Pod
	for _, list := range []*[]v1.Container{&pod.Spec.InitContainers, &pod.Spec.Containers} {
		for i := range *list {
			for _, name := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory, v1.ResourceEphemeralStorage} {
				a, ok := allocatable[name]
				if _, set := (*list)[i].Resources.Limits[name]; set || !ok {
					continue
				}
				if out == nil {
					out = pod.DeepCopy()
				}
				c := &out.Spec.Containers
				if list == &pod.Spec.InitContainers {
					c = &out.Spec.InitContainers
				}
				if (*c)[i].Resources.Limits == nil {
					(*c)[i].Resources.Limits = v1.ResourceList{}
				}
				(*c)[i].Resources.Limits[name] = a.DeepCopy()
			}
		}
	}
	if out == nil {
		return pod
	}
	return out
}

// ResourceFieldValue reads a container's request or limit for resourceFieldRef, in units of the
// divisor, rounded up. The container is rf.ContainerName, or self when that is empty (env).
func ResourceFieldValue(pod *v1.Pod, self string, rf *v1.ResourceFieldSelector) (string, error) {
	name := rf.ContainerName
	if name == "" {
		name = self
	}
	// Init containers may read their own resources too.
	for _, ctr := range podspec.AllContainers(&pod.Spec) {
		if ctr.Name != name {
			continue
		}
		kind, key, _ := strings.Cut(rf.Resource, ".")
		list := ctr.Resources.Limits
		if kind == "requests" {
			list = ctr.Resources.Requests
		}
		q, ok := list[v1.ResourceName(key)]
		if !ok {
			return "0", nil
		}
		// The value is given in units of the divisor (1 when unset), rounded up, as kubelet does.
		div := rf.Divisor
		if div.IsZero() {
			div = *resource.NewQuantity(1, resource.DecimalSI)
		} else if div.Sign() < 0 {
			return "", fmt.Errorf("resourceFieldRef divisor %s is negative", div.String())
		}
		if key == "cpu" {
			return fmt.Sprint(ceilDiv(q.MilliValue(), div.MilliValue())), nil
		}
		return fmt.Sprint(ceilDiv(q.Value(), div.Value())), nil
	}
	return "", fmt.Errorf("resourceFieldRef names unknown container %q", name)
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

func PodField(pod *v1.Pod, path string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP":
		return pod.Status.PodIP, nil
	case "status.hostIP":
		return pod.Status.HostIP, nil
	case "status.podIPs": // comma-joined, as kubelet gives them
		return joinIPs(pod.Status.PodIPs, func(ip v1.PodIP) string { return ip.IP }), nil
	case "status.hostIPs":
		return joinIPs(pod.Status.HostIPs, func(ip v1.HostIP) string { return ip.IP }), nil
	}
	for _, m := range []struct {
		prefix string
		from   map[string]string
	}{{"metadata.labels['", pod.Labels}, {"metadata.annotations['", VisibleAnnotations(pod)}} {
		if strings.HasPrefix(path, m.prefix) && strings.HasSuffix(path, "']") {
			return m.from[strings.TrimSuffix(strings.TrimPrefix(path, m.prefix), "']")], nil
		}
	}
	return "", fmt.Errorf("fieldRef %q is not supported", path)
}

// VisibleAnnotations are the pod's annotations as the downward API shows them: without
// svcenv.Annotation, the bridge's transport of the service variables (kubelet's pods have no
// such annotation, and a changed Service must not change what a container reads).
func VisibleAnnotations(pod *v1.Pod) map[string]string {
	if _, ok := pod.Annotations[svcenv.Annotation]; !ok {
		return pod.Annotations
	}
	out := maps.Clone(pod.Annotations)
	delete(out, svcenv.Annotation)
	return out
}

func ExpandAll(in []string, env []v1.EnvVar) []string {
	vars := make(map[string]string, len(env))
	for _, e := range env {
		vars[e.Name] = e.Value
	}
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = Expand(s, vars)
	}
	return out
}

// Expand replaces $(NAME) with its value when NAME is known and leaves it as written otherwise;
// $$ is an escaped $. These are Kubernetes' rules for env values, command and args.
func Expand(s string, vars map[string]string) string {
	return ExpandFunc(s, func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	})
}

// ExpandFunc is Expand with the values from lookup: $(NAME) stays as written where lookup says
// NAME is not known. Callers that must refuse a missing variable (subPathExpr) note it in lookup.
func ExpandFunc(s string, lookup func(name string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

func joinIPs[T any](ips []T, ip func(T) string) string {
	out := make([]string, len(ips))
	for i, x := range ips {
		out[i] = ip(x)
	}
	return strings.Join(out, ",")
}
