package agent

import (
	"context"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// ResizeContainer makes the agent's fake runtime one that resizes in place. Its containers carry
// no resize labels, so the worker replaces them to resize, as for a container of an older mqlet:
// these tests are about the allocation, agent/pod's about the actuation.
func (f *fakeRuntime) ResizeContainer(_ context.Context, p *v1.Pod, c *v1.Container, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	ct := f.ctrs[id]
	ct.Hash = ctrspec.SpecHash(p, c)
	f.ctrs[id] = ct
	return nil
}

var _ interface {
	ResizeContainer(context.Context, *v1.Pod, *v1.Container, string) error
} = (*fakeRuntime)(nil)

func TestJudgeResize(t *testing.T) {
	mem := func(q string) *v1.Pod {
		p := memPod("p", q)
		return p
	}
	alloc := v1.ResourceList{v1.ResourceMemory: resource.MustParse("1Gi"), v1.ResourceCPU: resource.MustParse("2")}
	others := []*v1.Pod{mem("600Mi")}
	tests := []struct {
		name      string
		p         *v1.Pod
		canResize bool
		alloc     v1.ResourceList
		reason    string
		message   string
	}{
		{"fits", mem("400Mi"), true, alloc, "", ""},
		{"not beside the others", mem("500Mi"), true, alloc, v1.PodReasonDeferred,
			"Node didn't have enough resource: memory, requested: 524288000, used: 629145600, capacity: 1073741824"},
		// kubelet 1.37 defers a resize beyond the whole node too (its allocation manager's tests).
		{"beyond the node", mem("2Gi"), true, alloc, v1.PodReasonDeferred,
			"Node didn't have enough resource: memory, requested: 2147483648, used: 629145600, capacity: 1073741824"},
		{"no in-place resize in the runtime", mem("100Mi"), false, alloc, v1.PodReasonInfeasible, "not supported"},
		{"allocatable unknown", mem("2Gi"), true, nil, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := judgeResize(tt.p, tt.canResize, others, tt.alloc)
			if v.Reason != tt.reason || !strings.Contains(v.Message, tt.message) {
				t.Errorf("verdict %+v, want reason %q with %q", v, tt.reason, tt.message)
			}
		})
	}
}

func condOf(p *v1.Pod, t v1.PodConditionType) *v1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// A resize that does not fit beside the other pods is Deferred: PodResizePending with kubelet's
// message, the pod keeps running with what it had (allocatedResources unchanged); once a pod
// leaves, it is allocated and applied, and the condition goes.
func TestResizeDeferredUntilRoom(t *testing.T) {
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.MQTT)
	a := startAgentWith(t, Options{Allocatable: allocatable("memory=1Gi")}, rt, st, src)
	src.send(source.Change{Op: source.Resync, Items: []source.Item{mqttItem(memPod("a", "600Mi"), 1), mqttItem(memPod("b", "300Mi"), 1)}})
	waitPhase(t, a, "a", v1.PodRunning, "")
	waitPhase(t, a, "b", v1.PodRunning, "")

	bigger := memPod("b", "500Mi")
	bigger.Generation = 2
	src.send(source.Change{Op: source.Upsert, Items: []source.Item{mqttItem(bigger, 2)}})
	var b *v1.Pod
	eventually(t, "b's resize pending", func() bool {
		b = podNamed(a, "b")
		return b != nil && condOf(b, v1.PodResizePending) != nil
	})
	c := condOf(b, v1.PodResizePending)
	want := "Node didn't have enough resource: memory, requested: 524288000, used: 629145600, capacity: 1073741824"
	if c.Reason != v1.PodReasonDeferred || c.Message != want || c.ObservedGeneration != 2 {
		t.Errorf("PodResizePending %+v, want Deferred with %q for generation 2", c, want)
	}
	if got := b.Status.ContainerStatuses[0].AllocatedResources.Memory().String(); got != "300Mi" {
		t.Errorf("allocatedResources memory %s while the resize waits, want 300Mi", got)
	}
	if rt.podContainers(b.UID) != 1 || rt.startsOf() != 2 {
		t.Errorf("a deferred resize touched the containers: %d starts", rt.startsOf())
	}

	// a leaves: the deferred resize is allocated and applied.
	src.send(source.Change{Op: source.Delete, Keys: []string{"default/a"}})
	eventually(t, "b resized", func() bool {
		b = podNamed(a, "b")
		cs := b.Status.ContainerStatuses
		return condOf(b, v1.PodResizePending) == nil && len(cs) == 1 && cs[0].State.Running != nil &&
			cs[0].AllocatedResources.Memory().String() == "500Mi" && cs[0].Resources.Requests.Memory().String() == "500Mi"
	})
}

func (f *fakeRuntime) startsOf() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts
}
