package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/sync/broker"
	"github.com/mqlet/mqlet/sync/protocol"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// FleetSimCmd is mqlet-fleetsim's flags: many simulated nodes in one process, each the real agent code
// (MQTT source, admission, desired set, pod workers, node status, the MQTT sync with its outbox)
// over an in-memory store and an in-memory runtime (simruntime) whose containers run the
// moment they start. A control plane (mqlet-bridge, `mqlet ctl`) sees the traffic of real nodes:
// it is for the bridge's scale test and for sizing a broker. It creates no pods itself.
//
// The MQTT settings keep the agent's flag names, values and checks (config.Load validates them).
// Every simulated node uses the same credentials: a broker ACL that confines each node to its own
// topics by user name (pattern ... %u) must give the simulator's user every node's subtree, and
// use_username_as_clientid must be off for it, or the nodes would take over each other's session.
type FleetSimCmd struct {
	Nodes       int    `name:"nodes" default:"10" help:"Number of simulated nodes."`
	PodsPerNode int64  `name:"pods-per-node" default:"10" help:"Pods each node must have room for: its capacity and allocatable pods are at least this (and at least the agent's default of ${max_pods}). The simulator creates no pods; a control plane binds them (mqlet-bridge from the Kubernetes API, or mqlet ctl apply)."`
	NamePrefix  string `name:"name-prefix" default:"sim-" help:"Node names are PREFIX0000, PREFIX0001, ... (more digits past 10000 nodes)."`
	ConnectRate int    `name:"connect-rate" default:"100" help:"Nodes started (and connecting) per second, so a large fleet does not hit the broker all at once."`
	NodeCPUs    int    `name:"node-cpus" default:"4" help:"CPUs each simulated node reports."`
	NodeMemory  string `name:"node-memory" default:"4Gi" help:"Memory each simulated node reports, a quantity such as 4Gi."`
	Arch        string `name:"arch" default:"arm64" help:"Architecture each node reports (kubernetes.io/arch)."`

	Broker           string         `name:"broker" aliases:"mqtt-broker" required:"" placeholder:"URL" help:"MQTT broker, scheme://host:port with scheme tcp, ssl, tls, ws or wss (mqtt means tcp, mqtts ssl), as the agent's --mqtt-broker."`
	MQTTCAFile       *string        `name:"mqtt-ca-file" placeholder:"FILE" help:"CA bundle (PEM) for the broker's certificate; ssl, tls and wss brokers only (default the system roots)."`
	MQTTCertFile     *string        `name:"mqtt-cert-file" placeholder:"FILE" help:"Client certificate (PEM), used by every simulated node; needs --mqtt-key-file (default none)."`
	MQTTKeyFile      *string        `name:"mqtt-key-file" placeholder:"FILE" help:"Private key (PEM) of --mqtt-cert-file, readable by its owner only (chmod 600) (default none)."`
	MQTTUsername     *string        `name:"mqtt-username" placeholder:"NAME" help:"MQTT user name of every simulated node (default none)."`
	MQTTPasswordFile *string        `name:"mqtt-password-file" placeholder:"FILE" help:"File holding the MQTT password, readable by its owner only (default none)."`
	MQTTKeepalive    *time.Duration `name:"mqtt-keepalive" placeholder:"DURATION" help:"MQTT keepalive of each node in whole seconds, 5s to 65535s: with N nodes the broker sees N pings per keepalive (default ${mqtt_keepalive})."`
	MQTTTopicPrefix  *string        `name:"mqtt-topic-prefix" placeholder:"PREFIX" help:"First levels of every MQTT topic (default ${mqtt_topic_prefix})."`
	MQTTReconnectMax *time.Duration `name:"mqtt-reconnect-max" placeholder:"DURATION" help:"Longest wait between attempts to reach the broker (default ${mqtt_reconnect_max})."`
	MQTTMaxPayload   *int64         `name:"mqtt-max-payload" placeholder:"BYTES" help:"Largest MQTT message sent or accepted (default ${mqtt_max_payload})."`

	NodeLabels []string `name:"node-label" placeholder:"KEY=VALUE" help:"Label of every node; repeatable or comma-separated (default none; every node also gets mqlet.io/simulated=true)."`
	NodeTaints []string `name:"node-taint" placeholder:"KEY[=VALUE]:EFFECT" help:"Taint of every node; repeatable or comma-separated (default none)."`

	// The agent's periodic safety nets, lengthened for simulated nodes: they change no traffic
	// (the node status is published only when it changes, the relist catches containerd events the
	// simulated runtime never loses), but 1,000 nodes at the agent's 10s are 200 wakeups a second.
	RelistPeriod              time.Duration `name:"relist-period" default:"5m" help:"Period of each node's relist (the agent's default is ${relist_period})."`
	NodeStatusUpdateFrequency time.Duration `name:"node-status-update-frequency" default:"5m" help:"How often each node's status is computed; new images and the first Ready are picked up at once anyway (the agent's default is ${node_status_update_frequency})."`

	LogLevel     string `name:"log-level" default:"info" help:"Log level of the simulator's own lines: debug, info, warn or error."`
	NodeLogLevel string `name:"node-log-level" default:"warn" help:"Log level of the simulated agents (each line names its node): debug, info, warn or error."`
	LogFormat    string `name:"log-format" default:"text" help:"Log format: text or json."`
}

