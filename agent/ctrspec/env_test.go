package ctrspec

import (
	"errors"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/core/svcenv"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "x", "B": "y", "EMPTY": ""}
	tests := []struct{ in, want string }{
		{"plain", "plain"},
		{"$(A)", "x"},
		{"pre-$(A)-post", "pre-x-post"},
		{"$(A)$(B)", "xy"},
		{"$(EMPTY)z", "z"},
		{"$(UNKNOWN)", "$(UNKNOWN)"},
		{"$(A)$(UNKNOWN)$(B)", "x$(UNKNOWN)y"},
		{"$$(A)", "$(A)"},
		{"$$$(A)", "$x"},
		{"$$$$", "$$"},
		{"$(A", "$(A"},
		{"x$(A)$(B", "xx$(B"},
		{"$", "$"},
		{"a$", "a$"},
		{"$A", "$A"},
		{"$()", "$()"},
		{"cost: 5$", "cost: 5$"},
	}
	for _, tt := range tests {
		if got := Expand(tt.in, vars); got != tt.want {
			t.Errorf("Expand(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func envPod() *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web", Namespace: "edge", UID: "0b0e2c9e-5d1f-4a7b-9c3d-2e1f0a9b8c7d",
			Labels:      map[string]string{"app": "web", "tier": "front"},
			Annotations: map[string]string{"note": "hello"},
		},
		Spec: v1.PodSpec{
			NodeName: "gw-1", ServiceAccountName: "default",
			Containers: []v1.Container{{
				Name: "app",
				Resources: v1.ResourceRequirements{
					Limits:   v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi"), v1.ResourceCPU: resource.MustParse("1500m")},
					Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("250m"), v1.ResourceMemory: resource.MustParse("1G")},
				},
			}, {Name: "side"}},
		},
		Status: v1.PodStatus{PodIP: "10.88.0.5", HostIP: "192.0.2.10",
			PodIPs: []v1.PodIP{{IP: "10.88.0.5"}, {IP: "fd00::5"}}, HostIPs: []v1.HostIP{{IP: "192.0.2.10"}}},
	}
}

func envMap(t *testing.T, env []v1.EnvVar) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, e := range env {
		if _, dup := m[e.Name]; dup {
			t.Errorf("variable %s appears twice", e.Name)
		}
		m[e.Name] = e.Value
	}
	return m
}

func TestContainerEnvOrder(t *testing.T) {
	pod := envPod()
	c := &v1.Container{Name: "app", Env: []v1.EnvVar{
		{Name: "A", Value: "x"},
		{Name: "B", Value: "$(A)-$(C)"}, // C is defined later: left as written
		{Name: "C", Value: "z"},
		{Name: "D", Value: "$(B)/$(C)"},
		{Name: "A", Value: "$(A)$(A)"}, // redefining refers to the earlier value
		{Name: "POD", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "E", Value: "$(POD).$$(POD)"},
	}}
	env, err := containerEnv(pod, c)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"A=x", "B=x-$(C)", "C=z", "D=x-$(C)/z", "A=xx", "POD=web", "E=web.$(POD)"}
	var got []string
	for _, e := range env {
		got = append(got, e.Name+"="+e.Value)
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("containerEnv = %v, want %v", got, want)
	}
}

func fieldEnv(name, path string) v1.EnvVar {
	return v1.EnvVar{Name: name, ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: path}}}
}

func resourceEnv(name, ctr, res, divisor string) v1.EnvVar {
	rf := &v1.ResourceFieldSelector{ContainerName: ctr, Resource: res}
	if divisor != "" {
		rf.Divisor = resource.MustParse(divisor)
	}
	return v1.EnvVar{Name: name, ValueFrom: &v1.EnvVarSource{ResourceFieldRef: rf}}
}

