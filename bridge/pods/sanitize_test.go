package pods

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
)

// admitAsNode runs the pod through what a node does with a desired message: the strict decoder
// and the agent's admission with the default MQTT policy.
func admitAsNode(t *testing.T, node string, p *v1.Pod) (*v1.Pod, []string, error) {
	t.Helper()
	d, err := protocol.NewDesired(node, 1, p)
	if err != nil {
		t.Fatal(err)
	}
	payload := mustEncode(t, d)
	got, err := protocol.DecodeDesired(protocol.Topic{Class: protocol.ClassDesired, Node: node, Kind: protocol.KindPod,
		Namespace: p.Namespace, Name: p.Name}, payload, 0)
	if err != nil {
		t.Fatalf("the node's decoder refuses the sanitized pod: %v", err)
	}
	a := admission.Admitter{NodeName: node}
	admitted, err := a.Admit(source.Item{Pod: got.Pod, Ref: source.Ref{Kind: source.MQTT}, Generation: 1})
	if err != nil {
		return nil, nil, err
	}
	return admitted, admission.FieldWarnings(admitted), nil
}

func TestSanitizedAPIPodPassesTheNodesAdmissionWithoutWarnings(t *testing.T) {
	in := apiPod("default", "web-1", "edge-a", "6f1c2d3e-aaaa-4bbb-8ccc-0123456789ab")
	// As kubectl debug --target adds one through the ephemeralcontainers subresource, defaulted.
	in.Spec.EphemeralContainers = []v1.EphemeralContainer{{TargetContainerName: in.Spec.Containers[0].Name,
		EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "debugger-x7k2p", Image: "busybox:1.36", Command: []string{"sleep", "3600"},
			TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: v1.TerminationMessageReadFile, ImagePullPolicy: v1.PullIfNotPresent}}}
	before, _ := json.Marshal(in)
	p := SanitizePod(in)
	after, _ := json.Marshal(in)
	if string(before) != string(after) {
		t.Fatal("SanitizePod modified its input")
	}
	admitted, warnings, err := admitAsNode(t, "edge-a", p)
	if err != nil {
		t.Fatalf("the node's admission refuses the API's pod: %v", err)
	}
	if len(warnings) > 0 {
		t.Errorf("the node warns about fields the API defaulted: %q", warnings)
	}
	if admitted.UID != in.UID {
		t.Errorf("the node runs the pod as uid %q, the API pod is %q: statuses could not be matched", admitted.UID, in.UID)
	}
	if admitted.Generation != in.Generation {
		t.Errorf("generation %d on the node, %d in the API", admitted.Generation, in.Generation)
	}

	// Without the sanitizing, the API's pod is refused (the token volume), which is what the
	// sanitizing is for.
	if _, _, err := admitAsNode(t, "edge-a", in.DeepCopy()); err == nil || !strings.Contains(err.Error(), "serviceAccountToken") {
		t.Errorf("the raw API pod: want a refusal naming serviceAccountToken, got %v", err)
	}
}

func TestSanitizeStripsOnlyWhatItMust(t *testing.T) {
	in := apiPod("default", "web-1", "edge-a", "6f1c2d3e-aaaa-4bbb-8ccc-0123456789ab")
	in.Spec.InitContainers = []v1.Container{{Name: "init", Image: "x:1", VolumeMounts: in.Spec.Containers[0].VolumeMounts}}
	in.Spec.EphemeralContainers = []v1.EphemeralContainer{{TargetContainerName: in.Spec.Containers[0].Name,
		EphemeralContainerCommon: v1.EphemeralContainerCommon{Name: "debugger", Image: "x:1", VolumeMounts: in.Spec.Containers[0].VolumeMounts}}}
	p := SanitizePod(in)
	if p.ManagedFields != nil || p.ResourceVersion != "" {
		t.Errorf("managedFields %v, resourceVersion %q: want both gone", p.ManagedFields, p.ResourceVersion)
	}
	if len(p.Spec.Volumes) != 1 || p.Spec.Volumes[0].Name != "config" {
		t.Errorf("volumes %+v: want only config", p.Spec.Volumes)
	}
	for _, cs := range [][]v1.Container{p.Spec.InitContainers, p.Spec.Containers, {v1.Container(p.Spec.EphemeralContainers[0].EphemeralContainerCommon)}} {
		if len(cs[0].VolumeMounts) != 1 || cs[0].VolumeMounts[0].Name != "config" {
			t.Errorf("container %s mounts %+v: want only config", cs[0].Name, cs[0].VolumeMounts)
		}
	}
	if p.Status.Phase != "" || len(p.Status.Conditions) != 0 {
		t.Errorf("status %+v: want empty", p.Status)
	}
	if p.Spec.ServiceAccountName != "default" || len(p.Spec.Tolerations) != 2 || p.Labels["app"] != "web" || len(p.OwnerReferences) != 1 {
		t.Errorf("sanitizing removed fields the node should get: %+v", p)
	}

	// A token volume the user wrote is kept, so the node refuses the pod with a message rather
	// than running it without the volume.
	in.Spec.Volumes[1].Name = "my-token"
	in.Spec.Containers[0].VolumeMounts[1].Name = "my-token"
	p = SanitizePod(in)
	if len(p.Spec.Volumes) != 2 {
		t.Errorf("a user's own token volume was stripped")
	}
}

