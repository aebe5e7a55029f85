package nodemetrics

import (
	"errors"
	"testing"

	"github.com/mqlet/mqlet/agent/usage"
	"github.com/mqlet/mqlet/core/prom"
)

// Per-container and node usage under kubelet's resource-metric names and labels, from one read
// per scrape; a failed read leaves the families empty rather than stale.
func TestUsageFamilies(t *testing.T) {
	r := prom.NewRegistry()
	a := NewAgent(r, "v", "c")
	snap := usage.Snapshot{
		Node: usage.Node{CPUSeconds: 1234.5, CPUs: 4, MemoryWorkingSetBytes: 700 << 20, MemoryCapacityBytes: 4 << 30},
		Containers: []usage.Container{
			{Namespace: "default", Pod: "web", Container: "app", ID: "x1", CPUSeconds: 2.5, MemoryWorkingSetBytes: 8 << 20},
			{Namespace: "default", Pod: "web", Container: "sidecar", ID: "x2", CPUSeconds: 0.25, MemoryWorkingSetBytes: 1 << 20},
		},
	}
	var fail error
	a.Usage(func() (usage.Snapshot, error) { return snap, fail })
	fams := parseText(t, writeText(t, r))
	web := func(c string) map[string]string {
		return map[string]string{"namespace": "default", "pod": "web", "container": c}
	}
	mustValue(t, fams, "container_cpu_usage_seconds_total", web("app"), 2.5)
	mustValue(t, fams, "container_cpu_usage_seconds_total", web("sidecar"), 0.25)
	mustValue(t, fams, "container_memory_working_set_bytes", web("app"), 8<<20)
	mustValue(t, fams, "node_cpu_usage_seconds_total", nil, 1234.5)
	mustValue(t, fams, "node_memory_working_set_bytes", nil, 700<<20)
	if typ := fams["container_cpu_usage_seconds_total"].GetType().String(); typ != "COUNTER" {
		t.Errorf("container_cpu_usage_seconds_total is a %s, want a counter", typ)
	}

	fail = errors.New("no /proc")
	fams = parseText(t, writeText(t, r))
	if f := fams["container_cpu_usage_seconds_total"]; f != nil && len(f.Metric) > 0 {
		t.Errorf("a failed read still gave samples: %v", f.Metric)
	}
}

// Temperature and throttling from the Raspberry Pi 4 fixture tree (get_throttled 0x50005:
// under-voltage and throttled now, and both since boot); none of either on a tree without them.
func TestThermalFamilies(t *testing.T) {
	r := prom.NewRegistry()
	NewAgent(r, "v", "c").Thermal("../../hw/testdata/rpi4")
	fams := parseText(t, writeText(t, r))
	mustValue(t, fams, "mqlet_node_temperature_celsius", map[string]string{"zone": "thermal_zone0", "type": "cpu-thermal"}, 47.712)
	for flag, want := range map[string]float64{"under-voltage": 1, "freq-capped": 0, "throttled": 1, "soft-temp-limit": 0} {
		mustValue(t, fams, "mqlet_node_throttling", map[string]string{"flag": flag}, want)
		mustValue(t, fams, "mqlet_node_throttling_since_boot", map[string]string{"flag": flag}, want)
	}

	r = prom.NewRegistry()
	NewAgent(r, "v", "c").Thermal(t.TempDir())
	fams = parseText(t, writeText(t, r))
	for _, name := range []string{"mqlet_node_temperature_celsius", "mqlet_node_throttling"} {
		if f := fams[name]; f != nil && len(f.Metric) > 0 {
			t.Errorf("%s on a machine without sensors: %v", name, f.Metric)
		}
	}
}
