package cni

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/mqlet/mqlet/internal/testenv"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// testNet is a private network with mqlet's default chain, on its own bridge and subnet.
func testNet(t *testing.T) *testenv.CNINet {
	return testenv.NewCNINet(t, func(n *testenv.CNINet) []byte {
		b, err := DefaultNetwork{Name: n.Name, Bridge: n.Bridge, Subnet: n.Subnet.String(), DataDir: n.DataDir}.ConfList()
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}

func testManager(t *testing.T, n *testenv.CNINet, state string) *Manager {
	return New(Options{ConfDir: n.ConfDir, BinDirs: []string{n.BinDir}, StateDir: state})
}

// pinNetns makes a network namespace pinned at path, as the runtime's sandbox does, and releases
// it at the end of the test.
func pinNetns(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o400)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// The thread ends still locked and so is thrown away, never reused in the new namespace.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "none", unix.MS_BIND, "")
	}()
	if err := <-errc; err != nil {
		t.Fatalf("pin a network namespace at %s: %v", path, err)
	}
	t.Cleanup(func() { unix.Unmount(path, unix.MNT_DETACH); os.Remove(path) })
}

func unpinNetns(t *testing.T, path string) {
	t.Helper()
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
}

func testPod(name string, ports ...v1.ContainerPort) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "busybox", Ports: ports}}}}
}

// inNetns runs a command inside the namespace pinned at path.
func inNetns(t *testing.T, path string, args ...string) string {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + path}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nsenter --net=%s %v: %v\n%s", path, args, err, out)
	}
	return string(out)
}

// Two pods get distinct addresses from the subnet on eth0, with a route through the bridge; DEL
// frees both addresses and every NAT rule.
func TestSetupTeardownRealPlugins(t *testing.T) {
	n := testNet(t)
	state := t.TempDir()
	m := testManager(t, n, filepath.Join(state, "cni"))
	ctx := context.Background()
	var ips []string
	for _, name := range []string{"a", "b"} {
		ns := filepath.Join(state, "ns-"+name)
		pinNetns(t, ns)
		got, err := m.Setup(ctx, testPod(name), ns, true)
		if err != nil {
			t.Fatalf("Setup %s: %v", name, err)
		}
		if len(got) != 1 || !n.Subnet.Contains(net.ParseIP(got[0])) {
			t.Fatalf("pod %s IPs = %v, want one address in %s", name, got, n.Subnet)
		}
		if addr := inNetns(t, ns, "ip", "-4", "addr", "show", "dev", "eth0"); !strings.Contains(addr, got[0]+"/") {
			t.Errorf("eth0 in pod %s lacks %s:\n%s", name, got[0], addr)
		}
		if lo := inNetns(t, ns, "ip", "link", "show", "lo"); !strings.Contains(lo, "UP") {
			t.Errorf("lo in pod %s is not up:\n%s", name, lo)
		}
		ips = append(ips, got[0])
	}
	if ips[0] == ips[1] {
		t.Fatalf("both pods got %s", ips[0])
	}
	if got := n.Allocated(t); len(got) != 2 {
		t.Fatalf("host-local holds %v, want the two pods' addresses", got)
	}
	if uids, err := m.Pods(); err != nil || !slices.Equal(uids, []string{"uid-a", "uid-b"}) {
		t.Errorf("Pods = %v, %v", uids, err)
	}
	if len(n.Rules(t)) == 0 {
		t.Error("no masquerading rule names the network (ipMasq)")
	}
	for _, name := range []string{"a", "b"} {
		if err := m.Teardown(ctx, "uid-"+name, filepath.Join(state, "ns-"+name)); err != nil {
			t.Fatalf("Teardown %s: %v", name, err)
		}
	}
	if got := n.Allocated(t); len(got) != 0 {
		t.Errorf("addresses still held after DEL: %v", got)
	}
	if r := n.Rules(t); len(r) != 0 {
		t.Errorf("rules left after DEL:\n%s", strings.Join(r, "\n"))
	}
	if uids, _ := m.Pods(); len(uids) != 0 {
		t.Errorf("records left after DEL: %v", uids)
	}
	// Teardown of a pod never attached is no error.
	if err := m.Teardown(ctx, "uid-never", ""); err != nil {
		t.Errorf("Teardown of a pod never attached: %v", err)
	}
}