func TestContainerEnvFieldRefs(t *testing.T) {
	pod := envPod()
	c := &v1.Container{Name: "app", Env: []v1.EnvVar{
		fieldEnv("NAME", "metadata.name"),
		fieldEnv("NS", "metadata.namespace"),
		fieldEnv("UID", "metadata.uid"),
		fieldEnv("NODE", "spec.nodeName"),
		fieldEnv("SA", "spec.serviceAccountName"),
		fieldEnv("POD_IP", "status.podIP"),
		fieldEnv("HOST_IP", "status.hostIP"),
		fieldEnv("POD_IPS", "status.podIPs"),
		fieldEnv("HOST_IPS", "status.hostIPs"),
		fieldEnv("APP", "metadata.labels['app']"),
		fieldEnv("MISSING_LABEL", "metadata.labels['nope']"),
		fieldEnv("NOTE", "metadata.annotations['note']"),
		{Name: "URL", Value: "http://$(POD_IP):8080/$(APP)"},
	}}
	env, err := containerEnv(pod, c)
	if err != nil {
		t.Fatal(err)
	}
	got := envMap(t, env)
	want := map[string]string{
		"NAME": "web", "NS": "edge", "UID": "0b0e2c9e-5d1f-4a7b-9c3d-2e1f0a9b8c7d", "NODE": "gw-1", "SA": "default",
		"POD_IP": "10.88.0.5", "HOST_IP": "192.0.2.10", "APP": "web", "MISSING_LABEL": "", "NOTE": "hello",
		"URL": "http://10.88.0.5:8080/web", "POD_IPS": "10.88.0.5,fd00::5", "HOST_IPS": "192.0.2.10",
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %q, want %q", k, got[k], w)
		}
	}
}

func TestContainerEnvResourceFieldRefs(t *testing.T) {
	pod := envPod()
	c := &pod.Spec.Containers[1] // "side" reads app's resources by name, its own by default
	c.Env = []v1.EnvVar{
		resourceEnv("MEM_LIMIT", "app", "limits.memory", ""),
		resourceEnv("CPU_REQUEST", "app", "requests.cpu", ""), // 250m rounds up to 1
		resourceEnv("CPU_LIMIT", "app", "limits.cpu", ""),     // 1500m rounds up to 2
		resourceEnv("MEM_REQUEST", "app", "requests.memory", ""),
		resourceEnv("OWN_CPU_LIMIT", "", "limits.cpu", ""), // side has none
		resourceEnv("MEM_LIMIT_MI", "app", "limits.memory", "1Mi"),
		resourceEnv("CPU_REQUEST_M", "app", "requests.cpu", "1m"),
	}
	env, err := containerEnv(pod, c)
	if err != nil {
		t.Fatal(err)
	}
	got := envMap(t, env)
	want := map[string]string{
		"MEM_LIMIT": "67108864", "CPU_REQUEST": "1", "CPU_LIMIT": "2", "MEM_REQUEST": "1000000000", "OWN_CPU_LIMIT": "0",
		"MEM_LIMIT_MI": "64", "CPU_REQUEST_M": "250",
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %q, want %q", k, got[k], w)
		}
	}
}

func TestContainerEnvResourceFieldRefInitContainer(t *testing.T) {
	pod := envPod()
	pod.Spec.InitContainers = []v1.Container{{
		Name:      "setup",
		Resources: v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("32Mi")}},
		Env:       []v1.EnvVar{resourceEnv("MEM", "", "limits.memory", "")},
	}}
	env, err := containerEnv(pod, &pod.Spec.InitContainers[0])
	if err != nil {
		t.Fatalf("init container reading its own limits: %v", err)
	}
	if got := envMap(t, env)["MEM"]; got != "33554432" {
		t.Errorf("MEM = %q, want 33554432", got)
	}
}

func TestContainerEnvConfigErrors(t *testing.T) {
	ref := v1.LocalObjectReference{Name: "settings"}
	tests := []struct {
		name    string
		c       v1.Container
		mention []string
	}{
		{"configMapKeyRef", v1.Container{Name: "app", Env: []v1.EnvVar{{Name: "LEVEL", ValueFrom: &v1.EnvVarSource{
			ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: ref, Key: "level"}}}}},
			[]string{`"app"`, "LEVEL", "ConfigMap edge/settings"}},
		{"secretKeyRef", v1.Container{Name: "app", Env: []v1.EnvVar{{Name: "A", Value: "1"}, {Name: "TOKEN", ValueFrom: &v1.EnvVarSource{
			SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: ref, Key: "token"}}}}},
			[]string{`"app"`, "TOKEN", "Secret edge/settings"}},
		{"envFrom", v1.Container{Name: "side", EnvFrom: []v1.EnvFromSource{{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: ref}}}},
			[]string{`"side"`, "envFrom[0]", "ConfigMap settings"}},
		{"unknown fieldRef", v1.Container{Name: "app", Env: []v1.EnvVar{fieldEnv("X", "spec.priority")}},
			[]string{`"app"`, "X", "spec.priority"}},
		{"resourceFieldRef to unknown container", v1.Container{Name: "app", Env: []v1.EnvVar{resourceEnv("M", "ghost", "limits.memory", "")}},
			[]string{`"app"`, "M", "ghost"}},
		{"negative divisor", v1.Container{Name: "app", Env: []v1.EnvVar{resourceEnv("M", "", "limits.memory", "-1m")}},
			[]string{`"app"`, "M", "divisor"}},
		{"valueFrom with no source", v1.Container{Name: "app", Env: []v1.EnvVar{{Name: "V", ValueFrom: &v1.EnvVarSource{}}}},
			[]string{`"app"`, "V"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, err := containerEnv(envPod(), &tt.c)
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("containerEnv = %v, %v; want a *ConfigError", env, err)
			}
			for _, m := range tt.mention {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %s", err, m)
				}
			}
		})
	}
}

