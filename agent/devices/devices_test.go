package devices

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/config"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
)

const serial v1.ResourceName = "mqlet.io/serial"

// devNumbers are the numbers of the host's /dev/null and /dev/zero, so nodes made with them are
// harmless to open.
func devNumbers(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Rdev
}

// mknod makes a character device node at root+path with the numbers of the host's node like.
func mknod(t *testing.T, root, path, like string) {
	t.Helper()
	p := filepath.Join(root, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(devNumbers(t, like))); err != nil {
		if errors.Is(err, unix.EPERM) {
			t.Skipf("mknod needs CAP_MKNOD: %v", err)
		}
		t.Fatal(err)
	}
}

func symlink(t *testing.T, root, path, target string) {
	t.Helper()
	p := filepath.Join(root, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

// twoPorts is a root with /dev/ttyUSB0 and /dev/ttyUSB1.
func twoPorts(t *testing.T) string {
	root := t.TempDir()
	mknod(t, root, "/dev/ttyUSB0", "/dev/null")
	mknod(t, root, "/dev/ttyUSB1", "/dev/zero")
	return root
}

func newManager(root string, share int, globs ...string) *Manager {
	if len(globs) == 0 {
		globs = []string{"/dev/ttyUSB*"}
	}
	return New([]config.DeviceResource{{Name: serial, Globs: globs, Share: share}}, root, nil)
}

func capacityOf(m *Manager, n v1.ResourceName) int64 {
	q, ok := m.Capacity()[n]
	if !ok {
		return -1
	}
	return q.Value()
}

func one(container string, n int64) Request {
	return Request{Container: container, Counts: map[v1.ResourceName]int64{serial: n}}
}

func allocate(t *testing.T, m *Manager, pod types.UID, reqs ...Request) Allocation {
	t.Helper()
	a, err := m.Allocate(pod, reqs)
	if err != nil {
		t.Fatalf("Allocate(%s): %v", pod, err)
	}
	return a
}

func TestScanCountsOnlyDeviceNodesInsideRoot(t *testing.T) {
	root := twoPorts(t)
	if err := os.WriteFile(filepath.Join(root, "dev/ttyUSB2"), []byte("not a device"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "dev/ttyUSB3"), 0o755); err != nil {
		t.Fatal(err)
	}
	symlink(t, root, "/dev/serial/by-id/usb-FTDI-0", "../../ttyUSB0") // inside root: counts
	symlink(t, root, "/dev/serial/by-id/usb-evil-abs", "/dev/null")   // the host's /dev/null, not root's
	symlink(t, root, "/dev/serial/by-id/usb-evil-rel", "../../../../../../../../dev/zero")
	symlink(t, root, "/dev/serial/by-id/usb-dangling", "../../ttyUSB9")

	m := newManager(root, 1, "/dev/serial/by-id/*")
	if got := m.present[serial]; !slices.Equal(got, []string{"/dev/serial/by-id/usb-FTDI-0"}) {
		t.Errorf("by-id devices = %v, want only the link to a node inside the root", got)
	}
	n, err := m.Node("/dev/serial/by-id/usb-FTDI-0")
	if err != nil || n.HostPath != filepath.Join(root, "dev/ttyUSB0") || n.Type != "c" || uint64(unix.Mkdev(uint32(n.Major), uint32(n.Minor))) != devNumbers(t, "/dev/null") {
		t.Errorf("Node(by-id link) = %+v, %v; want the root's ttyUSB0 with /dev/null's numbers", n, err)
	}
	if _, err := m.Node("/dev/serial/by-id/usb-evil-abs"); err == nil {
		t.Errorf("Node of a link to the host's /dev/null resolved; want it looked up below the root only")
	}

	m = newManager(root, 3)
	if got := m.present[serial]; !slices.Equal(got, []string{"/dev/ttyUSB0", "/dev/ttyUSB1"}) {
		t.Errorf("ttyUSB devices = %v, want the two nodes (not the file or the dir)", got)
	}
	if got := capacityOf(m, serial); got != 6 {
		t.Errorf("capacity = %d, want 2 devices x share 3 = 6", got)
	}

	// A node reached by two globs (itself and a by-id link) is one device.
	m = newManager(root, 1, "/dev/ttyUSB*", "/dev/serial/by-id/*")
	if got := m.present[serial]; !slices.Equal(got, []string{"/dev/ttyUSB0", "/dev/ttyUSB1"}) {
		t.Errorf("devices through two globs = %v, want ttyUSB0 once and ttyUSB1", got)
	}
}

// A resource with no device present is in capacity with 0; allocatable equals capacity.
func TestCapacityOfEmptyResource(t *testing.T) {
	m := newManager(t.TempDir(), 2)
	want := v1.ResourceList{serial: *resource.NewQuantity(0, resource.DecimalSI)}
	if got := m.Capacity(); !got[serial].Equal(want[serial]) || len(got) != 1 {
		t.Errorf("Capacity = %v, want %v", got, want)
	}
	if got := m.Allocatable(); !got[serial].Equal(want[serial]) || len(got) != 1 {
		t.Errorf("Allocatable = %v, want %v", got, want)
	}
	if got := New(nil, t.TempDir(), nil).Capacity(); len(got) != 0 {
		t.Errorf("Capacity with no resources = %v, want empty", got)
	}
}

// USB devices come and go: capacity follows at the next scan, which Capacity makes no more often
// than the rescan interval.
func TestCapacityFollowsDevicesThatComeAndGo(t *testing.T) {
	root := twoPorts(t)
	m := newManager(root, 1)
	m.SetRescanInterval(time.Hour)
	mknod(t, root, "/dev/ttyUSB2", "/dev/null")
	if got := capacityOf(m, serial); got != 2 {
		t.Errorf("capacity right after a scan = %d, want the 2 of that scan (rescans are rate-limited)", got)
	}
	m.Rescan()
	if got := capacityOf(m, serial); got != 3 {
		t.Errorf("capacity after Rescan with a third device = %d, want 3", got)
	}
	m.SetRescanInterval(0)
	if err := os.Remove(filepath.Join(root, "dev/ttyUSB1")); err != nil {
		t.Fatal(err)
	}
	if got := capacityOf(m, serial); got != 2 {
		t.Errorf("capacity after ttyUSB1 vanished = %d, want 2", got)
	}
}

// share 1: each device to one pod; a third pod is refused with the counts; a released device goes
// to the next pod.
func TestAllocateShareOne(t *testing.T) {
	m := newManager(twoPorts(t), 1)
	a := allocate(t, m, "pod-a", one("c", 1))
	b := allocate(t, m, "pod-b", one("c", 1))
	if got := a.Paths("c"); !slices.Equal(got, []string{"/dev/ttyUSB0"}) {
		t.Errorf("pod-a got %v, want ttyUSB0", got)
	}
	if got := b.Paths("c"); !slices.Equal(got, []string{"/dev/ttyUSB1"}) {
		t.Errorf("pod-b got %v, want ttyUSB1", got)
	}
	_, err := m.Allocate("pod-c", []Request{one("app", 1)})
	var se *ShortageError
	if !errors.As(err, &se) || se.Resource != serial || se.Requested != 1 || se.Available != 0 || se.Present != 2 {
		t.Fatalf("third pod: err = %v, want a ShortageError for %s, 1 requested, 0 available of 2", err, serial)
	}
	for _, want := range []string{string(serial), `"app"`, "requests 1", "0 available", "2 present"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %s", err, want)
		}
	}
	if _, ok := m.Lookup("pod-c"); ok {
		t.Errorf("a refused pod holds an allocation")
	}
	m.Release("pod-a")
	m.Release("pod-a") // idempotent
	if got := allocate(t, m, "pod-c", one("app", 1)).Paths("app"); !slices.Equal(got, []string{"/dev/ttyUSB0"}) {
		t.Errorf("pod-c after pod-a left got %v, want the freed ttyUSB0", got)
	}
}

// share 2: pods spread over the devices first, then double up; the fifth is refused.
func TestAllocateShared(t *testing.T) {
	m := newManager(twoPorts(t), 2)
	var got []string
	for _, p := range []types.UID{"p1", "p2", "p3", "p4"} {
		got = append(got, allocate(t, m, p, one("c", 1)).Paths("c")...)
	}
	if want := []string{"/dev/ttyUSB0", "/dev/ttyUSB1", "/dev/ttyUSB0", "/dev/ttyUSB1"}; !slices.Equal(got, want) {
		t.Errorf("four pods got %v, want %v", got, want)
	}
	var se *ShortageError
	if _, err := m.Allocate("p5", []Request{one("c", 1)}); !errors.As(err, &se) || se.Share != 2 {
		t.Errorf("fifth pod: err = %v, want a ShortageError (2 devices x share 2 all held)", err)
	}
}

// A container asking for two gets two distinct devices, even when one could be shared.
func TestAllocateDistinctDevicesPerContainer(t *testing.T) {
	m := newManager(twoPorts(t), 2)
	if got := allocate(t, m, "p", one("c", 2)).Paths("c"); !slices.Equal(got, []string{"/dev/ttyUSB0", "/dev/ttyUSB1"}) {
		t.Errorf("a container asking for 2 got %v, want both devices", got)
	}
	var se *ShortageError
	if _, err := m.Allocate("q", []Request{one("c", 3)}); !errors.As(err, &se) || se.Available != 2 {
		t.Errorf("3 from 2 devices: err = %v, want a shortage with 2 available", err)
	}
}

// Each container of a pod gets its own devices; a pod is allocated all or nothing.
func TestAllocatePerContainerAllOrNothing(t *testing.T) {
	m := newManager(twoPorts(t), 1)
	a := allocate(t, m, "p", one("a", 1), one("b", 1), Request{Container: "plain"})
	if !slices.Equal(a.Paths("a"), []string{"/dev/ttyUSB0"}) || !slices.Equal(a.Paths("b"), []string{"/dev/ttyUSB1"}) {
		t.Errorf("containers a, b got %v, %v; want ttyUSB0, ttyUSB1", a.Paths("a"), a.Paths("b"))
	}
	if _, ok := a.For("plain"); ok || len(a) != 2 {
		t.Errorf("allocation %+v names a container that asked for nothing", a)
	}
	m.Release("p")
	if _, err := m.Allocate("big", []Request{one("a", 1), one("b", 2)}); err == nil {
		t.Fatal("3 devices from 2: no error")
	}
	if _, ok := m.Lookup("big"); ok {
		t.Errorf("a refused pod kept part of its allocation")
	}
	if got := allocate(t, m, "other", one("c", 2)).Paths("c"); len(got) != 2 {
		t.Errorf("after a refused pod, another got %v, want both devices", got)
	}
}

// Later containers take the devices of finished init containers, as admission counts a pod (the
// larger of its init containers and the sum of its app containers); sidecars keep theirs.
func TestAllocateReusesInitContainerDevices(t *testing.T) {
	root := t.TempDir()
	mknod(t, root, "/dev/ttyUSB0", "/dev/null")
	m := newManager(root, 1)
	init1 := Request{Container: "flash", Init: true, Counts: map[v1.ResourceName]int64{serial: 1}}
	init2 := Request{Container: "check", Init: true, Counts: map[v1.ResourceName]int64{serial: 1}}
	a := allocate(t, m, "p", init1, init2, one("app", 1))
	for _, c := range []string{"flash", "check", "app"} {
		if got := a.Paths(c); !slices.Equal(got, []string{"/dev/ttyUSB0"}) {
			t.Errorf("%s got %v, want the node's only device", c, got)
		}
	}
	if _, err := m.Allocate("q", []Request{one("c", 1)}); err == nil {
		t.Errorf("a second pod got the device the first pod's app container holds")
	}
	m.Release("p")
	// Two app containers cannot both reuse one init container's device.
	if _, err := m.Allocate("p", []Request{init1, one("a", 1), one("b", 1)}); err == nil {
		t.Errorf("two app containers shared one device with share 1")
	}
	// A sidecar runs beside the app container: no reuse.
	sidecar := Request{Container: "side", Counts: map[v1.ResourceName]int64{serial: 1}}
	if _, err := m.Allocate("p", []Request{sidecar, one("app", 1)}); err == nil {
		t.Errorf("a sidecar and an app container shared one device with share 1")
	}
}

// The same pod gets the same devices: asked again, and from a new Manager given the recorded
// allocation (an agent restart), whose other pods then get the rest.
func TestAllocateDeterministicAfterRestore(t *testing.T) {
	root := twoPorts(t)
	m := newManager(root, 1)
	allocate(t, m, "first", one("c", 1)) // takes ttyUSB0
	b := allocate(t, m, "second", one("c", 1))
	if again := allocate(t, m, "second", one("c", 1)); !slices.Equal(again.Paths("c"), b.Paths("c")) {
		t.Errorf("second Allocate for the same pod got %v, first %v", again.Paths("c"), b.Paths("c"))
	}
	m.Release("first")

	// A restarted agent: a new Manager over the same root, given what was recorded for "second".
	m2 := newManager(root, 1)
	if err := m2.Restore("second", b); err != nil {
		t.Fatal(err)
	}
	if got := allocate(t, m2, "second", one("c", 1)).Paths("c"); !slices.Equal(got, []string{"/dev/ttyUSB1"}) {
		t.Errorf("restored pod got %v, want its ttyUSB1 again", got)
	}
	if got := allocate(t, m2, "third", one("c", 1)).Paths("c"); !slices.Equal(got, []string{"/dev/ttyUSB0"}) {
		t.Errorf("new pod after restore got %v, want ttyUSB0 (ttyUSB1 is the restored pod's)", got)
	}
	if err := m2.Restore("bad", Allocation{{Container: "c", Devices: []Device{{Resource: serial, Path: "dev/x"}}}}); err == nil {
		t.Errorf("Restore took a relative device path")
	}
}

// A device that vanishes stays with the pod that holds it, is not handed to anyone else, and makes
// a pod needing it short; Node says it is gone.
func TestVanishedDevice(t *testing.T) {
	root := twoPorts(t)
	m := newManager(root, 1)
	a := allocate(t, m, "holder", one("c", 1))
	if err := os.Remove(filepath.Join(root, "dev/ttyUSB1")); err != nil {
		t.Fatal(err)
	}
	var se *ShortageError
	if _, err := m.Allocate("new", []Request{one("c", 1)}); !errors.As(err, &se) || se.Present != 1 || se.Available != 0 {
		t.Errorf("with ttyUSB1 gone and ttyUSB0 held: err = %v, want a shortage, 1 present, 0 available", err)
	}
	if err := os.Remove(filepath.Join(root, "dev/ttyUSB0")); err != nil {
		t.Fatal(err)
	}
	if got := allocate(t, m, "holder", one("c", 1)); !slices.Equal(got.Paths("c"), a.Paths("c")) {
		t.Errorf("holder after its device vanished got %v, want its %v kept", got.Paths("c"), a.Paths("c"))
	}
	if _, err := m.Node("/dev/ttyUSB0"); err == nil || !strings.Contains(err.Error(), "gone") {
		t.Errorf("Node of a vanished device: err = %v, want one saying it is gone", err)
	}
	mknod(t, root, "/dev/ttyUSB0", "/dev/zero") // re-plugged with other numbers
	n, err := m.Node("/dev/ttyUSB0")
	if err != nil || uint64(unix.Mkdev(uint32(n.Major), uint32(n.Minor))) != devNumbers(t, "/dev/zero") {
		t.Errorf("Node after re-plug = %+v, %v; want the new node's numbers", n, err)
	}
}

func TestAllocateUnknownResource(t *testing.T) {
	m := newManager(twoPorts(t), 1)
	_, err := m.Allocate("p", []Request{{Container: "c", Counts: map[v1.ResourceName]int64{"mqlet.io/gpio": 1}}})
	var ue *UnknownResourceError
	if !errors.As(err, &ue) || ue.Resource != "mqlet.io/gpio" || !strings.Contains(err.Error(), string(serial)) {
		t.Errorf("err = %v, want an UnknownResourceError naming mqlet.io/gpio and what is offered", err)
	}
}

func TestRequests(t *testing.T) {
	q := resource.MustParse
	always := v1.ContainerRestartPolicyAlways
	pod := &v1.Pod{Spec: v1.PodSpec{
		InitContainers: []v1.Container{
			{Name: "flash", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{serial: q("1")}}},
			{Name: "side", RestartPolicy: &always, Resources: v1.ResourceRequirements{Limits: v1.ResourceList{serial: q("1")}}},
		},
		Containers: []v1.Container{
			{Name: "plain", Resources: v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceCPU: q("1"), "hugepages-2Mi": q("2Mi")}}},
			{Name: "app", Resources: v1.ResourceRequirements{
				Limits: v1.ResourceList{serial: q("2"), "example.com/cam": q("1"), v1.ResourceMemory: q("1Gi")}, Requests: v1.ResourceList{serial: q("2")}}},
		},
	}}
	got, err := Requests(pod)
	if err != nil {
		t.Fatal(err)
	}
	want := []Request{
		{Container: "flash", Init: true, Counts: map[v1.ResourceName]int64{serial: 1}},
		{Container: "side", Counts: map[v1.ResourceName]int64{serial: 1}},
		{Container: "app", Counts: map[v1.ResourceName]int64{serial: 2, "example.com/cam": 1}},
	}
	if !slices.EqualFunc(got, want, func(a, b Request) bool {
		return a.Container == b.Container && a.Init == b.Init && len(a.Counts) == len(b.Counts) && a.Counts[serial] == b.Counts[serial] && a.Counts["example.com/cam"] == b.Counts["example.com/cam"]
	}) {
		t.Errorf("Requests = %+v, want %+v", got, want)
	}

	bad := []struct {
		res  v1.ResourceRequirements
		want string
	}{
		{v1.ResourceRequirements{Requests: v1.ResourceList{serial: q("1")}}, "must be set in resources.limits"},
		{v1.ResourceRequirements{Limits: v1.ResourceList{serial: q("2")}, Requests: v1.ResourceList{serial: q("1")}}, "must equal its limit"},
		{v1.ResourceRequirements{Limits: v1.ResourceList{serial: q("500m")}}, "whole number"},
	}
	for _, b := range bad {
		_, err := ContainerCounts(&v1.Container{Name: "c", Resources: b.res})
		if err == nil || !strings.Contains(err.Error(), b.want) || !strings.Contains(err.Error(), string(serial)) {
			t.Errorf("ContainerCounts(%+v): err = %v, want one naming %s and saying %q", b.res, err, serial, b.want)
		}
	}
	for name, want := range map[v1.ResourceName]bool{serial: true, "nvidia.com/gpu": true, v1.ResourceCPU: false,
		"hugepages-2Mi": false, "kubernetes.io/batch": false, "example.kubernetes.io/x": false, v1.ResourceEphemeralStorage: false} {
		if IsExtended(name) != want {
			t.Errorf("IsExtended(%s) = %v, want %v", name, !want, want)
		}
	}
}
