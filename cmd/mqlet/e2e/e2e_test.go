// Package e2e holds the end-to-end tests of the edge binary: the real mqlet, built from
// ./cmd/mqlet as users get it, against the real containerd, registry, mosquitto and kube-apiserver
// that scripts/testenv.sh starts. Each test has its own containerd namespace, state dir and socket.
// They live outside package main so that cmd/mqlet's own tests are unit tests of its code, and
// so that nothing here can reach into the CLI's internals: they see what a user sees.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/mqlet/mqlet/agent/api"
	"github.com/mqlet/mqlet/core/logs"
	"github.com/mqlet/mqlet/internal/testenv"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// TestMain removes the binary the e2e tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// mqletPackage is the edge binary the tests build and run.
const mqletPackage = "github.com/mqlet/mqlet/cmd/mqlet"

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// mqletBinary builds the binary once per test run, as users get it (static, no cgo).
func mqletBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "mqlet-bin")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "mqlet")
		cmd := exec.Command("go", "build", "-o", binPath, mqletPackage)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

type harness struct {
	t         *testing.T
	env       testenv.Env
	bin       string
	ns        string
	dir       string
	manifests string
	state     string
	sock      string
	agent     *exec.Cmd
	agentLog  *syncBuffer
	exited    chan error
	// agentEnv is added to the agent's environment at startAgent (notify_e2e_test.go).
	agentEnv []string
	// agentPrefix runs the agent under a command that execs it, e.g. nsenter into a private
	// network namespace (uninstall_e2e_test.go).
	agentPrefix []string
	client      *api.Client
	// cniConfDir and cniBinDir are the agent's CNI settings. By default a private directory with a
	// loopback-only network (pods get CNI but no bridge, address or rule to clean up); network
	// tests point them at a testenv.CNINet (cni_e2e_test.go).
	cniConfDir, cniBinDir string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	env := testenv.Require(t)
	h := &harness{t: t, env: env, bin: mqletBinary(t)}
	// A short path: unix socket paths stop at 108 bytes.
	dir, err := os.MkdirTemp("", "mq")
	if err != nil {
		t.Fatal(err)
	}
	h.dir = dir
	h.manifests = filepath.Join(dir, "pods")
	h.state = filepath.Join(dir, "state")
	h.sock = filepath.Join(dir, "api.sock")
	os.MkdirAll(h.manifests, 0o755)
	h.cniConfDir = filepath.Join(dir, "net.d")
	os.MkdirAll(h.cniConfDir, 0o755)
	os.WriteFile(filepath.Join(h.cniConfDir, "99-loopback.conflist"), []byte(loopbackNetwork), 0o644)
	t.Cleanup(func() {
		// Pod namespaces are bind mounts under the state dir and each pod's /dev/shm a tmpfs in
		// its pod dir; unmount before removing.
		mounts, _ := filepath.Glob(filepath.Join(h.state, "netns", "*"))
		ipc, _ := filepath.Glob(filepath.Join(h.state, "ipcns", "*"))
		pid, _ := filepath.Glob(filepath.Join(h.state, "pidns", "*"))
		shm, _ := filepath.Glob(filepath.Join(h.state, "pods", "*", "shm"))
		for _, m := range append(append(append(mounts, ipc...), pid...), shm...) {
			unix.Unmount(m, unix.MNT_DETACH)
		}
		os.RemoveAll(dir)
	})
	h.ns = testenv.Namespace(t, env.ContainerdAddress)
	t.Cleanup(h.stopAgent)
	h.client = api.NewClient(h.sock)
	h.mqlet("image", "import", env.Image(testenv.Busybox))
	return h
}

func (h *harness) flags() []string {
	f := []string{"--node-name", "e2e-node", "--state-dir", h.state,
		"--containerd-address", h.env.ContainerdAddress, "--containerd-namespace", h.ns,
		"--manifest-dir", h.manifests, "--api-socket", h.sock, "--image-preload-dir", filepath.Join(h.dir, "preload"),
		"--relist-period", "2s", "--plain-http-registry", h.env.Registry, "--log-level", "debug",
		// Every node makes its node key at first start: the test's, not /etc/mqlet's.
		"--secret-key-file", filepath.Join(h.dir, "node.key"),
		// containerd's root here is the test environment's; any existing dir serves as the imagefs.
		"--image-fs-dir", h.dir, "--cni-conf-dir", h.cniConfDir}
	if h.cniBinDir != "" {
		f = append(f, "--cni-bin-dir", h.cniBinDir)
	}
	return f
}

// loopbackNetwork is the e2e agents' default CNI network: the pod's lo only.
const loopbackNetwork = `{"cniVersion": "1.0.0", "name": "mqlet-e2e-loopback", "plugins": [{"type": "loopback"}]}`

