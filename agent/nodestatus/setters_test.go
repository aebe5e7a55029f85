package nodestatus

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/eviction"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func run(t *testing.T, s Setter, n *v1.Node) error {
	t.Helper()
	return s(context.Background(), n)
}

func TestNodeAddress(t *testing.T) {
	ip := "192.168.1.23"
	s := NodeAddress("edge-1", func() string { return ip })
	n := &v1.Node{}
	if err := run(t, s, n); err != nil {
		t.Fatal(err)
	}
	want := []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.1.23"}, {Type: v1.NodeHostName, Address: "edge-1"}}
	if !reflect.DeepEqual(n.Status.Addresses, want) {
		t.Errorf("addresses %+v, want %+v", n.Status.Addresses, want)
	}
	// The address moves (DHCP): the new one replaces it.
	ip = "192.168.1.40"
	run(t, s, n)
	if n.Status.Addresses[0].Address != "192.168.1.40" || len(n.Status.Addresses) != 2 {
		t.Errorf("after the address moved: %+v", n.Status.Addresses)
	}
	// The link drops: the last address stays.
	ip = ""
	if err := run(t, s, n); err != nil {
		t.Errorf("no address: err = %v", err)
	}
	if n.Status.Addresses[0].Address != "192.168.1.40" {
		t.Errorf("after the link dropped: %+v, want the last address kept", n.Status.Addresses)
	}
	// Never had one: the hostname alone.
	fresh := &v1.Node{}
	run(t, s, fresh)
	if want := []v1.NodeAddress{{Type: v1.NodeHostName, Address: "edge-1"}}; !reflect.DeepEqual(fresh.Status.Addresses, want) {
		t.Errorf("no address ever: %+v, want %+v", fresh.Status.Addresses, want)
	}
}

func q(s string) resource.Quantity { return resource.MustParse(s) }

// equalList compares resource lists by value (1Gi and 1073741824 are equal).
func equalList(t *testing.T, what string, got, want v1.ResourceList) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %v, want %v", what, got, want)
		return
	}
	for name, w := range want {
		if g, ok := got[name]; !ok || g.Cmp(w) != 0 {
			t.Errorf("%s[%s] = %v, want %v (all: %v)", what, name, got[name], w, got)
		}
	}
}

