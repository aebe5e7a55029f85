package ctrd_test

// Host devices with real containers: device nodes made with mknod in a temp dir stand in for
// /dev/ttyUSB*, with the numbers of the host's /dev/null and /dev/zero so containers can use them.

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/devices"
	"github.com/mqlet/mqlet/internal/testenv"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

const serialRes v1.ResourceName = "mqlet.io/serial"

// devRig is a runtime with a device manager, over a state dir and a device root that a second rig
// (an agent restart) can share.
type devRig struct {
	*rig
	m    *devices.Manager
	root string
	ns   string
}

// newDevRig starts a runtime over state (new if "") with the devices of res under root.
func newDevRig(t *testing.T, ns, state, root string, res ...config.DeviceResource) *devRig {
	t.Helper()
	env := testenv.Require(t)
	if ns == "" {
		ns = testenv.Namespace(t, env.ContainerdAddress)
	}
	if state == "" {
		state = t.TempDir()
	}
	m := devices.New(res, root, nil)
	r, err := ctrd.New(context.Background(), ctrd.Options{Address: env.ContainerdAddress, Namespace: ns, StateDir: state,
		Log: slog.New(slog.DiscardHandler), Devices: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if _, err := r.ImportArchiveIfMissing(context.Background(), env.Image(testenv.Busybox)); err != nil {
		t.Fatal(err)
	}
	return &devRig{rig: &rig{t: t, r: r, state: state}, m: m, root: root, ns: ns}
}

// mknodLike makes a node at root+path of the given type with the numbers of the host's node like.
func mknodLike(t *testing.T, root, path string, typ uint32, like string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(like, &st); err != nil {
		t.Skipf("no %s on this host: %v", like, err)
	}
	p := filepath.Join(root, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(p, typ|0o666, int(st.Rdev)); err != nil {
		t.Fatalf("mknod %s: %v", p, err)
	}
}

// serialRoot is a device root with /dev/ttyUSB0 (as /dev/null) and /dev/ttyUSB1 (as /dev/zero).
func serialRoot(t *testing.T) (string, config.DeviceResource) {
	root := t.TempDir()
	mknodLike(t, root, "/dev/ttyUSB0", unix.S_IFCHR, "/dev/null")
	mknodLike(t, root, "/dev/ttyUSB1", unix.S_IFCHR, "/dev/zero")
	return root, config.DeviceResource{Name: serialRes, Globs: []string{"/dev/ttyUSB*"}, Share: 1}
}

func withDevice(c v1.Container, res v1.ResourceName, n int64) v1.Container {
	c.Resources.Limits = v1.ResourceList{res: *resource.NewQuantity(n, resource.DecimalSI)}
	return c
}

// allocated is the one device recorded in the pod dir for container c.
func (g *devRig) allocated(p *v1.Pod, c string) string {
	g.t.Helper()
	a, err := g.r.DeviceAllocation(p.UID)
	if err != nil {
		g.t.Fatalf("devices.json of %s: %v", p.Name, err)
	}
	paths := a.Paths(c)
	if len(paths) != 1 {
		g.t.Fatalf("devices.json of %s gives container %s %v, want one device", p.Name, c, paths)
	}
	return paths[0]
}

// removePod removes the pod's containers and sandbox, as a deletion does.
func (g *devRig) removePod(p *v1.Pod) {
	g.t.Helper()
	ctx := context.Background()
	cs, _ := g.r.ListContainers(ctx, string(p.UID))
	for _, c := range cs {
		if err := g.r.RemoveContainer(ctx, c.ID); err != nil {
			g.t.Fatal(err)
		}
	}
	if err := g.r.RemoveSandbox(ctx, ctrd.RefOf(p)); err != nil {
		g.t.Fatal(err)
	}
}

// The script a device container runs: which ttyUSB nodes it sees, and that it can use $DEV.
const useSerial = `for f in /dev/ttyUSB*; do echo "sees=$f"; done; test -c "$DEV" && echo is-char; ` +
	`echo hi > "$DEV" && echo wrote; echo "read=$(head -c 8 "$DEV" | wc -c)"; echo done; sleep 3600`

// A pod asking for mqlet.io/serial: 1 gets the device recorded in its devices.json, as a character
// device it can write and read, and no other ttyUSB node. With both devices held, a third pod's
// container is refused with the resource and the counts; when the first pod goes, the third gets
// its device.
func TestDeviceAllocatedToOnePod(t *testing.T) {
	root, res := serialRoot(t)
	g := newDevRig(t, "", "", root, res)

	a := newPod("de5e0001-a", withDevice(shell("c", useSerial), serialRes, 1))
	sbA := g.sandbox(a)
	devA := g.allocated(a, "c")
	a.Spec.Containers[0].Env = []v1.EnvVar{{Name: "DEV", Value: devA}}
	ca := g.start(a, sbA, &a.Spec.Containers[0])
	g.waitLog(ca, "done")
	log, _ := readLog(ca.LogPath)
	var sees []string
	for _, l := range strings.Split(string(log), "\n") {
		if s, ok := strings.CutPrefix(l, "sees="); ok {
			sees = append(sees, s)
		}
	}
	if !slices.Equal(sees, []string{devA}) {
		t.Errorf("container of pod a sees ttyUSB nodes %v, want only its %s", sees, devA)
	}
	// ttyUSB0 is made like /dev/null (reads nothing), ttyUSB1 like /dev/zero (reads 8 zero bytes).
	wantRead := map[string]string{"/dev/ttyUSB0": "read=0", "/dev/ttyUSB1": "read=8"}[devA]
	for _, want := range []string{"is-char", "wrote", wantRead} {
		if !strings.Contains(string(log), want+"\n") {
			t.Errorf("container of pod a with %s did not log %q; log:\n%s", devA, want, log)
		}
	}

	b := newPod("de5e0002-b", withDevice(shell("c", "sleep 3600"), serialRes, 1))
	sbB := g.sandbox(b)
	if devB := g.allocated(b, "c"); devB == devA {
		t.Fatalf("pods a and b both got %s with share 1", devA)
	}
	g.start(b, sbB, &b.Spec.Containers[0])

	c := newPod("de5e0003-c", withDevice(shell("c", useSerial), serialRes, 1))
	sbC := g.sandbox(c) // the sandbox is set up; the container that wants a device is refused
	_, err := g.r.StartContainer(context.Background(), c, sbC, &c.Spec.Containers[0], 0)
	var se *ctrd.StartError
	if !errors.As(err, &se) || se.Reason != "UnexpectedAdmissionError" {
		t.Fatalf("third pod with both devices held: err = %v, want a StartError UnexpectedAdmissionError", err)
	}
	for _, want := range []string{string(serialRes), "requests 1", "0 available", "2 present"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if _, err := g.r.DeviceAllocation(c.UID); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused pod has a devices.json (err %v)", err)
	}

	g.removePod(a)
	if _, ok := g.m.Lookup(a.UID); ok {
		t.Errorf("pod a still holds devices after its sandbox was removed")
	}
	c.Spec.Containers[0].Env = []v1.EnvVar{{Name: "DEV", Value: devA}}
	cc, err := g.r.StartContainer(context.Background(), c, sbC, &c.Spec.Containers[0], 1)
	if err != nil {
		t.Fatalf("third pod after pod a went: %v", err)
	}
	if got := g.allocated(c, "c"); got != devA {
		t.Errorf("third pod got %s, want %s that pod a freed", got, devA)
	}
	g.waitLog(cc, "done")
	if log, _ := readLog(cc.LogPath); !strings.Contains(string(log), "sees="+devA+"\n") || !strings.Contains(string(log), "wrote\n") {
		t.Errorf("third pod's container did not see and write %s; log:\n%s", devA, log)
	}
}

// An evicted pod stays on the node without running: ReleasePodStorage gives back its devices (and
// their record, so a restart does not restore them), and a pod that was refused one gets it.
func TestDeviceFreedWhenPodStorageReleased(t *testing.T) {
	root, res := serialRoot(t)
	res.Globs = []string{"/dev/ttyUSB0"}
	g := newDevRig(t, "", "", root, res)

	a := newPod("de5e0011-a", withDevice(shell("c", "sleep 3600"), serialRes, 1))
	g.sandbox(a)
	devA := g.allocated(a, "c")
	b := newPod("de5e0012-b", withDevice(shell("c", "sleep 3600"), serialRes, 1))
	sbB := g.sandbox(b)
	_, err := g.r.StartContainer(context.Background(), b, sbB, &b.Spec.Containers[0], 0)
	var se *ctrd.StartError
	if !errors.As(err, &se) || se.Reason != "UnexpectedAdmissionError" {
		t.Fatalf("second pod with the one device held: err = %v, want UnexpectedAdmissionError", err)
	}

	if err := g.r.ReleasePodStorage(a); err != nil {
		t.Fatal(err)
	}
	if _, ok := g.m.Lookup(a.UID); ok {
		t.Errorf("pod a still holds devices after ReleasePodStorage")
	}
	if _, err := g.r.DeviceAllocation(a.UID); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pod a's devices.json is still there (err %v)", err)
	}
	if _, err := g.r.StartContainer(context.Background(), b, sbB, &b.Spec.Containers[0], 1); err != nil {
		t.Fatalf("second pod after pod a's release: %v", err)
	}
	if got := g.allocated(b, "c"); got != devA {
		t.Errorf("second pod got %s, want %s", got, devA)
	}
}

// The cgroup rule allows the allocated device and no other: a container opens its device (a block
// device, which runc's default rules do not allow) but not a node it makes itself with the numbers of
// a device it was not given.
func TestDeviceCgroupRuleOnlyAllocated(t *testing.T) {
	root := t.TempDir()
	mknodLike(t, root, "/dev/loopx0", unix.S_IFBLK, "/dev/loop0")
	mknodLike(t, root, "/dev/loopx1", unix.S_IFBLK, "/dev/loop1")
	res := config.DeviceResource{Name: "mqlet.io/loop", Globs: []string{"/dev/loopx*"}, Share: 1}
	g := newDevRig(t, "", "", root, res)

	var other unix.Stat_t
	p := newPod("de5e0004-cg", withDevice(shell("c", "sleep 3600"), res.Name, 1))
	sb := g.sandbox(p)
	mine := g.allocated(p, "c")
	otherPath := map[string]string{"/dev/loopx0": "/dev/loop1", "/dev/loopx1": "/dev/loop0"}[mine]
	if err := unix.Stat(otherPath, &other); err != nil {
		t.Fatal(err)
	}
	script := `if head -c 1 ` + mine + ` >/dev/null; then echo mine-opened; fi; ` +
		`mknod /dev/notmine b ` + itoa(unix.Major(other.Rdev)) + ` ` + itoa(unix.Minor(other.Rdev)) + ` && echo made; ` +
		`if head -c 1 /dev/notmine >/dev/null; then echo notmine-opened; else echo notmine-refused; fi; echo done; sleep 3600`
	p.Spec.Containers[0].Command = []string{"sh", "-c", script}
	c := g.start(p, sb, &p.Spec.Containers[0])
	g.waitLog(c, "done")
	log, _ := readLog(c.LogPath)
	for _, want := range []string{"mine-opened", "made", "notmine-refused"} {
		if !strings.Contains(string(log), want+"\n") {
			t.Errorf("container did not log %q; log:\n%s", want, log)
		}
	}
	if !strings.Contains(string(log), "Operation not permitted") {
		t.Errorf("opening a device not allocated did not fail by the cgroup rule (EPERM); log:\n%s", log)
	}
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

// After an agent restart (a new runtime and device manager over the same state dir) a pod keeps the
// device recorded in its pod dir, and a new pod gets another, though a fresh allocation would have
// given the restored pod's device first.
func TestDeviceKeptAcrossAgentRestart(t *testing.T) {
	root, res := serialRoot(t)
	g := newDevRig(t, "", "", root, res)
	first := newPod("de5e0005-x", withDevice(shell("c", "sleep 3600"), serialRes, 1))
	g.sandbox(first)
	if got := g.allocated(first, "c"); got != "/dev/ttyUSB0" {
		t.Fatalf("first pod got %s, want ttyUSB0", got)
	}
	kept := newPod("de5e0006-k", withDevice(shell("c", "test -c \"$DEV\" && echo has-dev; sleep 3600"), serialRes, 1))
	sb := g.sandbox(kept)
	dev := g.allocated(kept, "c")
	if dev != "/dev/ttyUSB1" {
		t.Fatalf("second pod got %s, want ttyUSB1", dev)
	}
	kept.Spec.Containers[0].Env = []v1.EnvVar{{Name: "DEV", Value: dev}}
	c := g.start(kept, sb, &kept.Spec.Containers[0])
	g.waitLog(c, "has-dev")
	g.removePod(first) // ttyUSB0 is free: a fresh allocation for kept would now pick it

	g2 := newDevRig(t, g.ns, g.state, root, res)
	if a, ok := g2.m.Lookup(kept.UID); !ok || !slices.Equal(a.Paths("c"), []string{dev}) {
		t.Errorf("restarted manager holds %v for the kept pod, want %s from its devices.json", a.Paths("c"), dev)
	}
	sb2, err := g2.r.EnsureSandbox(context.Background(), kept)
	if err != nil {
		t.Fatal(err)
	}
	if got := sb2.Devices.Paths("c"); !slices.Equal(got, []string{dev}) {
		t.Errorf("kept pod's sandbox after restart has %v, want %s", got, dev)
	}
	if got := g2.allocated(kept, "c"); got != dev {
		t.Errorf("kept pod's devices.json after restart says %s, want %s", got, dev)
	}
	other := newPod("de5e0007-o", withDevice(shell("c", "sleep 3600"), serialRes, 1))
	g2.sandbox(other)
	if got := g2.allocated(other, "c"); got != "/dev/ttyUSB0" {
		t.Errorf("new pod after restart got %s, want ttyUSB0 (ttyUSB1 is the kept pod's)", got)
	}
	// The kept pod's container was never touched: it still runs with its device.
	cs, err := g2.r.ListContainers(context.Background(), string(kept.UID))
	if err != nil || len(cs) != 1 || cs[0].State != ctrd.StateRunning {
		t.Errorf("kept pod's containers after restart: %+v, %v; want its one running container", cs, err)
	}
}

// A container asking for a device resource the node does not offer is refused with a config error
// naming it and what is offered.
func TestDeviceResourceNotOffered(t *testing.T) {
	root, res := serialRoot(t)
	g := newDevRig(t, "", "", root, res)
	p := newPod("de5e0009-u", withDevice(shell("c", "sleep 3600"), "mqlet.io/gpio", 1))
	sb := g.sandbox(p)
	_, err := g.r.StartContainer(context.Background(), p, sb, &p.Spec.Containers[0], 0)
	var se *ctrd.StartError
	if !errors.As(err, &se) || se.Reason != "CreateContainerConfigError" || !strings.Contains(err.Error(), "mqlet.io/gpio") ||
		!strings.Contains(err.Error(), string(serialRes)) {
		t.Errorf("err = %v, want a CreateContainerConfigError naming mqlet.io/gpio and the offered %s", err, serialRes)
	}
}

// A runtime without a device manager refuses a container asking for a device, naming the resource,
// and starts the pod's other containers.
func TestDeviceWithoutManager(t *testing.T) {
	g := newRig(t)
	p := newPod("de5e0008-n", withDevice(shell("c", "sleep 3600"), serialRes, 1), shell("plain", "echo plain-up; sleep 3600"))
	sb := g.sandbox(p)
	_, err := g.r.StartContainer(context.Background(), p, sb, &p.Spec.Containers[0], 0)
	var se *ctrd.StartError
	if !errors.As(err, &se) || se.Reason != "CreateContainerConfigError" || !strings.Contains(err.Error(), string(serialRes)) {
		t.Errorf("device container without a manager: err = %v, want a CreateContainerConfigError naming %s", err, serialRes)
	}
	g.waitLog(g.start(p, sb, &p.Spec.Containers[1]), "plain-up")
}
