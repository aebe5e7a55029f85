package ctrd_test

// Sandbox tests with real containers on the test environment's containerd.

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/pod"
	"github.com/mqlet/mqlet/internal/testenv"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// waitLimit bounds waits for a container to do something; it only matters when a test fails.
const waitLimit = 30 * time.Second

type rig struct {
	t     *testing.T
	r     *ctrd.Runtime
	state string
	opts  ctrd.Options
}

func newRig(t *testing.T) *rig {
	t.Helper()
	env := testenv.Require(t)
	ns := testenv.Namespace(t, env.ContainerdAddress)
	state := t.TempDir()
	exe, err := os.Executable() // its TestMain acts as the mqlet binary's sandbox-pause
	if err != nil {
		t.Fatal(err)
	}
	opts := ctrd.Options{Address: env.ContainerdAddress, Namespace: ns, StateDir: state,
		Executable: exe, Log: slog.New(slog.DiscardHandler)}
	r, err := ctrd.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	g := &rig{t: t, r: r, state: state, opts: opts}
	t.Cleanup(func() { g.r.Close() })
	if _, err := r.ImportArchiveIfMissing(context.Background(), env.Image(testenv.Busybox)); err != nil {
		t.Fatal(err)
	}
	return g
}

// restart closes the runtime and opens another on the same state, as a restarted agent does: the
// copies of container output stop and the new runtime resumes them when it lists the containers.
func (g *rig) restart() {
	g.t.Helper()
	if err := g.r.Close(); err != nil {
		g.t.Fatalf("close the runtime: %v", err)
	}
	r, err := ctrd.New(context.Background(), g.opts)
	if err != nil {
		g.t.Fatal(err)
	}
	g.r = r
	if _, err := r.ListContainers(context.Background(), ""); err != nil {
		g.t.Fatal(err)
	}
}

func newPod(uid string, ctrs ...v1.Container) *v1.Pod {
	for i := range ctrs {
		ctrs[i].Image = testenv.BusyboxRef
		ctrs[i].ImagePullPolicy = v1.PullNever
	}
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p" + uid[:4], Namespace: "default", UID: types.UID(uid)},
		Spec: v1.PodSpec{Containers: ctrs}}
}

func shell(name, script string) v1.Container {
	return v1.Container{Name: name, Command: []string{"sh", "-c", script}}
}

// sandbox sets the pod's sandbox up and removes containers and sandbox when the test ends.
func (g *rig) sandbox(p *v1.Pod) *ctrd.Sandbox {
	g.t.Helper()
	ctx := context.Background()
	sb, err := g.r.EnsureSandbox(ctx, p)
	if err != nil {
		g.t.Fatalf("EnsureSandbox: %v", err)
	}
	g.t.Cleanup(func() {
		cs, _ := g.r.ListContainers(ctx, string(p.UID))
		for _, c := range cs {
			g.r.RemoveContainer(ctx, c.ID)
		}
		if err := g.r.RemoveSandbox(ctx, ctrd.RefOf(p)); err != nil {
			g.t.Logf("cleanup: %v", err)
		}
	})
	return sb
}

func (g *rig) start(p *v1.Pod, sb *ctrd.Sandbox, c *v1.Container) ctrd.Container {
	g.t.Helper()
	ctr, err := g.r.StartContainer(context.Background(), p, sb, c, 0)
	if err != nil {
		g.t.Fatalf("StartContainer %s: %v", c.Name, err)
	}
	return ctr
}

