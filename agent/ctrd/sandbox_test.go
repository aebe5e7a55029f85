package ctrd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/ctrspec"
	"golang.org/x/sys/unix"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// needRoot skips tests that mount namespaces and tmpfs; they need no containerd.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting namespaces needs root")
	}
}

func sandboxPod(uid, name string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(uid)},
		Spec:       v1.PodSpec{Volumes: []v1.Volume{{Name: "cache", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}},
	}
}

func testSandboxRuntime(t *testing.T) *Runtime {
	return &Runtime{opts: Options{StateDir: t.TempDir(), Namespace: "mqlet-unit-" + strings.ToLower(t.Name())}}
}

// mountedUnder lists the mount points below dir, from the host's mount table.
func mountedUnder(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// The sandbox makes private dirs, pinned namespaces, a shared shm and the emptyDirs; ListSandboxes
// finds it; RemoveSandbox by UID alone removes all of it, twice without error, and a UID that never
// had a sandbox is fine too.
func TestSandboxSetUpListRemove(t *testing.T) {
	needRoot(t)
	r := testSandboxRuntime(t)
	ctx := context.Background()
	pod := sandboxPod("6f1c2d3e-0001", "web")
	other := sandboxPod("x6f1c2d3e-0001", "other") // its UID ends like pod's: must survive pod's removal
	t.Cleanup(func() {
		r.RemoveSandbox(ctx, RefOf(pod))
		r.RemoveSandbox(ctx, RefOf(other))
	})
	sb, err := r.EnsureSandbox(ctx, pod)
	if err != nil {
		t.Fatalf("EnsureSandbox: %v", err)
	}
	if _, err := r.EnsureSandbox(ctx, other); err != nil {
		t.Fatalf("EnsureSandbox(other): %v", err)
	}
	if !sb.Created {
		t.Errorf("a new pod's sandbox is not reported Created")
	}
	for _, d := range []string{sb.Dir, sb.LogDir, filepath.Dir(sb.Dir), filepath.Dir(sb.LogDir)} {
		if m := mode(t, d); m != 0o750 {
			t.Errorf("%s mode = %v, want 0750", d, m)
		}
	}
	if m := mode(t, sb.Volumes["cache"]); m != 0o777 {
		t.Errorf("emptyDir mode = %v, want 0777", m)
	}
	if !isNS(sb.NetNS) || !isNS(sb.IPCNS) {
		t.Errorf("netns %s / ipcns %s are not pinned namespaces", sb.NetNS, sb.IPCNS)
	}
	if b, err := os.ReadFile(sb.HostsFile); err != nil || !strings.Contains(string(b), "127.0.0.1\tlocalhost\n") {
		t.Errorf("hosts file %s: %q %v", sb.HostsFile, b, err)
	}
	if b, err := os.ReadFile(sb.HostnameFile); err != nil || string(b) != "web\n" {
		t.Errorf("hostname file %s: %q %v", sb.HostnameFile, b, err)
	}
	if again, err := r.EnsureSandbox(ctx, pod); err != nil || again.Created {
		t.Errorf("second EnsureSandbox: created=%v err=%v, want an intact sandbox", again != nil && again.Created, err)
	}
	refs, err := r.ListSandboxes()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ref := range refs {
		if ref.UID == pod.UID {
			found = ref.Name == "web" && ref.Namespace == "default"
		}
	}
	if !found || len(refs) != 2 {
		t.Errorf("ListSandboxes = %v, want both pods, web with its name", refs)
	}

	for i := 0; i < 2; i++ {
		if err := r.RemoveSandbox(ctx, PodRef{UID: pod.UID}); err != nil {
			t.Fatalf("RemoveSandbox #%d by UID: %v", i+1, err)
		}
	}
	for _, p := range []string{sb.Dir, sb.LogDir, sb.NetNS, sb.IPCNS} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after RemoveSandbox: %v", p, err)
		}
	}
	for _, m := range mountedUnder(t, r.opts.StateDir) {
		if strings.Contains(m, string(pod.UID)) && !strings.Contains(m, string(other.UID)) {
			t.Errorf("mount %s left after RemoveSandbox", m)
		}
	}
	if refs, _ := r.ListSandboxes(); len(refs) != 1 || refs[0].UID != other.UID {
		t.Errorf("ListSandboxes after removing web = %v, want only other", refs)
	}
	if err := r.RemoveSandbox(ctx, PodRef{UID: "never-set-up"}); err != nil {
		t.Errorf("RemoveSandbox of a pod that never had a sandbox: %v", err)
	}
}

