package main

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParseStatTicks(t *testing.T) {
	// A command name with spaces and a paren, as /proc shows it; utime 1234, stime 56.
	stat := "4242 (kube (api) x) S 1 4242 4242 0 -1 4194560 9 0 0 0 1234 56 0 0 20 0 12 0 100 1000 200 18446744073709551615"
	got, err := parseStatTicks(4242, stat)
	if err != nil || got != 1290 {
		t.Fatalf("parseStatTicks = %d, %v; want 1290", got, err)
	}
	if _, err := parseStatTicks(1, "1 (x) S 1 2"); err == nil {
		t.Fatal("a truncated stat line was accepted")
	}
}

func TestSeriesAndCosts(t *testing.T) {
	before, err := parseSeries(strings.NewReader(`# HELP x
apiserver_request_duration_seconds_sum{component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 1
apiserver_request_duration_seconds_count{component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 10
`))
	if err != nil {
		t.Fatal(err)
	}
	after, err := parseSeries(strings.NewReader(`apiserver_request_duration_seconds_sum{component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 5
apiserver_request_duration_seconds_count{component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 110
apiserver_request_duration_seconds_sum{component="apiserver",group="",resource="pods",scope="resource",subresource="status",verb="PUT",version="v1"} 2
apiserver_request_duration_seconds_count{component="apiserver",group="",resource="pods",scope="resource",subresource="status",verb="PUT",version="v1"} 100
apiserver_request_duration_seconds_sum{component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="WATCH",version="v1"} 900
apiserver_request_duration_seconds_count{component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="WATCH",version="v1"} 3
mqlet_bridge_queue_depth{queue="status"} 7
mqlet_bridge_queue_depth{queue="nodes"} 2
`))
	if err != nil {
		t.Fatal(err)
	}
	costs := apiserverCosts(after.minus(before))
	if len(costs) != 2 {
		t.Fatalf("costs = %v; want POST pods and PUT pods/status, no WATCH", costs)
	}
	if got := costs[0].String(); got != "POST pods: 100 requests, mean 40.0 ms" {
		t.Errorf("costliest = %q", got)
	}
	if got := costs[1].String(); got != "PUT pods/status: 100 requests, mean 20.0 ms" {
		t.Errorf("second = %q", got)
	}
	if got := after.sum("mqlet_bridge_queue_depth"); got != 9 {
		t.Errorf("sum of queue depths = %v, want 9", got)
	}
	if got := after.sum("mqlet_bridge_queue_depth", "queue", "status"); got != 7 {
		t.Errorf("status queue depth = %v, want 7", got)
	}
}

func node(name string, ready bool, taints ...corev1.Taint) *corev1.Node {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: time.Now().String()},
		Spec:       corev1.NodeSpec{Taints: taints},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}}},
	}
}

func TestTracker(t *testing.T) {
	tr := newTracker(nodeSchedulable)
	h := tr.handlers()
	notReady := corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule}
	h.OnAdd(node("a", true, notReady), false)
	h.OnAdd(node("b", false), false)
	if n := tr.count(); n != 0 {
		t.Fatalf("count = %d, want 0 (a is tainted, b not Ready)", n)
	}
	ctx := context.Background()
	if _, err := tr.waitFor(ctx, 2, 50*time.Millisecond, "both", nil, nil); err == nil {
		t.Fatal("waitFor returned before the count was reached")
	}
	h.OnUpdate(node("a", true, notReady), node("a", true))
	if _, err := tr.waitFor(ctx, 2, 50*time.Millisecond, "both", nil, nil); err == nil || tr.count() != 1 {
		t.Fatalf("waitFor returned with %d of 2 (err %v)", tr.count(), err)
	}
	before := time.Now()
	h.OnUpdate(node("b", false), node("b", true))
	at, err := tr.waitFor(ctx, 2, time.Second, "both", nil, nil)
	if err != nil || at.Before(before) {
		t.Fatalf("waitFor = %v, %v; want the instant b turned Ready", at, err)
	}
	if tr.updates.Load() != 2 {
		t.Errorf("updates = %d, want 2", tr.updates.Load())
	}
	h.OnDelete(node("a", true))
	if n := tr.count(); n != 1 {
		t.Errorf("count after a deletion = %d, want 1", n)
	}
	if got := changedParts(node("a", true, notReady), node("a", true)); got != "/a: spec.taints (removed)" {
		t.Errorf("changedParts = %q", got)
	}
}