// A restarted agent (a new Manager) finds the namespace intact: the pod keeps its address and
// nothing is attached twice. After a reboot (a new namespace at the same pin) the old address is
// released before the new ADD, so host-local holds one address for the pod, never two.
func TestSetupAdoptsAndRedoesAfterReboot(t *testing.T) {
	n := testNet(t)
	state := t.TempDir()
	ctx := context.Background()
	ns := filepath.Join(state, "ns")
	pinNetns(t, ns)
	pod := testPod("p")
	first, err := testManager(t, n, filepath.Join(state, "cni")).Setup(ctx, pod, ns, true)
	if err != nil {
		t.Fatal(err)
	}
	restarted := testManager(t, n, filepath.Join(state, "cni"))
	again, err := restarted.Setup(ctx, pod, ns, false)
	if err != nil {
		t.Fatalf("Setup after a restart: %v", err)
	}
	if !slices.Equal(first, again) {
		t.Errorf("IPs after an agent restart = %v, want %v", again, first)
	}
	if got := n.Allocated(t); len(got) != 1 {
		t.Errorf("host-local holds %v after adoption, want one address", got)
	}
	if links := inNetns(t, ns, "ip", "-o", "link"); strings.Count(links, "eth0@") != 1 {
		t.Errorf("pod interfaces after adoption:\n%s", links)
	}

	// Reboot: the pin is replaced by a new, empty namespace; the bridge and the NAT rules go too.
	unpinNetns(t, ns)
	n.SimulateReboot(t)
	pinNetns(t, ns)
	booted := testManager(t, n, filepath.Join(state, "cni"))
	after, err := booted.Setup(ctx, pod, ns, true)
	if err != nil {
		t.Fatalf("Setup after a reboot: %v", err)
	}
	if len(after) != 1 {
		t.Fatalf("IPs after a reboot = %v", after)
	}
	if got := n.Allocated(t); len(got) != 1 || got[0] != after[0] {
		t.Errorf("host-local holds %v after the reboot, want only %s (the old address released)", got, after[0])
	}
	if addr := inNetns(t, ns, "ip", "-4", "addr", "show", "dev", "eth0"); !strings.Contains(addr, after[0]+"/") {
		t.Errorf("new namespace's eth0 lacks %s:\n%s", after[0], addr)
	}
	if err := booted.Teardown(ctx, string(pod.UID), ns); err != nil {
		t.Fatal(err)
	}
	if got := n.Allocated(t); len(got) != 0 {
		t.Errorf("addresses left: %v", got)
	}
}

// A missing plugin: Ready and Setup name it and the file that wants it, nothing is left half
// made, and Setup works once the plugin is back.
func TestMissingPluginNamedAndRecovered(t *testing.T) {
	n := testNet(t)
	state := t.TempDir()
	ctx := context.Background()
	ns := filepath.Join(state, "ns")
	pinNetns(t, ns)
	m := testManager(t, n, filepath.Join(state, "cni"))
	n.RemovePlugin(t, "portmap")
	for what, err := range map[string]error{"Ready": m.Ready(), "Setup": func() error { _, err := m.Setup(ctx, testPod("p"), ns, true); return err }()} {
		if err == nil || !strings.Contains(err.Error(), `"portmap"`) || !strings.Contains(err.Error(), n.ConfDir) {
			t.Errorf("%s with portmap missing: %v; want the plugin and the configuration file named", what, err)
		}
	}
	if got := n.Allocated(t); len(got) != 0 {
		t.Errorf("addresses held after a refused ADD: %v", got)
	}
	n.RestorePlugin(t, "portmap")
	if err := m.Ready(); err != nil {
		t.Errorf("Ready after the plugin is back: %v", err)
	}
	ips, err := m.Setup(ctx, testPod("p"), ns, true)
	if err != nil || len(ips) != 1 {
		t.Fatalf("Setup after the plugin is back: %v %v", ips, err)
	}
	if err := m.Teardown(ctx, "uid-p", ns); err != nil {
		t.Fatal(err)
	}
}

