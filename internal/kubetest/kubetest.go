// Package kubetest runs a real Kubernetes control plane for tests and benchmarks: Debian's etcd,
// and kube-apiserver, kube-controller-manager and kube-scheduler built by scripts/kubebins.sh,
// each a separate process on free loopback ports with its files and logs in one directory.
//
// The apiserver authenticates clients by certificates from a CA made here (the admin is in
// system:masters; UserKubeconfig makes any other identity) and authorizes with Node,RBAC, so a
// program run with a limited identity meets the same RBAC a real cluster applies. The
// controller-manager runs the node lifecycle controller with fast timing by default (a node whose
// Lease is not renewed turns Unknown after 20s instead of 50s).
//
// Tests call Start; programs (the fleet bench) call StartCluster and Stop.
package kubetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Component names: the keys of Cluster.PIDs and the log file names (<name>.log in Dir).
const (
	Etcd              = "etcd"
	APIServer         = "kube-apiserver"
	ControllerManager = "kube-controller-manager"
	Scheduler         = "kube-scheduler"
)

// Defaults of the fast node timing (see Options).
const (
	DefaultNodeMonitorPeriod      = 2 * time.Second
	DefaultNodeMonitorGracePeriod = 20 * time.Second
	DefaultStartTimeout           = 3 * time.Minute
)

// serviceCIDR is the cluster's service range; its first address is the kubernetes Service's.
const serviceCIDR = "10.0.0.0/24"

// Options configure a cluster. The zero value is a cluster with fast node timing, binaries found
// as findBinaries describes, files in a fresh temporary directory.
type Options struct {
	// BinDir holds kube-apiserver, kube-controller-manager and kube-scheduler. Empty: the
	// MQLET_TEST_KUBE_BIN variable, then MQLET_TEST_KUBE_BIN in /run/mqlet-test/env, then
	// /var/lib/mqlet-test/kube/<v1.Y.Z of the linked client-go>/bin.
	BinDir string
	// EtcdPath is the etcd binary; empty: etcd on PATH (Debian's etcd-server).
	EtcdPath string
	// Dir holds certificates, kubeconfigs and logs. Empty: a new temporary directory (Start: the
	// test's TempDir; StartCluster: removed by Stop unless KeepDir).
	Dir     string
	KeepDir bool
	// EtcdOnDisk keeps etcd's data under Dir. By default it lives on /dev/shm (tmpfs) when there
	// is one: Debian's etcd 3.4 has no --unsafe-no-fsync, and fsyncs on a shared VM disk would
	// make every write of a test or of the fleet bench wait for the disk.
	EtcdOnDisk bool

	// NodeMonitorPeriod and NodeMonitorGracePeriod are the node lifecycle controller's timing;
	// zero means DefaultNodeMonitorPeriod and DefaultNodeMonitorGracePeriod. A client renewing
	// node Leases (the bridge) must renew well inside the grace period. The startup grace period
	// (a registered node that never reported Ready) is set to the grace period too.
	NodeMonitorPeriod      time.Duration
	NodeMonitorGracePeriod time.Duration
	// KubeNodeTiming leaves the node lifecycle timing at Kubernetes' own defaults (5s period,
	// 50s grace, 1m startup grace), ignoring the two fields above.
	KubeNodeTiming bool

	// Extra flags per component, appended after the ones kubetest sets; for a flag given twice
	// the last one wins, so these also override kubetest's.
	EtcdFlags, APIServerFlags, ControllerManagerFlags, SchedulerFlags []string

	// StartTimeout bounds the whole start-up; zero means DefaultStartTimeout.
	StartTimeout time.Duration
	// Logf receives progress lines (StartCluster); nil discards them. Start uses t.Logf.
	Logf func(format string, args ...any)
}