// A UID or name that would leave its directory is refused before anything is made or removed.
func TestSandboxRefusesEscapingNames(t *testing.T) {
	r := testSandboxRuntime(t)
	ctx := context.Background()
	victim := filepath.Join(t.TempDir(), "victim")
	os.MkdirAll(victim, 0o755)
	for _, uid := range []string{"../../../victim", "..", "a/b", ""} {
		if _, err := r.EnsureSandbox(ctx, sandboxPod(uid, "web")); err == nil {
			t.Errorf("EnsureSandbox with UID %q: no error", uid)
		}
		if err := r.RemoveSandbox(ctx, PodRef{UID: types.UID(uid)}); err == nil {
			t.Errorf("RemoveSandbox with UID %q: no error", uid)
		}
	}
	if _, err := r.EnsureSandbox(ctx, sandboxPod("u1", "../x")); err == nil {
		t.Errorf("EnsureSandbox with pod name ../x: no error")
	}
	bad := sandboxPod("u2", "web")
	bad.Spec.Volumes[0].Name = "../../x"
	if _, err := r.EnsureSandbox(ctx, bad); err == nil || !strings.Contains(err.Error(), "../../x") {
		t.Errorf("EnsureSandbox with volume name ../../x: err = %v", err)
	}
	r.RemoveSandbox(ctx, PodRef{UID: "u1"})
	r.RemoveSandbox(ctx, PodRef{UID: "u2"})
	if _, err := os.Stat(victim); err != nil {
		t.Errorf("a directory outside the state dir was touched: %v", err)
	}
}

