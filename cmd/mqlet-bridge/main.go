// Command mqlet-bridge makes mqlet nodes Nodes of a Kubernetes cluster: it talks to the
// Kubernetes API on one side and to the nodes' MQTT broker on the other (docs/protocol.md).
package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/mqlet/mqlet/bridge"
	"github.com/mqlet/mqlet/bridge/kubeletapi"
	"github.com/mqlet/mqlet/bridge/mq"
	"github.com/mqlet/mqlet/bridge/nodes"
	"github.com/mqlet/mqlet/bridge/pods"
	"github.com/mqlet/mqlet/internal/buildversion"
	"github.com/mqlet/mqlet/sync/sealing"
	"github.com/mqlet/mqlet/sync/signing"

	"github.com/alecthomas/kong"
)

// Stamped by the Makefile with -ldflags "-X main.stampedVersion=... -X main.stampedCommit=...".
var stampedVersion, stampedCommit string

// version and commit are what the bridge reports (version, --version, its user agent towards the
// Kubernetes API, bridge_build_info): the stamps, or for a plain `go build` what the go command
// recorded of the checkout.
var version, commit = buildversion.Resolve(stampedVersion, stampedCommit, debug.ReadBuildInfo)

type cli struct {
	Version kong.VersionFlag `help:"Print the version and exit."`

	Run      RunCmd     `cmd:"" default:"withargs" help:"Run the bridge (the default command)."`
	VersionC VersionCmd `cmd:"" name:"version" help:"Print the version."`
}

