package pod

import (
	"context"
	"encoding/json"
	"fmt"
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
		{"memory limit down", func(c *v1.Container) { c.Resources.Limits["memory"] = resource.MustParse("48Mi") }, ""}, // checked against usage by the runtime
		{"memory request down", func(c *v1.Container) { c.Resources.Requests["memory"] = resource.MustParse("16Mi") }, ""},
		{"cpu limit removed", func(c *v1.Container) { delete(c.Resources.Limits, "cpu") }, ""},
		{"memory limit removed", func(c *v1.Container) { delete(c.Resources.Limits, "memory") }, ""},
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
	// Limits added to a container made without them (the conformance spec's c1 and c2).
	bare := testPod(v1.RestartPolicyAlways, "app")
	bare.Spec.Containers[0].Resources = v1.ResourceRequirements{Requests: rl("cpu", "20m", "memory", "35Mi")}
	limited := bare.DeepCopy()
	limited.Spec.Containers[0].Resources.Limits = rl("cpu", "35m", "memory", "50Mi")
	if ok, why := CanResizeInPlace(limited, &limited.Spec.Containers[0], made(bare, &bare.Spec.Containers[0])); !ok {
		t.Errorf("limits added: not in place (%s)", why)
	}
	// A container made before in-place resize has no labels for it.
	legacy := *cur
	legacy.ResizeBase, legacy.Resources = "", ""
	if ok, _ := CanResizeInPlace(cpu, &cpu.Spec.Containers[0], &legacy); ok {
		t.Errorf("a container without resize labels was resized in place")
	}
}

// resizingRuntime is the fake runtime with in-place resize: containers carry the resize labels
// ctrd writes, and ResizeContainer rewrites them, or fails with err while it is set.
type resizingRuntime struct {
	*fakeRuntime
	err     error
	resizes int
}

