package node

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/internal/testenv"
)

// machineConfig is a node of this machine on the test's containerd namespace, with its state,
// manifests, socket, node key and a loopback-only CNI network in a temp dir.
func machineConfig(t *testing.T) config.Config {
	t.Helper()
	env := testenv.Require(t)
	dir, err := os.MkdirTemp("", "mqn") // short: unix socket paths stop at 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := config.Defaults()
	cfg.NodeName = "node-test"
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.ContainerdAddress = env.ContainerdAddress
	cfg.ContainerdNamespace = testenv.Namespace(t, env.ContainerdAddress)
	cfg.ManifestDir = filepath.Join(dir, "pods")
	cfg.ImagePreloadDir = filepath.Join(dir, "preload")
	cfg.APISocket = filepath.Join(dir, "api.sock")
	cfg.SecretKeyFile = filepath.Join(dir, "node.key")
	cfg.ImageFSDir = dir
	cfg.CNIConfDir = filepath.Join(dir, "net.d")
	os.MkdirAll(cfg.ManifestDir, 0o755)
	os.MkdirAll(cfg.StateDir, 0o700)
	os.MkdirAll(cfg.CNIConfDir, 0o755)
	os.WriteFile(filepath.Join(cfg.CNIConfDir, "99-loopback.conflist"),
		[]byte(`{"cniVersion": "1.0.0", "name": "mqlet-node-test", "plugins": [{"type": "loopback"}]}`), 0o644)
	return cfg
}

// goroutinesIn counts the goroutines whose stack passes through fn.
func goroutinesIn(fn string) int {
	var b strings.Builder
	pprof.Lookup("goroutine").WriteTo(&b, 2)
	n := 0
	for _, g := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(g, fn) {
			n++
		}
	}
	return n
}

const notifierLoop = "eviction.(*KernelNotifier).loop"

// New that fails part-way (--metrics-address taken) leaves nothing of the node behind: the
// eviction manager's kernel memory notifier, made before the metrics listener, is released too
// (the old AgentCmd.Run's deferred cancel ended it through the eviction manager).
func TestNewFailingPartWayReleasesWhatItMade(t *testing.T) {
	cfg := machineConfig(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg.MetricsAddress = taken.Addr().String()
	before := goroutinesIn(notifierLoop)
	n, err := New(context.Background(), cfg, Deps{})
	if err == nil {
		n.Close()
		t.Fatal("New with --metrics-address taken: no error")
	}
	if !strings.Contains(err.Error(), "--metrics-address") {
		t.Errorf("error does not name --metrics-address: %v", err)
	}
	if got := goroutinesIn(notifierLoop); got != before {
		t.Errorf("%d kernel memory notifier goroutines after New failed, %d before", got, before)
	}
}

// A node built and closed without running releases what New made: the kernel memory notifier
// and the --metrics-address listener (the address can be listened on again).
func TestCloseUnrunReleasesWhatNewMade(t *testing.T) {
	cfg := machineConfig(t)
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.MetricsAddress = free.Addr().String()
	free.Close()
	before := goroutinesIn(notifierLoop)
	n, err := New(context.Background(), cfg, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if got := goroutinesIn(notifierLoop); got != before {
		t.Errorf("%d kernel memory notifier goroutines after Close, %d before", got, before)
	}
	ln, err := net.Listen("tcp", cfg.MetricsAddress)
	if err != nil {
		t.Errorf("metrics address still held after Close: %v", err)
	} else {
		ln.Close()
	}
	runtime.KeepAlive(n) // the listener is the node's, not the garbage collector's, to close
}