// A plugin that fails after the bridge (tuning with a sysctl the kernel lacks) leaves no address
// held and no record: the failed ADD is cleaned up with DEL.
func TestFailedAddIsCleanedUp(t *testing.T) {
	n := testenv.NewCNINet(t, func(n *testenv.CNINet) []byte {
		b, _ := DefaultNetwork{Name: n.Name, Bridge: n.Bridge, Subnet: n.Subnet.String(), DataDir: n.DataDir}.ConfList()
		var conf map[string]any
		json.Unmarshal(b, &conf)
		conf["plugins"] = append(conf["plugins"].([]any), map[string]any{"type": "tuning", "sysctl": map[string]string{"net.ipv4.conf.eth0.no_such_knob": "1"}})
		b, _ = json.Marshal(conf)
		return b
	})
	state := t.TempDir()
	ns := filepath.Join(state, "ns")
	pinNetns(t, ns)
	m := testManager(t, n, filepath.Join(state, "cni"))
	_, err := m.Setup(context.Background(), testPod("p"), ns, true)
	if err == nil || !strings.Contains(err.Error(), "tuning") {
		t.Fatalf("Setup with a failing tuning plugin: %v", err)
	}
	if got := n.Allocated(t); len(got) != 0 {
		t.Errorf("addresses held after a failed ADD: %v", got)
	}
	if uids, _ := m.Pods(); len(uids) != 0 {
		t.Errorf("records left after a failed ADD that DEL cleaned up: %v", uids)
	}
	if r := n.Rules(t); len(r) != 0 {
		t.Errorf("rules left after a failed ADD:\n%s", strings.Join(r, "\n"))
	}
}