func (r *resizingRuntime) StartContainer(ctx context.Context, pod *v1.Pod, sb *ctrd.Sandbox, c *v1.Container, restarts int) (ctrd.Container, error) {
	ctr, err := r.fakeRuntime.StartContainer(ctx, pod, sb, c, restarts)
	if err != nil {
		return ctr, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := made(pod, c)
	r.ctrs[ctr.ID].ResizeBase, r.ctrs[ctr.ID].Resources, r.ctrs[ctr.ID].QOSClass = m.ResizeBase, m.Resources, m.QOSClass
	return *r.ctrs[ctr.ID], nil
}

func (r *resizingRuntime) ResizeContainer(_ context.Context, pod *v1.Pod, c *v1.Container, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	r.resizes++
	ctr := r.ctrs[id]
	ctr.Hash, ctr.Resources = ctrspec.SpecHash(pod, c), made(pod, c).Resources
	return nil
}

func (r *resizingRuntime) setErr(err error) {
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
}

func conditionOf(st *v1.PodStatus, t v1.PodConditionType) *v1.PodCondition {
	for i := range st.Conditions {
		if st.Conditions[i].Type == t {
			return &st.Conditions[i]
		}
	}
	return nil
}

// The worker's side of a resize, as the conformance spec "burstable pods - extended 6 containers"
// drives it: limits added in place (no restart, status.resources follow), a resize the agent defers
// reported PodResizePending with nothing applied, and an in-place update that fails (a memory limit
// below the usage) reported PodResizeInProgress/Error with the old resources kept, then done.
func TestWorkerResizeStatus(t *testing.T) {
	rl := func(kv ...string) v1.ResourceList {
		l := v1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			l[v1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return l
	}
	rt := &resizingRuntime{fakeRuntime: newFakeRuntime()}
	p := testPod(v1.RestartPolicyAlways, "c1")
	p.Generation = 1
	p.Spec.Containers[0].Resources = v1.ResourceRequirements{Requests: rl("cpu", "20m", "memory", "35Mi")}
	h := startWorkerOn(t, p, nil, rt, rt.fakeRuntime, nil)
	h.waitFor("c1 running", func(st *v1.PodStatus) bool { return isRunning(st, "c1", 0) })

	resized := func(want v1.ResourceRequirements) func(st *v1.PodStatus) bool {
		return func(st *v1.PodStatus) bool {
			cs := statusOf(st, "c1")
			return cs != nil && cs.Resources != nil && sameCPUMem(*cs.Resources, want) && cs.Resources.Limits != nil == (want.Limits != nil)
		}
	}

	// 1. Limits added, allocated: in place.
	p2 := p.DeepCopy()
	p2.Generation = 2
	p2.Spec.Containers[0].Resources = v1.ResourceRequirements{Requests: rl("cpu", "25m", "memory", "30Mi"), Limits: rl("cpu", "35m", "memory", "50Mi")}
	h.w.Allocate(p2)
	h.w.Update(Desired{Pod: p2})
	st := h.waitFor("limits added", resized(p2.Spec.Containers[0].Resources))
	if !isRunning(st, "c1", 0) || len(rt.callsOf("stop")) != 0 {
		t.Fatalf("the container was restarted to add limits: %s; calls %v", describe(st), rt.allCalls())
	}
	if a := statusOf(st, "c1").AllocatedResources; !sameCPUMem(v1.ResourceRequirements{Requests: a}, v1.ResourceRequirements{Requests: p2.Spec.Containers[0].Resources.Requests}) {
		t.Errorf("allocatedResources = %v, want %v", a, p2.Spec.Containers[0].Resources.Requests)
	}
	if c := conditionOf(st, v1.PodResizeInProgress); c != nil {
		t.Errorf("done resize still in progress: %+v", c)
	}

	// 2. A resize the agent defers: reported, nothing applied.
	p3 := p2.DeepCopy()
	p3.Generation = 3
	p3.Spec.Containers[0].Resources.Requests = rl("cpu", "64", "memory", "30Mi")
	p3.Spec.Containers[0].Resources.Limits = rl("cpu", "64", "memory", "50Mi")
	const msg = "Node didn't have enough resource: cpu, requested: 64000, used: 0, capacity: 2000"
	h.w.DeferResize(v1.PodReasonDeferred, msg, p3.Generation)
	h.w.Update(Desired{Pod: p3})
	st = h.waitFor("resize pending", func(st *v1.PodStatus) bool { return conditionOf(st, v1.PodResizePending) != nil })
	if c := conditionOf(st, v1.PodResizePending); c.Reason != v1.PodReasonDeferred || c.Message != msg || c.ObservedGeneration != 3 {
		t.Errorf("PodResizePending = %+v", c)
	}
	if !resized(p2.Spec.Containers[0].Resources)(st) || rt.resizes != 1 {
		t.Errorf("a deferred resize was applied: %s (%d resizes)", describe(st), rt.resizes)
	}
	if st.ObservedGeneration != 3 {
		t.Errorf("observedGeneration = %d, want 3", st.ObservedGeneration)
	}

	// 3. Back to what is allocated, then a memory limit below the usage: in progress with the error.
	rt.setErr(fmt.Errorf(`attempting to set container "c1" memory limit (1048576) below current usage (2000000): %w`, ctrd.ErrBelowUsage))
	p4 := p2.DeepCopy()
	p4.Generation = 4
	p4.Spec.Containers[0].Resources.Limits = rl("cpu", "35m", "memory", "1Mi")
	h.w.Allocate(p4)
	h.w.Update(Desired{Pod: p4})
	st = h.waitFor("resize in progress", func(st *v1.PodStatus) bool { return conditionOf(st, v1.PodResizeInProgress) != nil })
	c := conditionOf(st, v1.PodResizeInProgress)
	if c.Reason != v1.PodReasonError || !strings.Contains(c.Message, "memory limit (1048576) below current usage") {
		t.Errorf("PodResizeInProgress = %+v", c)
	}
	if conditionOf(st, v1.PodResizePending) != nil {
		t.Errorf("PodResizePending left after the allocation: %s", describe(st))
	}
	if !isRunning(st, "c1", 0) || !resized(p2.Spec.Containers[0].Resources)(st) {
		t.Errorf("a failed in-place resize changed the container: %s", describe(st))
	}

	// 4. The usage went down: the retry applies it and the condition goes.
	rt.setErr(nil)
	h.w.Nudge()
	st = h.waitFor("resize done", func(st *v1.PodStatus) bool {
		return conditionOf(st, v1.PodResizeInProgress) == nil && resized(p4.Spec.Containers[0].Resources)(st)
	})
	if !isRunning(st, "c1", 0) {
		t.Errorf("restarted: %s", describe(st))
	}
}

// A worker made after an agent restart takes the allocation the containers ran with (the stored
// status), not the desired pod's: a resize that was pending is pending again, to be judged anew,
// and is not applied unjudged.
func TestRestoredAllocationKeepsAPendingResizePending(t *testing.T) {
	q := func(s string) resource.Quantity { return resource.MustParse(s) }
	old := v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: q("20m"), v1.ResourceMemory: q("35Mi")}}
	p := testPod(v1.RestartPolicyAlways, "c1")
	p.Generation = 3
	p.Spec.Containers[0].Resources = v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: q("64"), v1.ResourceMemory: q("35Mi")}}
	prev := &v1.PodStatus{Phase: v1.PodRunning,
		Conditions:        []v1.PodCondition{{Type: v1.PodResizePending, Status: v1.ConditionTrue, Reason: v1.PodReasonDeferred, Message: "Node didn't have enough resource: cpu"}},
		ContainerStatuses: []v1.ContainerStatus{{Name: "c1", Resources: &old, State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}}}
	w := NewWorker(Desired{Pod: p}, prev, Env{})
	if got := w.ResizePending(); got != v1.PodReasonDeferred {
		t.Errorf("ResizePending() = %q after the restart, want Deferred", got)
	}
	a := w.AllocatedPod()
	if r := a.Spec.Containers[0].Resources; !sameCPUMem(r, old) {
		t.Errorf("allocated after the restart: %v, want what the container ran with, %v", r, old)
	}

	// Nothing pending before the restart, and nothing asked beyond it: no resize.
	prev.Conditions = nil
	p.Spec.Containers[0].Resources = old
	if w := NewWorker(Desired{Pod: p}, prev, Env{}); w.ResizePending() != "" {
		t.Errorf("a pod without a resize restored with one pending: %q", w.ResizePending())
	}
}
