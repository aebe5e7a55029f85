package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/mqlet/mqlet/core/source"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Object is a ConfigMap or Secret declared in a manifest file next to the pods that use it.
// Exactly one of ConfigMap and Secret is set. A Secret's stringData is folded into data, as the
// API server does on write.
type Object struct {
	ConfigMap *v1.ConfigMap
	Secret    *v1.Secret
	Sum       string // identifies the document's content
	File      string
	Index     int
	Line      int
	Stale     bool // kept from an earlier scan because its file now has problems (see Pod.Stale)
}

// Kind is "ConfigMap" or "Secret".
func (o Object) Kind() string {
	if o.Secret != nil {
		return "Secret"
	}
	return "ConfigMap"
}

func (o Object) meta() (namespace, name string) {
	if o.Secret != nil {
		return o.Secret.Namespace, o.Secret.Name
	}
	return o.ConfigMap.Namespace, o.ConfigMap.Name
}

// Key is "<Kind> <namespace>/<name>": objects of both kinds and pods have separate names.
func (o Object) Key() string {
	ns, name := o.meta()
	return o.Kind() + " " + ns + "/" + name
}

// Ref is where the object came from.
func (o Object) Ref() source.Ref { return source.Ref{Kind: source.File, Origin: o.File, Doc: o.Index} }

func (o Object) deepCopy() Object {
	c := o
	if o.ConfigMap != nil {
		c.ConfigMap = o.ConfigMap.DeepCopy()
	}
	if o.Secret != nil {
		c.Secret = o.Secret.DeepCopy()
	}
	return c
}

// isObjectKind reports whether a document's kind is one decodeObject takes.
func isObjectKind(kind string) bool { return kind == "ConfigMap" || kind == "Secret" }

// decodeObject turns a ConfigMap or Secret document into an Object, strictly, and checks what
// would reach the filesystem or the store: names, namespace and keys. Messages never quote a
// value of the data.
func decodeObject(d Document, apiVersion, kind string) (Object, error) {
	if apiVersion == "" {
		return Object{}, fmt.Errorf("apiVersion is required (want apiVersion: v1)")
	}
	if apiVersion != "v1" {
		return Object{}, fmt.Errorf("apiVersion %q is not supported for kind %s (want v1)", apiVersion, kind)
	}
	var o Object
	var ns, name *string
	switch kind {
	case "ConfigMap":
		cm := &v1.ConfigMap{}
		if err := d.DecodeStrict(cm); err != nil {
			return Object{}, err
		}
		o.ConfigMap, ns, name = cm, &cm.Namespace, &cm.Name
	case "Secret":
		s := &v1.Secret{}
		if err := d.DecodeStrict(s); err != nil {
			return Object{}, err
		}
		o.Secret, ns, name = s, &s.Namespace, &s.Name
	}
	if *ns == "" {
		*ns = "default"
	}
	var problems []string
	for _, e := range validation.IsDNS1123Subdomain(*name) {
		problems = append(problems, fmt.Sprintf("metadata.name %q: %s", *name, e))
	}
	for _, e := range validation.IsDNS1123Label(*ns) {
		problems = append(problems, fmt.Sprintf("metadata.namespace %q: %s", *ns, e))
	}
	if o.ConfigMap != nil {
		problems = append(problems, checkKeys("data", keysOf(o.ConfigMap.Data), nil)...)
		problems = append(problems, checkKeys("binaryData", keysOf(o.ConfigMap.BinaryData), o.ConfigMap.Data)...)
	} else {
		foldStringData(o.Secret)
		problems = append(problems, checkKeys("data", keysOf(o.Secret.Data), nil)...)
		problems = append(problems, checkSecretType(o.Secret)...)
	}
	if len(problems) > 0 {
		return Object{}, errors.New(strings.Join(problems, "; "))
	}
	sum := sha256.Sum256(d.JSON)
	o.Sum = hex.EncodeToString(sum[:16])
	return o, nil
}

func keysOf[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkKeys: keys become file names in volumes and variable names in envFrom.
func checkKeys(field string, keys []string, other map[string]string) []string {
	var out []string
	for _, k := range keys {
		if errs := validation.IsConfigMapKey(k); len(errs) > 0 {
			out = append(out, fmt.Sprintf("%s key %q: %s", field, k, strings.Join(errs, "; ")))
		}
		if _, dup := other[k]; dup {
			out = append(out, fmt.Sprintf("key %q is in both data and binaryData", k))
		}
	}
	return out
}

// foldStringData merges stringData into data (stringData wins) and clears it.
func foldStringData(s *v1.Secret) {
	if len(s.StringData) == 0 {
		return
	}
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	for k, v := range s.StringData {
		s.Data[k] = []byte(v)
	}
	s.StringData = nil
}

// checkSecretType checks the keys the registry credential types require, as the API server does,
// so a broken pull secret is refused here rather than failing a pull later.
func checkSecretType(s *v1.Secret) []string {
	var key string
	switch s.Type {
	case v1.SecretTypeDockerConfigJson:
		key = v1.DockerConfigJsonKey
	case v1.SecretTypeDockercfg:
		key = v1.DockerConfigKey
	default:
		return nil
	}
	b, ok := s.Data[key]
	if !ok {
		return []string{fmt.Sprintf("a Secret of type %s needs data key %s", s.Type, key)}
	}
	if !json.Valid(b) {
		return []string{fmt.Sprintf("data key %s of a Secret of type %s is not valid JSON", key, s.Type)}
	}
	return nil
}

// keepPreviousObjects is keepPrevious for objects.
func keepPreviousObjects(valid, previous []Object) []Object {
	have := map[string]bool{}
	for _, o := range valid {
		have[o.Key()] = true
	}
	out := append([]Object(nil), valid...)
	for _, o := range previous {
		if !have[o.Key()] {
			o.Stale = true
			out = append(out, o)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out
}

// KeptFiles are the files (or the directory) whose stored objects and pods stay as they are because
// they cannot be read cleanly now: every problem but a duplicate marks its file (see Change).
func (s Snapshot) KeptFiles() []string {
	var out []string
	for _, p := range s.Problems {
		if !p.Duplicate && !slices.Contains(out, p.File) {
			out = append(out, p.File)
		}
	}
	return out
}
