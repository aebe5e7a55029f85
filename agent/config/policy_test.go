package config

import (
	"strings"
	"testing"
)

func TestLoadPolicySettings(t *testing.T) {
	c, err := Load(Flags{NodeName: ptr("n1"),
		SystemReserved: []string{"cpu=200m,memory=150Mi"},
		EvictionHard:   []string{"memory.available<300Mi", "nodefs.available<5%"},
		Devices:        []string{"mqlet.io/serial=/dev/ttyUSB*", "mqlet.io/serial=/dev/ttyACM*:2"},
		NodeTaints:     []string{"edge=true:NoSchedule"},
	}, []string{"MQLET_AGENT_RESERVED=memory=50Mi"})
	if err != nil {
		t.Fatal(err)
	}
	sys, agent := c.Reservations()
	if q := sys["memory"]; q.Value() != 150<<20 {
		t.Errorf("systemReserved memory = %s", q.String())
	}
	if q := agent["memory"]; q.Value() != 50<<20 {
		t.Errorf("agentReserved memory = %s", q.String())
	}
	if ts := c.Thresholds(); len(ts) != 2 {
		t.Errorf("thresholds = %+v, want the 2 given (the flag replaces the defaults)", ts)
	}
	ds := c.DeviceResources()
	if len(ds) != 1 || len(ds[0].Globs) != 2 || ds[0].Share != 2 {
		t.Errorf("DeviceResources = %+v, want one resource with 2 globs, share 2", ds)
	}
	if ts := c.Taints(); len(ts) != 1 || ts[0].Key != "edge" || ts[0].Value != "true" || ts[0].Effect != "NoSchedule" {
		t.Errorf("Taints = %+v", ts)
	}
	if c.ShutdownSignalNumber() == 0 {
		t.Errorf("default shutdown signal SIGPWR not parsed")
	}
}

// A metricsAddress naming only a host listens on DefaultMetricsPort, not node_exporter's 9100.
func TestMetricsListenAddress(t *testing.T) {
	for in, want := range map[string]string{"": "", "127.0.0.1": "127.0.0.1:10264", "[::1]": "[::1]:10264",
		"0.0.0.0:9200": "0.0.0.0:9200", ":10264": ":10264", "localhost": "localhost:10264"} {
		c, err := Load(Flags{NodeName: ptr("n1"), MetricsAddress: ptr(in)}, nil)
		if err != nil {
			t.Errorf("Load(metricsAddress %q): %v", in, err)
			continue
		}
		if got := c.MetricsListenAddress(); got != want {
			t.Errorf("metricsAddress %q listens on %q, want %q", in, got, want)
		}
	}
}

func TestLoadPolicyErrors(t *testing.T) {
	for _, tc := range []struct {
		f    Flags
		want string
	}{
		{Flags{SystemReserved: []string{"gpu=1"}}, `systemReserved`},
		{Flags{SystemReserved: []string{"memory=lots"}}, `want a non-negative quantity`},
		{Flags{EvictionHard: []string{"memory.free<1Mi"}}, `unknown signal "memory.free"`},
		{Flags{EvictionHard: []string{"memory.available"}}, `--eviction-hard`},
		{Flags{Devices: []string{"serial=/dev/ttyUSB*"}}, `domain-qualified`},
		{Flags{Devices: []string{"mqlet.io/serial=dev/tty*"}}, `absolute, clean path`},
		{Flags{Devices: []string{"mqlet.io/serial=/dev/tty*:0"}}, `at least 1`},
		{Flags{NodeTaints: []string{"edge:Sometimes"}}, `NoSchedule`},
		{Flags{ShutdownSignal: ptr("SIGTERM")}, `already means something else`},
		{Flags{ShutdownSignal: ptr("SIGNOPE")}, `unknown signal`},
		{Flags{ImageGCLowThresholdPercent: ptr(int64(90))}, `must not exceed imageGCHighThresholdPercent`},
		{Flags{MetricsAddress: ptr("9100")}, `a port alone: want HOST:PORT or HOST (port 10264)`},
		{Flags{MetricsAddress: ptr("127.0.0.1:http")}, `must be a number`},
		{Flags{CgroupRoot: ptr("mqlet")}, `cgroupRoot`},
		{Flags{CgroupDriver: ptr("kubepods")}, `"kubepods" (from flag --cgroup-driver): must be one of auto, systemd, cgroupfs`},
	} {
		tc.f.NodeName = ptr("n1")
		_, err := Load(tc.f, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Load(%+v) = %v, want an error with %q", tc.f, err, tc.want)
		}
	}
}
