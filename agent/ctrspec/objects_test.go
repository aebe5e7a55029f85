package ctrspec

import (
	"errors"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/core/satoken"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fakeObjects is an in-memory Objects keyed by "namespace/name".
type fakeObjects struct {
	cms     map[string]*v1.ConfigMap
	secrets map[string]*v1.Secret
}

func (f fakeObjects) ConfigMap(ns, name string) (*v1.ConfigMap, error) {
	if cm, ok := f.cms[ns+"/"+name]; ok {
		return cm, nil
	}
	return nil, &NotFoundError{Kind: "ConfigMap", Namespace: ns, Name: name}
}

func (f fakeObjects) Secret(ns, name string) (*v1.Secret, error) {
	if s, ok := f.secrets[ns+"/"+name]; ok {
		return s, nil
	}
	return nil, &NotFoundError{Kind: "Secret", Namespace: ns, Name: name}
}

func testObjects() fakeObjects {
	return fakeObjects{
		cms: map[string]*v1.ConfigMap{"edge/settings": {
			ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "settings"},
			Data:       map[string]string{"level": "debug", "PORT": "8080", "bad-key!": "x", "1st": "y", "a=b": "z", "tab\tkey": "w"},
		}},
		secrets: map[string]*v1.Secret{"edge/creds": {
			ObjectMeta: metav1.ObjectMeta{Namespace: "edge", Name: "creds"},
			Data:       map[string][]byte{"token": []byte("s3cr3t-value"), "user": []byte("admin")},
			StringData: map[string]string{"extra": "from-string-data"},
		}},
	}
}

func tru() *bool { t := true; return &t }

func cmKey(name, key string, optional *bool) *v1.EnvVarSource {
	return &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: name}, Key: key, Optional: optional}}
}

func secretKey(name, key string, optional *bool) *v1.EnvVarSource {
	return &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: name}, Key: key, Optional: optional}}
}

// lastWins is the env as the container sees it: a later definition of a name replaces an earlier.
func lastWins(env []v1.EnvVar) map[string]string {
	m := map[string]string{}
	for _, e := range env {
		m[e.Name] = e.Value
	}
	return m
}

func TestContainerEnvFromObjects(t *testing.T) {
	c := &v1.Container{Name: "app",
		EnvFrom: []v1.EnvFromSource{
			{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "settings"}}},
			{Prefix: "DB_", SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "creds"}}},
			{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "absent"}, Optional: tru()}},
		},
		Env: []v1.EnvVar{
			{Name: "LEVEL", ValueFrom: cmKey("settings", "level", nil)},
			{Name: "TOKEN", ValueFrom: secretKey("creds", "token", nil)},
			{Name: "URL", Value: "http://$(DB_user):$(PORT)"},
			{Name: "PORT", Value: "9090"}, // overrides envFrom's PORT
			{Name: "MAYBE", ValueFrom: cmKey("absent", "x", tru())},
			{Name: "MAYBEKEY", ValueFrom: secretKey("creds", "nope", tru())},
		},
	}
	env, skipped, err := ContainerEnvWith(envPod(), c, testObjects())
	if err != nil {
		t.Fatal(err)
	}
	got := lastWins(env)
	want := map[string]string{
		"PORT": "9090", "level": "debug",
		"DB_token": "s3cr3t-value", "DB_user": "admin", "DB_extra": "from-string-data",
		"LEVEL": "debug", "TOKEN": "s3cr3t-value", "URL": "http://admin:8080",
		"bad-key!": "x", "1st": "y", // the API's relaxed names, as kubelet takes them
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	for _, k := range []string{"MAYBE", "MAYBEKEY", "a=b", "tab\tkey"} {
		if _, ok := got[k]; ok {
			t.Errorf("%s is set; optional-missing and invalid names must be left out", k)
		}
	}
	if len(got) != len(want) {
		t.Errorf("env = %v, want exactly %v", got, want)
	}
	if strings.Join(skipped, ",") != "a=b,tab\tkey" {
		t.Errorf("skipped = %q, want [a=b tab\\tkey]", skipped)
	}
}

