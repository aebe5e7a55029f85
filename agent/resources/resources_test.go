package resources

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func rl(kv ...string) v1.ResourceList {
	out := v1.ResourceList{}
	for i := 0; i+1 < len(kv); i += 2 {
		out[v1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

func ctr(req, lim v1.ResourceList) v1.Container {
	return v1.Container{Resources: v1.ResourceRequirements{Requests: req, Limits: lim}}
}

func TestPodRequests(t *testing.T) {
	always := v1.ContainerRestartPolicyAlways
	sidecar := ctr(rl("cpu", "50m", "memory", "10Mi"), nil)
	sidecar.RestartPolicy = &always
	tests := []struct {
		name string
		spec v1.PodSpec
		want v1.ResourceList
	}{
		{"sum of app containers", v1.PodSpec{Containers: []v1.Container{
			ctr(rl("cpu", "100m", "memory", "64Mi"), nil), ctr(rl("cpu", "200m"), nil)}},
			rl("cpu", "300m", "memory", "64Mi")},
		{"limit stands in for a missing request", v1.PodSpec{Containers: []v1.Container{
			ctr(nil, rl("cpu", "1", "memory", "1Gi"))}},
			rl("cpu", "1", "memory", "1Gi")},
		{"an init container larger than the app sum wins", v1.PodSpec{
			InitContainers: []v1.Container{ctr(rl("memory", "512Mi"), nil)},
			Containers:     []v1.Container{ctr(rl("cpu", "100m", "memory", "64Mi"), nil)}},
			rl("cpu", "100m", "memory", "512Mi")},
		{"sidecars add to the app sum and to later init containers", v1.PodSpec{
			InitContainers: []v1.Container{sidecar, ctr(rl("memory", "100Mi"), nil)},
			Containers:     []v1.Container{ctr(rl("memory", "20Mi"), nil)}},
			rl("cpu", "50m", "memory", "110Mi")},
		{"overhead added", v1.PodSpec{Overhead: rl("memory", "1Mi"),
			Containers: []v1.Container{ctr(rl("memory", "1Mi"), nil)}},
			rl("memory", "2Mi")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := PodRequests(&tt.spec)
			if len(got) != len(tt.want) {
				t.Fatalf("PodRequests = %v, want %v", got, tt.want)
			}
			for name, q := range tt.want {
				if g := got[name]; g.Cmp(q) != 0 {
					t.Errorf("%s = %s, want %s", name, g.String(), q.String())
				}
			}
		})
	}
}

func TestLimitedByAll(t *testing.T) {
	spec := v1.PodSpec{Containers: []v1.Container{ctr(nil, rl("memory", "1Gi")), ctr(nil, nil)}}
	if LimitedByAll(&spec, v1.ResourceMemory) {
		t.Errorf("one container without a memory limit: LimitedByAll = true")
	}
	spec.Containers[1] = ctr(nil, rl("memory", "1Mi"))
	if !LimitedByAll(&spec, v1.ResourceMemory) {
		t.Errorf("every container limited: LimitedByAll = false")
	}
	if m := PodLimits(&spec)[v1.ResourceMemory]; m.Cmp(resource.MustParse("1025Mi")) != 0 {
		t.Errorf("PodLimits memory = %s, want 1025Mi", m.String())
	}
}

func TestAllocatable(t *testing.T) {
	got := Allocatable(rl("cpu", "4", "memory", "1Gi", "pods", "110"),
		rl("cpu", "500m", "memory", "100Mi"), rl("memory", "2Gi", "ephemeral-storage", "1Gi"))
	if q := got[v1.ResourceCPU]; q.Cmp(resource.MustParse("3500m")) != 0 {
		t.Errorf("cpu = %s, want 3500m", q.String())
	}
	if q := got[v1.ResourceMemory]; q.Sign() != 0 {
		t.Errorf("memory = %s, want 0 (clamped)", q.String())
	}
	if _, ok := got[v1.ResourceEphemeralStorage]; ok {
		t.Errorf("ephemeral-storage invented: %v", got)
	}
	if q := got[v1.ResourcePods]; q.Value() != 110 {
		t.Errorf("pods = %s, want 110", q.String())
	}
}

func TestCritical(t *testing.T) {
	p := &v1.Pod{}
	if IsCriticalPriority(p) {
		t.Errorf("plain pod is critical")
	}
	p.Spec.PriorityClassName = PriorityClassNodeCritical
	if !IsCriticalPriority(p) || Priority(p) <= SystemCriticalPriority {
		t.Errorf("system-node-critical: critical=%v priority=%d", IsCriticalPriority(p), Priority(p))
	}
	n := SystemCriticalPriority
	p = &v1.Pod{Spec: v1.PodSpec{Priority: &n}}
	if !IsCriticalPriority(p) {
		t.Errorf("priority %d not critical", n)
	}
}