// A sandbox whose network namespace vanished (a reboot) is made again and reported Created; a
// hostNetwork pod has no namespace to lose, so a boot id different from the recorded one says it.
func TestSandboxRecreated(t *testing.T) {
	needRoot(t)
	r := testSandboxRuntime(t)
	ctx := context.Background()
	pod := sandboxPod("6f1c2d3e-0002", "web")
	host := sandboxPod("6f1c2d3e-0003", "host")
	host.Spec.HostNetwork, host.Spec.HostIPC = true, true
	t.Cleanup(func() { r.RemoveSandbox(ctx, RefOf(pod)); r.RemoveSandbox(ctx, RefOf(host)) })

	sb, err := r.EnsureSandbox(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if err := unmount(sb.NetNS); err != nil {
		t.Fatal(err)
	}
	if sb, err = r.EnsureSandbox(ctx, pod); err != nil || !sb.Created || !isNS(sb.NetNS) {
		t.Errorf("EnsureSandbox after its netns vanished: created=%v pinned=%v err=%v, want a new one", sb != nil && sb.Created, sb != nil && isNS(sb.NetNS), err)
	}

	hsb, err := r.EnsureSandbox(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	if hsb.NetNS != "" || hsb.IPCNS != "" || hsb.Shm != "/dev/shm" {
		t.Errorf("host pod sandbox: netns %q ipcns %q shm %q, want none, none, the host's", hsb.NetNS, hsb.IPCNS, hsb.Shm)
	}
	if hsb, _ = r.EnsureSandbox(ctx, host); hsb.Created {
		t.Errorf("hostNetwork sandbox in the same boot reported Created")
	}
	if err := os.WriteFile(filepath.Join(hsb.Dir, "boot_id"), []byte("an-earlier-boot\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if hsb, err = r.EnsureSandbox(ctx, host); err != nil || !hsb.Created {
		t.Errorf("hostNetwork sandbox after a reboot: created=%v err=%v, want Created", hsb != nil && hsb.Created, err)
	}
}

// A pod an older mqlet set up (no IPC namespace, no boot marker, its network namespace live) is
// not a new sandbox: an upgrade must not restart every pod.
func TestSandboxFromOlderMqletNotRecreated(t *testing.T) {
	needRoot(t)
	r := testSandboxRuntime(t)
	ctx := context.Background()
	pod := sandboxPod("6f1c2d3e-0004", "web")
	t.Cleanup(func() { r.RemoveSandbox(ctx, RefOf(pod)) })
	sb, err := r.EnsureSandbox(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(unmount(filepath.Join(sb.Dir, "shm")), r.dirs().removePodNS(ipcNS(), string(pod.UID)), os.Remove(filepath.Join(sb.Dir, "boot_id"))); err != nil {
		t.Fatal(err)
	}
	if sb, err = r.EnsureSandbox(ctx, pod); err != nil || sb.Created || !isNS(sb.IPCNS) {
		t.Errorf("EnsureSandbox of an older mqlet's pod: created=%v ipc pinned=%v err=%v; want intact, with an IPC namespace now", sb != nil && sb.Created, sb != nil && isNS(sb.IPCNS), err)
	}
}

// readHolder is the pod's recorded PID namespace holder.
func readHolder(t *testing.T, sb *Sandbox) holder {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(sb.Dir, holderFile))
	if err != nil {
		t.Fatalf("holder record: %v", err)
	}
	hd, err := parseHolder(b)
	if err != nil {
		t.Fatalf("holder record: %v", err)
	}
	return hd
}

// pinnedTo reports whether the pinned namespace at pin is pid's PID namespace.
func pinnedTo(t *testing.T, pin string, pid int) bool {
	t.Helper()
	var a, b unix.Stat_t
	if err := unix.Stat(pin, &a); err != nil {
		t.Fatalf("stat %s: %v", pin, err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/pid", pid), &b); err != nil {
		t.Fatalf("PID namespace of %d: %v", pid, err)
	}
	return isNS(pin) && a.Dev == b.Dev && a.Ino == b.Ino
}

// waitGone waits until the holder no longer runs.
func waitGone(t *testing.T, hd holder) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); hd.alive(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("holder pid %d still runs", hd.pid)
		}
	}
}

// A pod with shareProcessNamespace gets a holder process as PID 1 of a new PID namespace, pinned;
// SIGTERM does not stop it; a restarted agent's Prerun finds it again. Killed by hand, it is replaced and the
// sandbox is reported Created (its containers died with it). RemoveSandbox by UID stops it and
// leaves nothing, twice without error.
func TestSharedPIDNamespaceHolder(t *testing.T) {
	needRoot(t)
	r := testSandboxRuntime(t)
	r.opts.Executable = testExecutable(t)
	ctx := context.Background()
	pod := sandboxPod("6f1c2d3e-0005", "shared")
	share := true
	pod.Spec.ShareProcessNamespace = &share
	var started []holder // stopped at the end even if RemoveSandbox fails to
	t.Cleanup(func() {
		r.RemoveSandbox(ctx, RefOf(pod))
		for _, hd := range started {
			killHolder(hd)
		}
		RemoveCgroupTree(filepath.Join("/mqlet", r.opts.Namespace))
	})

	sb, err := r.EnsureSandbox(ctx, pod)
	if err != nil {
		t.Fatalf("EnsureSandbox: %v", err)
	}
	first := readHolder(t, sb)
	started = append(started, first)
	if !first.alive() || !pinnedTo(t, sb.PIDNS, first.pid) {
		t.Fatalf("holder %+v alive=%v, PIDNS %q: want a live holder whose namespace is pinned", first, first.alive(), sb.PIDNS)
	}
	if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", first.pid)); !strings.Contains(string(cmd), PauseCommand) {
		t.Errorf("holder cmdline = %q, want %s", cmd, PauseCommand)
	}
	// Out of the agent's (here the test's) cgroup, in a leaf of the pod's, in every hierarchy.
	cgs, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", first.pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Fields(string(cgs)) {
		if want := "pod" + string(pod.UID) + "/" + holderCgroup; !strings.HasSuffix(line, want) {
			t.Errorf("holder cgroup %s, want one ending in %s", line, want)
		}
	}
	if pinnedTo(t, sb.PIDNS, os.Getpid()) {
		t.Errorf("the pinned PID namespace is the test's own")
	}
	// SIGTERM is ignored (SIG_IGN, so the kernel drops it): read the mask rather than wait and see.
	// The holder sets it as it starts up, so wait (bounded) for that; one that never does fails.
	for deadline := time.Now().Add(5 * time.Second); !ignores(t, first.pid, unix.SIGTERM); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("holder pid %d does not ignore SIGTERM", first.pid)
		}
	}
	if err := unix.Kill(first.pid, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if !first.alive() {
		t.Fatalf("holder pid %d stopped on SIGTERM; it must ignore it", first.pid)
	}
	restarted := &Runtime{opts: r.opts} // an agent restart: nothing in memory, the state dir kept
	again, err := restarted.EnsureSandbox(ctx, pod)
	if err != nil || again.Created || readHolder(t, again) != first || again.PIDNS != sb.PIDNS {
		t.Fatalf("EnsureSandbox after an agent restart: created=%v err=%v; want the same holder %+v, intact", again != nil && again.Created, err, first)
	}

	if err := unix.Kill(first.pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, first)
	sb, err = r.EnsureSandbox(ctx, pod)
	if err != nil {
		t.Fatalf("EnsureSandbox after the holder was killed: %v", err)
	}
	second := readHolder(t, sb)
	started = append(started, second)
	if !sb.Created || second == first || !second.alive() || !pinnedTo(t, sb.PIDNS, second.pid) {
		t.Fatalf("EnsureSandbox after the holder was killed: created=%v holder %+v (was %+v) alive=%v; want Created with a new, pinned holder",
			sb.Created, second, first, second.alive())
	}

	for i := 0; i < 2; i++ {
		if err := r.RemoveSandbox(ctx, PodRef{UID: pod.UID}); err != nil {
			t.Fatalf("RemoveSandbox #%d: %v", i+1, err)
		}
	}
	if second.alive() {
		t.Errorf("holder pid %d still runs after RemoveSandbox", second.pid)
	}
	for _, p := range []string{sb.PIDNS, sb.Dir} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after RemoveSandbox: %v", p, err)
		}
	}
	if refs, err := r.ListSandboxes(); err != nil || len(refs) != 0 {
		t.Errorf("ListSandboxes after RemoveSandbox = %v, %v; want none (no pin, no cgroup left)", refs, err)
	}
}

