package pods

import (
	v1 "k8s.io/api/core/v1"
)

// Ref is a configMap or secret a pod references, in the pod's namespace.
type Ref struct {
	Kind     string // "ConfigMap" or "Secret"
	Name     string
	Optional bool
}

// References lists the configMaps and secrets a pod needs on its node: volumes (configMap,
// secret, projected sources), env valueFrom, envFrom of every init, app and ephemeral container, and
// imagePullSecrets (which are always optional: kubelet pulls without a missing one). A name
// referenced both optionally and not counts as required. Ephemeral containers' env counts too. Order: first reference first.
func References(spec *v1.PodSpec) []Ref {
	var out []Ref
	at := map[Ref]int{} // Kind+Name (Optional false) -> index in out
	add := func(kind, name string, optional *bool) {
		if name == "" {
			return
		}
		opt := optional != nil && *optional
		k := Ref{Kind: kind, Name: name}
		if i, ok := at[k]; ok {
			out[i].Optional = out[i].Optional && opt
			return
		}
		at[k] = len(out)
		out = append(out, Ref{Kind: kind, Name: name, Optional: opt})
	}
	yes := true
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		if v.ConfigMap != nil {
			add("ConfigMap", v.ConfigMap.Name, v.ConfigMap.Optional)
		}
		if v.Secret != nil {
			add("Secret", v.Secret.SecretName, v.Secret.Optional)
		}
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.ConfigMap != nil {
					add("ConfigMap", s.ConfigMap.Name, s.ConfigMap.Optional)
				}
				if s.Secret != nil {
					add("Secret", s.Secret.Name, s.Secret.Optional)
				}
			}
		}
	}
	containers := func(cs []v1.Container) {
		for i := range cs {
			c := &cs[i]
			for _, e := range c.EnvFrom {
				if e.ConfigMapRef != nil {
					add("ConfigMap", e.ConfigMapRef.Name, e.ConfigMapRef.Optional)
				}
				if e.SecretRef != nil {
					add("Secret", e.SecretRef.Name, e.SecretRef.Optional)
				}
			}
			for _, e := range c.Env {
				if e.ValueFrom == nil {
					continue
				}
				if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
					add("ConfigMap", r.Name, r.Optional)
				}
				if r := e.ValueFrom.SecretKeyRef; r != nil {
					add("Secret", r.Name, r.Optional)
				}
			}
		}
	}
	containers(spec.InitContainers)
	containers(spec.Containers)
	for i := range spec.EphemeralContainers { // kubectl debug's containers read env like any
		containers([]v1.Container{v1.Container(spec.EphemeralContainers[i].EphemeralContainerCommon)})
	}
	for _, s := range spec.ImagePullSecrets {
		add("Secret", s.Name, &yes)
	}
	return out
}