// Cluster is a running control plane. Its methods are safe for concurrent use.
type Cluster struct {
	opts    Options
	dir     string
	ownDir  bool   // dir made by StartCluster: removed by Stop unless KeepDir
	etcdDir string // etcd's data dir when on tmpfs: removed by Stop
	t       testing.TB

	ca         *authority
	admin      *rest.Config
	kubeconfig string
	kubectl    string
	host       string
	etcdURL    string

	spawn *spawner
	mu    sync.Mutex
	procs []*process // in start order; Stop ends them in reverse
	users int        // kubeconfigs written so far, for unique file names

	stopOnce sync.Once
	stopErr  error
}

// Start starts a cluster for the test and stops it when the test ends, printing each
// component's log tail if the test failed. Without the binaries (or with -short) it skips the
// test, or fails it when MQLET_TEST_REQUIRE=1.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	Require(t, opts)
	if opts.Dir == "" {
		opts.Dir = t.TempDir() // before the Cleanup below, so it is removed after the logs are read
	}
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := StartCluster(ctx, opts)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	c.t = t
	t.Cleanup(func() {
		if t.Failed() {
			c.logTails(t.Logf, 40)
		}
		if err := c.Stop(); err != nil {
			t.Errorf("kubetest: %v", err)
		}
	})
	return c
}

// Require skips the test when the binaries a cluster needs are missing or with -short, or fails
// it when MQLET_TEST_REQUIRE=1; Start calls it. It is for tests that call StartCluster.
func Require(t testing.TB, opts Options) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a real Kubernetes control plane; skipped with -short (make unit)")
	}
	if _, err := findBinaries(opts); err != nil {
		if os.Getenv(VarRequire) == "1" {
			t.Fatalf("kubetest: %v (%s=1 makes this a failure rather than a skip)", err, VarRequire)
		}
		t.Skipf("kubetest: %v", err)
	}
}

// StartCluster starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler and
// returns when the cluster is ready to use: the apiserver's /readyz answers ok to the admin, the
// default namespace and its default ServiceAccount exist (the controller-manager's work), and
// the controller-manager and the scheduler hold their leader Leases in kube-system. On error
// nothing is left running and the error carries the failing component's log tail.
func StartCluster(ctx context.Context, opts Options) (*Cluster, error) {
	bins, err := findBinaries(opts)
	if err != nil {
		return nil, err
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	c := &Cluster{opts: opts, dir: opts.Dir, spawn: newSpawner(), kubectl: bins.kubectl}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "kubetest-"); err != nil {
			c.spawn.close()
			return nil, fmt.Errorf("make cluster dir: %w", err)
		}
		c.ownDir = true
	}
	began := time.Now()
	if err := c.start(ctx, bins); err != nil {
		if stopErr := c.Stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		return nil, err
	}
	opts.Logf("kubetest: cluster ready at %s in %s (files and logs in %s)", c.host, time.Since(began).Round(time.Millisecond), c.dir)
	return c, nil
}

