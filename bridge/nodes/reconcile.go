package nodes

import (
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Annotations in which the bridge remembers which of a Node's labels and taints the agent set, so
// that one the agent stops setting is removed again while labels and taints that others (an
// operator, a controller) put on the Node are left alone.
const (
	AnnotationAgentLabels = "mqlet.io/agent-labels" // label keys, comma-separated, sorted
	AnnotationAgentTaints = "mqlet.io/agent-taints" // key:effect of each taint, comma-separated, sorted
)

// reconcileAgentMeta returns n with the agent's current labels and taints (its config's nodeLabels
// and nodeTaints, changed on the device after registration) and without those the agent set before
// and no longer does; changed is false when n already matches. The labels are registration's (the
// agent's own plus the well-known ones and the role label), so the agent cannot take the role
// label away. A Node with no record of what the agent set (registered by an older bridge) loses
// nothing on the first pass: its record starts from the agent's current set.
func reconcileAgentMeta(n, agent *v1.Node, roleLabel string) (out *v1.Node, changed bool) {
	want := registration(n.Name, agent, roleLabel)
	out = n.DeepCopy()
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}

	prevLabels := listed(n.Annotations, AnnotationAgentLabels)
	for k := range prevLabels {
		if _, keep := want.Labels[k]; !keep {
			delete(out.Labels, k)
		}
	}
	maps.Copy(out.Labels, want.Labels)
	wantKeys := slices.Sorted(maps.Keys(want.Labels))
	out.Annotations[AnnotationAgentLabels] = strings.Join(wantKeys, ",")

	prevTaints := listed(n.Annotations, AnnotationAgentTaints)
	agentTaints := map[string]v1.Taint{}
	for _, t := range want.Spec.Taints {
		agentTaints[taintID(t)] = t
	}
	var taints []v1.Taint
	for _, t := range n.Spec.Taints {
		id := taintID(t)
		if a, ok := agentTaints[id]; ok {
			a.TimeAdded = t.TimeAdded
			taints = append(taints, a) // the agent's value wins
			delete(agentTaints, id)
			continue
		}
		if prevTaints[id] {
			continue // the agent set it before and no longer does
		}
		taints = append(taints, t) // someone else's
	}
	for _, id := range slices.Sorted(maps.Keys(agentTaints)) {
		taints = append(taints, agentTaints[id])
	}
	out.Spec.Taints = taints
	var ids []string
	for _, t := range want.Spec.Taints {
		ids = append(ids, taintID(t))
	}
	slices.Sort(ids)
	out.Annotations[AnnotationAgentTaints] = strings.Join(slices.Compact(ids), ",")

	changed = !maps.Equal(n.Labels, out.Labels) || !maps.Equal(n.Annotations, out.Annotations) ||
		!slices.EqualFunc(n.Spec.Taints, out.Spec.Taints, func(a, b v1.Taint) bool { return a.MatchTaint(&b) && a.Value == b.Value })
	return out, changed
}

// listed reads a comma-separated annotation as a set (empty when the annotation is absent).
func listed(a map[string]string, key string) map[string]bool {
	set := map[string]bool{}
	for _, s := range strings.Split(a[key], ",") {
		if s != "" {
			set[s] = true
		}
	}
	return set
}

// taintID is what makes a taint one (key and effect, as the API validates them unique).
func taintID(t v1.Taint) string { return t.Key + ":" + string(t.Effect) }
