//go:build conformance

// Package conformance runs Kubernetes' own e2e suite (the [sig-node] [Conformance] specs) against
// mqlet: a private control plane (internal/kubetest, the runner tools/kubecluster wraps), a
// private mosquitto with TLS identities (internal/mqtttest), one mqlet-bridge as its
// ServiceAccount with configs/bridge's RBAC, and one `mqlet agent` on the test containerd (its
// own containerd namespace, state dir, API socket and CNI network), the only node of the cluster.
// It then runs ginkgo on e2e.test and writes the result to docs/conformance.md.
//
// It is a test only to reuse the harness packages (they clean up through testing.TB); the build
// tag keeps it out of `go test ./...`. `make conformance` (scripts/conformance.sh) builds
// e2e.test, ginkgo and the images first and passes their paths. `make conformance-ci`, part of
// `make test`, runs the specs ci-specs.txt lists with -conformance.specs and -conformance.strict
// and no report.
package conformance

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/api"
	"github.com/mqlet/mqlet/agent/cni"
	"github.com/mqlet/mqlet/internal/kubetest"
	"github.com/mqlet/mqlet/internal/loopback"
	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/internal/testenv"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

var (
	binDir      = flag.String("conformance.bin-dir", "", "directory holding e2e.test and ginkgo (scripts/conformance-bins.sh)")
	repoList    = flag.String("conformance.repo-list", "", "KUBE_TEST_REPO_LIST file (scripts/conformance-images.sh)")
	report      = flag.String("conformance.report", "", "markdown report to write (docs/conformance.md); empty: none")
	focus       = flag.String("conformance.focus", `\[sig-node\].*\[Conformance\]`, "ginkgo --focus")
	skip        = flag.String("conformance.skip", `\[Serial\]|\[Disruptive\]`, "ginkgo --skip")
	ginkgoProcs = flag.Int("conformance.procs", 2, "ginkgo --procs")
	specLimit   = flag.Duration("conformance.timeout", 100*time.Minute, "ginkgo --timeout for the whole suite")
	keepDir     = flag.String("conformance.keep", "", "copy the logs and the junit report here at the end")
	dryRun      = flag.Bool("conformance.start-only", false, "start everything, check the node is Ready, stop: no suite")
	specsFile   = flag.String("conformance.specs", "", "run exactly the specs this file lists, one name a line (tools/conformance/ci-specs.txt); replaces -conformance.focus")
	strict      = flag.Bool("conformance.strict", false, "fail unless every selected spec ran and passed (and, with -conformance.specs, every listed one and no other)")
)

const (
	nodeName        = "mqlet-edge-1"
	bridgeNamespace = "mqlet-system"
	edgeRoleLabel   = "node-role.kubernetes.io/edge"
)

