package store

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func testNode(name string, ready v1.ConditionStatus, at time.Time) *v1.Node {
	n := &v1.Node{TypeMeta: metav1.TypeMeta{Kind: "Node", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{"kubernetes.io/hostname": name}, Annotations: map[string]string{"mqlet.io/board": "Raspberry Pi 4 Model B Rev 1.4"}}}
	n.Status.Capacity = v1.ResourceList{v1.ResourceCPU: resource.MustParse("4"), v1.ResourceMemory: resource.MustParse("3794Mi")}
	n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: ready, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.NewTime(at), LastTransitionTime: metav1.NewTime(at)}}
	n.Status.NodeInfo.ContainerRuntimeVersion = "containerd://1.7.24"
	return n
}

// testNodeStatus: one record, replaced by each put, kept exactly (whole seconds), refused without
// a name, and an undecodable record is an error naming it.
func testNodeStatus(t *testing.T, s stateUnderTest) {
	if n, ok, err := s.GetNodeStatus(); n != nil || ok || err != nil {
		t.Fatalf("GetNodeStatus on an empty state = %v, %v, %v", n, ok, err)
	}
	at := time.Date(2026, 3, 14, 9, 26, 53, 700_000_000, time.UTC)
	if err := s.PutNodeStatus(testNode("edge-1", v1.ConditionFalse, at)); err != nil {
		t.Fatal(err)
	}
	put := testNode("edge-1", v1.ConditionTrue, at.Add(time.Minute))
	if err := s.PutNodeStatus(put); err != nil {
		t.Fatal(err)
	}
	put.Annotations["mqlet.io/board"] = "changed by the caller after the put"
	got, ok, err := s.GetNodeStatus()
	if err != nil || !ok {
		t.Fatalf("GetNodeStatus = %v, %v", ok, err)
	}
	c := got.Status.Conditions[0]
	if got.Name != "edge-1" || c.Status != v1.ConditionTrue || !c.LastTransitionTime.Time.Equal(at.Add(time.Minute).Truncate(time.Second)) ||
		got.Annotations["mqlet.io/board"] != "Raspberry Pi 4 Model B Rev 1.4" || got.Status.NodeInfo.ContainerRuntimeVersion != "containerd://1.7.24" {
		t.Errorf("stored node %+v", got)
	}
	if q := got.Status.Capacity[v1.ResourceMemory]; q.Cmp(resource.MustParse("3794Mi")) != 0 {
		t.Errorf("memory capacity %v", q)
	}
	if err := s.PutNodeStatus(&v1.Node{}); err == nil || !strings.Contains(err.Error(), "name") {
		t.Errorf("PutNodeStatus without a name: %v", err)
	}
	if err := s.PutNodeStatus(nil); err == nil {
		t.Errorf("PutNodeStatus(nil): no error")
	}
	s.setRaw(t, "node_status", "node", []byte("{not json"))
	if _, _, err := s.GetNodeStatus(); err == nil || !strings.Contains(err.Error(), "node_status/node") {
		t.Errorf("undecodable node status: err = %v, want a record error naming node_status/node", err)
	}
}

// The record survives closing and reopening the file.
func TestNodeStatusPersists(t *testing.T) {
	d, path := openTemp(t)
	if err := d.PutNodeStatus(testNode("edge-1", v1.ConditionTrue, time.Now())); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if n, ok, err := d.GetNodeStatus(); err != nil || !ok || n.Name != "edge-1" {
		t.Errorf("after reopen: %v, %v, %v", n, ok, err)
	}
}
