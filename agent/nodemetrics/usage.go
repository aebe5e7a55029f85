package nodemetrics

import (
	"github.com/mqlet/mqlet/agent/usage"
	"github.com/mqlet/mqlet/core/prom"
	"github.com/mqlet/mqlet/hw"
)

// Usage registers the node's and each running container's CPU and memory use, read at every
// scrape by read (usage.Reader.Recent, so that the four families of one scrape read the cgroups
// once), under the names and labels of kubelet's resource metrics (/metrics/resource, which
// cAdvisor's figures feed): container_cpu_usage_seconds_total and
// container_memory_working_set_bytes by namespace, pod and container, and
// node_cpu_usage_seconds_total and node_memory_working_set_bytes. A failed read leaves the
// families empty for that scrape.
func (a *Agent) Usage(read func() (usage.Snapshot, error)) {
	containers := func(emit func(c usage.Container)) {
		s, err := read()
		if err != nil {
			return
		}
		for _, c := range s.Containers {
			emit(c)
		}
	}
	labels := []string{"namespace", "pod", "container"}
	a.reg.Func("container_cpu_usage_seconds_total", "Cumulative CPU time the container used, in seconds (its cgroup's cpuacct.usage or cpu.stat usage_usec).",
		prom.CounterType, labels, func(emit prom.Emit) {
			containers(func(c usage.Container) { emit(c.CPUSeconds, c.Namespace, c.Pod, c.Container) })
		})
	a.reg.Func("container_memory_working_set_bytes", "The container's memory working set: its cgroup's usage minus inactive file pages, in bytes.",
		prom.GaugeType, labels, func(emit prom.Emit) {
			containers(func(c usage.Container) { emit(float64(c.MemoryWorkingSetBytes), c.Namespace, c.Pod, c.Container) })
		})
	a.reg.Func("node_cpu_usage_seconds_total", "Cumulative CPU time the node's CPUs spent busy, in seconds (/proc/stat).",
		prom.CounterType, nil, func(emit prom.Emit) {
			if s, err := read(); err == nil {
				emit(s.Node.CPUSeconds)
			}
		})
	a.reg.Func("node_memory_working_set_bytes", "The node's memory working set: the root cgroup's usage minus inactive file pages, in bytes, as memory.available counts it.",
		prom.GaugeType, nil, func(emit prom.Emit) {
			if s, err := read(); err == nil {
				emit(float64(s.Node.MemoryWorkingSetBytes))
			}
		})
}

// Thermal registers the node's temperature, by thermal zone, and on a Raspberry Pi the firmware's
// throttling flags, read under root at every scrape. A machine without thermal zones (many VMs)
// has no temperature series; one that is not a Raspberry Pi has no throttling series.
func (a *Agent) Thermal(root string) {
	a.reg.Func("mqlet_node_temperature_celsius", "Temperature of each thermal zone of the node (/sys/class/thermal), in degrees Celsius.",
		prom.GaugeType, []string{"zone", "type"}, func(emit prom.Emit) {
			for _, t := range hw.Temperatures(root) {
				emit(t.Celsius, t.Zone, t.Type)
			}
		})
	throttling := func(emit prom.Emit, since bool) {
		t, ok, err := hw.Throttled(root)
		if !ok || err != nil {
			return
		}
		flags := []struct {
			name      string
			now, ever bool
		}{
			{"under-voltage", t.UnderVoltage, t.UnderVoltageOccurred},
			{"freq-capped", t.FreqCapped, t.FreqCappedOccurred},
			{"throttled", t.Throttled, t.ThrottledOccurred},
			{"soft-temp-limit", t.SoftTempLimit, t.SoftTempOccurred},
		}
		if t.Source != "get_throttled" {
			// The rpi_volt alarm tells under-voltage now, nothing else.
			if since {
				return
			}
			flags = flags[:1]
		}
		for _, f := range flags {
			v := f.now
			if since {
				v = f.ever
			}
			emit(boolValue(v), f.name)
		}
	}
	a.reg.Func("mqlet_node_throttling", "1 while the Raspberry Pi firmware reports the flag (get_throttled), else 0.",
		prom.GaugeType, []string{"flag"}, func(emit prom.Emit) { throttling(emit, false) })
	a.reg.Func("mqlet_node_throttling_since_boot", "1 if the Raspberry Pi firmware reported the flag at any time since boot (get_throttled), else 0.",
		prom.GaugeType, []string{"flag"}, func(emit prom.Emit) { throttling(emit, true) })
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