// An invalid configuration file is named with what is wrong; when a valid one sorts after it, it
// is used, as containerd's CRI does.
func TestLoadNetworkNamesBadFile(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "05-bad.conflist")
	os.WriteFile(bad, []byte(`{"cniVersion":"1.0.0","name":"x","plugins":[{"bridge":"b"}]}`), 0o644)
	_, err := loadNetwork(dir)
	if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "type") {
		t.Fatalf("loadNetwork with only a bad file: %v; want the file and the missing type named", err)
	}
	if _, err := loadNetwork(filepath.Join(dir, "none")); err == nil || !strings.Contains(err.Error(), "no CNI network configuration") {
		t.Errorf("loadNetwork of a missing dir: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "10-good.conf"), []byte(`{"cniVersion":"1.0.0","name":"good","type":"loopback"}`), 0o644)
	n, err := loadNetwork(dir)
	if err != nil || n.list.Name != "good" || len(n.list.Plugins) != 1 {
		t.Fatalf("loadNetwork with a good .conf after a bad file: %+v %v", n, err)
	}
	// What a record keeps loads back to the same chain.
	again, err := libcni.NetworkConfFromBytes(n.bytes)
	if err != nil || again.Name != "good" || again.Plugins[0].Network.Type != "loopback" {
		t.Errorf("stored conf reloads as %+v, %v", again, err)
	}
}

// A pod whose interface was deleted while the agent was down (`ip link del` of its veth) is not
// adopted with its old address and no network: the attachment is released and made again, so the
// namespace has eth0 with the address Setup returns, and host-local holds that one address only.
// Before, the failed CHECK was logged ("keeping it") and the pod kept an address it no longer had.
func TestAdoptRepairsLostInterface(t *testing.T) {
	n := testNet(t)
	state := t.TempDir()
	ctx := context.Background()
	ns := filepath.Join(state, "ns")
	pinNetns(t, ns)
	pod := testPod("p")
	if _, err := testManager(t, n, filepath.Join(state, "cni")).Setup(ctx, pod, ns, true); err != nil {
		t.Fatal(err)
	}
	inNetns(t, ns, "ip", "link", "del", "eth0") // takes the host's end of the veth with it

	restarted := testManager(t, n, filepath.Join(state, "cni"))
	got, err := restarted.Setup(ctx, pod, ns, false)
	if err != nil {
		t.Fatalf("Setup after the interface went: %v", err)
	}
	if len(got) != 1 {
		t.Fatalf("IPs = %v, want one", got)
	}
	if addr := inNetns(t, ns, "ip", "-4", "addr", "show", "dev", "eth0"); !strings.Contains(addr, got[0]+"/") {
		t.Errorf("eth0 after the repair lacks %s:\n%s", got[0], addr)
	}
	if held := n.Allocated(t); len(held) != 1 || held[0] != got[0] {
		t.Errorf("host-local holds %v, want only %s", held, got[0])
	}
	// The first address's NAT rule went with the repair's DEL: the pod's removal cleans up fully.
	if err := restarted.Teardown(ctx, string(pod.UID), ns); err != nil {
		t.Fatal(err)
	}
	if r := n.Rules(t); len(r) != 0 {
		t.Errorf("rules left after the pod went:\n%s", strings.Join(r, "\n"))
	}
	if held := n.Allocated(t); len(held) != 0 {
		t.Errorf("addresses left after the pod went: %v", held)
	}
}

// A teardown killed after its DEL leaves a record that is not taken for a live attachment: the
// next Setup releases it and attaches the pod again, and host-local holds one address, the pod's.
// The kill is simulated by a portmap wrapper that copies the pod's CNI dir when DEL reaches it
// (the first plugin DEL runs), and putting that copy back after the teardown.
func TestInterruptedTeardownNotAdopted(t *testing.T) {
	n := testNet(t)
	state := t.TempDir()
	ctx := context.Background()
	ns := filepath.Join(state, "ns")
	pinNetns(t, ns)
	pod := testPod("p")
	cniDir := filepath.Join(state, "cni")
	podDir := filepath.Join(cniDir, string(pod.UID))
	snapshot := filepath.Join(state, "at-del")
	real, err := os.Readlink(filepath.Join(n.BinDir, "portmap"))
	if err != nil {
		t.Fatal(err)
	}
	wrapper := fmt.Sprintf("#!/bin/sh\nif [ \"$CNI_COMMAND\" = DEL ] && [ ! -e %s ]; then cp -a %s %s; fi\nexec %s \"$@\"\n", snapshot, podDir, snapshot, real)
	if err := os.Remove(filepath.Join(n.BinDir, "portmap")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.BinDir, "portmap"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	m := testManager(t, n, cniDir)
	if _, err := m.Setup(ctx, pod, ns, true); err != nil {
		t.Fatal(err)
	}
	if err := m.Teardown(ctx, string(pod.UID), ns); err != nil {
		t.Fatal(err)
	}
	if held := n.Allocated(t); len(held) != 0 {
		t.Fatalf("host-local holds %v after the teardown", held)
	}
	// The agent was killed at that DEL: what it left is the dir as the DEL found it.
	if err := os.Rename(snapshot, podDir); err != nil {
		t.Fatalf("the wrapper did not copy the pod's CNI dir at DEL: %v", err)
	}

	restarted := testManager(t, n, cniDir)
	got, err := restarted.Setup(ctx, pod, ns, false)
	if err != nil {
		t.Fatalf("Setup after the interrupted teardown: %v", err)
	}
	if held := n.Allocated(t); len(got) != 1 || len(held) != 1 || held[0] != got[0] {
		t.Errorf("Setup gave %v and host-local holds %v: want the pod's one address held", got, held)
	}
	if addr := inNetns(t, ns, "ip", "-4", "addr", "show", "dev", "eth0"); len(got) == 1 && !strings.Contains(addr, got[0]+"/") {
		t.Errorf("eth0 lacks %v:\n%s", got, addr)
	}
	if err := restarted.Teardown(ctx, string(pod.UID), ns); err != nil {
		t.Fatal(err)
	}
}
