package e2e

// The edge e2e harness: one real control plane (internal/kubetest), one mosquitto with TLS
// identities (internal/mqtttest), two mqlet-bridge processes with leader election running as the
// ServiceAccount that configs/bridge binds to its least RBAC, and one real `mqlet agent` on the
// test containerd with its own namespace, state dir, CNI network and node certificate. The tests
// in edge_e2e_test.go run in order against this one world (TestEdgeNode's subtests), so the
// package pays for one cluster start and one agent.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/mqlet/mqlet/agent/api"
	"github.com/mqlet/mqlet/agent/cni"
	"github.com/mqlet/mqlet/internal/kubetest"
	"github.com/mqlet/mqlet/internal/loopback"
	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/internal/testenv"
	"github.com/mqlet/mqlet/sync/protocol"
	"golang.org/x/sys/unix"
	coordv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

const (
	// edgeNode is the agent's node name and its broker identity (certificate CN).
	edgeNode = "edge-e2e"
	// bridgeNamespace holds the bridge's ServiceAccount and leader Lease (configs/bridge).
	bridgeNamespace = "mqlet-system"
	// edgeRoleLabel is the label the bridge adds to the Nodes it registers and selects by.
	edgeRoleLabel = "node-role.kubernetes.io/edge"
	// Leader election timing of the bridges: shorter than the Deployment's defaults (15s, 10s,
	// 2s) so the takeover test is short; the relation between the three is the same.
	leaderLease, leaderRenew, leaderRetry = 8 * time.Second, 6 * time.Second, 1 * time.Second
)

var edgeTopics = protocol.MustTopics(protocol.DefaultPrefix)

// --- binaries, built once per test process -----------------------------------------------------

var (
	binDir   string
	binErr   error
	binBuilt = make(chan struct{})
)

// TestMain builds bin/mqlet and bin/mqlet-bridge (static, as `make build` does) in the background
// while the first test starts its cluster, and removes them at the end.
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		close(binBuilt)
	} else {
		go buildBinaries()
	}
	code := m.Run()
	<-binBuilt
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func buildBinaries() {
	defer close(binBuilt)
	root, err := moduleRoot()
	if err != nil {
		binErr = err
		return
	}
	if binDir, err = os.MkdirTemp("", "mqlet-e2e-bin"); err != nil {
		binErr = err
		return
	}
	cmd := exec.Command("go", "build", "-o", binDir+"/", "./cmd/mqlet", "./cmd/mqlet-bridge")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		binErr = fmt.Errorf("go build ./cmd/mqlet ./cmd/mqlet-bridge: %v\n%s", err, out)
	}
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the test's directory")
		}
		dir = parent
	}
}

func binaries(t *testing.T) (mqlet, bridge string) {
	t.Helper()
	select {
	case <-binBuilt:
	case <-time.After(10 * time.Minute):
		t.Fatal("building the binaries took more than 10 minutes")
	}
	if binErr != nil {
		t.Fatal(binErr)
	}
	return filepath.Join(binDir, "mqlet"), filepath.Join(binDir, "mqlet-bridge")
}

// --- processes --------------------------------------------------------------------------------

// proc is a program the harness started; it is stopped by its own pid only.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error // valid once done is closed
}