func (c *Cluster) start(ctx context.Context, bins binaries) error {
	if err := c.writeCredentials(); err != nil {
		return err
	}
	if !c.opts.EtcdOnDisk {
		if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
			d, err := os.MkdirTemp("/dev/shm", "kubetest-etcd-")
			if err != nil {
				return fmt.Errorf("make etcd data dir on /dev/shm: %w", err)
			}
			c.etcdDir = d
		}
	}
	began := time.Now()
	// Ports are free when picked but another process may take one before our component binds
	// it: a start that lost that race is retried with new ports.
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		err = c.startStorageAndAPI(ctx, bins)
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		c.opts.Logf("kubetest: a port was taken meanwhile (attempt %d): %v", attempt, err)
		c.stopAll()
	}
	if err != nil {
		return err
	}
	c.opts.Logf("kubetest: etcd and kube-apiserver ready after %s", time.Since(began).Round(time.Millisecond))
	cs, err := c.pollClient()
	if err != nil {
		return err
	}
	if err := c.startControllers(bins); err != nil {
		return err
	}
	cm, sched := c.proc(ControllerManager), c.proc(Scheduler)
	if err := waitFor(ctx, "the default ServiceAccount in namespace default (made by the controller-manager)", cm, func(ctx context.Context) error {
		_, err := cs.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		return err
	}
	for _, p := range []*process{cm, sched} {
		if err := waitFor(ctx, "the leader Lease kube-system/"+p.name, p, func(ctx context.Context) error {
			l, err := cs.CoordinationV1().Leases(metav1.NamespaceSystem).Get(ctx, p.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil {
				return fmt.Errorf("lease has no holder yet")
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// writeCredentials makes the CA, the apiserver's serving pair, the service-account key and the
// kubeconfigs of the admin, the controller-manager and the scheduler.
func (c *Cluster) writeCredentials() error {
	ca, err := newAuthority()
	if err != nil {
		return err
	}
	c.ca = ca
	serving, err := ca.serving(net.IPv4(10, 0, 0, 1))
	if err != nil {
		return err
	}
	saKey, err := newSigningKey()
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{
		"ca.crt": ca.certPEM, "ca.key": ca.keyPEM,
		"apiserver.crt": serving.certPEM, "apiserver.key": serving.keyPEM,
		"sa.key": saKey,
	} {
		if err := writeSecret(c.path(name), data); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) startStorageAndAPI(ctx context.Context, bins binaries) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	etcdPort, peerPort, apiPort := ports[0], ports[1], ports[2]
	c.etcdURL = "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	c.host = "https://127.0.0.1:" + strconv.Itoa(apiPort)

	dataDir := c.etcdDir
	if dataDir == "" {
		dataDir = c.path("etcd")
	}
	// A retry must not find the previous attempt's member data (its peer URL differs).
	if err := os.RemoveAll(dataDir); err != nil {
		return fmt.Errorf("clear etcd data dir: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return fmt.Errorf("make etcd data dir: %w", err)
	}
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	var env []string
	if runtime.GOARCH != "amd64" {
		// etcd 3.4 refuses to start on architectures it does not list as supported unless told.
		env = append(env, "ETCD_UNSUPPORTED_ARCH="+runtime.GOARCH)
	}
	etcd, err := c.launch(Etcd, bins.etcd, append([]string{
		"--name=kubetest",
		"--data-dir=" + dataDir,
		"--listen-client-urls=" + c.etcdURL,
		"--advertise-client-urls=" + c.etcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=kubetest=" + peerURL,
		"--initial-cluster-state=new",
		"--quota-backend-bytes=" + strconv.Itoa(4<<30),
		"--log-level=warn",
		"--logger=zap",
	}, c.opts.EtcdFlags...), env)
	if err != nil {
		return err
	}
	httpc := &http.Client{Timeout: 2 * time.Second}
	if err := waitFor(ctx, "etcd /health", etcd, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.etcdURL+"/health", nil)
		resp, err := httpc.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("etcd /health: %s", resp.Status)
		}
		return nil
	}); err != nil {
		return err
	}

	admin, err := c.ca.client("kubetest-admin", "system:masters")
	if err != nil {
		return err
	}
	c.admin = &rest.Config{Host: c.host, TLSClientConfig: rest.TLSClientConfig{
		CAData: c.ca.certPEM, CertData: admin.certPEM, KeyData: admin.keyPEM}}
	if c.kubeconfig, err = c.writeKubeconfig("admin.kubeconfig", "kubetest-admin", admin); err != nil {
		return err
	}
	// The apiserver's client certificate towards kubelets (logs, exec, node proxy), from the
	// cluster's CA as kubeadm issues it: a kubelet, or mqlet-bridge serving the kubelet API, checks
	// it against ClientCAFile. Kubelets' serving certificates are not verified
	// (no --kubelet-certificate-authority), as on most clusters.
	kubeletClient, err := c.ca.client("kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{"apiserver-kubelet-client.crt": kubeletClient.certPEM, "apiserver-kubelet-client.key": kubeletClient.keyPEM} {
		if err := writeSecret(c.path(name), data); err != nil {
			return err
		}
	}
	issuer := "https://kubernetes.default.svc.cluster.local"
	api, err := c.launch(APIServer, bins.apiserver, append([]string{
		"--etcd-servers=" + c.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// The lease reconciler refuses a loopback address for the kubernetes Service's
		// endpoints; nothing here reaches the apiserver through that Service.
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(apiPort),
		"--cert-dir=" + c.path("apiserver-certs"),
		"--tls-cert-file=" + c.path("apiserver.crt"),
		"--tls-private-key-file=" + c.path("apiserver.key"),
		"--client-ca-file=" + c.path("ca.crt"),
		"--kubelet-client-certificate=" + c.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + c.path("apiserver-kubelet-client.key"),
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=" + issuer,
		"--service-account-key-file=" + c.path("sa.key"),
		"--service-account-signing-key-file=" + c.path("sa.key"),
		"--service-cluster-ip-range=" + serviceCIDR,
		"--allow-privileged=true",
		"--profiling=false",
	}, c.opts.APIServerFlags...), nil)
	if err != nil {
		return err
	}
	cs, err := c.pollClient()
	if err != nil {
		return err
	}
	return waitFor(ctx, "kube-apiserver /readyz", api, func(ctx context.Context) error {
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("%w: %s", err, lastLines(string(body), 5))
		}
		return nil
	})
}

// pollClient is the admin's client for the readiness checks, without client-side rate limit:
// polling five times a second would otherwise wait on client-go's default 5 QPS.
func (c *Cluster) pollClient() (*kubernetes.Clientset, error) {
	cfg := rest.CopyConfig(c.admin)
	cfg.QPS = -1
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("admin client: %w", err)
	}
	return cs, nil
}

func (c *Cluster) startControllers(bins binaries) error {
	cmCreds, err := c.ca.client("system:kube-controller-manager")
	if err != nil {
		return err
	}
	cmConfig, err := c.writeKubeconfig("controller-manager.kubeconfig", "system:kube-controller-manager", cmCreds)
	if err != nil {
		return err
	}
	cmFlags := []string{
		"--kubeconfig=" + cmConfig,
		"--authentication-kubeconfig=" + cmConfig,
		"--authorization-kubeconfig=" + cmConfig,
		"--secure-port=0",
		"--leader-elect=true",
		// Each controller acts as its own ServiceAccount, as in a kubeadm cluster, so RBAC
		// applies to the controllers the way it does in production.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + c.path("sa.key"),
		"--root-ca-file=" + c.path("ca.crt"),
		"--cluster-signing-cert-file=" + c.path("ca.crt"),
		"--cluster-signing-key-file=" + c.path("ca.key"),
		"--controllers=*",
	}
	if !c.opts.KubeNodeTiming {
		period, grace := c.opts.NodeMonitorPeriod, c.opts.NodeMonitorGracePeriod
		if period == 0 {
			period = DefaultNodeMonitorPeriod
		}
		if grace == 0 {
			grace = DefaultNodeMonitorGracePeriod
		}
		cmFlags = append(cmFlags,
			"--node-monitor-period="+period.String(),
			"--node-monitor-grace-period="+grace.String(),
			"--node-startup-grace-period="+grace.String())
	}
	if _, err := c.launch(ControllerManager, bins.controllerManager, append(cmFlags, c.opts.ControllerManagerFlags...), nil); err != nil {
		return err
	}

	schedCreds, err := c.ca.client("system:kube-scheduler")
	if err != nil {
		return err
	}
	schedConfig, err := c.writeKubeconfig("scheduler.kubeconfig", "system:kube-scheduler", schedCreds)
	if err != nil {
		return err
	}
	_, err = c.launch(Scheduler, bins.scheduler, append([]string{
		"--kubeconfig=" + schedConfig,
		"--authentication-kubeconfig=" + schedConfig,
		"--authorization-kubeconfig=" + schedConfig,
		"--secure-port=0",
		"--leader-elect=true",
	}, c.opts.SchedulerFlags...), nil)
	return err
}

func (c *Cluster) launch(name, bin string, args, env []string) (*process, error) {
	c.opts.Logf("kubetest: starting %s", name)
	p, err := c.spawn.start(c.dir, name, bin, args, env)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

func (c *Cluster) proc(name string) *process {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.procs) - 1; i >= 0; i-- {
		if c.procs[i].name == name {
			return c.procs[i]
		}
	}
	return nil
}

// waitFor polls check until it succeeds, p exits, or ctx ends; the errors of the last two carry
// the last check error and p's log tail.
func waitFor(ctx context.Context, what string, p *process, check func(context.Context) error) error {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := check(cctx)
		cancel()
		if err == nil {
			return nil
		}
		// The check that ran into the deadline says only that; the one before says why.
		if last == nil || ctx.Err() == nil {
			last = err
		}
		if err := p.running(); err != nil {
			return fmt.Errorf("waiting for %s: %w; log tail (%s):\n%s", what, err, p.logPath, p.tail(30))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %v); %s log tail (%s):\n%s", what, ctx.Err(), last, p.name, p.logPath, p.tail(30))
		case <-tick.C:
		}
	}
}