func TestExpandAll(t *testing.T) {
	env := []v1.EnvVar{{Name: "PORT", Value: "8080"}, {Name: "HOST", Value: "0.0.0.0"}}
	got := ExpandAll([]string{"serve", "--addr=$(HOST):$(PORT)", "$(NOPE)", "$$(PORT)"}, env)
	want := []string{"serve", "--addr=0.0.0.0:8080", "$(NOPE)", "$(PORT)"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("ExpandAll = %q, want %q", got, want)
	}
}

// The service variables the bridge sends (svcenv.Annotation) come as kubelet's: the container's
// own variables (envFrom and env) win, $(NAME) falls back to a service variable where the
// container has not defined NAME before, and the rest follow the container's own, sorted.
func TestContainerEnvServiceLinks(t *testing.T) {
	pod := envPod()
	pod.Annotations[svcenv.Annotation] = svcenv.Encode(map[string]string{
		"FOO_SERVICE_HOST": "10.96.0.5",
		"FOO_SERVICE_PORT": "8080",
		"PORT":             "from-service", // envFrom's PORT wins
		"BAR_PORT":         "tcp://10.96.0.6:80",
		"A_SERVICE_HOST":   "10.96.0.7", // env's wins, and later references see env's
	})
	c := &v1.Container{Name: "app",
		EnvFrom: []v1.EnvFromSource{{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "settings"}}}},
		Env: []v1.EnvVar{
			{Name: "URL", Value: "http://$(FOO_SERVICE_HOST):$(FOO_SERVICE_PORT)/$(A_SERVICE_HOST)"},
			{Name: "A_SERVICE_HOST", Value: "mine"},
			{Name: "B", Value: "$(A_SERVICE_HOST)"},
		}}
	env, _, err := ContainerEnvWith(pod, c, testObjects())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range env {
		if e.Name == "level" || e.Name == "1st" || e.Name == "bad-key!" {
			continue
		}
		got = append(got, e.Name+"="+e.Value)
	}
	want := []string{"PORT=8080", "URL=http://10.96.0.5:8080/10.96.0.7", "A_SERVICE_HOST=mine", "B=mine",
		"BAR_PORT=tcp://10.96.0.6:80", "FOO_SERVICE_HOST=10.96.0.5", "FOO_SERVICE_PORT=8080"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("env =\n%v\nwant\n%v", got, want)
	}
	// command and args see them too
	if got := ExpandAll([]string{"$(FOO_SERVICE_HOST)"}, env); got[0] != "10.96.0.5" {
		t.Errorf("args expand to %q", got[0])
	}

	pod.Annotations[svcenv.Annotation] = `{"FOO": 1}`
	var ce *ConfigError
	if _, _, err := ContainerEnvWith(pod, c, testObjects()); !errors.As(err, &ce) || !strings.Contains(err.Error(), svcenv.Annotation) {
		t.Errorf("bad annotation: err %v, want a ConfigError naming %s", err, svcenv.Annotation)
	}
}

func TestServiceEnvAnnotationHidden(t *testing.T) {
	pod := envPod()
	pod.Annotations[svcenv.Annotation] = `{"A":"b"}`
	if v, _ := PodField(pod, "metadata.annotations['"+svcenv.Annotation+"']"); v != "" {
		t.Errorf("the downward API shows %s: %q", svcenv.Annotation, v)
	}
	if _, ok := VisibleAnnotations(pod)[svcenv.Annotation]; ok || VisibleAnnotations(pod)["note"] != "hello" {
		t.Errorf("VisibleAnnotations = %v", VisibleAnnotations(pod))
	}
	if _, ok := pod.Annotations[svcenv.Annotation]; !ok {
		t.Error("VisibleAnnotations changed the pod")
	}
}
