package nodestatus

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// NetworkUnavailable follows the network's readiness with its reason, keeps its transition time
// while the status holds, and Ready turns False with the same reason.
func TestNetworkConditionAndReady(t *testing.T) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := func() time.Time { return clock }
	var netErr error = errors.New(`CNI plugin "bridge" of network "mqlet" (/etc/cni/net.d/10-mqlet.conflist) not found in /usr/lib/cni`)
	network := func() error { return netErr }
	setters := []Setter{NetworkCondition(network, now), ReadyCondition(NetworkReady(func() error { return nil }, network), nil, now)}
	n := &v1.Node{}
	n.Status.Capacity = v1.ResourceList{v1.ResourceCPU: resource.MustParse("1"), v1.ResourceMemory: resource.MustParse("1Gi"),
		v1.ResourceEphemeralStorage: resource.MustParse("1Gi"), v1.ResourcePods: resource.MustParse("10")}
	run := func() {
		for _, s := range setters {
			if err := s(context.Background(), n); err != nil {
				t.Fatal(err)
			}
		}
	}
	cond := func(typ v1.NodeConditionType) v1.NodeCondition {
		for _, c := range n.Status.Conditions {
			if c.Type == typ {
				return c
			}
		}
		t.Fatalf("no %s condition in %+v", typ, n.Status.Conditions)
		return v1.NodeCondition{}
	}
	run()
	nu, ready := cond(v1.NodeNetworkUnavailable), cond(v1.NodeReady)
	if nu.Status != v1.ConditionTrue || nu.Reason != ReasonNetworkPluginNotReady || !strings.Contains(nu.Message, `"bridge"`) {
		t.Errorf("NetworkUnavailable with the plugin missing: %+v", nu)
	}
	if ready.Status != v1.ConditionFalse || !strings.Contains(ready.Message, MessageNetworkNotReady) || !strings.Contains(ready.Message, `"bridge"`) {
		t.Errorf("Ready with the plugin missing: %+v", ready)
	}
	if last := n.Status.Conditions[len(n.Status.Conditions)-1]; last.Type != v1.NodeReady {
		t.Errorf("Ready is not last: %+v", n.Status.Conditions)
	}

	clock = clock.Add(time.Minute)
	netErr = nil
	run()
	nu, ready = cond(v1.NodeNetworkUnavailable), cond(v1.NodeReady)
	if nu.Status != v1.ConditionFalse || nu.Reason != ReasonNetworkReady || !nu.LastTransitionTime.Time.Equal(clock) {
		t.Errorf("NetworkUnavailable once fixed: %+v", nu)
	}
	if ready.Status != v1.ConditionTrue {
		t.Errorf("Ready once the network is fixed: %+v", ready)
	}
	clock = clock.Add(time.Minute)
	run()
	if nu2 := cond(v1.NodeNetworkUnavailable); !nu2.LastTransitionTime.Equal(&nu.LastTransitionTime) || !nu2.LastHeartbeatTime.Time.Equal(clock) {
		t.Errorf("a holding status moved its transition time or kept its heartbeat: %+v", nu2)
	}
}

// Both reasons are given, the agent's own first.
func TestNetworkReadyBothReasons(t *testing.T) {
	err := NetworkReady(func() error { return errors.New("sources not read yet: manifest") }, func() error { return errors.New("no CNI") })()
	if err == nil || err.Error() != "sources not read yet: manifest, "+MessageNetworkNotReady+"no CNI" {
		t.Errorf("NetworkReady = %v", err)
	}
	if err := NetworkReady(nil, func() error { return nil })(); err != nil {
		t.Errorf("NetworkReady with both ready = %v", err)
	}
}