// Stop ends the components in reverse start order (SIGTERM, SIGKILL after 10s), each by its own
// pid, and removes etcd's tmpfs data and the directory StartCluster made (unless KeepDir). It is
// safe to call more than once.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		c.stopErr = c.stopAll()
		c.spawn.close()
		if c.etcdDir != "" {
			if err := os.RemoveAll(c.etcdDir); err != nil {
				c.stopErr = errors.Join(c.stopErr, fmt.Errorf("remove etcd data %s: %w", c.etcdDir, err))
			}
		}
		if c.ownDir && !c.opts.KeepDir {
			if err := os.RemoveAll(c.dir); err != nil {
				c.stopErr = errors.Join(c.stopErr, fmt.Errorf("remove cluster dir %s: %w", c.dir, err))
			}
		}
	})
	return c.stopErr
}

func (c *Cluster) stopAll() error {
	c.mu.Lock()
	procs := c.procs
	c.procs = nil
	c.mu.Unlock()
	var errs []error
	for i := len(procs) - 1; i >= 0; i-- {
		if err := procs[i].stop(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// logTails writes the last n lines of every component's log.
func (c *Cluster) logTails(logf func(string, ...any), n int) {
	for _, name := range []string{Etcd, APIServer, ControllerManager, Scheduler} {
		path := c.path(name + ".log")
		if _, err := os.Stat(path); err == nil {
			logf("kubetest: last %d lines of %s:\n%s", n, path, tailFile(path, n))
		}
	}
}

// RESTConfig returns a new copy of the admin's client configuration (system:masters).
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.admin) }

// Kubeconfig returns the path of the admin's kubeconfig file.
func (c *Cluster) Kubeconfig() string { return c.kubeconfig }

// Kubectl returns the path of the kubectl of the cluster's version (scripts/kubebins.sh builds
// it): tests use it, not whatever kubectl the machine has.
func (c *Cluster) Kubectl() string { return c.kubectl }

// Host returns the apiserver's URL (https://127.0.0.1:port).
func (c *Cluster) Host() string { return c.host }

// EtcdURL returns etcd's client URL.
func (c *Cluster) EtcdURL() string { return c.etcdURL }

// ClientCAFile is the cluster's client CA (PEM): it issued every client certificate, the
// apiserver's kubelet client certificate included.
func (c *Cluster) ClientCAFile() string { return c.path("ca.crt") }

// Dir returns the directory holding the cluster's certificates, kubeconfigs and logs
// (<component>.log).
func (c *Cluster) Dir() string { return c.dir }

// CACert returns the cluster CA certificate (PEM): it signed the apiserver's serving certificate
// and is the client CA.
func (c *Cluster) CACert() []byte { return append([]byte(nil), c.ca.certPEM...) }

// PIDs returns the pid of each running component, keyed by Etcd, APIServer, ControllerManager
// and Scheduler (for measuring their CPU and memory).
func (c *Cluster) PIDs() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]int, len(c.procs))
	for _, p := range c.procs {
		if p.running() == nil {
			m[p.name] = p.cmd.Process.Pid
		}
	}
	return m
}