func startProc(t *testing.T, dir, name, bin string, env []string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprintf(f, "=== %s %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(append([]string{bin}, args...), " "))
	cmd := exec.Command(bin, args...)
	cmd.Env = append(programEnv(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p
}

// programEnv is the test's environment without the MQLET_* variables of the test setup
// (MQLET_TEST_*): mqlet reserves the MQLET_ prefix for its settings and refuses unknown
// ones.
func programEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MQLET_") {
			env = append(env, kv)
		}
	}
	return env
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop sends sig to the process and waits for it to exit, SIGKILL after timeout.
func (p *proc) stop(sig syscall.Signal, timeout time.Duration) error {
	if !p.running() {
		return nil
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
		p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s (pid %d) did not exit within %s of %s: killed", p.name, p.pid(), timeout, sig)
	}
}

func (p *proc) tail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (p *proc) log() string {
	data, _ := os.ReadFile(p.logPath)
	return string(data)
}

// --- the world ----------------------------------------------------------------------------------

type edgeWorld struct {
	t       *testing.T
	cluster *kubetest.Cluster
	kube    kubernetes.Interface // the admin: what `kubectl` does in the tests
	broker  *mqtttest.Broker
	env     testenv.Env
	net     *testenv.CNINet

	mqletBin, bridgeBin string
	dir                 string // the agent's and the bridges' files; short, for the api socket
	ns                  string // the agent's containerd namespace
	sock                string
	agentAPI            *api.Client
	bridgeKubeconfig    string
	// kubeletPorts is the bridges' --kubelet-ports (both replicas get the same: only the leader
	// listens); kubeletAddr their --kubelet-address: a non-loopback address of this host, since
	// the API server refuses to proxy (/api/v1/nodes/<node>/proxy) to a loopback one.
	kubeletPorts []int
	kubeletAddr  string

	mu      sync.Mutex
	agent   *proc
	bridges map[string]*bridgeProc // by leader-election identity
	procs   []*proc                // every process started, for the logs of a failed test

	watch *retainedWatch
}

type bridgeProc struct {
	*proc
	identity string
	metrics  string // host:port of /metrics, /healthz, /readyz
}

// newEdgeWorld starts everything but the agent and the bridges.
func newEdgeWorld(t *testing.T) *edgeWorld {
	t.Helper()
	env := testenv.Require(t)
	w := &edgeWorld{t: t, env: env, bridges: map[string]*bridgeProc{}}
	w.cluster = kubetest.Start(t, kubetest.Options{})
	var err error
	if w.kube, err = kubernetes.NewForConfig(w.cluster.RESTConfig()); err != nil {
		t.Fatal(err)
	}
	w.net = testenv.NewCNINet(t, func(n *testenv.CNINet) []byte {
		b, err := cni.DefaultNetwork{Name: n.Name, Bridge: n.Bridge, Subnet: n.Subnet.String(), DataDir: n.DataDir}.ConfList()
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
	w.broker = mqtttest.Start(t, mqtttest.Options{Identities: []string{edgeNode}, UsernameAsClientID: true})
	w.mqletBin, w.bridgeBin = binaries(t)
	if w.kubeletPorts, err = loopback.FreePorts(3); err != nil {
		t.Fatal(err)
	}
	if w.kubeletAddr, err = kubetest.HostAddress(); err != nil {
		t.Fatal(err)
	}

	// A short path: unix socket paths stop at 108 bytes.
	if w.dir, err = os.MkdirTemp("", "mqb"); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(w.dir, "state")
	t.Cleanup(func() {
		// Pod namespaces are bind mounts under the state dir and each pod's /dev/shm a tmpfs in
		// its pod dir; unmount before removing.
		var mounts []string
		for _, g := range []string{"netns/*", "ipcns/*", "pidns/*", "pods/*/shm"} {
			m, _ := filepath.Glob(filepath.Join(state, g))
			mounts = append(mounts, m...)
		}
		for _, m := range mounts {
			unix.Unmount(m, unix.MNT_DETACH)
		}
		os.RemoveAll(w.dir)
	})
	w.ns = testenv.Namespace(t, env.ContainerdAddress)
	w.sock = filepath.Join(w.dir, "api.sock")
	w.agentAPI = api.NewClient(w.sock)
	if out, err := w.mqletCLI("image", "import", env.Image(testenv.Busybox)); err != nil {
		t.Fatalf("mqlet image import: %v\n%s", err, out)
	}

	applyManifestFiles(t, w.kube, "namespace.yaml", "rbac.yaml")
	w.bridgeKubeconfig = w.cluster.ServiceAccountKubeconfig(bridgeNamespace, "mqlet-bridge")
	w.watch = watchRetained(t, w.broker.Plain, edgeNode)

	// Registered last, so it runs first: the processes stop before their files go away.
	t.Cleanup(w.stopAll)
	return w
}

func (w *edgeWorld) mqletCLI(args ...string) (string, error) {
	cmd := exec.Command(w.mqletBin, args...)
	cmd.Env = append(programEnv(), "MQLET_CONTAINERD_ADDRESS="+w.env.ContainerdAddress,
		"MQLET_CONTAINERD_NAMESPACE="+w.ns, "MQLET_API_SOCKET="+w.sock)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// startAgent runs `mqlet agent` as an edge node of the cluster: MQTT over TLS with the node's own
// certificate (the broker's ACL confines it to its subtree), a label and a taint of its own, the
// test's CNI network.
func (w *edgeWorld) startAgent(t *testing.T) {
	t.Helper()
	w.startAgentWith(t, "--node-label", "site=e2e-lab", "--node-taint", "mqlet.io/edge=true:PreferNoSchedule")
}

// startAgentWith is startAgent with the node's labels and taints given as flags (--node-label,
// --node-taint) in place of the default ones.
func (w *edgeWorld) startAgentWith(t *testing.T, meta ...string) {
	t.Helper()
	cert, key := w.broker.ClientCert(edgeNode)
	args := []string{"agent",
		"--node-name", edgeNode, "--state-dir", filepath.Join(w.dir, "state"),
		"--containerd-address", w.env.ContainerdAddress, "--containerd-namespace", w.ns,
		"--manifest-dir", filepath.Join(w.dir, "manifests"), "--api-socket", w.sock,
		"--image-preload-dir", filepath.Join(w.dir, "preload"), "--relist-period", "2s",
		"--plain-http-registry", w.env.Registry, "--log-level", "debug",
		"--secret-key-file", filepath.Join(w.dir, "node.key"),
		// containerd's root here is the test environment's; any existing dir serves as the imagefs.
		"--image-fs-dir", w.dir,
		"--cni-conf-dir", w.net.ConfDir, "--cni-bin-dir", w.net.BinDir,
		"--mqtt-broker", w.broker.TLS, "--mqtt-ca-file", w.broker.CAFile,
		"--mqtt-cert-file", cert, "--mqtt-key-file", key,
		"--mqtt-keepalive", "5s", "--mqtt-reconnect-max", "2s",
		"--node-status-update-frequency", "2s",
	}
	args = append(args, meta...)
	os.MkdirAll(filepath.Join(w.dir, "manifests"), 0o755)
	p := startProc(t, w.dir, "agent", w.mqletBin, nil, args...)
	w.mu.Lock()
	w.agent = p
	w.procs = append(w.procs, p)
	w.mu.Unlock()
	within(t, 30*time.Second, "the agent's local API answers", func() (bool, string) {
		if !p.running() {
			t.Fatalf("agent exited at start: %v\n%s", p.err, p.tail(40))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err := w.agentAPI.Ready(ctx)
		return err == nil, fmt.Sprint(err)
	})
}

// stopAgent stops the agent as its service manager would (SIGTERM): it publishes its offline
// message and leaves its containers running.
func (w *edgeWorld) stopAgent(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	p := w.agent
	w.agent = nil
	w.mu.Unlock()
	if p == nil {
		return
	}
	if err := p.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Error(err)
	}
}

// startBridge runs one mqlet-bridge replica as the Deployment does: leader election on, the
// ServiceAccount's token, POD_NAMESPACE for the Lease's namespace, the admin MQTT identity.
func (w *edgeWorld) startBridge(t *testing.T, identity string) *bridgeProc {
	t.Helper()
	return w.startBridgeWith(t, identity)
}

// startBridgeWith is startBridge with more flags.
func (w *edgeWorld) startBridgeWith(t *testing.T, identity string, extra ...string) *bridgeProc {
	t.Helper()
	ports, err := loopback.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	cert, key := w.broker.ClientCert(mqtttest.Admin)
	args := append([]string{"--kubeconfig", w.bridgeKubeconfig,
		"--mqtt-broker", w.broker.TLS, "--mqtt-ca-file", w.broker.CAFile,
		"--mqtt-cert-file", cert, "--mqtt-key-file", key,
		"--node-selector", edgeRoleLabel,
		"--leader-elect-identity", identity,
		"--leader-elect-lease-duration", leaderLease.String(),
		"--leader-elect-renew-deadline", leaderRenew.String(),
		"--leader-elect-retry-period", leaderRetry.String(),
		"--metrics-addr", addr, "--log-level", "debug",
		"--kubelet-address", w.kubeletAddr, "--kubelet-ports", w.kubeletPortList(),
		"--kubelet-client-ca", w.cluster.ClientCAFile()}, extra...)
	p := startProc(t, w.dir, "bridge-"+identity, w.bridgeBin, []string{"POD_NAMESPACE=" + bridgeNamespace}, args...)
	b := &bridgeProc{proc: p, identity: identity, metrics: addr}
	w.mu.Lock()
	w.bridges[identity] = b
	w.procs = append(w.procs, p)
	w.mu.Unlock()
	within(t, 30*time.Second, "bridge "+identity+" serves /healthz", func() (bool, string) {
		if !p.running() {
			t.Fatalf("bridge %s exited at start: %v\n%s", identity, p.err, p.tail(40))
		}
		body, err := httpGet("http://" + addr + "/healthz")
		return err == nil && strings.TrimSpace(body) == "ok", fmt.Sprint(body, err)
	})
	return b
}

// kubeletPortList is --kubelet-ports.
func (w *edgeWorld) kubeletPortList() string {
	var ps []string
	for _, p := range w.kubeletPorts {
		ps = append(ps, fmt.Sprint(p))
	}
	return strings.Join(ps, ",")
}

// leader waits until one running bridge holds the leader Lease and says so on /readyz, and
// returns it.
// waitPodGone waits (runBound) until pod p (of testNS when its namespace is unset), this very
// object (its UID), is gone from the API.
func (w *edgeWorld) waitPodGone(t *testing.T, p *v1.Pod) {
	t.Helper()
	ns := p.Namespace
	if ns == "" {
		ns = testNS
	}
	within(t, runBound, "pod "+p.Name+" gone from the API", func() (bool, string) {
		cur, err := w.kube.CoreV1().Pods(ns).Get(context.Background(), p.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && cur.UID != p.UID) {
			return true, ""
		}
		if err != nil {
			return false, err.Error()
		}
		return false, podSummary(cur)
	})
}

func (w *edgeWorld) leader(t *testing.T) *bridgeProc {
	t.Helper()
	var found *bridgeProc
	within(t, 2*leaderLease+10*time.Second, "a bridge leads (Lease holder, /readyz ready: leader)", func() (bool, string) {
		l, err := w.kube.CoordinationV1().Leases(bridgeNamespace).Get(context.Background(), "mqlet-bridge", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if l.Spec.HolderIdentity == nil {
			return false, "no holder"
		}
		w.mu.Lock()
		b := w.bridges[*l.Spec.HolderIdentity]
		w.mu.Unlock()
		if b == nil || !b.running() {
			return false, "holder " + *l.Spec.HolderIdentity + " is not a running bridge"
		}
		body, err := httpGet("http://" + b.metrics + "/readyz")
		if err != nil || !strings.HasPrefix(body, "ready: leader") {
			return false, fmt.Sprintf("holder %s /readyz: %q %v", b.identity, body, err)
		}
		found = b
		return true, ""
	})
	return found
}

func (w *edgeWorld) stopAll() {
	w.mu.Lock()
	procs := slices.Clone(w.procs)
	w.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		if err := procs[i].stop(syscall.SIGTERM, 30*time.Second); err != nil {
			w.t.Log(err)
		}
	}
	if w.t.Failed() {
		for _, p := range procs {
			w.t.Logf("last lines of %s (%s):\n%s", p.name, p.logPath, p.tail(80))
		}
		w.t.Logf("last lines of mosquitto's log:\n%s", tailFile(w.broker.LogFile, 40))
	}
}

// checkProcs fails the test if a bridge or the agent exited on its own.
func (w *edgeWorld) checkProcs(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.agent != nil && !w.agent.running() {
		t.Fatalf("the agent exited: %v\n%s", w.agent.err, w.agent.tail(40))
	}
	for id, b := range w.bridges {
		if !b.running() {
			t.Fatalf("bridge %s exited: %v\n%s", id, b.err, b.tail(40))
		}
	}
}

// startCloudNode registers a Node that stands for the cluster's ordinary workers, kept healthy by
// the test renewing its Lease. The node lifecycle controller stops all evictions when every node of
// a zone is unhealthy (it takes that for a problem of the control plane's own network, "full
// disruption"), so with the edge node alone in the cluster its absence would never taint it
// NoExecute. Its NoSchedule taint keeps the scheduler away from it.
func (w *edgeWorld) startCloudNode(name string) {
	w.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	w.t.Cleanup(func() { cancel(); wg.Wait() })
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
		Spec:       v1.NodeSpec{Taints: []v1.Taint{{Key: "e2e.mqlet.io/cloud", Effect: v1.TaintEffectNoSchedule}}},
	}
	if _, err := w.kube.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		w.t.Fatalf("create Node %s: %v", name, err)
	}
	// The controller-manager's node controllers (taints, lifecycle) may write the new Node
	// between our create and this status write; read again and retry on a conflict.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := w.kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		cur.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: now, LastTransitionTime: now}}
		_, err = w.kube.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		w.t.Fatalf("status of Node %s: %v", name, err)
	}
	leases := w.kube.CoordinationV1().Leases("kube-node-lease")
	renew := func() error {
		t := metav1.NewMicroTime(time.Now())
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			l = &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: coordv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: new(int32(40)), RenewTime: &t}}
			_, err = leases.Create(ctx, l, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		l.Spec.RenewTime = &t
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		return err
	}
	if err := renew(); err != nil {
		w.t.Fatalf("Lease of Node %s: %v", name, err)
	}
	wg.Go(func() {
		tick := time.NewTicker(4 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if err := renew(); err != nil && ctx.Err() == nil {
					w.t.Logf("renew the Lease of Node %s: %v", name, err)
				}
			}
		}
	})
}