// fleet checks the flags and builds the fleet's shared settings.
func (c *FleetSimCmd) fleet(w io.Writer) (*fleet, error) {
	var errs []error
	bad := func(flag, format string, args ...any) {
		errs = append(errs, fmt.Errorf("--%s: %s", flag, fmt.Sprintf(format, args...)))
	}
	if c.Nodes < 1 {
		bad("nodes", "%d: must be at least 1", c.Nodes)
	}
	if c.PodsPerNode < 0 {
		bad("pods-per-node", "%d: must not be negative", c.PodsPerNode)
	}
	if c.ConnectRate < 1 {
		bad("connect-rate", "%d: must be at least 1 node per second", c.ConnectRate)
	}
	if c.NodeCPUs < 1 {
		bad("node-cpus", "%d: must be at least 1", c.NodeCPUs)
	}
	mem, err := resource.ParseQuantity(c.NodeMemory)
	if err != nil || mem.Sign() <= 0 {
		bad("node-memory", "%q: want a positive quantity such as 4Gi", c.NodeMemory)
	}
	if msgs := validation.IsValidLabelValue(c.Arch); c.Arch == "" || len(msgs) > 0 {
		bad("arch", "%q: want an architecture name such as arm64 or amd64", c.Arch)
	}
	width := max(4, len(strconv.Itoa(c.Nodes-1)))
	names := func(i int) string { return fmt.Sprintf("%s%0*d", c.NamePrefix, width, i) }
	for _, i := range []int{0, max(c.Nodes-1, 0)} {
		if err := protocol.ValidateNodeName(names(i)); err != nil {
			bad("name-prefix", "%q makes node names like %q: %v", c.NamePrefix, names(i), err)
			break
		}
	}
	var levels [2]slog.Level
	for i, l := range []struct{ flag, v string }{{"log-level", c.LogLevel}, {"node-log-level", c.NodeLogLevel}} {
		if err := levels[i].UnmarshalText([]byte(l.v)); err != nil {
			bad(l.flag, "%q: must be one of debug, info, warn, error", l.v)
		}
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("log-format", "%q: must be text or json", c.LogFormat)
	}
	if c.RelistPeriod < time.Second {
		bad("relist-period", "%s: must be at least 1s", c.RelistPeriod)
	}
	if c.NodeStatusUpdateFrequency < time.Second {
		bad("node-status-update-frequency", "%s: must be at least 1s", c.NodeStatusUpdateFrequency)
	}

	// The agent's own loading and checks, for what the simulated nodes share with real ones. The
	// environment is not read: MQLET_* variables meant for an agent on this machine must not
	// change the simulator.
	maxPods := max(c.PodsPerNode, config.Defaults().MaxPods)
	relist, statusEvery := c.RelistPeriod, c.NodeStatusUpdateFrequency
	first := names(0)
	cfg, err := config.Load(config.Flags{
		NodeName:   &first,
		MQTTBroker: &c.Broker, MQTTCAFile: c.MQTTCAFile, MQTTCertFile: c.MQTTCertFile, MQTTKeyFile: c.MQTTKeyFile,
		MQTTUsername: c.MQTTUsername, MQTTPasswordFile: c.MQTTPasswordFile, MQTTKeepalive: c.MQTTKeepalive,
		MQTTTopicPrefix: c.MQTTTopicPrefix, MQTTReconnectMax: c.MQTTReconnectMax, MQTTMaxPayload: c.MQTTMaxPayload,
		NodeLabels: c.NodeLabels, NodeTaints: c.NodeTaints, MaxPods: &maxPods,
		RelistPeriod: &relist, NodeStatusUpdateFrequency: &statusEvery,
	}, nil)
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	mk := func(l slog.Level) slog.Handler {
		o := &slog.HandlerOptions{Level: l}
		if c.LogFormat == "json" {
			return slog.NewJSONHandler(w, o)
		}
		return slog.NewTextHandler(w, o)
	}
	return &fleet{
		cfg: cfg, nodes: c.Nodes, name: names, rate: c.ConnectRate,
		cpus: c.NodeCPUs, memory: mem.Value(), arch: c.Arch,
		log: slog.New(mk(levels[0])), nodeLog: slog.New(mk(levels[1])),
		sessionBase: time.Now().Unix(),
	}, nil
}