func TestReferences(t *testing.T) {
	spec := v1.PodSpec{
		Volumes: []v1.Volume{
			{Name: "a", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm-vol"}, Optional: ptr(true)}}},
			{Name: "b", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "sec-vol"}}},
			{Name: "c", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
				{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "cm-proj"}}},
				{Secret: &v1.SecretProjection{LocalObjectReference: v1.LocalObjectReference{Name: "sec-proj"}, Optional: ptr(true)}},
			}}}},
			{Name: "d", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		},
		InitContainers: []v1.Container{{Name: "i", EnvFrom: []v1.EnvFromSource{{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm-envfrom"}}}}}},
		Containers: []v1.Container{{Name: "c",
			EnvFrom: []v1.EnvFromSource{{SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "sec-envfrom"}, Optional: ptr(true)}}},
			Env: []v1.EnvVar{
				{Name: "A", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "cm-key"}, Key: "k"}}},
				{Name: "B", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "sec-key"}, Key: "k"}}},
				// cm-vol again, required this time: required wins.
				{Name: "C", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "cm-vol"}, Key: "k"}}},
				{Name: "D", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			}}},
		ImagePullSecrets: []v1.LocalObjectReference{{Name: "pull"}},
	}
	got := References(&spec)
	want := []Ref{
		{"ConfigMap", "cm-vol", false}, {"Secret", "sec-vol", false}, {"ConfigMap", "cm-proj", false},
		{"Secret", "sec-proj", true}, {"ConfigMap", "cm-envfrom", false}, {"Secret", "sec-envfrom", true},
		{"ConfigMap", "cm-key", false}, {"Secret", "sec-key", false}, {"Secret", "pull", true},
	}
	if len(got) != len(want) {
		t.Fatalf("references %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("reference %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// selectedPod is bound to edge-1 and selects it by the bridge's role label and a site label.
func selectedPod() *v1.Pod {
	return &v1.Pod{Spec: v1.PodSpec{
		NodeName:     "edge-1",
		Containers:   []v1.Container{{Name: "main", Image: "busybox:1"}},
		NodeSelector: map[string]string{"node-role.kubernetes.io/edge": ""},
		Affinity: &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: "site", Operator: v1.NodeSelectorOpIn, Values: []string{"plant-7"}}}}}},
			PreferredDuringSchedulingIgnoredDuringExecution: []v1.PreferredSchedulingTerm{{Weight: 1, Preference: v1.NodeSelectorTerm{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: "fast", Operator: v1.NodeSelectorOpExists}}}}},
		}},
	}}
}

func TestDropNodeSelection(t *testing.T) {
	p := selectedPod()
	if !HasNodeSelection(p) {
		t.Fatal("HasNodeSelection: false for a pod with a nodeSelector")
	}
	DropNodeSelection(p)
	if HasNodeSelection(p) || p.Spec.Affinity == nil || len(p.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Errorf("spec %+v: want the selector and required affinity gone, the preferred kept", p.Spec)
	}
	p = selectedPod()
	p.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = nil
	DropNodeSelection(p)
	if p.Spec.Affinity != nil {
		t.Errorf("an affinity left empty should go: %+v", p.Spec.Affinity)
	}
	// What the node makes of it: admitted (the node's own labels are checked in the e2e test).
	p = selectedPod()
	p.Name, p.Namespace = "web", "default"
	DropNodeSelection(p)
	if _, _, err := admitAsNode(t, "edge-1", p); err != nil {
		t.Errorf("the node refuses the pod without its node selection: %v", err)
	}
}