// UserKubeconfig writes a kubeconfig for a client-certificate identity with the given user name
// and groups, and returns its path. The identity has no rights beyond what RBAC grants it (and
// system:authenticated's defaults). It fails the test (Start) or panics (StartCluster) when the
// certificate or the file cannot be written.
func (c *Cluster) UserKubeconfig(name string, groups ...string) string {
	path, err := c.userKubeconfig(name, groups...)
	if err != nil {
		c.fail(err)
	}
	return path
}

// UserRESTConfig is UserKubeconfig's identity as a client configuration.
func (c *Cluster) UserRESTConfig(name string, groups ...string) *rest.Config {
	kp, err := c.ca.client(name, groups...)
	if err != nil {
		c.fail(fmt.Errorf("client certificate for user %q: %w", name, err))
	}
	return &rest.Config{Host: c.host, TLSClientConfig: rest.TLSClientConfig{
		CAData: c.ca.certPEM, CertData: kp.certPEM, KeyData: kp.keyPEM}}
}

func (c *Cluster) userKubeconfig(name string, groups ...string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("user kubeconfig: empty user name")
	}
	kp, err := c.ca.client(name, groups...)
	if err != nil {
		return "", fmt.Errorf("client certificate for user %q: %w", name, err)
	}
	return c.writeKubeconfig(c.userFile(name), name, kp)
}

