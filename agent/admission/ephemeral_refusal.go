package admission

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// An ephemeral container (kubectl debug) that the node's policy refuses must not freeze its pod:
// the API never removes an ephemeral container, so every later version of the pod carries it, and
// refusing those versions whole would leave the node running the old spec for good (no resize, no
// image update, only deletion). So a version whose only violations are in ephemeral containers is
// admitted without those containers, and the refusal is recorded on the admitted pod
// (AnnotationRefusedEphemeral): the worker reports each such container terminated with reason
// PolicyDenied and the policy's words, which also ends kubectl debug's wait for it. What the
// policy refuses never reaches the runtime: the container is not in the admitted spec at all.

// AnnotationRefusedEphemeral lists, as JSON ([]RefusedEphemeral), the ephemeral containers
// admission left out of the pod for the policy. Only admission sets it; whatever a source sent
// under this key is dropped.
const AnnotationRefusedEphemeral = "mqlet.io/refused-ephemeral-containers"

// ReasonPolicyDenied is the reason of a refused ephemeral container's terminated state.
const ReasonPolicyDenied = "PolicyDenied"

// RefusedEphemeral is one ephemeral container left out by the policy.
type RefusedEphemeral struct {
	Name    string `json:"name"`
	Image   string `json:"image,omitempty"`
	Message string `json:"message"`
}

const ephemeralField = "spec.ephemeralContainers["

// ephemeralViolations groups violations by the ephemeral container they are of; ok is false when
// any violation is of something else (the pod is then refused whole).
func ephemeralViolations(vs []Violation) (map[int][]Violation, bool) {
	out := map[int][]Violation{}
	for _, v := range vs {
		rest, found := strings.CutPrefix(v.Field, ephemeralField)
		if !found {
			return nil, false
		}
		n, _, found := strings.Cut(rest, "]")
		i, err := strconv.Atoi(n)
		if !found || err != nil || i < 0 {
			return nil, false
		}
		out[i] = append(out[i], v)
	}
	return out, len(out) > 0
}

// leaveOutEphemeral removes the ephemeral containers refused (by index) from pod and records them
// in AnnotationRefusedEphemeral, in the spec's order.
func leaveOutEphemeral(pod *v1.Pod, refused map[int][]Violation, src string) error {
	var kept []v1.EphemeralContainer
	var out []RefusedEphemeral
	for i, c := range pod.Spec.EphemeralContainers {
		vs, bad := refused[i]
		if !bad {
			kept = append(kept, c)
			continue
		}
		msgs := make([]string, len(vs))
		for j, v := range vs {
			msgs[j] = v.String()
		}
		out = append(out, RefusedEphemeral{Name: c.Name, Image: c.Image,
			Message: fmt.Sprintf("ephemeral container %s refused by the node's policy for %s pods: %s", c.Name, src, strings.Join(msgs, "; "))})
	}
	b, err := json.Marshal(out)
	if err != nil {
		return fmt.Errorf("recording the refused ephemeral containers of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	pod.Spec.EphemeralContainers = kept
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[AnnotationRefusedEphemeral] = string(b)
	return nil
}

// RefusedEphemeralContainers reads AnnotationRefusedEphemeral; nil when the pod has none or the
// value does not parse (admission wrote it; a stored pod is not edited by hand).
func RefusedEphemeralContainers(pod *v1.Pod) []RefusedEphemeral {
	s, ok := pod.Annotations[AnnotationRefusedEphemeral]
	if !ok {
		return nil
	}
	var out []RefusedEphemeral
	if json.Unmarshal([]byte(s), &out) != nil {
		return nil
	}
	return out
}