// fleet is the simulator's shared settings and its nodes.
type fleet struct {
	cfg     config.Config // validated; NodeName is replaced per node
	nodes   int
	name    func(i int) string
	rate    int // nodes started per second
	cpus    int
	memory  int64
	arch    string
	log     *slog.Logger // the simulator's own lines
	nodeLog *slog.Logger // the simulated agents'

	// sessionBase starts every node's session numbers: the store is new at every start, but a
	// control plane believes liveness only from sessions that grow (protocol.IsStaleOffline).
	sessionBase int64
}

// nodeIP is node i's address: 10.128.0.0/9 holds 8 million nodes, each its own.
func nodeIP(i int) string {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], 10<<24|128<<16+uint32(i)+1)
	return netip.AddrFrom4(b).String()
}

// run starts the nodes at the connect rate, reports when all are connected, and on ctx's end
// stops them all and waits for every one.
func (f *fleet) run(parent context.Context) error {
	// The nodes run on ctx: cancelled when the caller's ends, or when a node cannot be built.
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	start := time.Now()
	f.log.Info("fleet simulator starting", "nodes", f.nodes, "broker", broker.Shown(f.cfg.MQTTBroker),
		"first", f.name(0), "last", f.name(f.nodes-1), "connect_rate", f.rate, "version", version)
	var wg sync.WaitGroup
	var failed atomic.Int64
	nodes := make([]*simNode, 0, f.nodes)
	interval := time.Second / time.Duration(f.rate)
	var startErr error
	pace := time.NewTimer(0)
	defer pace.Stop()
starting:
	for i := range f.nodes {
		select {
		case <-ctx.Done():
			break starting
		case <-pace.C:
		}
		n, err := newSimNode(ctx, f, i)
		if err != nil {
			// Every node shares the settings, so the first failure is everyone's.
			startErr = fmt.Errorf("node %s: %w", f.name(i), err)
			break
		}
		nodes = append(nodes, n)
		wg.Go(func() {
			if err := n.Run(ctx); err != nil {
				failed.Add(1)
				f.log.Error("simulated node stopped", "node", n.name, "err", err)
			}
		})
		pace.Reset(time.Until(start.Add(time.Duration(i+1) * interval)))
	}
	if startErr == nil && len(nodes) == f.nodes {
		f.waitConnected(ctx, nodes, start)
	}
	if startErr == nil {
		<-ctx.Done()
	}
	stopping := time.Now()
	f.log.Info("fleet simulator stopping: every node publishes offline", "nodes", len(nodes))
	cancel() // a start error: the nodes started so far stop too
	wg.Wait()
	f.log.Info("fleet simulator stopped", "nodes", len(nodes), "failed", failed.Load(),
		"stop_took", time.Since(stopping).Round(time.Millisecond), "ran", time.Since(start).Round(time.Second))
	return startErr
}

// waitConnected logs once every node's link is up: the summary that says the fleet is online.
func (f *fleet) waitConnected(ctx context.Context, nodes []*simNode, start time.Time) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		up := 0
		for _, n := range nodes {
			if n.Connected() {
				up++
			}
		}
		if up == len(nodes) {
			f.log.Info("all simulated nodes connected", "nodes", up, "took", time.Since(start).Round(time.Millisecond),
				"goroutines", runtime.NumGoroutine())
			return
		}
		select {
		case <-ctx.Done():
			f.log.Info("stopped before every node connected", "connected", up, "nodes", len(nodes))
			return
		case <-t.C:
		}
	}
}
