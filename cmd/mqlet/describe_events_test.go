package main

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Events table reads like kubectl's: repeated events as "last (xN over first)", least
// recently seen first, an empty list as <none>.
func TestPrintEvents(t *testing.T) {
	now := time.Date(2026, 3, 14, 10, 0, 0, 0, time.UTC)
	ev := func(typ, reason, msg string, count int32, first, last time.Duration) v1.Event {
		return v1.Event{Type: typ, Reason: reason, Message: msg, Count: count, Source: v1.EventSource{Component: "mqlet"},
			FirstTimestamp: metav1.NewTime(now.Add(-first)), LastTimestamp: metav1.NewTime(now.Add(-last))}
	}
	var out strings.Builder
	err := printEvents(&out, []v1.Event{
		ev("Warning", "BackOff", "Back-off restarting failed container main in pod web_default(u)", 5, 2*time.Minute, 10*time.Second),
		ev("Normal", "Pulled", `Container image "busybox" already present on machine`, 1, 3*time.Minute, 3*time.Minute),
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if len(lines) != 5 || lines[0] != "Events:" || !strings.HasPrefix(lines[1], "  Type") {
		t.Fatalf("table:\n%s", out.String())
	}
	if f := strings.Fields(lines[3]); strings.Join(f[:4], " ") != "Normal Pulled 3m mqlet" {
		t.Errorf("first row (least recently seen) = %q", lines[3])
	}
	if !strings.Contains(lines[4], "Warning  BackOff  10s (x5 over 2m)  mqlet  Back-off restarting failed container main") {
		t.Errorf("repeated event row = %q", lines[4])
	}
	out.Reset()
	if err := printEvents(&out, nil, now); err != nil || strings.TrimSpace(out.String()) != "Events:\t<none>" {
		t.Errorf("no events: %q, %v", out.String(), err)
	}
}
