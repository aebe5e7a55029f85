package admission

import (
	"strings"
	"testing"

	"github.com/mqlet/mqlet/core/source"
	v1 "k8s.io/api/core/v1"
)

// Ephemeral containers the MQTT policy refuses are left out of an admitted pod, recorded with the
// policy's words; the others stay; a source cannot claim a refusal of its own.
func TestPolicyLeavesOutRefusedEphemeralContainers(t *testing.T) {
	a := Admitter{NodeName: node}
	mqtt := source.Ref{Kind: source.MQTT, Origin: "mqlet/v2/nodes/edge-1/desired/pods/apps/web"}
	pod := policyPod(func(p *v1.Pod) {
		ptrace := debugger(&v1.SecurityContext{AllowPrivilegeEscalation: yes(), Capabilities: &v1.Capabilities{Add: []v1.Capability{"SYS_PTRACE"}}})
		plain := debugger(nil)
		plain.Name = "plain"
		priv := debugger(&v1.SecurityContext{Privileged: yes()})
		priv.Name = "priv"
		p.Spec.EphemeralContainers = []v1.EphemeralContainer{ptrace, plain, priv}
		p.Annotations = map[string]string{AnnotationRefusedEphemeral: `[{"name":"main","message":"spoofed"}]`}
	})
	got, err := a.Admit(source.Item{Pod: pod, Ref: mqtt, Generation: 2})
	if err != nil {
		t.Fatalf("a pod whose only violations are ephemeral containers: %v; want it admitted without them", err)
	}
	if n := len(got.Spec.EphemeralContainers); n != 1 || got.Spec.EphemeralContainers[0].Name != "plain" {
		t.Errorf("admitted ephemeral containers %+v, want only plain", got.Spec.EphemeralContainers)
	}
	refused := RefusedEphemeralContainers(got)
	if len(refused) != 2 || refused[0].Name != "debugger" || refused[1].Name != "priv" {
		t.Fatalf("refused %+v, want debugger and priv in spec order", refused)
	}
	for _, want := range []string{"spec.ephemeralContainers[0].securityContext.capabilities.add[0]", `"SYS_PTRACE"`,
		"spec.ephemeralContainers[0].securityContext.allowPrivilegeEscalation", "mqtt pods"} {
		if !strings.Contains(refused[0].Message, want) {
			t.Errorf("debugger's refusal %q does not mention %q", refused[0].Message, want)
		}
	}
	if !strings.Contains(refused[1].Message, "mqttPolicy.allowPrivileged") || refused[1].Image != "busybox:1" {
		t.Errorf("priv's refusal %+v", refused[1])
	}

	// The manifest dir is trusted: nothing is left out, and nothing a file says is taken as a
	// refusal.
	got, err = a.Admit(source.Item{Pod: pod, Ref: source.Ref{Kind: source.File, Origin: "/etc/mqlet/pods/web.yaml"}})
	if err != nil || len(got.Spec.EphemeralContainers) != 3 || RefusedEphemeralContainers(got) != nil {
		t.Errorf("file pod: %v, %d ephemeral containers, refused %v; want all three and no refusal", err, len(got.Spec.EphemeralContainers), RefusedEphemeralContainers(got))
	}
}
