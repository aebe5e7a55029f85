package nodestatus

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/hw"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

func fixture(name string) string { return filepath.Join("..", "..", "hw", "testdata", name) }

func TestHardwareFactsOnFixtures(t *testing.T) {
	for name, want := range map[string]struct {
		labels, annotations map[string]string
	}{
		"rpi4": {
			labels: map[string]string{LabelBoard: "Raspberry-Pi-4-Model-B-Rev-1.4", LabelThrottled: "true"},
			annotations: map[string]string{
				AnnotationBoard: "Raspberry Pi 4 Model B Rev 1.4", AnnotationSerial: "100000003a1c2b4d", AnnotationCPU: "ARM Cortex-A72",
				AnnotationMachine: "aarch64", AnnotationTemperature: "cpu-thermal=50C",
				AnnotationThrottled: "under-voltage,throttled", AnnotationThrottledSinceBoot: "under-voltage,throttled",
			},
		},
		"rpi5": {
			labels: map[string]string{LabelBoard: "Raspberry-Pi-5-Model-B-Rev-1.0", LabelThrottled: "true"},
			annotations: map[string]string{
				AnnotationBoard: "Raspberry Pi 5 Model B Rev 1.0", AnnotationSerial: "5a2e8c41f07b93d6", AnnotationCPU: "ARM Cortex-A76",
				AnnotationMachine: "aarch64", AnnotationTemperature: "cpu-thermal=55C",
				// The rpi_volt alarm knows under-voltage now only.
				AnnotationThrottled: "under-voltage", AnnotationThrottledSinceBoot: "none",
			},
		},
		"x86": {
			labels: map[string]string{LabelBoard: "Dell-Inc.-PowerEdge-R640"},
			annotations: map[string]string{
				AnnotationBoard: "Dell Inc. PowerEdge R640", AnnotationSerial: "4QXK2M3",
				AnnotationCPU: "Intel(R) Xeon(R) Silver 4114 CPU @ 2.20GHz", AnnotationTemperature: "acpitz=30C,x86_pkg_temp=45C",
			},
		},
	} {
		n := &v1.Node{}
		n.Labels = map[string]string{}
		if err := HardwareFacts(func() (Hardware, error) { return ReadHardware(fixture(name)) })(context.Background(), n); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(n.Labels, want.labels) {
			t.Errorf("%s: labels %v\nwant %v", name, n.Labels, want.labels)
		}
		if !reflect.DeepEqual(n.Annotations, want.annotations) {
			t.Errorf("%s: annotations %v\nwant %v", name, n.Annotations, want.annotations)
		}
		for k, v := range n.Labels {
			if len(validation.IsValidLabelValue(v)) > 0 {
				t.Errorf("%s: label %s=%q is not a valid label value", name, k, v)
			}
		}
	}
}

func TestHardwareFactsOwnTheirKeys(t *testing.T) {
	h := Hardware{Board: hw.Board{Model: "Raspberry Pi 4 Model B Rev 1.4"}, Throttling: &hw.Throttling{}}
	var readErr error
	s := HardwareFacts(func() (Hardware, error) { return h, readErr })
	n := &v1.Node{}
	n.Annotations = map[string]string{"example.com/owner": "ops", AnnotationSerial: "a serial this board no longer reports"}
	if err := s(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"example.com/owner": "ops", AnnotationBoard: "Raspberry Pi 4 Model B Rev 1.4",
		AnnotationThrottled: "none", AnnotationThrottledSinceBoot: "none"}
	if !reflect.DeepEqual(n.Annotations, want) {
		t.Errorf("annotations %v\nwant %v (others' kept, the stale mqlet.io one gone)", n.Annotations, want)
	}
	if n.Labels[LabelThrottled] != "false" {
		t.Errorf("throttled label %q, want false", n.Labels[LabelThrottled])
	}
	// A reader error is reported, and the facts it did read are still set.
	readErr = errors.New("read get_throttled: \"x\" is not a hex number")
	if err := s(context.Background(), n); err == nil || !strings.Contains(err.Error(), "get_throttled") {
		t.Errorf("err = %v", err)
	}
	if n.Annotations[AnnotationBoard] == "" {
		t.Errorf("board lost on a partial read: %v", n.Annotations)
	}
}