// waitLog waits until the container's log holds want.
func (g *rig) waitLog(c ctrd.Container, want string) {
	g.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		b, _ := readLog(c.LogPath)
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("container %s did not log %q within %s; log:\n%s", c.Name, want, waitLimit, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func nsOf(t *testing.T, pid uint32, kind string) string {
	t.Helper()
	p := "/proc/self/ns/" + kind
	if pid != 0 {
		p = filepath.Join("/proc", strconv.FormatUint(uint64(pid), 10), "ns", kind)
	}
	l, err := os.Readlink(p)
	if err != nil {
		t.Fatalf("namespace of pid %d: %v", pid, err)
	}
	return l
}

// Two containers of a pod share its IPC namespace (not the host's) and its /dev/shm.
func TestPodContainersShareIPC(t *testing.T) {
	g := newRig(t)
	p := newPod("6a0c0001-ipc",
		shell("writer", "echo shared-hi > /dev/shm/x; sleep 3600"),
		shell("reader", "until cat /dev/shm/x; do sleep 0.1; done; sleep 3600"))
	sb := g.sandbox(p)
	w := g.start(p, sb, &p.Spec.Containers[0])
	rd := g.start(p, sb, &p.Spec.Containers[1])
	g.waitLog(rd, "shared-hi")
	wi, ri, host := nsOf(t, w.Pid, "ipc"), nsOf(t, rd.Pid, "ipc"), nsOf(t, 0, "ipc")
	if wi != ri || wi == host {
		t.Errorf("ipc namespaces: writer %s, reader %s, host %s; want the pod's own, shared", wi, ri, host)
	}
}

// hostIPC and hostPID put the container in the host's namespaces: it sees the host's pid 1.
func TestHostIPCAndHostPID(t *testing.T) {
	g := newRig(t)
	p := newPod("6a0c0002-host", shell("c", "echo comm=$(cat /proc/1/comm); sleep 3600"))
	p.Spec.HostIPC, p.Spec.HostPID = true, true
	sb := g.sandbox(p)
	c := g.start(p, sb, &p.Spec.Containers[0])
	comm, err := os.ReadFile("/proc/1/comm")
	if err != nil {
		t.Fatal(err)
	}
	g.waitLog(c, "comm="+strings.TrimSpace(string(comm)))
	for _, kind := range []string{"ipc", "pid"} {
		if got, host := nsOf(t, c.Pid, kind), nsOf(t, 0, kind); got != host {
			t.Errorf("%s namespace = %s, want the host's %s", kind, got, host)
		}
	}
}

// shareProcessNamespace: the pod's containers share one PID namespace, not the host's, whose PID 1
// is the holder mqlet started; a container sees the other's processes, and an orphan that exits is
// reaped by the holder rather than left a zombie.
func TestShareProcessNamespace(t *testing.T) {
	g := newRig(t)
	p := newPod("6a0c0003-spn",
		shell("sleeper", "exec sleep 3601"),
		shell("looker", "until ps | grep -q '[s]leep 3601'; do sleep 0.1; done; echo saw-sleeper; echo init=$(tr '\\0' ' ' < /proc/1/cmdline); sleep 3600"),
		shell("orphaner", "(sh -c 'sleep 0.2; echo orphan-exiting' &); echo spawned; sleep 3600"))
	share := true
	p.Spec.ShareProcessNamespace = &share
	sb := g.sandbox(p)
	holder := ctrd.HolderPID(g.r, string(p.UID))
	if holder == 0 || sb.PIDNS == "" {
		t.Fatalf("sandbox of a pod with shareProcessNamespace: holder pid %d, PIDNS %q; want both", holder, sb.PIDNS)
	}
	s := g.start(p, sb, &p.Spec.Containers[0])
	l := g.start(p, sb, &p.Spec.Containers[1])
	g.waitLog(l, "saw-sleeper")
	g.waitLog(l, "init=/") // the holder's argv[0] is the executable's path
	g.waitLog(l, " "+ctrd.PauseCommand)
	sp, lp, hp := nsOf(t, s.Pid, "pid"), nsOf(t, l.Pid, "pid"), nsOf(t, uint32(holder), "pid")
	if sp != lp || sp != hp || sp == nsOf(t, 0, "pid") {
		t.Errorf("pid namespaces: sleeper %s, looker %s, holder %s, host %s; want the holder's, shared", sp, lp, hp, nsOf(t, 0, "pid"))
	}

	o := g.start(p, sb, &p.Spec.Containers[2])
	g.waitLog(o, "orphan-exiting")
	// The orphan exits right after its last words; a holder that reaps clears it at once, one that
	// does not keeps it a zombie past any deadline.
	deadline := time.Now().Add(5 * time.Second)
	for z := zombieChildren(t, holder); len(z) > 0; z = zombieChildren(t, holder) {
		if time.Now().After(deadline) {
			t.Fatalf("the holder (pid %d) left zombie children %v: it does not reap orphans", holder, z)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// zombieChildren lists the pids of ppid's children that are zombies.
func zombieChildren(t *testing.T, ppid int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:])) // state, ppid, ...
		if len(f) > 1 && f[0] == "Z" && f[1] == strconv.Itoa(ppid) {
			out = append(out, pid)
		}
	}
	return out
}

// A container plants symlinks in an emptyDir; a subPath through one pointing out of the volume is
// refused (CVE-2017-1002101), one staying inside works.
func TestSubPathSymlinkOutOfVolumeRefused(t *testing.T) {
	g := newRig(t)
	mount := func(sub string) []v1.VolumeMount { return []v1.VolumeMount{{Name: "v", MountPath: "/x", SubPath: sub}} }
	planter := shell("planter", "mkdir -p /x/data && echo inside > /x/data/f && ln -s /etc /x/evil && ln -s data /x/ok && echo planted; sleep 3600")
	planter.VolumeMounts = mount("")
	victim := shell("victim", "ls /x; sleep 3600")
	victim.VolumeMounts = mount("evil")
	fine := shell("fine", "cat /x/f; sleep 3600")
	fine.VolumeMounts = mount("ok")
	p := newPod("6a0c0004-sub", planter, victim, fine)
	p.Spec.Volumes = []v1.Volume{{Name: "v", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
	sb := g.sandbox(p)
	g.waitLog(g.start(p, sb, &p.Spec.Containers[0]), "planted")

	_, err := g.r.StartContainer(context.Background(), p, sb, &p.Spec.Containers[1], 0)
	var se *ctrd.StartError
	if !errors.As(err, &se) || se.Reason != "CreateContainerConfigError" || !strings.Contains(err.Error(), `subPath "evil"`) {
		t.Errorf("subPath through a symlink to /etc: err = %v, want a CreateContainerConfigError naming subPath \"evil\"", err)
	}
	g.waitLog(g.start(p, sb, &p.Spec.Containers[2]), "inside")
	// The subPaths were staged for runc (mountstage.go); nothing of it outlives the creates.
	if ents, err := os.ReadDir(filepath.Join(g.state, "volume-mounts")); err != nil || len(ents) != 0 {
		t.Errorf("volume mount stages left: %v %v", ents, err)
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), filepath.Join(g.state, "volume-mounts")) {
		t.Errorf("a volume mount stage is still mounted:\n%s", b)
	}
}

// Teardown with no grace given (an orphan) stops each container with its pod's own grace from the
// label, then removes containers and the whole sandbox, found by UID alone.
func TestTeardownOrphanByUID(t *testing.T) {
	g := newRig(t)
	p := newPod("6a0c0005-td", shell("c", "trap 'echo got-term; exit 0' TERM; echo up; while true; do sleep 0.1; done"))
	grace := int64(7)
	p.Spec.TerminationGracePeriodSeconds = &grace
	sb := g.sandbox(p)
	c := g.start(p, sb, &p.Spec.Containers[0])
	g.waitLog(c, "up")
	ctx := context.Background()
	ctrs, err := g.r.ListContainers(ctx, string(p.UID))
	if err != nil || len(ctrs) != 1 {
		t.Fatalf("ListContainers = %v, %v", ctrs, err)
	}
	if ctrs[0].Grace != 7*time.Second {
		t.Errorf("Container.Grace = %s, want the pod's 7s from its label", ctrs[0].Grace)
	}
	if err := pod.Teardown(ctx, g.r, ctrd.PodRef{UID: p.UID}, ctrs, nil, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatalf("Teardown: %v", err)
	}
	if left, err := g.r.ListContainers(ctx, string(p.UID)); err != nil || len(left) != 0 {
		t.Errorf("containers left after Teardown: %v %v", left, err)
	}
	if refs, err := g.r.ListSandboxes(); err != nil || len(refs) != 0 {
		t.Errorf("sandboxes left after Teardown: %v %v", refs, err)
	}
	for _, d := range []string{sb.Dir, sb.LogDir, sb.NetNS, sb.IPCNS} {
		if _, err := os.Lstat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after Teardown: %v", d, err)
		}
	}
}