// RunCmd holds the bridge's flags.
type RunCmd struct {
	Kubeconfig   string  `placeholder:"FILE" type:"existingfile" help:"kubeconfig file; without it the in-cluster config (the pod's service account) is used."`
	KubeAPIQPS   float32 `name:"kube-api-qps" default:"200" help:"Queries per second to the Kubernetes API (a 1,000-node fleet renews ~100 node Leases a second)."`
	KubeAPIBurst int     `name:"kube-api-burst" default:"400" help:"Burst of queries to the Kubernetes API."`

	LeaderElect          bool          `default:"true" negatable:"" help:"Elect a leader through the coordination Lease ${lease} (only the leader connects to MQTT and writes). --no-leader-elect for a single replica."`
	LeaderElectNamespace string        `placeholder:"NS" help:"Namespace of the leader Lease (default: the pod's namespace, else kube-system)."`
	LeaderElectIdentity  string        `placeholder:"ID" help:"This replica's identity in the leader Lease (default: hostname_random)."`
	LeaderElectLease     time.Duration `name:"leader-elect-lease-duration" default:"15s" help:"How long a standby waits after the leader's last renewal before taking over."`
	LeaderElectRenew     time.Duration `name:"leader-elect-renew-deadline" default:"10s" help:"How long the leader keeps trying to renew before it gives up (and exits)."`
	LeaderElectRetry     time.Duration `name:"leader-elect-retry-period" default:"2s" help:"How often candidates try to acquire or renew the leader Lease."`

	NodeSelector              string        `default:"${roleLabel}" help:"Label selector of the Nodes this bridge serves; a node whose labels would not match it is not registered."`
	NodeRoleLabel             string        `default:"${roleLabel}" help:"Label (value empty) added to every Node the bridge registers; \"\" adds none."`
	NodeLeaseRenewInterval    time.Duration `default:"10s" help:"How often an online node's Lease in kube-node-lease is renewed (kubelet: 10s)."`
	NodeLeaseDuration         time.Duration `default:"40s" help:"leaseDurationSeconds of node Leases (kubelet: 40s)."`
	NodeStatusReportFrequency time.Duration `default:"5m" help:"An online node's status is posted again (fresh heartbeat) this long after the last post, even unchanged (kubelet's nodeStatusReportFrequency)."`

	MQTTBroker       string        `name:"mqtt-broker" required:"" placeholder:"URL" help:"Broker URL: tcp://, ssl://, tls://, ws://, wss://, mqtt:// or mqtts:// (no credentials in it)."`
	MQTTCAFile       string        `name:"mqtt-ca-file" type:"existingfile" placeholder:"FILE" help:"CA (PEM) that verifies the broker; default the system's roots."`
	MQTTCertFile     string        `name:"mqtt-cert-file" type:"existingfile" placeholder:"FILE" help:"Client certificate (PEM); its CN is the bridge's identity on brokers that use it as the username."`
	MQTTKeyFile      string        `name:"mqtt-key-file" type:"existingfile" placeholder:"FILE" help:"Client key (PEM)."`
	MQTTUsername     string        `name:"mqtt-username" placeholder:"USER" help:"MQTT username."`
	MQTTPasswordFile string        `name:"mqtt-password-file" type:"existingfile" placeholder:"FILE" help:"File holding the MQTT password, readable by its owner only (chmod 600); never logged."`
	MQTTClientID     string        `name:"mqtt-client-id" placeholder:"ID" help:"MQTT client id (default mqlet-bridge-<hostname>-<random>)."`
	MQTTTimeout      time.Duration `name:"mqtt-timeout" default:"10s" help:"Bound of the MQTT connect, subscribes and retained-state reads."`
	TopicPrefix      string        `default:"mqlet/v2" help:"Topic prefix of the mqlet tree."`
	SigningKey       string        `name:"signing-key" type:"existingfile" placeholder:"FILE" help:"Ed25519 private key (PKCS #8 PEM, mode 0600 or stricter; from mqlet ctl keygen) that signs every index the bridge writes; nodes with trust anchors (--mqtt-trusted-key) take only signed ones. In a pod, mount it from a Secret with defaultMode 0400."`
	NodeCA           string        `name:"node-ca" placeholder:"FILE|none" help:"CA certificate (PEM) that issues the nodes' client certificates: Secrets are sealed only to a key the node's certificate vouches for. Default with --mqtt-cert-file: the CA in --mqtt-ca-file that issued the bridge's own certificate; none: take the key as the broker hands it over."`
	NodeCRL          string        `name:"node-crl" placeholder:"FILE" help:"The fleet CA's CRL (PEM, the broker's crlfile), read again when it changes: a revoked node certificate vouches for no sealing key."`

	NoServiceAccountTokens    bool          `name:"no-service-account-tokens" help:"Give pods no API token: strip the kube-api-access-* volume the API injects (a serviceAccountToken volume a user wrote is refused by the node). By default the bridge asks the TokenRequest API for each and sends the token sealed to the node."`
	ServiceAccountTokenMaxAge time.Duration `name:"service-account-token-max-age" default:"24h" hidden:"" help:"Renew a pod's token once this old even before 80% of its lifetime (kubelet: 24h); tests shorten it."`

	KubeletAddress  string `placeholder:"IP" help:"IP the Kubernetes API server reaches the bridge on for the nodes' kubelet API (logs, exec, stats): each Node gets it as its InternalIP. Default: $POD_IP, else the first non-loopback address."`
	KubeletPorts    string `default:"${kubeletPorts}" placeholder:"LIST" help:"Ports for the nodes' kubelet API, one per node (ranges and ports, comma-separated); none serves no kubelet API."`
	KubeletTLSCert  string `name:"kubelet-tls-cert" type:"existingfile" placeholder:"FILE" help:"Serving certificate (PEM) of the kubelet API; default a self-signed one made at start."`
	KubeletTLSKey   string `name:"kubelet-tls-key" type:"existingfile" placeholder:"FILE" help:"Key (PEM) of --kubelet-tls-cert."`
	KubeletClientCA string `name:"kubelet-client-ca" type:"existingfile" placeholder:"FILE" help:"CA (PEM) whose client certificates the kubelet API accepts: the cluster's client CA, which issues the API server's --kubelet-client-certificate. Without it only bearer tokens (TokenReview) authenticate."`

	MetricsAddr string `default:"127.0.0.1:10360" help:"Address of /metrics, /healthz and /readyz (in a pod use :10360 so the kubelet's probes reach it); \"-\" serves nothing."`
	LogLevel    string `default:"info" enum:"debug,info,warn,error" help:"Log level: debug, info, warn or error."`
}

// VersionCmd prints the build's version and commit.
type VersionCmd struct{}

// Run prints "mqlet-bridge VERSION (commit COMMIT)".
func (VersionCmd) Run(env *runEnv) error {
	_, err := fmt.Fprintln(env.stdout, versionLine())
	return err
}

// versionLine is what `mqlet-bridge version` and `--version` print.
func versionLine() string { return fmt.Sprintf("mqlet-bridge %s (commit %s)", version, commit) }