func TestTemperatureBands(t *testing.T) {
	reading := 47.4
	s := HardwareFacts(func() (Hardware, error) {
		return Hardware{Temperatures: []hw.Temperature{{Zone: "thermal_zone0", Type: "cpu-thermal", Celsius: reading}}}, nil
	})
	n := &v1.Node{}
	seq := []struct {
		c    float64
		want string
	}{
		{47.4, "cpu-thermal=45C"},
		{47.6, "cpu-thermal=45C"}, // would round to 50, but within a step of 45: no flip
		{47.4, "cpu-thermal=45C"},
		{49.9, "cpu-thermal=45C"},
		{50.0, "cpu-thermal=50C"}, // a full step away
		{46.0, "cpu-thermal=50C"},
		{45.0, "cpu-thermal=45C"},
		{62.3, "cpu-thermal=60C"},
	}
	for i, st := range seq {
		reading = st.c
		s(context.Background(), n)
		if got := n.Annotations[AnnotationTemperature]; got != st.want {
			t.Errorf("step %d: reading %.1f: %q, want %q", i, st.c, got, st.want)
		}
	}
	// Zones of the same type are told apart; a zone that goes away leaves the annotation.
	got := temperatureValue([]hw.Temperature{{Type: "acpitz", Celsius: 27.8}, {Type: "acpitz", Celsius: 31}, {Type: "a,b=c", Celsius: 40}}, "")
	if got != "acpitz=30C,acpitz-2=30C,a_b_c=40C" {
		t.Errorf("same-type zones: %q", got)
	}
	if got := temperatureValue(nil, "cpu-thermal=45C"); got != "" {
		t.Errorf("no zones: %q", got)
	}
}

