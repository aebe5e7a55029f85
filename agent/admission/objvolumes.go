package admission

import (
	"fmt"
	"strings"

	"github.com/mqlet/mqlet/agent/atomicwriter"
	"github.com/mqlet/mqlet/agent/podspec"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// validateObjectVolumes checks what configMap, secret, downwardAPI and projected volumes would write
// on the node, before the pod is stored: every item path stays inside its volume (relative, no
// '..', not one of the writer's own '..' names), modes are file modes, paths are unique in a volume,
// and the sources exist on a node without an API server. The runtime checks the paths again when it
// writes, and keys (which name files when no items are given) there.
func validateObjectVolumes(spec *v1.PodSpec, specPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		vp := specPath.Child("volumes").Index(i)
		paths := map[string]*field.Path{}
		switch {
		case v.ConfigMap != nil:
			p := vp.Child("configMap")
			errs = append(errs, required(p.Child("name"), v.ConfigMap.Name)...)
			errs = append(errs, checkMode(p.Child("defaultMode"), v.ConfigMap.DefaultMode)...)
			errs = append(errs, checkItems(p.Child("items"), v.ConfigMap.Items, paths)...)
		case v.Secret != nil:
			p := vp.Child("secret")
			errs = append(errs, required(p.Child("secretName"), v.Secret.SecretName)...)
			errs = append(errs, checkMode(p.Child("defaultMode"), v.Secret.DefaultMode)...)
			errs = append(errs, checkItems(p.Child("items"), v.Secret.Items, paths)...)
		case v.DownwardAPI != nil:
			p := vp.Child("downwardAPI")
			errs = append(errs, checkMode(p.Child("defaultMode"), v.DownwardAPI.DefaultMode)...)
			errs = append(errs, checkDownward(p.Child("items"), v.DownwardAPI.Items, paths)...)
		case v.Projected != nil:
			p := vp.Child("projected")
			errs = append(errs, checkMode(p.Child("defaultMode"), v.Projected.DefaultMode)...)
			for j, s := range v.Projected.Sources {
				sp := p.Child("sources").Index(j)
				switch {
				case s.ConfigMap != nil:
					errs = append(errs, required(sp.Child("configMap", "name"), s.ConfigMap.Name)...)
					errs = append(errs, checkItems(sp.Child("configMap", "items"), s.ConfigMap.Items, paths)...)
				case s.Secret != nil:
					errs = append(errs, required(sp.Child("secret", "name"), s.Secret.Name)...)
					errs = append(errs, checkItems(sp.Child("secret", "items"), s.Secret.Items, paths)...)
				case s.DownwardAPI != nil:
					errs = append(errs, checkDownward(sp.Child("downwardAPI", "items"), s.DownwardAPI.Items, paths)...)
				case s.ServiceAccountToken != nil:
					errs = append(errs, field.Forbidden(sp.Child("serviceAccountToken"), "not supported: mqlet has no Kubernetes API server to issue service account tokens"))
				case s.ClusterTrustBundle != nil:
					errs = append(errs, field.Forbidden(sp.Child("clusterTrustBundle"), "not supported: mqlet has no Kubernetes API server to read trust bundles from"))
				default:
					errs = append(errs, field.Required(sp, "one of configMap, secret or downwardAPI"))
				}
			}
		}
	}
	for _, group := range []struct {
		name string
		list []v1.Container
	}{{"initContainers", spec.InitContainers}, {"containers", spec.Containers}, {"ephemeralContainers", podspec.EphemeralContainers(spec)}} {
		for i, c := range group.list {
			for j, m := range c.VolumeMounts {
				if m.SubPath != "" && m.SubPathExpr != "" {
					errs = append(errs, field.Invalid(specPath.Child(group.name).Index(i).Child("volumeMounts").Index(j).Child("subPathExpr"),
						m.SubPathExpr, "subPathExpr and subPath are mutually exclusive"))
				}
			}
		}
	}
	return errs
}

func required(p *field.Path, v string) field.ErrorList {
	if v == "" {
		return field.ErrorList{field.Required(p, "")}
	}
	return nil
}

func checkMode(p *field.Path, m *int32) field.ErrorList {
	if m != nil && (*m < 0 || *m > 0o777) {
		return field.ErrorList{field.Invalid(p, fmt.Sprintf("%#o", *m), "must be a file mode from 0 to 0777 (511 in decimal)")}
	}
	return nil
}

// checkPath validates an item path and records it, refusing a second item at the same path.
func checkPath(p *field.Path, path string, paths map[string]*field.Path) field.ErrorList {
	if err := atomicwriter.ValidatePath(path); err != nil {
		return field.ErrorList{field.Invalid(p, path, err.Error()+" (the file must stay inside its volume)")}
	}
	if first, dup := paths[path]; dup {
		return field.ErrorList{field.Duplicate(p, path+" (also "+first.String()+")")}
	}
	paths[path] = p
	return nil
}

func checkItems(p *field.Path, items []v1.KeyToPath, paths map[string]*field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, it := range items {
		ip := p.Index(i)
		errs = append(errs, required(ip.Child("key"), it.Key)...)
		errs = append(errs, checkPath(ip.Child("path"), it.Path, paths)...)
		errs = append(errs, checkMode(ip.Child("mode"), it.Mode)...)
	}
	return errs
}

func checkDownward(p *field.Path, items []v1.DownwardAPIVolumeFile, paths map[string]*field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, it := range items {
		ip := p.Index(i)
		errs = append(errs, checkPath(ip.Child("path"), it.Path, paths)...)
		errs = append(errs, checkMode(ip.Child("mode"), it.Mode)...)
		switch {
		case it.FieldRef != nil && it.ResourceFieldRef != nil:
			errs = append(errs, field.Invalid(ip, it.Path, "fieldRef and resourceFieldRef are mutually exclusive"))
		case it.FieldRef != nil:
			if !volumeFieldPath(it.FieldRef.FieldPath) {
				errs = append(errs, field.NotSupported(ip.Child("fieldRef", "fieldPath"), it.FieldRef.FieldPath,
					[]string{"metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels", "metadata.annotations", "metadata.labels['<KEY>']", "metadata.annotations['<KEY>']"}))
			}
		case it.ResourceFieldRef != nil:
			errs = append(errs, required(ip.Child("resourceFieldRef", "containerName"), it.ResourceFieldRef.ContainerName)...)
		default:
			errs = append(errs, field.Required(ip, "one of fieldRef or resourceFieldRef"))
		}
	}
	return errs
}

func volumeFieldPath(p string) bool {
	switch p {
	case "metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels", "metadata.annotations":
		return true
	}
	for _, prefix := range []string{"metadata.labels['", "metadata.annotations['"} {
		if strings.HasPrefix(p, prefix) && strings.HasSuffix(p, "']") && len(p) > len(prefix)+2 {
			return true
		}
	}
	return false
}
