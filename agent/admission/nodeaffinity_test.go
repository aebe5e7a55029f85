package admission

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

func affinityPod(sel map[string]string, terms ...v1.NodeSelectorTerm) *v1.Pod {
	p := basePod()
	p.Spec.NodeName = "gw-1"
	p.Spec.NodeSelector = sel
	if len(terms) > 0 {
		p.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: terms}}}
	}
	return p
}

func expr(key string, op v1.NodeSelectorOperator, values ...string) v1.NodeSelectorTerm {
	return v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

func TestNodeAffinity(t *testing.T) {
	labels := map[string]string{"kubernetes.io/arch": "arm64", "site": "plant-3", "cores": "4"}
	for _, tc := range []struct {
		name  string
		pod   *v1.Pod
		admit bool
	}{
		{"no selector", affinityPod(nil), true},
		{"selector matches", affinityPod(map[string]string{"site": "plant-3", "kubernetes.io/arch": "arm64"}), true},
		{"selector value differs", affinityPod(map[string]string{"site": "plant-4"}), false},
		{"selector label missing", affinityPod(map[string]string{"zone": "a"}), false},
		{"In", affinityPod(nil, expr("site", v1.NodeSelectorOpIn, "plant-1", "plant-3")), true},
		{"In misses", affinityPod(nil, expr("site", v1.NodeSelectorOpIn, "plant-1")), false},
		{"NotIn", affinityPod(nil, expr("site", v1.NodeSelectorOpNotIn, "plant-1")), true},
		{"NotIn hits", affinityPod(nil, expr("site", v1.NodeSelectorOpNotIn, "plant-3")), false},
		{"Exists", affinityPod(nil, expr("cores", v1.NodeSelectorOpExists)), true},
		{"DoesNotExist", affinityPod(nil, expr("gpu", v1.NodeSelectorOpDoesNotExist)), true},
		{"DoesNotExist hits", affinityPod(nil, expr("site", v1.NodeSelectorOpDoesNotExist)), false},
		{"Gt", affinityPod(nil, expr("cores", v1.NodeSelectorOpGt, "2")), true},
		{"Lt misses", affinityPod(nil, expr("cores", v1.NodeSelectorOpLt, "2")), false},
		{"terms ORed", affinityPod(nil, expr("site", v1.NodeSelectorOpIn, "x"), expr("cores", v1.NodeSelectorOpExists)), true},
		{"empty term matches nothing", affinityPod(nil, v1.NodeSelectorTerm{}), false},
		{"matchFields name", affinityPod(nil, v1.NodeSelectorTerm{MatchFields: []v1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{"gw-1"}}}}), true},
		{"matchFields other name", affinityPod(nil, v1.NodeSelectorTerm{MatchFields: []v1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{"gw-2"}}}}), false},
		{"selector and affinity both needed", affinityPod(map[string]string{"site": "x"}, expr("cores", v1.NodeSelectorOpExists)), false},
	} {
		r := Check(tc.pod, false, nil, Node{Labels: labels})
		if (r == nil) != tc.admit {
			t.Errorf("%s: refusal %v, want admitted=%v", tc.name, r, tc.admit)
		}
		if r != nil && (r.Reason != ReasonNodeAffinity || r.Message != nodeAffinityMessage || !IsRefusal(r.Reason, r.Message)) {
			t.Errorf("%s: refusal %+v", tc.name, r)
		}
	}
	// A node not known yet refuses nothing.
	if r := Check(affinityPod(map[string]string{"site": "x"}), false, nil, Node{}); r != nil {
		t.Errorf("no labels known: %v", r)
	}
}

func TestNoExecuteTaints(t *testing.T) {
	taints := []v1.Taint{
		{Key: "dedicated", Value: "plc", Effect: v1.TaintEffectNoExecute},
		{Key: "soft", Effect: v1.TaintEffectNoSchedule},
	}
	tol := func(ts ...v1.Toleration) *v1.Pod { p := basePod(); p.Spec.Tolerations = ts; return p }
	for _, tc := range []struct {
		name     string
		pod      *v1.Pod
		critical bool
		admit    bool
	}{
		{"untolerated", tol(), false, false},
		{"untolerated, critical (manifest-dir)", tol(), true, true},
		{"Equal", tol(v1.Toleration{Key: "dedicated", Value: "plc"}), false, true},
		{"Equal other value", tol(v1.Toleration{Key: "dedicated", Value: "x"}), false, false},
		{"Exists with effect", tol(v1.Toleration{Key: "dedicated", Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoExecute}), false, true},
		{"wrong effect", tol(v1.Toleration{Key: "dedicated", Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoSchedule}), false, false},
		{"everything", tol(v1.Toleration{Operator: v1.TolerationOpExists}), false, true},
	} {
		r := Check(tc.pod, tc.critical, nil, Node{Taints: taints})
		if (r == nil) != tc.admit {
			t.Errorf("%s: refusal %v, want admitted=%v", tc.name, r, tc.admit)
		}
		if r != nil && (r.Reason != ReasonTaintToleration || r.Message != "Predicate TaintToleration failed: node(s) had untolerated taint {dedicated: plc}") {
			t.Errorf("%s: refusal %+v", tc.name, r)
		}
	}
}
