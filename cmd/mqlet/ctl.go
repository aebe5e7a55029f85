package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/sync/ctlclient"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
	"github.com/mqlet/mqlet/sync/signing"

	"sigs.k8s.io/yaml"
)

// CtlCmd is `mqlet ctl`: a control plane over MQTT for fleets without Kubernetes. It writes the
// nodes' desired state and reads what they report, all through the broker's retained messages, so
// no node needs to be online for apply and delete.
type CtlCmd struct {
	Config       string        `name:"config" env:"MQLET_CTL_CONFIG" help:"YAML file with the connection settings (broker, caFile, certFile, keyFile, username, passwordFile, topicPrefix, signingKey, trustedKeys, nodeCA, nodeCRL); flags override it."`
	Broker       string        `name:"broker" env:"MQLET_CTL_BROKER" help:"Broker URL: tcp://, ssl://, tls://, ws://, wss://, mqtt:// or mqtts://."`
	CAFile       string        `name:"ca-file" help:"CA certificate (PEM) that verifies the broker; default: the system's roots."`
	CertFile     string        `name:"cert-file" help:"Client certificate (PEM)."`
	KeyFile      string        `name:"key-file" help:"Client key (PEM)."`
	Username     string        `name:"username" help:"MQTT username."`
	PasswordFile string        `name:"password-file" help:"File holding the MQTT password (never on the command line, where ps shows it)."`
	TopicPrefix  string        `name:"topic-prefix" help:"Topic prefix of the fleet (default mqlet/v2)."`
	Timeout      time.Duration `name:"timeout" default:"10s" help:"Bound of each exchange with the broker."`
	SigningKey   string        `name:"signing-key" help:"Ed25519 private key (PEM, from mqlet ctl keygen; mode 0600) that signs every index written; nodes with trusted keys take only signed ones."`
	TrustedKeys  []string      `name:"trusted-key" placeholder:"FILE" help:"Public key (PEM) of a previous signing key whose indexes this ctl still builds on during a key rotation; repeatable."`
	NodeCA       string        `name:"node-ca" placeholder:"FILE|none" help:"CA certificate (PEM) that issues the nodes' client certificates: Secrets are sealed only to a key the node's certificate vouches for. Default with --cert-file: the CA in --ca-file that issued ctl's own certificate; none: take the key as the broker hands it over."`
	NodeCRL      string        `name:"node-crl" placeholder:"FILE" help:"The fleet CA's CRL (PEM, the broker's crlfile): a revoked node certificate vouches for no sealing key."`

	Apply       CtlApplyCmd       `cmd:"" help:"Apply Pods, ConfigMaps and Secrets from a file to a node."`
	Delete      CtlDeleteCmd      `cmd:"" help:"Delete a pod, configmap or secret of a node."`
	Get         CtlGetCmd         `cmd:"" help:"List nodes or pods."`
	Describe    CtlDescribeCmd    `cmd:"" help:"Show a node or a pod in detail."`
	Logs        CtlLogsCmd        `cmd:"" help:"Print the log of a container of a pod on a node."`
	Exec        CtlExecCmd        `cmd:"" help:"Run a command in a container of a pod on a node, sealed end to end (like kubectl exec)."`
	Attach      CtlAttachCmd      `cmd:"" help:"Attach to the process of a container of a pod on a node, sealed end to end (like kubectl attach)."`
	PortForward CtlPortForwardCmd `cmd:"" name:"port-forward" help:"Forward a local port to a port of a pod on a node, sealed end to end (like kubectl port-forward)."`
	Keygen      CtlKeygenCmd      `cmd:"" help:"Make a key pair that signs desired state: PREFIX.key (keep it secret) and PREFIX.pub (give it to the nodes)."`
}

// CtlKeygenCmd is `mqlet ctl keygen`.
type CtlKeygenCmd struct {
	Out string `name:"out" required:"" placeholder:"PREFIX" help:"Write PREFIX.key (mode 0600) and PREFIX.pub; neither may exist."`
}

// Run writes the key pair. It needs no broker.
func (c *CtlKeygenCmd) Run(env *ctlEnv) error {
	pub, err := signing.GenerateKeyPair(c.Out)
	if err != nil {
		return fmt.Errorf("keygen: %w", err)
	}
	fmt.Fprintf(env.out, "wrote %s.key (private: keep it on the control plane only) and %s.pub (key id %s: give it to nodes with --mqtt-trusted-key)\n",
		c.Out, c.Out, protocol.KeyID(pub))
	return nil
}

// ctlEnv is what ctl commands read and write, and their clock and context: main binds the
// process's, tests their own.
type ctlEnv struct {
	ctx context.Context
	// signals makes SIGINT and SIGTERM end the context (the process's env; not in tests).
	signals bool
	in      io.Reader
	out     io.Writer
	errOut  io.Writer
	now     func() time.Time
}

