package ctrspec

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/mqlet/mqlet/core/satoken"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Objects is where the runtime reads the ConfigMaps and Secrets that pods use in env, envFrom,
// volumes and imagePullSecrets. The agent implements it over its store (agent/objects). A
// missing object is a *NotFoundError; any other error is the store's. The objects returned are
// the caller's to keep but must not be changed.
type Objects interface {
	ConfigMap(namespace, name string) (*v1.ConfigMap, error)
	Secret(namespace, name string) (*v1.Secret, error)
}

// ForPod is objs as pod sees them: a service account token Secret made for another pod
// (core/satoken) is refused, so a pod that names it by its predictable name gets nothing.
func ForPod(objs Objects, pod *v1.Pod) Objects { return podObjects{objs, pod} }

type podObjects struct {
	Objects
	pod *v1.Pod
}

func (o podObjects) Secret(namespace, name string) (*v1.Secret, error) {
	s, err := o.Objects.Secret(namespace, name)
	if err == nil && satoken.ForOtherPod(s, string(o.pod.UID)) {
		return nil, fmt.Errorf("secret %s/%s holds another pod's service account token; pod %s may not read it", namespace, name, o.pod.Name)
	}
	return s, err
}

// NotFoundError says that no ConfigMap or Secret of that name is stored (yet). Kind is
// "ConfigMap" or "Secret".
type NotFoundError struct {
	Kind, Namespace, Name string
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("%s %s/%s not found", e.Kind, e.Namespace, e.Name)
}

// IsNotFound reports whether err says an object is missing.
func IsNotFound(err error) bool {
	var nf *NotFoundError
	return errors.As(err, &nf)
}

// keyRefValue resolves a configMapKeyRef or secretKeyRef. ok is false when an optional object or
// key is missing: the variable is then left out, as kubelet does. Messages name the object and
// the key, never a value.
func keyRefValue(pod *v1.Pod, objs Objects, vf *v1.EnvVarSource) (val string, ok bool, err error) {
	var (
		kind, name, key string
		optional        bool
		get             func() (map[string]string, error)
	)
	switch {
	case vf.ConfigMapKeyRef != nil:
		ref := vf.ConfigMapKeyRef
		kind, name, key, optional = "ConfigMap", ref.Name, ref.Key, ref.Optional != nil && *ref.Optional
		get = func() (map[string]string, error) {
			cm, err := objs.ConfigMap(pod.Namespace, name)
			if err != nil {
				return nil, err
			}
			return cm.Data, nil
		}
	case vf.SecretKeyRef != nil:
		ref := vf.SecretKeyRef
		kind, name, key, optional = "Secret", ref.Name, ref.Key, ref.Optional != nil && *ref.Optional
		get = func() (map[string]string, error) {
			s, err := objs.Secret(pod.Namespace, name)
			if err != nil {
				return nil, err
			}
			return secretStrings(s), nil
		}
	default:
		return "", false, errors.New("not a key reference")
	}
	data, err := get()
	if err != nil {
		if optional && IsNotFound(err) {
			return "", false, nil
		}
		return "", false, err
	}
	v, found := data[key]
	if !found {
		if optional {
			return "", false, nil
		}
		return "", false, fmt.Errorf("couldn't find key %s in %s %s/%s", key, kind, pod.Namespace, name)
	}
	return v, true, nil
}

// secretStrings is a Secret's data as env values; stringData is folded in as the API server
// would (a manifest-dir Secret may carry it).
func secretStrings(s *v1.Secret) map[string]string {
	out := make(map[string]string, len(s.Data)+len(s.StringData))
	for k, v := range s.Data {
		out[k] = string(v)
	}
	for k, v := range s.StringData {
		out[k] = v
	}
	return out
}

// envFromVars resolves one envFrom source into variables, prefixed, sorted by name. Every key is
// taken, as kubelet (1.34 and later, the API's relaxed variable names) takes them: data-1 and 1st
// too. Only a name no environment can hold (empty, '=', not printable ASCII: a manifest-dir object
// is not validated by an API server) is skipped and returned, for a warning.
func envFromVars(pod *v1.Pod, objs Objects, src v1.EnvFromSource) (vars []v1.EnvVar, skipped []string, err error) {
	var data map[string]string
	switch {
	case src.ConfigMapRef != nil:
		cm, gerr := objs.ConfigMap(pod.Namespace, src.ConfigMapRef.Name)
		if gerr != nil {
			if src.ConfigMapRef.Optional != nil && *src.ConfigMapRef.Optional && IsNotFound(gerr) {
				return nil, nil, nil
			}
			return nil, nil, gerr
		}
		data = cm.Data
	case src.SecretRef != nil:
		s, gerr := objs.Secret(pod.Namespace, src.SecretRef.Name)
		if gerr != nil {
			if src.SecretRef.Optional != nil && *src.SecretRef.Optional && IsNotFound(gerr) {
				return nil, nil, nil
			}
			return nil, nil, gerr
		}
		data = secretStrings(s)
	default:
		return nil, nil, errors.New("envFrom entry names neither configMapRef nor secretRef")
	}
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		name := src.Prefix + k
		if errs := validation.IsRelaxedEnvVarName(name); len(errs) > 0 {
			skipped = append(skipped, name)
			continue
		}
		vars = append(vars, v1.EnvVar{Name: name, Value: data[k]})
	}
	return vars, skipped, nil
}

// envFromName names an envFrom source in messages.
func envFromName(src v1.EnvFromSource) string {
	switch {
	case src.ConfigMapRef != nil:
		return "ConfigMap " + src.ConfigMapRef.Name
	case src.SecretRef != nil:
		return "Secret " + src.SecretRef.Name
	}
	return "an empty source"
}

// SkippedMessage is the warning for envFrom keys that cannot be variable names.
func SkippedMessage(c *v1.Container, skipped []string) string {
	return fmt.Sprintf("container %q: keys [%s] from envFrom were skipped since they are not valid environment variable names",
		c.Name, strings.Join(skipped, ", "))
}

// NoObjects is the Objects of a runtime that was given none.
type NoObjects struct{}

func (NoObjects) ConfigMap(ns, name string) (*v1.ConfigMap, error) {
	return nil, fmt.Errorf("ConfigMap %s/%s: this runtime has no ConfigMap store", ns, name)
}

func (NoObjects) Secret(ns, name string) (*v1.Secret, error) {
	return nil, fmt.Errorf("Secret %s/%s: this runtime has no Secret store", ns, name)
}
