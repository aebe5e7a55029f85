package admission

import (
	"fmt"
	"slices"

	"github.com/mqlet/mqlet/core/nodeaffinity"
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

// checkNodeAffinity refuses pod when the node, named nodeName with labels, does not match its
// nodeSelector or its required node affinity (core/nodeaffinity, the rule mqlet-bridge judges
// nodes by too). nil labels are a node not known yet (a node always has its hostname, os and arch
// labels): nothing is refused for them.
func checkNodeAffinity(pod *v1.Pod, nodeName string, labels map[string]string) *Refusal {
	if labels == nil || nodeaffinity.Matches(pod, nodeName, labels) {
		return nil
	}
	return &Refusal{Reason: ReasonNodeAffinity, Message: nodeAffinityMessage}
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