// --- containerd, from the test's side -----------------------------------------------------------

// tasks returns container id -> pid of the running tasks in the agent's namespace, read from
// containerd itself so that assertions do not rest on the agent's or the API's word.
func (w *edgeWorld) tasks(t *testing.T) map[string]uint32 {
	t.Helper()
	out := map[string]uint32{}
	w.eachTask(t, func(ctx context.Context, ctr containerd.Container, task containerd.Task) bool {
		if st, err := task.Status(ctx); err == nil && st.Status == containerd.Running {
			out[ctr.ID()] = task.Pid()
		}
		return true
	})
	return out
}

// eachTask calls fn with each container in the agent's namespace that has a task, until fn says
// stop (false).
func (w *edgeWorld) eachTask(t *testing.T, fn func(context.Context, containerd.Container, containerd.Task) bool) {
	t.Helper()
	c, err := containerd.New(w.env.ContainerdAddress)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := namespaces.WithNamespace(context.Background(), w.ns)
	ctrs, err := c.Containers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ctr := range ctrs {
		task, err := ctr.Task(ctx, nil)
		if err != nil {
			continue
		}
		if !fn(ctx, ctr, task) {
			return
		}
	}
}

// containers lists the container ids in the agent's namespace, running or not.
func (w *edgeWorld) containers(t *testing.T) []string {
	t.Helper()
	c, err := containerd.New(w.env.ContainerdAddress)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctrs, err := c.Containers(namespaces.WithNamespace(context.Background(), w.ns))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ctr := range ctrs {
		ids = append(ids, ctr.ID())
	}
	return ids
}