func TestLabelValue(t *testing.T) {
	for in, want := range map[string]string{
		"Raspberry Pi 4 Model B Rev 1.4": "Raspberry-Pi-4-Model-B-Rev-1.4",
		"Dell Inc. PowerEdge R640":       "Dell-Inc.-PowerEdge-R640",
		"  (ZOTAC) ZBOX—CI329 ":          "ZOTAC-ZBOX-CI329",
		"--":                             "",
		strings.Repeat("x", 70):          strings.Repeat("x", 63),
		strings.Repeat("y", 62) + " z":   strings.Repeat("y", 62),
	} {
		if got := labelValue(in); got != want {
			t.Errorf("labelValue(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDefaultSettersOnFixture runs the whole default list against the Raspberry Pi 4 tree with
// fake readers for what is not a file: the node a Pi 4 would report.
func TestDefaultSettersOnFixture(t *testing.T) {
	c := &clock{t: time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)}
	setters := DefaultSetters(Config{
		NodeName: "edge-1", AgentVersion: "mqlet-v0.3.0", Root: fixture("rpi4"), StateDir: "/var/lib/mqlet",
		MaxPods: 110, MaxImages: 50, NodeLabels: map[string]string{"site": "plant-3"},
		Taints:         []v1.Taint{{Key: "edge", Effect: v1.TaintEffectNoSchedule}},
		SystemReserved: v1.ResourceList{v1.ResourceMemory: q("100Mi")},
		HostIP:         func() string { return "192.168.1.23" },
		RuntimeVersion: func() string { return "1.7.24" },
		ListImages: func(context.Context) ([]Image, error) {
			return []Image{{Name: "mqlet.test/busybox:1", Digest: "sha256:c", Size: 3 << 20}}, nil
		},
		DiskCapacity: func(string) (int64, error) { return 29 << 30, nil },
		Now:          c.now,
	})
	n := &v1.Node{}
	n.Name = "edge-1"
	for _, s := range setters {
		if err := s(context.Background(), n); err != nil {
			t.Errorf("setter: %v", err)
		}
	}
	equalList(t, "capacity", n.Status.Capacity, v1.ResourceList{v1.ResourceCPU: q("4"), v1.ResourceMemory: q("3882236Ki"),
		v1.ResourceEphemeralStorage: q("29Gi"), v1.ResourcePods: q("110")})
	equalList(t, "allocatable", n.Status.Allocatable, v1.ResourceList{v1.ResourceCPU: q("4"), v1.ResourceMemory: q("3779836Ki"),
		v1.ResourceEphemeralStorage: q("29Gi"), v1.ResourcePods: q("110")})
	wantInfo := v1.NodeSystemInfo{MachineID: "3c9b2f7d41e84a0f9d6a5e1b2c8f7a04", SystemUUID: "3c9b2f7d-41e8-4a0f-9d6a-5e1b2c8f7a04", BootID: "5f0c1a7e-3b9d-4c2e-8a61-0d4e9b7f2c13",
		KernelVersion: "6.6.51+rpt-rpi-v8", OSImage: "Debian GNU/Linux 12 (bookworm)", ContainerRuntimeVersion: "containerd://1.7.24",
		KubeletVersion: "mqlet-v0.3.0", OperatingSystem: "linux", Architecture: runtime.GOARCH}
	if n.Status.NodeInfo != wantInfo {
		t.Errorf("nodeInfo %+v\nwant %+v", n.Status.NodeInfo, wantInfo)
	}
	if n.Labels["site"] != "plant-3" || n.Labels[LabelHostname] != "edge-1" || n.Labels[LabelBoard] != "Raspberry-Pi-4-Model-B-Rev-1.4" ||
		n.Labels[LabelThrottled] != "true" {
		t.Errorf("labels %v", n.Labels)
	}
	if n.Annotations[AnnotationSerial] != "100000003a1c2b4d" || len(n.Spec.Taints) != 1 || len(n.Status.Images) != 1 ||
		n.Status.Addresses[0].Address != "192.168.1.23" {
		t.Errorf("annotations %v, taints %v, images %v, addresses %v", n.Annotations, n.Spec.Taints, n.Status.Images, n.Status.Addresses)
	}
	var types []v1.NodeConditionType
	for _, cond := range n.Status.Conditions {
		types = append(types, cond.Type)
		want := v1.ConditionFalse
		if cond.Type == v1.NodeReady {
			want = v1.ConditionTrue
		}
		if cond.Status != want {
			t.Errorf("%s: %s, want %s", cond.Type, cond.Status, want)
		}
	}
	if want := []v1.NodeConditionType{v1.NodeMemoryPressure, v1.NodeDiskPressure, v1.NodePIDPressure, v1.NodeReady}; !reflect.DeepEqual(types, want) {
		t.Errorf("conditions %v, want %v", types, want)
	}
}

// DefaultSetters reads the facts that cannot change while the agent runs (os image, kernel, boot
// and machine id, board) once, when it is built; the temperature is read every period.
func TestDefaultSettersReadFixedFactsOnce(t *testing.T) {
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS(fixture("rpi4"))); err != nil {
		t.Fatal(err)
	}
	setters := DefaultSetters(Config{NodeName: "edge-1", Root: root, MaxPods: 110,
		HostIP: func() string { return "192.168.1.23" }})
	compute := func() *v1.Node {
		n := &v1.Node{}
		n.Name = "edge-1"
		for _, s := range setters {
			s(context.Background(), n)
		}
		return n
	}
	first := compute()
	write := func(rel, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(root, rel), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/os-release", "PRETTY_NAME=\"Debian GNU/Linux 13 (trixie)\"\n")
	write("proc/sys/kernel/osrelease", "6.12.0\n")
	write("proc/device-tree/model", "Raspberry Pi 5 Model B Rev 1.0\x00")
	write("sys/class/thermal/thermal_zone0/temp", "71000\n")
	second := compute()
	if second.Status.NodeInfo.OSImage != first.Status.NodeInfo.OSImage || first.Status.NodeInfo.OSImage != "Debian GNU/Linux 12 (bookworm)" ||
		second.Status.NodeInfo.KernelVersion != "6.6.51+rpt-rpi-v8" {
		t.Errorf("nodeInfo re-read: first %+v, then %+v", first.Status.NodeInfo, second.Status.NodeInfo)
	}
	if got := second.Annotations[AnnotationBoard]; got != "Raspberry Pi 4 Model B Rev 1.4" {
		t.Errorf("board re-read: %q", got)
	}
	if got := second.Annotations[AnnotationTemperature]; got != "cpu-thermal=70C" {
		t.Errorf("temperature after it rose to 71 °C: %q, want it read again (cpu-thermal=70C)", got)
	}
}