func TestMachineInfo(t *testing.T) {
	ts, err := eviction.ParseThresholds(eviction.DefaultHard(), nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	memErr := error(nil)
	var diskPath string
	m := Machine{
		CPUs:   func() (int, error) { return 4, nil },
		Memory: func() (int64, error) { return 4 << 30, memErr },
		DiskCapacity: func(path string) (int64, error) {
			diskPath = path
			return 32 << 30, nil
		},
		Path:           "/var/lib/mqlet",
		MaxPods:        110,
		Extra:          func() v1.ResourceList { return v1.ResourceList{"mqlet.io/serial": q("2")} },
		SystemReserved: v1.ResourceList{v1.ResourceCPU: q("100m"), v1.ResourceMemory: q("100Mi"), "pid": q("1000")},
		AgentReserved:  v1.ResourceList{v1.ResourceMemory: q("50Mi")},
		Thresholds:     ts, // kubelet's: memory.available<100Mi, nodefs.available<10%, ...
	}
	n := &v1.Node{}
	if err := run(t, MachineInfo(m), n); err != nil {
		t.Fatal(err)
	}
	if diskPath != "/var/lib/mqlet" {
		t.Errorf("disk capacity measured at %q, want the state dir", diskPath)
	}
	equalList(t, "capacity", n.Status.Capacity, v1.ResourceList{
		v1.ResourceCPU: q("4"), v1.ResourceMemory: q("4Gi"), v1.ResourceEphemeralStorage: q("32Gi"),
		v1.ResourcePods: q("110"), "mqlet.io/serial": q("2"),
	})
	storage := resource.NewQuantity(32<<30-3435973836, resource.BinarySI) // 10% of 32Gi, rounded down
	equalList(t, "allocatable", n.Status.Allocatable, v1.ResourceList{
		v1.ResourceCPU:              q("3900m"),
		v1.ResourceMemory:           q("3846Mi"), // 4096Mi - 100Mi system - 50Mi agent - 100Mi hard eviction
		v1.ResourceEphemeralStorage: *storage,    // less the 10% nodefs threshold
		v1.ResourcePods:             q("110"),
		"mqlet.io/serial":           q("2"),
	})

	// Memory cannot be read: the previous value stays and the error says which.
	memErr = errors.New("meminfo: permission denied")
	if err := run(t, MachineInfo(m), n); err == nil || !strings.Contains(err.Error(), "memory capacity") {
		t.Errorf("memory unreadable: err = %v", err)
	}
	if got := n.Status.Capacity[v1.ResourceMemory]; got.Cmp(q("4Gi")) != 0 {
		t.Errorf("memory after a failed read = %v, want the previous 4Gi", got)
	}
	// ...and on a fresh node it is absent (Ready then names it).
	fresh := &v1.Node{}
	run(t, MachineInfo(m), fresh)
	if _, ok := fresh.Status.Capacity[v1.ResourceMemory]; ok {
		t.Errorf("memory never read but present: %v", fresh.Status.Capacity)
	}
	// A device resource that disappears from Extra is gone from both lists.
	m.Extra, memErr = nil, nil
	run(t, MachineInfo(m), n)
	if _, ok := n.Status.Allocatable["mqlet.io/serial"]; ok {
		t.Errorf("a resource gone from Extra stays in allocatable: %v", n.Status.Allocatable)
	}
}

// Huge page pools are hugepages-<size> capacity and allocatable, named as kubelet names them, and
// the memory they hold leaves allocatable memory (kubelet's MachineInfo setter); a pool that cannot
// be read keeps its previous figures.
func TestMachineInfoHugePages(t *testing.T) {
	var poolErr error
	m := Machine{
		CPUs:           func() (int, error) { return 4, nil },
		Memory:         func() (int64, error) { return 4 << 30, nil },
		MaxPods:        110,
		HugePages:      func() (map[int64]int64, error) { return map[int64]int64{2 << 20: 64, 1 << 30: 0}, poolErr },
		SystemReserved: v1.ResourceList{v1.ResourceMemory: q("100Mi")},
	}
	n := &v1.Node{}
	if err := run(t, MachineInfo(m), n); err != nil {
		t.Fatal(err)
	}
	equalList(t, "capacity", n.Status.Capacity, v1.ResourceList{v1.ResourceCPU: q("4"), v1.ResourceMemory: q("4Gi"),
		v1.ResourcePods: q("110"), "hugepages-2Mi": q("128Mi"), "hugepages-1Gi": q("0")})
	equalList(t, "allocatable", n.Status.Allocatable, v1.ResourceList{v1.ResourceCPU: q("4"),
		v1.ResourceMemory: q("3868Mi"), // 4096Mi - 100Mi reserved - 128Mi in 2Mi pages
		v1.ResourcePods:   q("110"), "hugepages-2Mi": q("128Mi"), "hugepages-1Gi": q("0")})
	// The pods' cgroup is sized without that subtraction: huge pages are not charged to memory.max.
	if got := m.Allocatable(n.Status.Capacity)[v1.ResourceMemory]; got.Cmp(q("3996Mi")) != 0 {
		t.Errorf("Allocatable (the pods' cgroup) memory = %v, want 3996Mi", got.String())
	}
	poolErr = errors.New("nr_hugepages: permission denied")
	if err := run(t, MachineInfo(m), n); err == nil || !strings.Contains(err.Error(), "hugepages") {
		t.Errorf("pools unreadable: err = %v, want one naming hugepages", err)
	}
	if got := n.Status.Capacity["hugepages-2Mi"]; got.Cmp(q("128Mi")) != 0 {
		t.Errorf("hugepages-2Mi after a failed read = %v, want the previous 128Mi", got.String())
	}
}

func TestNodeInfo(t *testing.T) {
	version := "1.7.24"
	s := NodeInfo("mqlet-v0.3.0", func() string { return version }, func() Info {
		return Info{OSImage: "Debian GNU/Linux 12 (bookworm)", KernelVersion: "6.6.51+rpt-rpi-v8", BootID: "b0", MachineID: "m1",
			SystemUUID: "u1", OperatingSystem: "linux", Architecture: "arm64"}
	})
	n := &v1.Node{}
	run(t, s, n)
	want := v1.NodeSystemInfo{MachineID: "m1", SystemUUID: "u1", BootID: "b0", KernelVersion: "6.6.51+rpt-rpi-v8", OSImage: "Debian GNU/Linux 12 (bookworm)",
		ContainerRuntimeVersion: "containerd://1.7.24", KubeletVersion: "mqlet-v0.3.0", OperatingSystem: "linux", Architecture: "arm64"}
	if n.Status.NodeInfo != want {
		t.Errorf("nodeInfo %+v\nwant %+v", n.Status.NodeInfo, want)
	}
	version = ""
	run(t, s, n)
	if n.Status.NodeInfo.ContainerRuntimeVersion != "containerd://Unknown" {
		t.Errorf("runtime version unknown: %q", n.Status.NodeInfo.ContainerRuntimeVersion)
	}
}

func TestImages(t *testing.T) {
	var listErr error
	list := func(context.Context) ([]Image, error) {
		return []Image{
			{Name: "docker.io/library/busybox:1.36", Digest: "sha256:b", Size: 2 << 20},
			{Name: "registry.local/app:v2", Digest: "sha256:a", Size: 80 << 20},
			{Name: "registry.local/app@sha256:a", Digest: "sha256:a", Size: 80 << 20},
			{Name: "registry.local/app:latest", Digest: "sha256:a", Size: 80 << 20},
			{Name: "mqlet.test/busybox:1", Digest: "sha256:c", Size: 3 << 20},
			{Name: "a:1", Digest: "sha256:d", Size: 1}, {Name: "a:2", Digest: "sha256:d", Size: 1}, {Name: "a:3", Digest: "sha256:d", Size: 1},
			{Name: "a:4", Digest: "sha256:d", Size: 1}, {Name: "a:5", Digest: "sha256:d", Size: 1}, {Name: "a:6", Digest: "sha256:d", Size: 1},
		}, listErr
	}
	n := &v1.Node{}
	if err := run(t, Images(3, list), n); err != nil {
		t.Fatal(err)
	}
	want := []v1.ContainerImage{
		{Names: []string{"registry.local/app@sha256:a", "registry.local/app:latest", "registry.local/app:v2"}, SizeBytes: 80 << 20},
		{Names: []string{"mqlet.test/busybox:1"}, SizeBytes: 3 << 20},
		{Names: []string{"docker.io/library/busybox:1.36"}, SizeBytes: 2 << 20},
	}
	if !reflect.DeepEqual(n.Status.Images, want) {
		t.Errorf("images (max 3) %+v\nwant %+v", n.Status.Images, want)
	}
	run(t, Images(50, list), n)
	if len(n.Status.Images) != 4 || len(n.Status.Images[3].Names) != MaxNamesPerImage {
		t.Errorf("images (max 50): %+v, want 4 with the last cut to %d names", n.Status.Images, MaxNamesPerImage)
	}
	// containerd does not answer: the list stays as it was.
	listErr = errors.New("containerd: deadline exceeded")
	if err := run(t, Images(50, list), n); err == nil || len(n.Status.Images) != 4 {
		t.Errorf("list failed: err %v, images %d; want an error and the 4 kept", err, len(n.Status.Images))
	}
	run(t, Images(0, list), n)
	if n.Status.Images != nil {
		t.Errorf("nodeStatusMaxImages 0: %+v", n.Status.Images)
	}
}

func TestLabelsAndTaints(t *testing.T) {
	n := &v1.Node{}
	n.Labels = map[string]string{"old": "from a previous config"}
	extra := map[string]string{"site": "plant-3", LabelArch: "riscv64"}
	run(t, Labels("edge-1", "linux", "arm64", extra), n)
	want := map[string]string{LabelHostname: "edge-1", LabelOS: "linux", LabelArch: "arm64", "site": "plant-3"}
	if !reflect.DeepEqual(n.Labels, want) {
		t.Errorf("labels %v, want %v (the stale one gone, arch not overridden)", n.Labels, want)
	}
	taints := []v1.Taint{{Key: "dedicated", Value: "camera", Effect: v1.TaintEffectNoSchedule}}
	run(t, Taints(taints), n)
	taints[0].Key = "changed by the caller later"
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != "dedicated" {
		t.Errorf("taints %+v", n.Spec.Taints)
	}
	run(t, Taints(nil), n)
	if n.Spec.Taints != nil {
		t.Errorf("taints after they were removed: %+v", n.Spec.Taints)
	}
}

// clock is a settable time for the condition setters.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }
func (c *clock) tick(d time.Duration) metav1.Time {
	c.t = c.t.Add(d)
	return metav1.NewTime(c.t)
}

type pressure map[v1.NodeConditionType]bool

func (p pressure) Conditions() map[v1.NodeConditionType]bool { return p }

func condition(n *v1.Node, t v1.NodeConditionType) v1.NodeCondition {
	for _, c := range n.Status.Conditions {
		if c.Type == t {
			return c
		}
	}
	return v1.NodeCondition{}
}

func TestPressureConditions(t *testing.T) {
	for _, tc := range []struct {
		typ                       v1.NodeConditionType
		falseReason, trueReason   string
		falseMessage, trueMessage string
	}{
		{v1.NodeMemoryPressure, "KubeletHasSufficientMemory", "KubeletHasInsufficientMemory",
			"mqlet has sufficient memory available", "mqlet has insufficient memory available"},
		{v1.NodeDiskPressure, "KubeletHasNoDiskPressure", "KubeletHasDiskPressure", "mqlet has no disk pressure", "mqlet has disk pressure"},
		{v1.NodePIDPressure, "KubeletHasSufficientPID", "KubeletHasInsufficientPID",
			"mqlet has sufficient PID available", "mqlet has insufficient PID available"},
	} {
		t.Run(string(tc.typ), func(t *testing.T) {
			c := &clock{t: time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)}
			p := pressure{}
			s := PressureCondition(tc.typ, p, c.now)
			n := &v1.Node{}
			t0 := c.tick(0)
			run(t, s, n)
			got := condition(n, tc.typ)
			want := v1.NodeCondition{Type: tc.typ, Status: v1.ConditionFalse, Reason: tc.falseReason, Message: tc.falseMessage,
				LastHeartbeatTime: t0, LastTransitionTime: t0}
			if got != want {
				t.Fatalf("first: %+v\nwant %+v", got, want)
			}
			// Same status later: a new heartbeat, the same transition time.
			t1 := c.tick(10 * time.Second)
			run(t, s, n)
			if got := condition(n, tc.typ); got.LastHeartbeatTime != t1 || got.LastTransitionTime != t0 || got.Status != v1.ConditionFalse {
				t.Errorf("unchanged: %+v; want heartbeat %v, transition %v", got, t1, t0)
			}
			// Pressure: a transition.
			p[tc.typ] = true
			t2 := c.tick(10 * time.Second)
			run(t, s, n)
			want = v1.NodeCondition{Type: tc.typ, Status: v1.ConditionTrue, Reason: tc.trueReason, Message: tc.trueMessage,
				LastHeartbeatTime: t2, LastTransitionTime: t2}
			if got := condition(n, tc.typ); got != want {
				t.Errorf("under pressure: %+v\nwant %+v", got, want)
			}
			// Another kind of pressure does not touch this condition.
			delete(p, tc.typ)
			p[v1.NodeConditionType("Other")] = true
			t3 := c.tick(10 * time.Second)
			run(t, s, n)
			if got := condition(n, tc.typ); got.Status != v1.ConditionFalse || got.LastTransitionTime != t3 || len(n.Status.Conditions) != 1 {
				t.Errorf("pressure gone: %+v (conditions %d)", got, len(n.Status.Conditions))
			}
		})
	}
	// A nil Pressure is never under pressure.
	n := &v1.Node{}
	run(t, PressureCondition(v1.NodeMemoryPressure, nil, time.Now), n)
	if got := condition(n, v1.NodeMemoryPressure); got.Status != v1.ConditionFalse {
		t.Errorf("nil pressure: %+v", got)
	}
	defer func() {
		if recover() == nil {
			t.Errorf("PressureCondition(Ready) did not panic")
		}
	}()
	PressureCondition(v1.NodeReady, nil, time.Now)
}