// containerLog is the container's log as `mqlet logs` shows it (the agent's local API).
func (w *edgeWorld) containerLog(namespace, pod, container string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var b bytes.Buffer
	err := w.agentAPI.Logs(ctx, namespace, pod, api.LogOptions{Container: container}, &b)
	return b.String(), err
}

// --- the retained state, watched from the broker's side -----------------------------------------

// desiredPod is one desired pod message as the watcher saw it: an object, or the clearing of its
// retained topic (an empty payload) once an index left it out.
type desiredPod struct {
	seq        int // order of arrival among everything the watcher saw
	generation int64
	digest     string // protocol.Digest of the payload
	cleared    bool
	labels     map[string]string
}

// seenIndex is one index message as the watcher saw it.
type seenIndex struct {
	seq int
	protocol.Index
}

// retainedWatch records every index, acks and desired pod message of one node, as a subscriber
// sees them.
type retainedWatch struct {
	mu      sync.Mutex
	seq     int
	index   []seenIndex             // in arrival order
	pods    map[string][]desiredPod // desired pod messages by object key, in arrival order
	acks    *protocol.Acks          // the latest
	refused map[string]protocol.Refusal
	bad     []string // payloads that did not decode
}

func watchRetained(t *testing.T, broker, node string) *retainedWatch {
	t.Helper()
	w := &retainedWatch{refused: map[string]protocol.Refusal{}, pods: map[string][]desiredPod{}}
	id := make([]byte, 4)
	rand.Read(id)
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(broker).SetClientID("e2e-watch-" + hex.EncodeToString(id)).
		SetAutoReconnect(true).SetOrderMatters(true))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("watcher: connect %s: %v", broker, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	indexTopic, acksTopic := edgeTopics.Index(node), edgeTopics.Acks(node)
	handler := func(_ mqtt.Client, m mqtt.Message) {
		tp, err := edgeTopics.Parse(m.Topic())
		w.mu.Lock()
		defer w.mu.Unlock()
		w.seq++
		if err != nil {
			w.bad = append(w.bad, fmt.Sprintf("%s: %v", m.Topic(), err))
			return
		}
		if len(m.Payload()) == 0 {
			if tp.Class == protocol.ClassDesired && tp.Kind == protocol.KindPod {
				key := protocol.ObjectKey(tp.Kind, tp.Namespace, tp.Name)
				w.pods[key] = append(w.pods[key], desiredPod{seq: w.seq, cleared: true})
			}
			return
		}
		switch {
		case tp.Class == protocol.ClassDesired && tp.Kind == protocol.KindPod:
			x, err := protocol.DecodeDesired(tp, m.Payload(), protocol.DefaultMaxPayload)
			if err != nil {
				w.bad = append(w.bad, fmt.Sprintf("%s: %v", m.Topic(), err))
				return
			}
			d := desiredPod{seq: w.seq, generation: x.Generation, digest: protocol.Digest(m.Payload())}
			if x.Pod != nil {
				d.labels = x.Pod.Labels
			}
			w.pods[x.Key()] = append(w.pods[x.Key()], d)
		case m.Topic() == indexTopic:
			x, err := protocol.DecodeIndex(tp, m.Payload(), protocol.DefaultMaxPayload)
			if err != nil {
				w.bad = append(w.bad, fmt.Sprintf("%s: %v", m.Topic(), err))
				return
			}
			w.index = append(w.index, seenIndex{seq: w.seq, Index: *x})
		case m.Topic() == acksTopic:
			x, err := protocol.DecodeAcks(m.Payload(), protocol.DefaultMaxPayload)
			if err != nil {
				w.bad = append(w.bad, fmt.Sprintf("%s: %v", m.Topic(), err))
				return
			}
			w.acks = x
			for k, r := range x.Refused {
				w.refused[k] = r
			}
		}
	}
	podsFilter := edgeTopics.Node(node) + "/desired/pods/#"
	tok := c.SubscribeMultiple(map[string]byte{indexTopic: 1, acksTopic: 1, podsFilter: 1}, handler)
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("watcher: subscribe: %v", tok.Error())
	}
	return w
}

