package cni

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
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
		goruntime.LockOSThread()
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