func fullCapacity() v1.ResourceList {
	return v1.ResourceList{v1.ResourceCPU: q("4"), v1.ResourceMemory: q("4Gi"), v1.ResourceEphemeralStorage: q("32Gi"), v1.ResourcePods: q("110")}
}

func TestReadyCondition(t *testing.T) {
	c := &clock{t: time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC)}
	var readyErr error
	shutting := false
	s := ReadyCondition(func() error { return readyErr }, func() bool { return shutting }, c.now)
	// A node stored by an older mqlet: Ready first, then a pressure condition.
	n := &v1.Node{}
	n.Status.Capacity = fullCapacity()
	old := metav1.NewTime(c.t.Add(-time.Hour))
	n.Status.Conditions = []v1.NodeCondition{
		{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "MqletReady", Message: "mqlet is running", LastTransitionTime: old},
		{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse},
	}
	t0 := c.tick(0)
	run(t, s, n)
	if last := n.Status.Conditions[len(n.Status.Conditions)-1]; last.Type != v1.NodeReady {
		t.Fatalf("Ready is not listed last: %+v", n.Status.Conditions)
	}
	want := v1.NodeCondition{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", Message: "mqlet is posting ready status",
		LastHeartbeatTime: t0, LastTransitionTime: old}
	if got := condition(n, v1.NodeReady); got != want || len(n.Status.Conditions) != 2 {
		t.Errorf("ready: %+v\nwant %+v (the transition time kept: the status did not change)", got, want)
	}

	// containerd stops answering.
	readyErr = errors.New("containerd is not answering")
	t1 := c.tick(10 * time.Second)
	run(t, s, n)
	want = v1.NodeCondition{Type: v1.NodeReady, Status: v1.ConditionFalse, Reason: "KubeletNotReady", Message: "containerd is not answering",
		LastHeartbeatTime: t1, LastTransitionTime: t1}
	if got := condition(n, v1.NodeReady); got != want {
		t.Errorf("not ready: %+v\nwant %+v", got, want)
	}
	// Still not ready, for more reasons: same transition time, both reasons said.
	shutting = true
	t2 := c.tick(10 * time.Second)
	run(t, s, n)
	got := condition(n, v1.NodeReady)
	if got.LastTransitionTime != t1 || got.LastHeartbeatTime != t2 || got.Message != "node is shutting down, containerd is not answering" {
		t.Errorf("shutting down: %+v", got)
	}
	// Shutting down alone.
	readyErr = nil
	run(t, s, n)
	if got := condition(n, v1.NodeReady); got.Status != v1.ConditionFalse || got.Message != "node is shutting down" {
		t.Errorf("shutting down while otherwise ready: %+v", got)
	}

	// A capacity never read keeps the node NotReady and says which.
	shutting = false
	fresh := &v1.Node{}
	fresh.Status.Capacity = v1.ResourceList{v1.ResourceCPU: q("1"), v1.ResourcePods: q("110")}
	run(t, s, fresh)
	if got := condition(fresh, v1.NodeReady); got.Status != v1.ConditionFalse || got.Message != "missing node capacity for resources: memory, ephemeral-storage" {
		t.Errorf("missing capacity: %+v", got)
	}
	// A nil shuttingDown is never shutting down.
	ok := &v1.Node{}
	ok.Status.Capacity = fullCapacity()
	run(t, ReadyCondition(func() error { return nil }, nil, c.now), ok)
	if got := condition(ok, v1.NodeReady); got.Status != v1.ConditionTrue {
		t.Errorf("nil shuttingDown: %+v", got)
	}
}
