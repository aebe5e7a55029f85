package agent

import (
	"context"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// kubectl debug's general profile adds SYS_PTRACE, which the MQTT policy refuses. The API never
// drops an ephemeral container, so every later version of the pod carries it: the node admits
// those versions without it (the pod keeps taking updates, here an in-place resize) and reports it
// terminated with reason PolicyDenied, so kubectl debug stops waiting and says why.
func TestRefusedDebugContainerDoesNotFreezeThePod(t *testing.T) {
	rt, st, src := newFakeRuntime(), store.NewMemory(), newFakeSource(source.MQTT)
	a := startAgentWith(t, Options{Allocatable: allocatable("memory=1Gi")}, rt, st, src)
	src.send(source.Change{Op: source.Resync, Items: []source.Item{mqttItem(memPod("m", "100Mi"), 1)}})
	waitPhase(t, a, "m", v1.PodRunning, "")
	uid := uidOf(a, "m")
	dbg := memPod("m", "100Mi")
	dbg.UID = uid
	dbg.Spec.EphemeralContainers = []v1.EphemeralContainer{{EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "debugger", Image: "busybox:1",
		SecurityContext: &v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"SYS_PTRACE"}}}}}}
	src.send(source.Change{Op: source.Upsert, Items: []source.Item{mqttItem(dbg, 2)}})
	var refused *v1.ContainerStatus
	eventually(t, "the debugger reported refused", func() bool {
		p := podNamed(a, "m")
		if len(p.Status.EphemeralContainerStatuses) == 1 {
			refused = &p.Status.EphemeralContainerStatuses[0]
		}
		return refused != nil
	})
	if tm := refused.State.Terminated; refused.Name != "debugger" || tm == nil || tm.Reason != admission.ReasonPolicyDenied ||
		!strings.Contains(tm.Message, "SYS_PTRACE") {
		t.Errorf("refused debugger's status %+v, want terminated PolicyDenied naming SYS_PTRACE", refused)
	}
	if len(a.Rejected()) != 0 {
		t.Errorf("the version was refused whole: %v", a.Rejected())
	}

	resized := dbg.DeepCopy()
	resized.Spec.Containers[0].Resources.Requests[v1.ResourceMemory] = resource.MustParse("200Mi")
	src.send(source.Change{Op: source.Upsert, Items: []source.Item{mqttItem(resized, 3)}})
	waitApplied(t, src)
	eventually(t, "the resize reaches the node", func() bool {
		return podNamed(a, "m").Spec.Containers[0].Resources.Requests.Memory().String() == "200Mi"
	})
	cs, _ := rt.ListContainers(context.Background(), string(uid))
	for _, c := range cs {
		if c.Name == "debugger" {
			t.Errorf("the refused debugger reached the runtime: %+v", c)
		}
	}
}