// options turns the flags into bridge options; key signs the indexes (nil: unsigned), nodes
// verifies the nodes' sealing keys (nil: not verified).
func (r *RunCmd) options(log *slog.Logger, key ed25519.PrivateKey, nodes *sealing.NodeTrust) bridge.Options {
	return bridge.Options{
		Kubeconfig:           r.Kubeconfig,
		KubeAPIQPS:           r.KubeAPIQPS,
		KubeAPIBurst:         r.KubeAPIBurst,
		LeaderElect:          r.LeaderElect,
		LeaderElectNamespace: r.LeaderElectNamespace,
		Identity:             r.LeaderElectIdentity,
		LeaseDuration:        r.LeaderElectLease,
		RenewDeadline:        r.LeaderElectRenew,
		RetryPeriod:          r.LeaderElectRetry,
		MQTT: mq.Options{
			Broker:       r.MQTTBroker,
			CAFile:       r.MQTTCAFile,
			CertFile:     r.MQTTCertFile,
			KeyFile:      r.MQTTKeyFile,
			Username:     r.MQTTUsername,
			PasswordFile: r.MQTTPasswordFile,
			ClientID:     r.MQTTClientID,
			TopicPrefix:  r.TopicPrefix,
			Timeout:      r.MQTTTimeout,
		},
		NodeSelector:              r.NodeSelector,
		RoleLabel:                 r.NodeRoleLabel,
		NoRoleLabel:               r.NodeRoleLabel == "",
		NodeLeaseRenewInterval:    r.NodeLeaseRenewInterval,
		NodeLeaseDuration:         r.NodeLeaseDuration,
		NodeStatusReportFrequency: r.NodeStatusReportFrequency,
		MetricsAddr:               r.MetricsAddr,
		Version:                   version,
		Log:                       log,
		Pods: podsPart(pods.Options{SigningKey: key, NodeTrust: nodes, // see pods.go
			NoServiceAccountTokens: r.NoServiceAccountTokens, TokenMaxAge: r.ServiceAccountTokenMaxAge}),
	}
}

// kubeletOptions turns the --kubelet-* flags into the bridge's kubelet API options (nil: none).
func (r *RunCmd) kubeletOptions(key ed25519.PrivateKey) (*bridge.KubeletOptions, error) {
	if r.KubeletPorts == "" || r.KubeletPorts == "none" {
		return nil, nil
	}
	ports, err := kubeletapi.ParsePorts(r.KubeletPorts)
	if err != nil {
		return nil, fmt.Errorf("--kubelet-ports: %w", err)
	}
	addr := r.KubeletAddress
	if addr == "" {
		if addr, err = defaultKubeletAddress(); err != nil {
			return nil, fmt.Errorf("--kubelet-address: %w", err)
		}
	}
	if net.ParseIP(addr) == nil {
		return nil, fmt.Errorf("--kubelet-address %q: not an IP address (the API server dials the Node's InternalIP)", addr)
	}
	return &bridge.KubeletOptions{Address: addr, Ports: ports, CertFile: r.KubeletTLSCert, KeyFile: r.KubeletTLSKey,
		ClientCAFile: r.KubeletClientCA, SigningKey: key}, nil
}

// defaultKubeletAddress is $POD_IP (the Deployment sets it from status.podIP), else the first
// non-loopback address of this host.
func defaultKubeletAddress() (string, error) {
	if ip := os.Getenv("POD_IP"); ip != "" {
		return ip, nil
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() && n.IP.To4() != nil {
			return n.IP.String(), nil
		}
	}
	return "", fmt.Errorf("no non-loopback address on this host: give one")
}

// validate checks what kong cannot: relations between flags.
func (r *RunCmd) validate() error {
	switch {
	case r.KubeAPIQPS <= 0:
		return fmt.Errorf("--kube-api-qps %v: must be positive", r.KubeAPIQPS)
	case r.KubeAPIBurst <= 0:
		return fmt.Errorf("--kube-api-burst %d: must be positive", r.KubeAPIBurst)
	case r.NodeLeaseRenewInterval <= 0 || r.NodeLeaseDuration <= 0 || r.NodeStatusReportFrequency <= 0:
		return fmt.Errorf("--node-lease-renew-interval, --node-lease-duration and --node-status-report-frequency must be positive")
	case r.NodeLeaseRenewInterval >= r.NodeLeaseDuration:
		return fmt.Errorf("--node-lease-renew-interval %s must be shorter than --node-lease-duration %s", r.NodeLeaseRenewInterval, r.NodeLeaseDuration)
	case r.NodeLeaseDuration%time.Second != 0:
		return fmt.Errorf("--node-lease-duration %s: a Lease counts whole seconds", r.NodeLeaseDuration)
	case r.LeaderElect && !(r.LeaderElectLease > r.LeaderElectRenew && r.LeaderElectRenew > r.LeaderElectRetry && r.LeaderElectRetry > 0):
		return fmt.Errorf("leader election wants lease duration (%s) > renew deadline (%s) > retry period (%s) > 0",
			r.LeaderElectLease, r.LeaderElectRenew, r.LeaderElectRetry)
	case (r.MQTTCertFile == "") != (r.MQTTKeyFile == ""):
		return fmt.Errorf("--mqtt-cert-file and --mqtt-key-file go together: give both or neither")
	case r.MQTTPasswordFile != "" && r.MQTTUsername == "":
		return fmt.Errorf("--mqtt-password-file needs --mqtt-username")
	case (r.KubeletTLSCert == "") != (r.KubeletTLSKey == ""):
		return fmt.Errorf("--kubelet-tls-cert and --kubelet-tls-key go together: give both or neither")
	}
	return nil
}