// mqlet runs a CLI command against this harness's containerd namespace and returns its output.
func (h *harness) mqlet(args ...string) string {
	h.t.Helper()
	out, err := h.mqletErr(args...)
	if err != nil {
		h.t.Fatalf("mqlet %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (h *harness) mqletErr(args ...string) (string, error) {
	cmd := exec.Command(h.bin, args...)
	cmd.Env = append(os.Environ(), "MQLET_CONTAINERD_ADDRESS="+h.env.ContainerdAddress, "MQLET_CONTAINERD_NAMESPACE="+h.ns, "MQLET_API_SOCKET="+h.sock)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (h *harness) startAgent(extra ...string) {
	h.t.Helper()
	h.agentLog = &syncBuffer{}
	args := append(append([]string{"agent"}, h.flags()...), extra...)
	cmd := exec.Command(h.bin, args...)
	if len(h.agentPrefix) > 0 {
		cmd = exec.Command(h.agentPrefix[0], append(append(h.agentPrefix[1:], h.bin), args...)...)
	}
	cmd.Stdout, cmd.Stderr = h.agentLog, h.agentLog
	if h.agentEnv != nil {
		cmd.Env = append(os.Environ(), h.agentEnv...)
	}
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	h.agent = cmd
	h.exited = make(chan error, 1)
	go func() { h.exited <- cmd.Wait() }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := h.client.Ready(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case err := <-h.exited:
			h.agent = nil // its exit is read: a later stopAgent (a cleanup) must not wait for it again
			h.t.Fatalf("agent exited at start: %v\n%s", err, h.agentLog)
		default:
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("agent not ready after 15s: %v\n%s", err, h.agentLog)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stopAgent sends SIGTERM to the agent we started (by pid) and waits.
func (h *harness) stopAgent() { h.signalAgent(syscall.SIGTERM) }

func (h *harness) kill9Agent() { h.signalAgent(syscall.SIGKILL) }

func (h *harness) signalAgent(sig syscall.Signal) {
	if h.agent == nil {
		return
	}
	h.agent.Process.Signal(sig)
	select {
	case <-h.exited:
	case <-time.After(20 * time.Second):
		h.agent.Process.Kill()
		<-h.exited
	}
	h.agent = nil
	if h.t.Failed() {
		h.t.Logf("agent log:\n%s", h.agentLog)
	}
}

func (h *harness) writeManifest(name, content string) {
	h.t.Helper()
	// Write then rename, as editors and config management do, so the agent never reads half a file.
	tmp := filepath.Join(h.manifests, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(h.manifests, name)); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) getPod(name string) (*v1.Pod, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return h.client.GetPod(ctx, "default", name)
}

// waitPod polls the agent's API until cond holds (bounded), and returns the pod.
func (h *harness) waitPod(name string, what string, cond func(*v1.Pod) bool) *v1.Pod {
	h.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last *v1.Pod
	var lastErr error
	for time.Now().Before(deadline) {
		p, err := h.getPod(name)
		if err == nil && cond(p) {
			return p
		}
		last, lastErr = p, err
		time.Sleep(100 * time.Millisecond)
	}
	h.t.Fatalf("pod %s: not %s within 60s; last: %v %s\nagent log:\n%s", name, what, lastErr, podSummaryForTest(last), h.agentLog)
	return nil
}

func podSummaryForTest(p *v1.Pod) string {
	if p == nil {
		return "<no pod>"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "phase=%s", p.Status.Phase)
	for _, cs := range p.Status.ContainerStatuses {
		fmt.Fprintf(&b, " %s{restarts=%d running=%v waiting=%v terminated=%v}", cs.Name, cs.RestartCount, cs.State.Running != nil, cs.State.Waiting, cs.State.Terminated)
	}
	return b.String()
}

func allRunning(p *v1.Pod) bool {
	if p.Status.Phase != v1.PodRunning || len(p.Status.ContainerStatuses) != len(p.Spec.Containers) {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running == nil || !cs.Ready {
			return false
		}
	}
	return true
}

func containerStatus(p *v1.Pod, name string) v1.ContainerStatus {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == name {
			return cs
		}
	}
	return v1.ContainerStatus{}
}

// tasks returns container id -> pid of the running tasks in the test's namespace, straight from
// containerd, so assertions don't trust the agent's own report.
func (h *harness) tasks() map[string]uint32 {
	h.t.Helper()
	c, err := containerd.New(h.env.ContainerdAddress)
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	ctx := namespaces.WithNamespace(context.Background(), h.ns)
	ctrs, err := c.Containers(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]uint32{}
	for _, ctr := range ctrs {
		task, err := ctr.Task(ctx, nil)
		if err != nil {
			continue
		}
		st, err := task.Status(ctx)
		if err == nil && st.Status == containerd.Running {
			out[ctr.ID()] = task.Pid()
		}
	}
	return out
}

func (h *harness) logOf(p *v1.Pod, container string) string {
	cs := containerStatus(p, container)
	files, _ := filepath.Glob(filepath.Join(h.state, "logs", "*_"+p.Name+"_*", container, fmt.Sprintf("%d.log", cs.RestartCount)))
	if len(files) == 0 {
		return ""
	}
	var b bytes.Buffer
	logs.Read(context.Background(), files[0], logs.ReadOptions{Tail: logs.All}, &b) // the file holds CRI records
	return b.String()
}

func (h *harness) containerIDs() []string {
	h.t.Helper()
	c, err := containerd.New(h.env.ContainerdAddress)
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	ctrs, err := c.Containers(namespaces.WithNamespace(context.Background(), h.ns))
	if err != nil {
		h.t.Fatal(err)
	}
	var ids []string
	for _, ctr := range ctrs {
		ids = append(ids, ctr.ID())
	}
	return ids
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 60s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// syncBuffer is the agent's output: written by the process pipe, read by the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// tagBusybox makes the test's busybox image also known under name in the harness's namespace, so a
// pod can ask for an image whose registry is unreachable or untrusted and still have a local copy.
func (h *harness) tagBusybox(name string) {
	h.t.Helper()
	c, err := containerd.New(h.env.ContainerdAddress)
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	ctx := namespaces.WithNamespace(context.Background(), h.ns)
	img, err := c.ImageService().Get(ctx, testenv.BusyboxRef)
	if err != nil {
		h.t.Fatal(err)
	}
	img.Name = name
	if _, err := c.ImageService().Create(ctx, img); err != nil {
		h.t.Fatal(err)
	}
}

// writeFile writes content to a file name in a temporary directory of t and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