// context is the context of one command: interrupting ends its waits (a followed log) cleanly.
// Only ctl commands ask for it, so other commands keep the default signal handling.
func (e *ctlEnv) context() (context.Context, context.CancelFunc) {
	if e.signals {
		return signal.NotifyContext(e.ctx, syscall.SIGINT, syscall.SIGTERM)
	}
	return context.WithCancel(e.ctx)
}

// ctlFile is the --config file. Paths in it are relative to the file's directory.
type ctlFile struct {
	Broker       string   `json:"broker"`
	CAFile       string   `json:"caFile"`
	CertFile     string   `json:"certFile"`
	KeyFile      string   `json:"keyFile"`
	Username     string   `json:"username"`
	PasswordFile string   `json:"passwordFile"`
	TopicPrefix  string   `json:"topicPrefix"`
	SigningKey   string   `json:"signingKey"`
	TrustedKeys  []string `json:"trustedKeys"`
	NodeCA       string   `json:"nodeCA"`
	NodeCRL      string   `json:"nodeCRL"`
}

// options merges the config file and the flags (a flag that is set wins) and reads the password.
func (c *CtlCmd) options() (ctlclient.Options, error) {
	var f ctlFile
	if c.Config != "" {
		data, err := os.ReadFile(c.Config)
		if err != nil {
			return ctlclient.Options{}, fmt.Errorf("read ctl config: %w", err)
		}
		if err := yaml.UnmarshalStrict(data, &f); err != nil {
			return ctlclient.Options{}, fmt.Errorf("ctl config %s: %w", c.Config, err)
		}
		dir := filepath.Dir(c.Config)
		for _, p := range []*string{&f.CAFile, &f.CertFile, &f.KeyFile, &f.PasswordFile, &f.SigningKey, &f.NodeCA, &f.NodeCRL} {
			if *p != "" && *p != "none" && !filepath.IsAbs(*p) {
				*p = filepath.Join(dir, *p)
			}
		}
	}
	pick := func(flag, file string) string {
		if flag != "" {
			return flag
		}
		return file
	}
	o := ctlclient.Options{
		Broker:      pick(c.Broker, f.Broker),
		CAFile:      pick(c.CAFile, f.CAFile),
		CertFile:    pick(c.CertFile, f.CertFile),
		KeyFile:     pick(c.KeyFile, f.KeyFile),
		Username:    pick(c.Username, f.Username),
		TopicPrefix: pick(c.TopicPrefix, f.TopicPrefix),
		Timeout:     c.Timeout,
	}
	if o.Broker == "" {
		return o, fmt.Errorf("no broker: give --broker URL, or broker: in the --config file")
	}
	if k := pick(c.SigningKey, f.SigningKey); k != "" {
		var err error
		if o.SigningKey, err = signing.LoadPrivateKey(k); err != nil {
			return o, fmt.Errorf("signing key: %w", err)
		}
	}
	trusted := c.TrustedKeys
	if len(trusted) == 0 {
		trusted = f.TrustedKeys
		for i, p := range trusted {
			if p != "" && !filepath.IsAbs(p) && c.Config != "" {
				trusted[i] = filepath.Join(filepath.Dir(c.Config), p)
			}
		}
	}
	if len(trusted) > 0 {
		if o.SigningKey == nil {
			return o, fmt.Errorf("--trusted-key needs --signing-key: trusted keys only say which signed indexes a signing ctl builds on")
		}
		var err error
		if o.TrustedKeys, err = signing.LoadPublicKeys(trusted); err != nil {
			return o, err
		}
	}
	var err error
	if o.NodeTrust, err = sealing.LoadNodeTrust(pick(c.NodeCA, f.NodeCA), pick(c.NodeCRL, f.NodeCRL), o.CAFile, o.CertFile); err != nil {
		return o, err
	}
	if pw := pick(c.PasswordFile, f.PasswordFile); pw != "" {
		var err error
		if o.Password, err = config.ReadPasswordFile(pw); err != nil {
			return o, fmt.Errorf("read password file: %w", err)
		}
		if o.Username == "" {
			return o, fmt.Errorf("password file %s given without a username", pw)
		}
	}
	return o, nil
}

// connect opens a client with the merged options.
func (c *CtlCmd) connect(ctx context.Context) (*ctlclient.Client, error) {
	o, err := c.options()
	if err != nil {
		return nil, err
	}
	return ctlclient.Connect(ctx, o)
}

// warnSkipped reports retained messages that could not be read, after what could.
func warnSkipped(w io.Writer, skipped []error) {
	for _, err := range skipped {
		fmt.Fprintf(w, "warning: skipped %v\n", err)
	}
}
