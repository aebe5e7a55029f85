package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/mqlet/mqlet/agent/cni"
	"github.com/mqlet/mqlet/internal/testenv"
	"golang.org/x/sys/unix"
)

// `mqlet uninstall --purge` (what the .deb's purge runs) removes what mqlet made on the host and
// nothing else: the pods (their processes, containers, network attachment, cgroups), the images and
// the containerd namespace, the default network's conflist, its mqlet0 bridge and the iptables
// rules naming it, the node key and the state dir; it keeps the manifests. It refuses while the
// agent runs. The agent and the uninstall run in a network namespace of the test's own, so the
// default bridge and rules are real (mqlet0, network "mqlet") without touching the host's.
func TestUninstallPurge(t *testing.T) {
	h := newHarness(t)
	netns := privateNetns(t, h.dir)
	enter := []string{"nsenter", "--net=" + netns, "--"}
	h.agentPrefix = enter
	// An empty CNI conf dir: the agent writes its default network (bridge mqlet0) there.
	h.cniConfDir = filepath.Join(h.dir, "net.d-default")
	h.cniBinDir = testenv.CNIPlugins
	h.writeManifest("web.yaml", twoContainers)
	h.startAgent()
	h.waitPod("web", "running", allRunning)
	pids := h.tasks()
	inNetns := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(enter[0], append(append(enter[1:], args[0]), args[1:]...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	uninstall := func() (string, error) {
		args := append(append(append([]string{}, enter...), h.bin, "uninstall", "--purge"), h.flags()...)
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		return string(out), err
	}
	conflist := filepath.Join(h.cniConfDir, cni.DefaultConfFile)
	made := []string{conflist, h.state, filepath.Join(h.dir, "node.key")}
	for _, p := range made {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("before uninstall: %v", err)
		}
	}
	if !strings.Contains(inNetns("ip", "link", "show"), "mqlet0") {
		t.Fatal("no mqlet0 bridge in the agent's network namespace")
	}
	if !strings.Contains(inNetns("iptables-save", "-t", "nat"), `name: \"mqlet\"`) {
		t.Fatal("no iptables rule naming the network mqlet")
	}

	// While the agent runs: refused, nothing removed.
	if out, err := uninstall(); err == nil || !strings.Contains(out, "agent is running") {
		t.Fatalf("uninstall --purge with the agent running: %v\n%s", err, out)
	}
	h.undisturbed("web", pids)

	h.stopAgent() // pods keep running
	// As if an agent had died in the middle of a teardown: the pod's CNI record is gone, so no CNI
	// DEL removes its rules; the purge must find them by the network's name.
	if err := os.RemoveAll(filepath.Join(h.state, "cni", "pods")); err != nil {
		t.Fatal(err)
	}
	out, err := uninstall()
	t.Logf("mqlet uninstall --purge:\n%s", out)
	if err != nil {
		t.Fatalf("uninstall --purge: %v", err)
	}
	for name, pid := range pids {
		if err := syscall.Kill(int(pid), 0); err == nil {
			t.Errorf("container %s (pid %d) still runs", name, pid)
		}
	}
	if ns, _ := h.mqletErr("image", "ls"); strings.Contains(ns, "busybox") {
		t.Errorf("images left in namespace %s:\n%s", h.ns, ns)
	}
	ctr, _ := exec.Command("ctr", "--address", h.env.ContainerdAddress, "namespaces", "ls", "-q").CombinedOutput()
	if strings.Contains(string(ctr), h.ns) {
		t.Errorf("containerd namespace %s still there", h.ns)
	}
	for _, p := range made {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s still there", p)
		}
	}
	if _, err := os.Stat(filepath.Join(h.manifests, "web.yaml")); err != nil {
		t.Errorf("the manifest was removed: %v", err)
	}
	if links := inNetns("ip", "link", "show"); strings.Contains(links, "mqlet0") {
		t.Errorf("mqlet0 still there:\n%s", links)
	}
	for _, table := range []string{"nat", "filter"} {
		if rules := inNetns("iptables-save", "-t", table); strings.Contains(rules, `name: \"mqlet\"`) || strings.Contains(rules, ":CNI-") && !strings.Contains(rules, ":CNI-HOSTPORT") {
			t.Errorf("rules of network mqlet left in table %s:\n%s", table, rules)
		}
	}
	for _, hier := range cgroupHierarchies(t) {
		if _, err := os.Stat(filepath.Join(hier, "mqlet", h.ns)); err == nil {
			t.Errorf("cgroup %s still there", filepath.Join(hier, "mqlet", h.ns))
		}
	}
	// A second purge finds nothing to do and succeeds.
	if out, err := uninstall(); err != nil {
		t.Errorf("second uninstall --purge: %v\n%s", err, out)
	}
}

// privateNetns makes a network namespace pinned at dir/netns (unmounted at the end of the test).
func privateNetns(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "netns")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("unshare", "--net="+path, "true").CombinedOutput(); err != nil {
		t.Fatalf("unshare --net=%s: %v\n%s", path, err, out)
	}
	t.Cleanup(func() { unix.Unmount(path, unix.MNT_DETACH) })
	return path
}

// cgroupHierarchies lists the mount points of the host's cgroup hierarchies.
func cgroupHierarchies(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		for i, x := range f {
			if x == "-" && i+1 < len(f) && (f[i+1] == "cgroup" || f[i+1] == "cgroup2") {
				out = append(out, f[4])
			}
		}
	}
	return out
}
