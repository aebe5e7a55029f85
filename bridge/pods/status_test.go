package pods

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestMergeStatusKeepsATerminalPhase(t *testing.T) {
	api := &v1.PodStatus{Phase: v1.PodFailed, Reason: "NodeRefused", Message: "policy"}
	got := MergeStatus(api, &v1.PodStatus{Phase: v1.PodRunning}, 3)
	if got.Phase != v1.PodFailed || got.Reason != "NodeRefused" {
		t.Errorf("merged %s/%s over a Failed pod, want Failed/NodeRefused kept", got.Phase, got.Reason)
	}
	got = MergeStatus(&v1.PodStatus{Phase: v1.PodRunning}, &v1.PodStatus{Phase: v1.PodSucceeded}, 3)
	if got.Phase != v1.PodSucceeded {
		t.Errorf("phase %s, want Succeeded from the node", got.Phase)
	}
}
