package qos

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func resources(req, lim map[v1.ResourceName]string) v1.ResourceRequirements {
	r := v1.ResourceRequirements{}
	if req != nil {
		r.Requests = v1.ResourceList{}
		for k, v := range req {
			r.Requests[k] = resource.MustParse(v)
		}
	}
	if lim != nil {
		r.Limits = v1.ResourceList{}
		for k, v := range lim {
			r.Limits[k] = resource.MustParse(v)
		}
	}
	return r
}

func TestClass(t *testing.T) {
	const cpu, mem = v1.ResourceCPU, v1.ResourceMemory
	full := map[v1.ResourceName]string{cpu: "500m", mem: "64Mi"}
	tests := []struct {
		name string
		init []v1.ResourceRequirements
		ctrs []v1.ResourceRequirements
		want v1.PodQOSClass
	}{
		{"nothing set", nil, []v1.ResourceRequirements{{}, {}}, v1.PodQOSBestEffort},
		{"only a request", nil, []v1.ResourceRequirements{resources(map[v1.ResourceName]string{cpu: "100m"}, nil)}, v1.PodQOSBurstable},
		{"limits equal requests", nil, []v1.ResourceRequirements{resources(full, full)}, v1.PodQOSGuaranteed},
		{"limits only: requests default to them", nil, []v1.ResourceRequirements{resources(nil, full), resources(nil, full)}, v1.PodQOSGuaranteed},
		{"same quantity written differently", nil, []v1.ResourceRequirements{
			resources(map[v1.ResourceName]string{cpu: "0.5", mem: "67108864"}, full)}, v1.PodQOSGuaranteed},
		{"request below limit", nil, []v1.ResourceRequirements{
			resources(map[v1.ResourceName]string{cpu: "250m", mem: "64Mi"}, full)}, v1.PodQOSBurstable},
		{"memory limit only", nil, []v1.ResourceRequirements{resources(nil, map[v1.ResourceName]string{mem: "64Mi"})}, v1.PodQOSBurstable},
		{"one container without limits", nil, []v1.ResourceRequirements{resources(nil, full), {}}, v1.PodQOSBurstable},
		{"init container without limits", []v1.ResourceRequirements{{}}, []v1.ResourceRequirements{resources(nil, full)}, v1.PodQOSBurstable},
		{"init container with limits", []v1.ResourceRequirements{resources(nil, full)}, []v1.ResourceRequirements{{}}, v1.PodQOSBurstable},
		{"init and app guaranteed", []v1.ResourceRequirements{resources(full, full)}, []v1.ResourceRequirements{resources(nil, full)}, v1.PodQOSGuaranteed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := &v1.PodSpec{}
			for i, r := range tt.init {
				spec.InitContainers = append(spec.InitContainers, v1.Container{Name: "i" + string(rune('0'+i)), Resources: r})
			}
			for i, r := range tt.ctrs {
				spec.Containers = append(spec.Containers, v1.Container{Name: "c" + string(rune('0'+i)), Resources: r})
			}
			if got := Class(spec); got != tt.want {
				t.Errorf("Class = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestOOMScoreAdj(t *testing.T) {
	const gib = int64(1) << 30
	withMem := func(req, lim string) *v1.Container {
		c := &v1.Container{}
		if req != "" {
			c.Resources.Requests = v1.ResourceList{v1.ResourceMemory: resource.MustParse(req)}
		}
		if lim != "" {
			c.Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse(lim)}
		}
		return c
	}
	for _, tt := range []struct {
		name string
		qos  v1.PodQOSClass
		c    *v1.Container
		cap  int64
		want int
	}{
		{"guaranteed", v1.PodQOSGuaranteed, withMem("1Gi", "1Gi"), 4 * gib, -997},
		{"besteffort", v1.PodQOSBestEffort, withMem("", ""), 4 * gib, 1000},
		{"burstable quarter", v1.PodQOSBurstable, withMem("1Gi", ""), 4 * gib, 750},
		{"burstable limit only", v1.PodQOSBurstable, withMem("", "2Gi"), 4 * gib, 500},
		{"burstable tiny request", v1.PodQOSBurstable, withMem("1Ki", ""), 4 * gib, 999},
		{"burstable no memory", v1.PodQOSBurstable, withMem("", ""), 4 * gib, 999},
		{"burstable over capacity", v1.PodQOSBurstable, withMem("8Gi", ""), 4 * gib, 3},
		{"capacity unknown", v1.PodQOSBurstable, withMem("1Gi", ""), 0, 999},
	} {
		if got := OOMScoreAdj(tt.qos, tt.c, tt.cap); got != tt.want {
			t.Errorf("%s: OOMScoreAdj = %d, want %d", tt.name, got, tt.want)
		}
	}
}
