package nodes

import (
	"context"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels and taints changed in the agent's config after registration reach the Node; those the
// agent no longer sets go; an operator's labels and taints, and the role label, stay.
func TestAgentLabelAndTaintChangesReachTheNode(t *testing.T) {
	h := newHarness(t, nil)
	h.liveness("edge-1", true, 3, 1)
	st := agentStatus("edge-1", v1.ConditionTrue)
	h.statusMsg("edge-1", st, 1)
	n := h.waitNode("edge-1", "registered", func(n *v1.Node) bool { return n.Labels["site"] == "plant-7" })

	// An operator labels and taints the Node.
	n = n.DeepCopy()
	n.Labels["team"] = "ops"
	n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: "ops/maintenance", Effect: v1.TaintEffectNoSchedule})
	if _, err := h.kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The bridge writes from its informer's copy; the API server would refuse a write from an
	// older copy (a conflict, then a retry with a fresh one), the fake clientset does not check,
	// so the test lets the informer see the operator's change first.
	eventually(t, "the informer sees the operator's change", func() bool {
		got, err := h.c.lister.Get("edge-1")
		return err == nil && got.Labels["team"] == "ops"
	})

	// The device's config changes: site moves, a zone label appears, the edge taint goes and
	// another comes.
	st = st.DeepCopy()
	st.Labels["site"] = "plant-8"
	st.Labels["zone"] = "a"
	st.Spec.Taints = []v1.Taint{{Key: "mqlet.io/battery", Value: "low", Effect: v1.TaintEffectNoExecute}}
	h.statusMsg("edge-1", st, 1)
	n = h.waitNode("edge-1", "the agent's new labels", func(n *v1.Node) bool { return n.Labels["site"] == "plant-8" })
	for k, v := range map[string]string{"zone": "a", "team": "ops", DefaultRoleLabel: "", LabelArch: "arm64"} {
		if got, ok := n.Labels[k]; !ok || got != v {
			t.Errorf("label %s = %q (present %v), want %q; labels %v", k, got, ok, v, n.Labels)
		}
	}
	if got := taintIDs(n); !slices.Equal(got, []string{"mqlet.io/battery:NoExecute", "ops/maintenance:NoSchedule"}) {
		t.Errorf("taints %v, want the agent's new one and the operator's (the agent's old one gone)", got)
	}

	// The agent drops the zone label: it goes; the operator's stays.
	st = st.DeepCopy()
	delete(st.Labels, "zone")
	h.statusMsg("edge-1", st, 1)
	n = h.waitNode("edge-1", "zone label removed", func(n *v1.Node) bool { _, ok := n.Labels["zone"]; return !ok })
	if n.Labels["team"] != "ops" || n.Labels["site"] != "plant-8" {
		t.Errorf("labels %v: the operator's team and the agent's site must stay", n.Labels)
	}
}

// A Node registered by an older bridge (no record of what the agent set) loses nothing on the
// first pass, and gets the record.
func TestReconcileWithoutRecordRemovesNothing(t *testing.T) {
	agent := agentStatus("edge-1", v1.ConditionTrue)
	old := registration("edge-1", agent, DefaultRoleLabel)
	old.Labels["stale"] = "x" // set by the agent long ago, or by someone: unknown
	old.Annotations = nil
	out, changed := reconcileAgentMeta(old, agent, DefaultRoleLabel)
	if !changed || out.Labels["stale"] != "x" || out.Annotations[AnnotationAgentLabels] == "" {
		t.Errorf("changed %v labels %v annotations %v", changed, out.Labels, out.Annotations)
	}
	if _, again := reconcileAgentMeta(out, agent, DefaultRoleLabel); again {
		t.Error("a reconciled Node must not change again")
	}
}

func taintIDs(n *v1.Node) []string {
	var out []string
	for _, t := range n.Spec.Taints {
		out = append(out, taintID(t))
	}
	slices.Sort(out)
	return out
}