func TestConformance(t *testing.T) {
	if *binDir == "" && !*dryRun {
		t.Fatal("-conformance.bin-dir is required (run it through `make conformance`)")
	}
	var listed []string
	if *specsFile != "" {
		var err error
		if listed, err = readSpecList(*specsFile); err != nil {
			t.Fatal(err)
		}
		*focus = focusFor(listed)
	}
	env := testenv.Require(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	dir, err := os.MkdirTemp("", "mqconf") // short: the API socket path is limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	t.Cleanup(func() {
		// Pod namespaces are bind mounts under the state dir, each pod's /dev/shm a tmpfs.
		for _, g := range []string{"netns/*", "ipcns/*", "pidns/*", "pods/*/shm"} {
			m, _ := filepath.Glob(filepath.Join(state, g))
			for _, p := range m {
				unix.Unmount(p, unix.MNT_DETACH)
			}
		}
		os.RemoveAll(dir)
	})

	// Binaries as `make build` makes them.
	bin := filepath.Join(dir, "bin")
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/mqlet", "./cmd/mqlet-bridge")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/mqlet ./cmd/mqlet-bridge: %v\n%s", err, out)
	}
	mqletBin, bridgeBin := filepath.Join(bin, "mqlet"), filepath.Join(bin, "mqlet-bridge")
	t.Logf("conformance: binaries built in %s", time.Since(began).Round(time.Second))

	startCluster := time.Now()
	cluster := kubetest.Start(t, kubetest.Options{KubeNodeTiming: true})
	kube, err := kubernetes.NewForConfig(cluster.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	net := testenv.NewCNINet(t, func(n *testenv.CNINet) []byte {
		b, err := cni.DefaultNetwork{Name: n.Name, Bridge: n.Bridge, Subnet: n.Subnet.String(), DataDir: n.DataDir}.ConfList()
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
	broker := mqtttest.Start(t, mqtttest.Options{Identities: []string{nodeName}, UsernameAsClientID: true})
	ns := testenv.Namespace(t, env.ContainerdAddress)
	var paths []string
	for _, f := range []string{"namespace.yaml", "rbac.yaml"} {
		paths = append(paths, filepath.Join(root, "configs", "bridge", f))
	}
	if err := kubetest.CreateManifests(context.Background(), kube, paths...); err != nil {
		t.Fatal(err)
	}
	bridgeKubeconfig := cluster.ServiceAccountKubeconfig(bridgeNamespace, "mqlet-bridge")

	var procs []*proc
	t.Cleanup(func() { // registered last: runs first, before the files go away
		for i := len(procs) - 1; i >= 0; i-- {
			if err := procs[i].stop(syscall.SIGTERM, 30*time.Second); err != nil {
				t.Log(err)
			}
		}
		if t.Failed() {
			for _, p := range procs {
				t.Logf("last lines of %s:\n%s", p.logPath, p.tail(60))
			}
		}
	})

	ports, err := loopback.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	// The bridge serves the node's kubelet API (logs, exec, stats) on a real address of this
	// host: the API server does not proxy to loopback.
	kubeletAddr, err := kubetest.HostAddress()
	if err != nil {
		t.Fatal(err)
	}
	cert, key := broker.ClientCert(mqtttest.Admin)
	bridge := startProc(t, dir, "bridge", bridgeBin, []string{"POD_NAMESPACE=" + bridgeNamespace},
		"--kubeconfig", bridgeKubeconfig,
		"--mqtt-broker", broker.TLS, "--mqtt-ca-file", broker.CAFile,
		"--mqtt-cert-file", cert, "--mqtt-key-file", key,
		"--node-selector", edgeRoleLabel, "--leader-elect-identity", "conformance",
		"--metrics-addr", fmt.Sprintf("127.0.0.1:%d", ports[0]),
		"--kubelet-address", kubeletAddr, "--kubelet-ports", fmt.Sprint(ports[1]),
		"--kubelet-client-ca", cluster.ClientCAFile())
	procs = append(procs, bridge)

	cert, key = broker.ClientCert(nodeName)
	os.MkdirAll(filepath.Join(dir, "manifests"), 0o755)
	sock := filepath.Join(dir, "api.sock")
	agent := startProc(t, dir, "agent", mqletBin, nil, "agent",
		"--node-name", nodeName, "--state-dir", state,
		"--containerd-address", env.ContainerdAddress, "--containerd-namespace", ns,
		"--manifest-dir", filepath.Join(dir, "manifests"), "--api-socket", sock,
		"--image-preload-dir", filepath.Join(dir, "preload"),
		"--plain-http-registry", env.Registry,
		"--secret-key-file", filepath.Join(dir, "node.key"),
		"--image-fs-dir", dir,
		"--cni-conf-dir", net.ConfDir, "--cni-bin-dir", net.BinDir,
		"--mqtt-broker", broker.TLS, "--mqtt-ca-file", broker.CAFile,
		"--mqtt-cert-file", cert, "--mqtt-key-file", key,
		// KubeletManagedEtcHosts mounts the host's /etc/hosts (hostPath) and runs a hostNetwork
		// pod: a node takes hostPath and the host's namespaces from MQTT only where its operator
		// allows them, as this cluster's owner does here.
		"--mqtt-allowed-host-path", "/etc/hosts", "--mqtt-allow-host-namespaces")
	procs = append(procs, agent)
	agentAPI := api.NewClient(sock)
	waitFor(t, 60*time.Second, "the agent's local API answers", func() (bool, string) {
		if !agent.running() {
			t.Fatalf("agent exited at start:\n%s", agent.tail(40))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err := agentAPI.Ready(ctx)
		return err == nil, fmt.Sprint(err)
	})
	waitFor(t, 3*time.Minute, "Node "+nodeName+" Ready in the API", func() (bool, string) {
		if !bridge.running() {
			t.Fatalf("bridge exited:\n%s", bridge.tail(40))
		}
		n, err := kube.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == v1.NodeReady {
				return c.Status == v1.ConditionTrue, c.Reason + ": " + c.Message
			}
		}
		return false, "no Ready condition"
	})
	t.Logf("conformance: control plane, broker, bridge and node %s ready in %s", nodeName, time.Since(startCluster).Round(time.Second))
	if *dryRun {
		return
	}

	// The suite.
	out := filepath.Join(dir, "report")
	os.MkdirAll(out, 0o755)
	ginkgoArgs := []string{
		"--procs", fmt.Sprint(*ginkgoProcs), "--timeout", specLimit.String(),
		"--focus", *focus, "--skip", *skip, "--no-color", "--silence-skips",
		"--junit-report", "junit.xml", "--output-dir", out,
		filepath.Join(*binDir, "e2e.test"), "--",
		"--kubeconfig", cluster.Kubeconfig(), "--provider", "skeleton",
		"--report-dir", out, "--disable-log-dump",
		// One node, and no kube-system pods: nothing to wait for at the start.
		"--minStartupPods", "0",
	}
	suite := exec.Command(filepath.Join(*binDir, "ginkgo"), ginkgoArgs...)
	suite.Env = append(os.Environ(), "KUBE_TEST_REPO_LIST="+*repoList, "KUBECONFIG="+cluster.Kubeconfig())
	logFile, err := os.Create(filepath.Join(dir, "ginkgo.log"))
	if err != nil {
		t.Fatal(err)
	}
	suite.Stdout, suite.Stderr = logFile, logFile
	runStart := time.Now()
	t.Logf("conformance: ginkgo %s (output in %s; SIGINT to ginkgo ends the run early with a report)", strings.Join(ginkgoArgs, " "), logFile.Name())
	runErr := suite.Run() // failing specs make ginkgo exit non-zero: the report says which
	logFile.Close()
	runTime := time.Since(runStart)
	t.Logf("conformance: suite ran in %s (%v)", runTime.Round(time.Second), runErr)

	if *keepDir != "" {
		os.MkdirAll(*keepDir, 0o755)
		for _, f := range []string{"ginkgo.log", "agent.log", "bridge.log", "report/junit.xml"} {
			if b, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
				os.WriteFile(filepath.Join(*keepDir, filepath.Base(f)), b, 0o644)
			}
		}
	}
	specs, err := readJUnit(filepath.Join(out, "junit.xml"))
	if err != nil {
		t.Fatalf("suite (%v): %v; last lines of ginkgo's output:\n%s", runErr, err, tailFile(filepath.Join(dir, "ginkgo.log"), 60))
	}
	res := summarize(specs)
	res.selected = selectedSpecs(filepath.Join(dir, "ginkgo.log"))
	t.Logf("conformance: %d of %d specs passed (%d ran)", res.passed, max(res.total, res.selected), res.total)
	if *strict {
		problems := strictProblems(specs, res, listed)
		for _, p := range problems {
			t.Error(p)
		}
		if len(problems) == 0 && runErr != nil {
			t.Errorf("ginkgo exited with %v though every spec passed", runErr)
		}
		if t.Failed() {
			t.Logf("last lines of ginkgo's output:\n%s", tailFile(filepath.Join(dir, "ginkgo.log"), 80))
		}
	}
	if *report != "" {
		md := renderReport(res, reportInfo{procs: *ginkgoProcs, runTime: runTime, focus: *focus, skip: *skip, node: nodeName})
		if err := os.WriteFile(*report, []byte(md), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
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
		time.Sleep(500 * time.Millisecond)
	}
}