func TestContainerEnvMissingObjects(t *testing.T) {
	tests := []struct {
		name    string
		c       v1.Container
		mention []string
	}{
		{"missing configMap", v1.Container{Name: "app", Env: []v1.EnvVar{{Name: "L", ValueFrom: cmKey("ghost", "level", nil)}}},
			[]string{`"app"`, "env L", "ConfigMap edge/ghost not found"}},
		{"missing key", v1.Container{Name: "app", Env: []v1.EnvVar{{Name: "L", ValueFrom: cmKey("settings", "nokey", nil)}}},
			[]string{"couldn't find key nokey in ConfigMap edge/settings"}},
		{"missing secret key", v1.Container{Name: "app", Env: []v1.EnvVar{{Name: "T", ValueFrom: secretKey("creds", "nokey", nil)}}},
			[]string{"couldn't find key nokey in Secret edge/creds"}},
		{"missing secret", v1.Container{Name: "app", EnvFrom: []v1.EnvFromSource{{SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "ghost"}}}}},
			[]string{"envFrom[0]", "Secret edge/ghost not found"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := ContainerEnvWith(envPod(), &tt.c, testObjects())
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v; want a *ConfigError", err)
			}
			for _, m := range tt.mention {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
			if strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("error %q quotes a secret value", err)
			}
		})
	}
}

// The downward API reads an unset limit as the node's allocatable (kubelet's
// defaultPodLimitsForDownwardAPI): limits.cpu of an unlimited container is what it may use, not 0.
// A limit the spec sets stays, requests are not touched, and the pod given is not changed.
func TestWithDownwardLimits(t *testing.T) {
	alloc := v1.ResourceList{v1.ResourceCPU: resource.MustParse("4"), v1.ResourceMemory: resource.MustParse("8Gi"),
		v1.ResourceEphemeralStorage: resource.MustParse("100Gi")}
	pod := &v1.Pod{Spec: v1.PodSpec{
		InitContainers: []v1.Container{{Name: "init"}},
		Containers: []v1.Container{{Name: "free"}, {Name: "capped", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{v1.ResourceCPU: resource.MustParse("500m")}}}},
	}}
	got := WithDownwardLimits(pod, alloc)
	if pod.Spec.Containers[0].Resources.Limits != nil || len(pod.Spec.Containers[1].Resources.Limits) != 1 {
		t.Fatal("WithDownwardLimits changed the pod it was given")
	}
	read := func(container, field string) string {
		t.Helper()
		v, err := ResourceFieldValue(got, container, &v1.ResourceFieldSelector{Resource: field})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct{ container, field, want string }{
		{"free", "limits.cpu", "4"},
		{"free", "limits.memory", "8589934592"},
		{"free", "limits.ephemeral-storage", "107374182400"},
		{"free", "requests.cpu", "0"},
		{"capped", "limits.cpu", "1"}, // 500m rounded up to whole cpus, the spec's own
		{"capped", "limits.memory", "8589934592"},
		{"init", "limits.cpu", "4"},
	} {
		if v := read(tc.container, tc.field); v != tc.want {
			t.Errorf("%s %s = %s, want %s", tc.container, tc.field, v, tc.want)
		}
	}
	if WithDownwardLimits(pod, nil) != pod {
		t.Error("no allocatable: want the pod itself")
	}
}

// A service account token Secret (core/satoken) is given only to the pod it was made for: another
// pod naming it, in env or a volume, gets an error that says why; ordinary Secrets are unaffected.
func TestTokenSecretOnlyForItsPod(t *testing.T) {
	tok := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "mqlet-sa-token-uid-a-1-0",
		Annotations: map[string]string{satoken.AnnotationPodUID: "uid-a"}}, Data: map[string][]byte{"token": []byte("t")}}
	objs := fakeObjects{secrets: map[string]*v1.Secret{"default/" + tok.Name: tok, "default/plain": {Data: map[string][]byte{"k": []byte("v")}}}}
	own := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "default", UID: "uid-a"}}
	other := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: "default", UID: "uid-b"}}
	if _, err := ForPod(objs, own).Secret("default", tok.Name); err != nil {
		t.Errorf("the token's own pod: %v", err)
	}
	if _, err := ForPod(objs, other).Secret("default", tok.Name); err == nil || !strings.Contains(err.Error(), "another pod's service account token") {
		t.Errorf("another pod: %v, want a refusal", err)
	}
	if _, err := ForPod(objs, other).Secret("default", "plain"); err != nil {
		t.Errorf("an ordinary Secret: %v", err)
	}
	c := &v1.Container{Name: "c", Env: []v1.EnvVar{{Name: "T", ValueFrom: secretKey(tok.Name, "token", nil)}}}
	if _, _, err := ContainerEnvWith(other, c, objs); err == nil {
		t.Error("another pod read the token through env")
	}
}
