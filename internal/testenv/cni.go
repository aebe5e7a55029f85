package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/internal/netclean"
)

// CNIPlugins is where Debian's containernetworking-plugins installs the plugins the tests run.
const CNIPlugins = "/usr/lib/cni"

// CNINet is one test's own CNI network: its own bridge, subnet, host-local data dir and
// configuration directory, so tests that run at the same time never share an address or a rule.
type CNINet struct {
	Name    string // network name (in iptables comments and chain hashes)
	Bridge  string
	Subnet  *net.IPNet
	ConfDir string // holds the network's conflist
	DataDir string // host-local's allocations: one file per address in use
	BinDir  string // a private plugin dir of symlinks into CNIPlugins (see RemovePlugin)
}

// NewCNINet makes a network with mqlet's default plugin chain (bridge, host-local, portmap,
// loopback) written by the caller's conflist function, and removes the bridge, the host-local
// files and any iptables rule naming the network at the end of the test. It fails (or skips, as
// Require does) when the plugins or iptables are missing or the test is not root.
func NewCNINet(t testing.TB, conflist func(n *CNINet) []byte) *CNINet {
	t.Helper()
	if testing.Short() {
		t.Skip("needs real CNI plugins; skipped with -short (make unit)")
	}
	var missing []string
	for _, p := range []string{"bridge", "host-local", "portmap", "loopback"} {
		if _, err := os.Stat(filepath.Join(CNIPlugins, p)); err != nil {
			missing = append(missing, p)
		}
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		missing = append(missing, "iptables")
	}
	if len(missing) > 0 || os.Geteuid() != 0 {
		msg := fmt.Sprintf("CNI tests need root, iptables and the plugins in %s (apt-get install containernetworking-plugins iptables); missing: %v", CNIPlugins, missing)
		if os.Getenv(VarRequire) == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	var b [4]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	dir := t.TempDir()
	n := &CNINet{Name: "mqlet-test-" + id, Bridge: "mqt" + id, ConfDir: filepath.Join(dir, "net.d"),
		DataDir: filepath.Join(dir, "ipam"), BinDir: filepath.Join(dir, "bin"), Subnet: freeSubnet(t)}
	for _, d := range []string{n.ConfDir, n.BinDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := os.ReadDir(CNIPlugins)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.Symlink(filepath.Join(CNIPlugins, e.Name()), filepath.Join(n.BinDir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	sharedBefore := natChains(t)
	t.Cleanup(func() { n.cleanup(t, sharedBefore) })
	if err := os.WriteFile(filepath.Join(n.ConfDir, "10-"+n.Name+".conflist"), conflist(n), 0o644); err != nil {
		t.Fatal(err)
	}
	return n
}

// RemovePlugin takes a plugin out of the network's bin dir; RestorePlugin puts it back.
func (n *CNINet) RemovePlugin(t testing.TB, name string) {
	t.Helper()
	if err := os.Remove(filepath.Join(n.BinDir, name)); err != nil {
		t.Fatal(err)
	}
}

func (n *CNINet) RestorePlugin(t testing.TB, name string) {
	t.Helper()
	if err := os.Symlink(filepath.Join(CNIPlugins, name), filepath.Join(n.BinDir, name)); err != nil {
		t.Fatal(err)
	}
}

// Allocated lists the addresses host-local holds in the network's data dir.
func (n *CNINet) Allocated(t testing.TB) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(n.DataDir, n.Name))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if net.ParseIP(e.Name()) != nil {
			out = append(out, e.Name())
		}
	}
	return out
}

// Rules returns the iptables rules (nat and filter) that name the network: the NAT of its pods
// and their host ports, which DEL must remove.
func (n *CNINet) Rules(t testing.TB) []string {
	t.Helper()
	var out []string
	for _, table := range []string{"nat", "filter"} {
		rules, err := netclean.Rules(table, n.Name)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rules {
			out = append(out, table+": "+r)
		}
	}
	return out
}

// cleanup removes what the test's pods may have left (their teardown removes it all when the test
// passes): the bridge, the rules naming the network and the per-pod chains they jump to, and
// portmap's shared chains when this test made them and no pod of any network uses them.
func (n *CNINet) cleanup(t testing.TB, sharedBefore []string) {
	n.SimulateReboot(t)
	b, _ := exec.Command("iptables", "-w", "-t", "nat", "-S").CombinedOutput()
	if strings.Contains(string(b), "--comment \"name: ") {
		return // some network's pods are still attached: its host ports may need the shared chains
	}
	for _, c := range natChains(t) {
		if strings.HasPrefix(c, "CNI-HOSTPORT-") && !slices.Contains(sharedBefore, c) {
			dropJumps(t, c)
			exec.Command("iptables", "-w", "-t", "nat", "-F", c).Run()
			exec.Command("iptables", "-w", "-t", "nat", "-X", c).Run()
		}
	}
}

// SimulateReboot removes what a reboot takes from the network: its bridge, and the iptables rules
// naming it with the per-pod chains they jump to. (The caller replaces the pods' namespaces.)
func (n *CNINet) SimulateReboot(t testing.TB) {
	if err := netclean.Network(n.Bridge, n.Name); err != nil {
		t.Logf("remove network %s: %v", n.Name, err)
	}
}

func natChains(t testing.TB) []string {
	b, err := exec.Command("iptables", "-w", "-t", "nat", "-S").CombinedOutput()
	if err != nil {
		t.Logf("iptables -t nat -S: %v %s", err, b)
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if c, ok := strings.CutPrefix(l, "-N "); ok {
			out = append(out, c)
		}
	}
	return out
}

// dropJumps deletes every nat rule that jumps to chain.
func dropJumps(t testing.TB, chain string) {
	b, _ := exec.Command("iptables", "-w", "-t", "nat", "-S").CombinedOutput()
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "-A ") && strings.HasSuffix(l, "-j "+chain) {
			args := append([]string{"-w", "-t", "nat", "-D"}, netclean.SplitRule(strings.TrimPrefix(l, "-A "))...)
			exec.Command("iptables", args...).Run()
		}
	}
}

// freeSubnet picks a /24 in 10.123.0.0/16 that no host address or route overlaps.
func freeSubnet(t testing.TB) *net.IPNet {
	t.Helper()
	used := map[byte]bool{}
	if out, err := exec.Command("ip", "-4", "route", "show", "table", "all").CombinedOutput(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], "10.123.") {
				parts := strings.Split(strings.Split(f[0], "/")[0], ".")
				var x int
				fmt.Sscan(parts[2], &x)
				used[byte(x)] = true
			}
		}
	}
	for range 100 {
		var b [1]byte
		rand.Read(b[:])
		if b[0] < 10 || b[0] > 250 || used[b[0]] {
			continue
		}
		_, n, _ := net.ParseCIDR(fmt.Sprintf("10.123.%d.0/24", b[0]))
		return n
	}
	t.Fatal("no free /24 in 10.123.0.0/16 for a test network")
	return nil
}
