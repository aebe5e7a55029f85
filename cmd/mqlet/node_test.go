package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPrintNodeTables(t *testing.T) {
	now := time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1", CreationTimestamp: metav1.NewTime(now.Add(-49 * time.Hour)),
		Labels: map[string]string{"node-role.kubernetes.io/gateway": "", "kubernetes.io/role": "edge", "site": "x"}}}
	n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse}, {Type: v1.NodeReady, Status: v1.ConditionFalse}}
	n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.1.23"}, {Type: v1.NodeHostName, Address: "edge-1"}}
	n.Status.NodeInfo = v1.NodeSystemInfo{KubeletVersion: "mqlet-v0.3.0", OSImage: "Debian GNU/Linux 12 (bookworm)",
		KernelVersion: "6.6.51+rpt-rpi-v8", ContainerRuntimeVersion: "containerd://1.7.24"}
	n.Spec.Unschedulable = true

	var out bytes.Buffer
	if err := printNode(&out, n, outputTable, now); err != nil {
		t.Fatal(err)
	}
	want := "NAME     STATUS                        ROLES          AGE    VERSION\n" +
		"edge-1   NotReady,SchedulingDisabled   edge,gateway   2d1h   mqlet-v0.3.0\n"
	if out.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	if err := printNode(&out, n, outputWide, now); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	wantHeader := []string{"NAME", "STATUS", "ROLES", "AGE", "VERSION", "INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE", "KERNEL-VERSION", "CONTAINER-RUNTIME"}
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != strings.Join(wantHeader, " ") {
		t.Errorf("wide header %q", lines[0])
	}
	for _, s := range []string{"192.168.1.23", "<none>", "Debian GNU/Linux 12 (bookworm)", "6.6.51+rpt-rpi-v8", "containerd://1.7.24"} {
		if !strings.Contains(lines[1], s) {
			t.Errorf("wide row %q lacks %q", lines[1], s)
		}
	}

	// A node without a Ready condition, roles or creation time.
	bare := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	out.Reset()
	printNode(&out, bare, outputTable, now)
	if row := strings.Fields(strings.Split(out.String(), "\n")[1]); strings.Join(row, " ") != "n Unknown <none> <unknown> <none>" {
		t.Errorf("bare node row %q", row)
	}
	if err := printNode(&out, bare, "xml", now); err == nil {
		t.Errorf("unknown format: no error")
	}
}
