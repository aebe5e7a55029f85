package pod

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/agent/qos"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// made is the container record of an attempt made from pod's container c (the labels ctrd writes).
func made(pod *v1.Pod, c *v1.Container) *ctrd.Container {
	res, _ := json.Marshal(c.Resources)
	return &ctrd.Container{ID: "x", Name: c.Name, State: ctrd.StateRunning, Hash: ctrspec.SpecHash(pod, c),
		ResizeBase: ctrspec.ResizeBase(pod, c), Resources: string(res), QOSClass: string(qos.Class(&pod.Spec))}
}

func TestCanResizeInPlace(t *testing.T) {
	rl := func(kv ...string) v1.ResourceList {
		l := v1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			l[v1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return l
	}
	base := func() *v1.Pod {
		p := testPod(v1.RestartPolicyAlways, "app")
		p.Spec.Containers[0].Resources = v1.ResourceRequirements{Requests: rl("cpu", "100m", "memory", "32Mi"), Limits: rl("cpu", "250m", "memory", "64Mi")}
		return p
	}
	tests := []struct {
		name   string
		change func(c *v1.Container)
		want   string // "" when in place, else part of the reason
	}{
		{"memory limit up", func(c *v1.Container) { c.Resources.Limits["memory"] = resource.MustParse("96Mi") }, ""},
		{"cpu request and limit", func(c *v1.Container) {
			c.Resources.Requests["cpu"], c.Resources.Limits["cpu"] = resource.MustParse("200m"), resource.MustParse("500m")
		}, ""},
		{"memory with RestartContainer", func(c *v1.Container) {
			c.ResizePolicy = []v1.ContainerResizePolicy{{ResourceName: "memory", RestartPolicy: v1.RestartContainer}}
			c.Resources.Limits["memory"] = resource.MustParse("96Mi")
		}, "more than its resources"}, // the policy is part of the spec: its change alone replaces
		{"image too", func(c *v1.Container) {
			c.Image = "busybox:2"
			c.Resources.Limits["memory"] = resource.MustParse("96Mi")
		}, "more than its resources"},
		{"memory limit down", func(c *v1.Container) { c.Resources.Limits["memory"] = resource.MustParse("48Mi") }, "memory limit decreases"},
		{"memory request down", func(c *v1.Container) { c.Resources.Requests["memory"] = resource.MustParse("16Mi") }, ""},
		{"cpu limit removed", func(c *v1.Container) { delete(c.Resources.Limits, "cpu") }, "cpu limit was added or removed"},
		{"ephemeral storage", func(c *v1.Container) { c.Resources.Limits["ephemeral-storage"] = resource.MustParse("1Gi") }, "ephemeral-storage changed"},
		{"QoS class changes", func(c *v1.Container) {
			c.Resources.Requests = rl("cpu", "250m", "memory", "64Mi") // now Guaranteed
		}, "QoS class changed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old := base()
			if tt.name == "memory with RestartContainer" {
				old.Spec.Containers[0].ResizePolicy = nil
			}
			cur := made(old, &old.Spec.Containers[0])
			now := base()
			tt.change(&now.Spec.Containers[0])
			ok, why := CanResizeInPlace(now, &now.Spec.Containers[0], cur)
			if tt.want == "" && !ok {
				t.Errorf("not in place: %s", why)
			}
			if tt.want != "" && (ok || !strings.Contains(why, tt.want)) {
				t.Errorf("in place %v (%q); want refused with %q", ok, why, tt.want)
			}
		})
	}
	// The policy applies when it was set before: RestartContainer for memory refuses a memory
	// change in place but not a cpu one.
	old := base()
	old.Spec.Containers[0].ResizePolicy = []v1.ContainerResizePolicy{{ResourceName: "memory", RestartPolicy: v1.RestartContainer}}
	cur := made(old, &old.Spec.Containers[0])
	mem := old.DeepCopy()
	mem.Spec.Containers[0].Resources.Limits["memory"] = resource.MustParse("96Mi")
	if ok, why := CanResizeInPlace(mem, &mem.Spec.Containers[0], cur); ok || !strings.Contains(why, "memory resizePolicy is RestartContainer") {
		t.Errorf("memory change under RestartContainer: in place %v (%q)", ok, why)
	}
	cpu := old.DeepCopy()
	cpu.Spec.Containers[0].Resources.Limits["cpu"] = resource.MustParse("300m")
	if ok, why := CanResizeInPlace(cpu, &cpu.Spec.Containers[0], cur); !ok {
		t.Errorf("cpu change with memory under RestartContainer: not in place (%s)", why)
	}
	// A container made before in-place resize has no labels for it.
	legacy := *cur
	legacy.ResizeBase, legacy.Resources = "", ""
	if ok, _ := CanResizeInPlace(cpu, &cpu.Spec.Containers[0], &legacy); ok {
		t.Errorf("a container without resize labels was resized in place")
	}
}
