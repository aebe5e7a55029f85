package pods

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
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

// A sidecar's status (initContainerStatuses with started, ready and restartCount), the containers'
// resources and the conditions the node computes from them reach the API as the node sent them.
func TestMergeStatusPassesSidecarsAndResources(t *testing.T) {
	yes := true
	res := &v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("32Mi")},
		Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse("32Mi")}}
	node := &v1.PodStatus{Phase: v1.PodRunning,
		InitContainerStatuses: []v1.ContainerStatus{{Name: "proxy", Started: &yes, Ready: true, RestartCount: 3,
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}, Resources: res, AllocatedResources: res.Requests}},
		ContainerStatuses: []v1.ContainerStatus{{Name: "app", Started: &yes, Ready: true, Resources: res, AllocatedResources: res.Requests,
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}},
		Conditions: []v1.PodCondition{{Type: v1.PodInitialized, Status: v1.ConditionTrue}, {Type: v1.ContainersReady, Status: v1.ConditionTrue}},
	}
	got := MergeStatus(&v1.PodStatus{Phase: v1.PodPending}, node, 1)
	if !equality.Semantic.DeepEqual(got.InitContainerStatuses, node.InitContainerStatuses) ||
		!equality.Semantic.DeepEqual(got.ContainerStatuses, node.ContainerStatuses) {
		t.Errorf("container statuses changed on the way:\n got %+v\nwant %+v", got.InitContainerStatuses, node.InitContainerStatuses)
	}
	for _, c := range node.Conditions {
		found := false
		for _, g := range got.Conditions {
			found = found || g.Type == c.Type && g.Status == c.Status
		}
		if !found {
			t.Errorf("condition %s=%s lost: %+v", c.Type, c.Status, got.Conditions)
		}
	}
}

// The resize conditions are the node's: one it stops reporting (the resize is done) leaves the API's
// status too, where a controller's condition of another type stays.
func TestMergeStatusClearsResizeConditions(t *testing.T) {
	api := &v1.PodStatus{Phase: v1.PodRunning, Conditions: []v1.PodCondition{
		{Type: v1.PodResizePending, Status: v1.ConditionTrue, Reason: v1.PodReasonDeferred},
		{Type: v1.PodResizeInProgress, Status: v1.ConditionTrue},
		{Type: "example.com/gate", Status: v1.ConditionTrue},
	}}
	node := &v1.PodStatus{Phase: v1.PodRunning, Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue},
		{Type: v1.PodResizeInProgress, Status: v1.ConditionTrue, Reason: v1.PodReasonError, Message: "below current usage"}}}
	got := MergeStatus(api, node, 2)
	types := map[v1.PodConditionType]v1.PodCondition{}
	for _, c := range got.Conditions {
		types[c.Type] = c
	}
	if _, ok := types[v1.PodResizePending]; ok {
		t.Errorf("PodResizePending kept after the node cleared it: %+v", got.Conditions)
	}
	if c := types[v1.PodResizeInProgress]; c.Reason != v1.PodReasonError {
		t.Errorf("PodResizeInProgress = %+v, want the node's", c)
	}
	if _, ok := types["example.com/gate"]; !ok {
		t.Errorf("a controller's condition was dropped: %+v", got.Conditions)
	}
}