// Without the mqlet executable there is no holder: the sandbox has no PID namespace, and the
// containers' spec is refused (a CreateContainerConfigError) rather than run apart.
func TestSharedPIDNamespaceWithoutExecutable(t *testing.T) {
	needRoot(t)
	r := testSandboxRuntime(t)
	ctx := context.Background()
	pod := sandboxPod("6f1c2d3e-0006", "shared")
	share := true
	pod.Spec.ShareProcessNamespace = &share
	t.Cleanup(func() { r.RemoveSandbox(ctx, RefOf(pod)) })
	sb, err := r.EnsureSandbox(ctx, pod)
	if err != nil {
		t.Fatalf("EnsureSandbox: %v", err)
	}
	if _, err := os.Stat(filepath.Join(sb.Dir, holderFile)); sb.PIDNS != "" || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("PIDNS = %q, holder record: %v; want neither", sb.PIDNS, err)
	}
	_, err = ctrspec.NamespaceOpts(pod, sb.namespaces())
	var ce *ctrspec.ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "shareProcessNamespace") {
		t.Errorf("namespaceOpts: err = %v, want a ConfigError naming shareProcessNamespace", err)
	}
}

// ignores reports whether process pid has sig set to SIG_IGN (the SigIgn mask of /proc/PID/status).
func ignores(t *testing.T, pid int, sig unix.Signal) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if hex, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err != nil {
				t.Fatalf("SigIgn of pid %d: %v", pid, err)
			}
			return mask&(1<<(uint(sig)-1)) != 0
		}
	}
	t.Fatalf("/proc/%d/status has no SigIgn", pid)
	return false
}