// ServiceAccountKubeconfig writes a kubeconfig that authenticates as the ServiceAccount
// namespace/name with a bound token from the TokenRequest API (valid 24h), creating the namespace
// and the ServiceAccount when they do not exist: the identity the bridge has when deployed with
// configs/' manifests. Errors fail the test (Start) or panic (StartCluster).
func (c *Cluster) ServiceAccountKubeconfig(namespace, name string) string {
	path, err := c.serviceAccountKubeconfig(namespace, name)
	if err != nil {
		c.fail(err)
	}
	return path
}

func (c *Cluster) serviceAccountKubeconfig(namespace, name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := kubernetes.NewForConfig(c.admin)
	if err != nil {
		return "", fmt.Errorf("admin client: %w", err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("create namespace %s: %w", namespace, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("create serviceaccount %s/%s: %w", namespace, name, err)
	}
	expiry := int64((24 * time.Hour).Seconds())
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for serviceaccount %s/%s: %w", namespace, name, err)
	}
	user := "system:serviceaccount:" + namespace + ":" + name
	cfg := c.kubeconfigFor(user)
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	path := c.path(c.userFile(user))
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return path, nil
}

var unsafeFileChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// userFile names a user's kubeconfig uniquely (names may repeat with other groups).
func (c *Cluster) userFile(user string) string {
	c.mu.Lock()
	c.users++
	n := c.users
	c.mu.Unlock()
	return fmt.Sprintf("user-%d-%s.kubeconfig", n, unsafeFileChars.ReplaceAllString(user, "_"))
}

func (c *Cluster) writeKubeconfig(file, user string, kp keyPair) (string, error) {
	cfg := c.kubeconfigFor(user)
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: kp.certPEM, ClientKeyData: kp.keyPEM}
	path := c.path(file)
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return path, nil
}

func (c *Cluster) kubeconfigFor(user string) *clientcmdapi.Config {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: c.host, CertificateAuthorityData: c.ca.certPEM}
	cfg.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: user}
	cfg.CurrentContext = "kubetest"
	return cfg
}

func (c *Cluster) path(name string) string { return filepath.Join(c.dir, name) }

func (c *Cluster) fail(err error) {
	if c.t != nil {
		c.t.Helper()
		c.t.Fatalf("kubetest: %v", err)
	}
	panic(fmt.Sprintf("kubetest: %v", err))
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// HostAddress is this host's first non-loopback, non-link-local IPv4 address: where a bridge in
// a test serves the kubelet API, since the API server refuses to proxy (/api/v1/nodes/<node>/
// proxy) to loopback and link-local addresses. Traffic to it stays on this host.
func HostAddress() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String(), nil
		}
	}
	return "", errors.New("this host has no non-loopback IPv4 address for the kubelet API (the API server does not proxy to loopback)")
}
