// Package nodeaffinity is Kubernetes' rule for whether a node suits a pod: the pod's nodeSelector
// and its required node affinity, matched against the node's name and labels. The agent's admission
// refuses a pod its node does not match (kubelet re-checks a scheduler's choice the same way), and
// mqlet-bridge judges with it, against the API's Node, whether a node needs those fields sent at
// all; one rule, so the two cannot disagree.
package nodeaffinity

import (
	"slices"
	"strconv"

	v1 "k8s.io/api/core/v1"
)

// Matches says whether the node, named nodeName with labels, matches the pod's nodeSelector and
// required node affinity. nil labels are a node with no labels.
func Matches(pod *v1.Pod, nodeName string, labels map[string]string) bool {
	for k, v := range pod.Spec.NodeSelector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return true
	}
	// The terms are ORed; a term's expressions and fields are ANDed; a term with neither matches
	// nothing.
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		if len(term.MatchExpressions) == 0 && len(term.MatchFields) == 0 {
			continue
		}
		ok := true
		for _, r := range term.MatchExpressions {
			v, has := labels[r.Key]
			ok = ok && requirementMatches(r, v, has)
		}
		for _, r := range term.MatchFields {
			// metadata.name is the only field a node selector may match on.
			ok = ok && r.Key == "metadata.name" && requirementMatches(r, nodeName, true)
		}
		if ok {
			return true
		}
	}
	return false
}

func requirementMatches(r v1.NodeSelectorRequirement, v string, has bool) bool {
	switch r.Operator {
	case v1.NodeSelectorOpIn:
		return has && slices.Contains(r.Values, v)
	case v1.NodeSelectorOpNotIn:
		return !has || !slices.Contains(r.Values, v)
	case v1.NodeSelectorOpExists:
		return has
	case v1.NodeSelectorOpDoesNotExist:
		return !has
	case v1.NodeSelectorOpGt, v1.NodeSelectorOpLt:
		if !has || len(r.Values) != 1 {
			return false
		}
		got, err1 := strconv.ParseInt(v, 10, 64)
		want, err2 := strconv.ParseInt(r.Values[0], 10, 64)
		if err1 != nil || err2 != nil {
			return false
		}
		if r.Operator == v1.NodeSelectorOpGt {
			return got > want
		}
		return got < want
	}
	return false
}
