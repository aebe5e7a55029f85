package runtime

import (
	"fmt"
	"github.com/mqlet/mqlet/agent/podspec"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// containerEnv resolves a container's env list in order, the way kubelet does: a value may refer to
// variables defined earlier with $(NAME); valueFrom.fieldRef reads pod fields. ConfigMap and Secret
// references come with a later issue and are refused with a clear error instead of an empty value.
func containerEnv(pod *v1.Pod, c *v1.Container) ([]v1.EnvVar, error) {
	out := make([]v1.EnvVar, 0, len(c.Env))
	seen := map[string]string{}
	for _, e := range c.Env {
		val := e.Value
		if e.ValueFrom != nil {
			var err error
			if val, err = envFrom(pod, c, e); err != nil {
				return nil, configErr("container %q env %s: %v", c.Name, e.Name, err)
			}
		} else {
			val = expand(val, seen)
		}
		seen[e.Name] = val
		out = append(out, v1.EnvVar{Name: e.Name, Value: val})
	}
	if len(c.EnvFrom) > 0 {
		return nil, configErr("container %q: envFrom (ConfigMap/Secret) is not supported yet", c.Name)
	}
	return out, nil
}

func envFrom(pod *v1.Pod, c *v1.Container, e v1.EnvVar) (string, error) {
	vf := e.ValueFrom
	switch {
	case vf.FieldRef != nil:
		return podField(pod, vf.FieldRef.FieldPath)
	case vf.ResourceFieldRef != nil:
		rf := vf.ResourceFieldRef
		name := rf.ContainerName
		if name == "" {
			name = c.Name
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
	case vf.ConfigMapKeyRef != nil:
		return "", fmt.Errorf("configMapKeyRef is not supported yet")
	case vf.SecretKeyRef != nil:
		return "", fmt.Errorf("secretKeyRef is not supported yet")
	}
	return "", fmt.Errorf("valueFrom has no source")
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

func podField(pod *v1.Pod, path string) (string, error) {
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
	}
	for _, m := range []struct {
		prefix string
		from   map[string]string
	}{{"metadata.labels['", pod.Labels}, {"metadata.annotations['", pod.Annotations}} {
		if strings.HasPrefix(path, m.prefix) && strings.HasSuffix(path, "']") {
			return m.from[strings.TrimSuffix(strings.TrimPrefix(path, m.prefix), "']")], nil
		}
	}
	return "", fmt.Errorf("fieldRef %q is not supported", path)
}

func expandAll(in []string, env []v1.EnvVar) []string {
	vars := make(map[string]string, len(env))
	for _, e := range env {
		vars[e.Name] = e.Value
	}
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = expand(s, vars)
	}
	return out
}

// expand replaces $(NAME) with its value when NAME is known and leaves it as written otherwise;
// $$ is an escaped $. These are Kubernetes' rules for env values, command and args.
func expand(s string, vars map[string]string) string {
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
			if v, ok := vars[name]; ok {
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
