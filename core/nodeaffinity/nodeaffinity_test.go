package nodeaffinity

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

// The operators, the ORed terms and matchFields are tested through the agent's admission
// (agent/admission TestNodeAffinity); this covers what only a caller with the API's Node meets:
// a node with no labels at all is judged, not waved through.
func TestNodeWithoutLabels(t *testing.T) {
	plain := &v1.Pod{}
	if !Matches(plain, "gw-1", nil) {
		t.Error("a pod with no selector does not match a node without labels")
	}
	selecting := &v1.Pod{Spec: v1.PodSpec{NodeSelector: map[string]string{"site": "plant-3"}}}
	if Matches(selecting, "gw-1", nil) {
		t.Error("a pod selecting site=plant-3 matches a node without labels")
	}
	named := &v1.Pod{Spec: v1.PodSpec{Affinity: &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
			MatchFields: []v1.NodeSelectorRequirement{{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{"gw-1"}}}}}}}}}}
	if !Matches(named, "gw-1", nil) || Matches(named, "gw-2", nil) {
		t.Error("matchFields on metadata.name does not follow the node's name")
	}
}
