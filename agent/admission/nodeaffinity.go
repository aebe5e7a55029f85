package admission

import (
	"fmt"
	"slices"
	"strconv"

	v1 "k8s.io/api/core/v1"
)

// kubelet re-checks at admission what a scheduler decided: that the pod's nodeSelector and required
// node affinity match the node's labels, and (for pods that are not static) that the pod tolerates
// the node's NoExecute taints. On a node without a scheduler these checks are what make those
// fields mean something: a pod meant for other nodes is refused, Failed with kubelet's reason.

// Reasons and messages kubelet refuses such pods with.
const (
	ReasonNodeAffinity     = "NodeAffinity"
	ReasonTaintToleration  = "TaintToleration"
	nodeAffinityMessage    = "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
	taintTolerationMessage = "Predicate TaintToleration failed: node(s) had untolerated taint {%s: %s}"
)

// NodeAffinityMatches says whether the node, named nodeName with labels, matches the pod's
// nodeSelector and required node affinity: the check admission makes, for a control plane that
// judges a pod against labels the node itself does not know (mqlet-bridge, with the API's Node).
func NodeAffinityMatches(pod *v1.Pod, nodeName string, labels map[string]string) bool {
	if labels == nil {
		labels = map[string]string{}
	}
	return checkNodeAffinity(pod, nodeName, labels) == nil
}

// checkNodeAffinity refuses pod when the node, named nodeName with labels, does not match its
// nodeSelector or its required node affinity. nil labels are a node not known yet (a node always
// has its hostname, os and arch labels): nothing is refused for them.
func checkNodeAffinity(pod *v1.Pod, nodeName string, labels map[string]string) *Refusal {
	if labels == nil {
		return nil
	}
	for k, v := range pod.Spec.NodeSelector {
		if got, ok := labels[k]; !ok || got != v {
			return &Refusal{Reason: ReasonNodeAffinity, Message: nodeAffinityMessage}
		}
	}
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
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
			return nil
		}
	}
	return &Refusal{Reason: ReasonNodeAffinity, Message: nodeAffinityMessage}
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

// checkTaints refuses pod when one of the node's NoExecute taints is not tolerated by it. kubelet
// skips the check for static pods; mqlet for its critical pods (manifest-dir pods, its static
// pods, and critical priorities).
func checkTaints(pod *v1.Pod, critical bool, taints []v1.Taint) *Refusal {
	if critical {
		return nil
	}
	for _, t := range taints {
		if t.Effect != v1.TaintEffectNoExecute {
			continue
		}
		if !slices.ContainsFunc(pod.Spec.Tolerations, func(tol v1.Toleration) bool { return tolerates(tol, t) }) {
			return &Refusal{Reason: ReasonTaintToleration, Message: fmt.Sprintf(taintTolerationMessage, t.Key, t.Value)}
		}
	}
	return nil
}

// tolerates is Kubernetes' rule: the effect matches (or the toleration names none); an empty key
// with Exists matches every taint; Exists matches the key; Equal (the default) the key and value.
func tolerates(tol v1.Toleration, t v1.Taint) bool {
	if tol.Effect != "" && tol.Effect != t.Effect {
		return false
	}
	if tol.Key != "" && tol.Key != t.Key {
		return false
	}
	switch tol.Operator {
	case v1.TolerationOpExists:
		return true
	case "", v1.TolerationOpEqual:
		return tol.Value == t.Value
	}
	return false
}