// indexes returns a copy of the index messages seen so far.
func (r *retainedWatch) indexes() []seenIndex {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.index)
}

// podMessages returns a copy of the desired messages seen for a pod's object key.
func (r *retainedWatch) podMessages(key string) []desiredPod {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.pods[key])
}

func (r *retainedWatch) latestAcks() *protocol.Acks {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.acks
}

// --- the API side -------------------------------------------------------------------------------

// applyManifestFiles creates the objects of configs/bridge/<file>s as the admin, so that the
// bridge runs with exactly the rights it is deployed with.
func applyManifestFiles(t *testing.T, cs kubernetes.Interface, files ...string) {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range files {
		paths = append(paths, filepath.Join(root, "configs", "bridge", f))
	}
	if err := kubetest.CreateManifests(context.Background(), cs, paths...); err != nil {
		t.Fatal(err)
	}
}

// --- small helpers ------------------------------------------------------------------------------

// within polls cond every 200ms until it holds; after d it fails the test with what cond said
// last.
func within(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last: %s", what, d, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func httpGet(url string) (string, error) {
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// metricValue returns the value of an unlabelled metric in a /metrics body, "" when absent.
func metricValue(body, name string) string {
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == name {
			return f[1]
		}
	}
	return ""
}

func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func uniqueName(prefix string) string {
	b := make([]byte, 3)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

func nodeReady(n *v1.Node) v1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status
		}
	}
	return ""
}

// podRunning: phase Running, every container running and ready, and a pod IP.
func podRunning(p *v1.Pod) bool {
	if p.Status.Phase != v1.PodRunning || p.Status.PodIP == "" || len(p.Status.ContainerStatuses) != len(p.Spec.Containers) {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running == nil || !cs.Ready || cs.ContainerID == "" {
			return false
		}
	}
	return true
}

func podSummary(p *v1.Pod) string {
	if p == nil {
		return "<no pod>"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s node=%q phase=%s ip=%q deleting=%v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.PodIP, p.DeletionTimestamp != nil)
	for _, c := range p.Status.Conditions {
		fmt.Fprintf(&b, " %s=%s", c.Type, c.Status)
	}
	for _, cs := range p.Status.ContainerStatuses {
		fmt.Fprintf(&b, " %s{id=%s restarts=%d ready=%v running=%v waiting=%v terminated=%v}", cs.Name, cs.ContainerID,
			cs.RestartCount, cs.Ready, cs.State.Running != nil, cs.State.Waiting, cs.State.Terminated)
	}
	return b.String()
}

// containerdID strips the "containerd://" of a container status's containerID.
func containerdID(s string) string { return strings.TrimPrefix(s, "containerd://") }
