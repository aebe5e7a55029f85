package podspec

import v1 "k8s.io/api/core/v1"

// Kinds of object a pod can refer to, as UsesObject takes them.
const (
	KindConfigMap = "ConfigMap"
	KindSecret    = "Secret"
)

// UsesObject reports whether spec refers to the ConfigMap or Secret (kind) called name in the pod's
// namespace: from env, envFrom, a volume (projected sources included) or imagePullSecrets.
func UsesObject(spec *v1.PodSpec, kind, name string) bool {
	cm, secret := kind == KindConfigMap, kind == KindSecret
	if secret {
		for _, s := range spec.ImagePullSecrets {
			if s.Name == name {
				return true
			}
		}
	}
	for _, v := range spec.Volumes {
		switch {
		case cm && v.ConfigMap != nil && v.ConfigMap.Name == name,
			secret && v.Secret != nil && v.Secret.SecretName == name:
			return true
		case v.Projected != nil:
			for _, p := range v.Projected.Sources {
				if cm && p.ConfigMap != nil && p.ConfigMap.Name == name || secret && p.Secret != nil && p.Secret.Name == name {
					return true
				}
			}
		}
	}
	for _, c := range EveryContainer(spec) {
		for _, e := range c.EnvFrom {
			if cm && e.ConfigMapRef != nil && e.ConfigMapRef.Name == name || secret && e.SecretRef != nil && e.SecretRef.Name == name {
				return true
			}
		}
		for _, e := range c.Env {
			if vf := e.ValueFrom; vf != nil &&
				(cm && vf.ConfigMapKeyRef != nil && vf.ConfigMapKeyRef.Name == name || secret && vf.SecretKeyRef != nil && vf.SecretKeyRef.Name == name) {
				return true
			}
		}
	}
	return false
}