// Run runs the bridge until SIGINT or SIGTERM.
func (r *RunCmd) Run(env *runEnv) error {
	if err := r.validate(); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(r.LogLevel)); err != nil {
		return fmt.Errorf("--log-level %q: %w", r.LogLevel, err)
	}
	log := slog.New(slog.NewTextHandler(env.stderr, &slog.HandlerOptions{Level: level}))
	var key ed25519.PrivateKey
	if r.SigningKey != "" {
		var err error
		if key, err = signing.LoadPrivateKey(r.SigningKey); err != nil {
			return fmt.Errorf("--signing-key: %w", err)
		}
	} else {
		log.Warn("no --signing-key: the indexes this bridge writes are unsigned, so nodes with trust anchors refuse them, and nodes without anchors run whatever anyone who can write their topics publishes; see docs/security.md")
	}
	nodeTrust, err := sealing.LoadNodeTrust(r.NodeCA, r.NodeCRL, r.MQTTCAFile, r.MQTTCertFile)
	if err != nil {
		return fmt.Errorf("--node-ca/--node-crl: %w", err)
	}
	if nodeTrust == nil {
		log.Warn("no --node-ca: nodes' sealing keys are taken as the broker hands them over, so a broker that replaced one could read the Secrets sealed to it; see docs/security.md")
	}
	opts := r.options(log, key, nodeTrust)
	if opts.Kubelet, err = r.kubeletOptions(key); err != nil {
		return err
	}
	if opts.Kubelet != nil {
		opts.Kubelet.NodeTrust = nodeTrust // exec sessions agree keys only with an attested one
	}
	b, err := bridge.New(opts)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(env.ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Info("mqlet-bridge starting", "version", version, "commit", commit, "broker", r.MQTTBroker, "node_selector", r.NodeSelector)
	return b.Run(ctx)
}

type runEnv struct {
	ctx    context.Context
	stdout io.Writer
	stderr io.Writer
}

func parser(c *cli, opts ...kong.Option) (*kong.Kong, error) {
	return kong.New(c, append([]kong.Option{
		kong.Name("mqlet-bridge"),
		kong.Description("mqlet-bridge makes mqlet edge nodes Nodes of a Kubernetes cluster, over MQTT."),
		kong.Vars{"roleLabel": nodes.DefaultRoleLabel, "lease": bridge.LeaderLeaseName, "version": versionLine(), "kubeletPorts": kubeletapi.DefaultPorts},
	}, opts...)...)
}

// kongExit carries the status kong asked to exit with (after --help or --version) out of the
// parse, so that run returns it instead of kong ending the process from inside.
type kongExit int

func (e kongExit) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// run runs the command line args and returns the exit status: 0, or 1 with a short error and a
// hint on env.stderr (the full usage is --help's).
func run(args []string, env *runEnv) int {
	var c cli
	p, err := parser(&c, kong.Writers(env.stdout, env.stderr), kong.Exit(func(code int) { panic(kongExit(code)) }))
	if err != nil {
		panic(err) // the CLI's own tags are wrong: a bug, caught by the tests
	}
	kctx, err := parseExiting(p, args)
	var exit kongExit
	if errors.As(err, &exit) {
		return int(exit)
	}
	if err != nil {
		fmt.Fprintf(env.stderr, "mqlet-bridge: %v\nRun 'mqlet-bridge --help' for usage.\n", err)
		return 1
	}
	if err := kctx.Run(env); err != nil {
		fmt.Fprintln(env.stderr, "mqlet-bridge:", err)
		return 1
	}
	return 0
}

// parseExiting is p.Parse with kong's exits (help, version) turned into a kongExit error.
func parseExiting(p *kong.Kong, args []string) (kctx *kong.Context, err error) {
	defer func() {
		if r := recover(); r != nil {
			code, ok := r.(kongExit)
			if !ok {
				panic(r)
			}
			kctx, err = nil, code
		}
	}()
	return p.Parse(args)
}

func main() {
	os.Exit(run(os.Args[1:], &runEnv{ctx: context.Background(), stdout: os.Stdout, stderr: os.Stderr}))
}
