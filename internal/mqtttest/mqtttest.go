// Package mqtttest runs a real mosquitto broker for a test: one process per
// Start, on free loopback ports, in the test's temporary directory, stopped by
// its pid when the test ends. No mocks: tests talk MQTT to the same broker
// that runs in production.
//
// Each broker has three listeners:
//
//   - Plain: anonymous, no ACL, for tests that only need a broker;
//   - TLS: a client certificate is required and its Subject CN becomes the
//     username, and the ACL file confines a node to <prefix>/nodes/<CN>/#
//     while the "admin" identity may use all of <prefix>/#;
//   - WS: MQTT over websockets, anonymous, no ACL.
//
// Brokers can be stopped, killed and started again on the same ports (with
// Options.Persistence retained messages survive that), and a "site" broker
// can bridge the prefix's topics to a "cloud" broker (Options.BridgeTo).
package mqtttest

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/mqlet/mqlet/internal/loopback"
)

const (
	// DefaultPrefix is the topic prefix used when Options.Prefix is empty.
	DefaultPrefix = "mqlet/v2"
	// Admin is the identity that may read and write the whole prefix. Start
	// always issues a client certificate for it.
	Admin = "admin"
	// VarRequire set to "1" turns a missing mosquitto into a test failure
	// instead of a skip (CI sets it).
	VarRequire = "MQLET_TEST_REQUIRE"

	// DebianMosquitto is where Debian's mosquitto package puts the broker.
	DebianMosquitto = "/usr/sbin/mosquitto"

	readyTimeout = 10 * time.Second // listeners accepting after a start
	stopTimeout  = 30 * time.Second // exit after SIGTERM, before SIGKILL: generous, since a loaded CI machine has made mosquitto take over 10 s
	killTimeout  = 5 * time.Second  // exit after SIGKILL
	// bridgeTimeout bounds WaitBridge. The site retries a lost bridge after
	// 1 to 3 seconds (restart_timeout 1 2).
	bridgeTimeout = 15 * time.Second
	startAttempts = 3 // fresh ports when another process took one first
)

// Require returns the path of the mosquitto binary: DebianMosquitto, else
// `mosquitto` on PATH. When there is none it skips the test, or fails it when
// MQLET_TEST_REQUIRE=1, so a missing broker cannot pass as a skip. Like
// internal/testenv it also skips under -short (make unit).
func Require(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a real mosquitto broker; skipped with -short")
	}
	bin, err := findMosquitto()
	if err != nil {
		if os.Getenv(VarRequire) == "1" {
			t.Fatalf("mosquitto unavailable: %v; install it (scripts/testenv.sh does: apt-get install mosquitto) (%s=1 makes this a failure rather than a skip)", err, VarRequire)
		}
		t.Skipf("mosquitto unavailable: %v; install the mosquitto package (scripts/testenv.sh does) to run this test", err)
	}
	return bin
}

func findMosquitto() (string, error) {
	if fi, err := os.Stat(DebianMosquitto); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
		return DebianMosquitto, nil
	}
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		return "", fmt.Errorf("no executable %s and no mosquitto on PATH", DebianMosquitto)
	}
	return bin, nil
}

// Options configure Start.
type Options struct {
	// Persistence turns on `persistence true` with the database in Dir and a
	// one-second autosave, so retained messages survive Stop/Start (mosquitto
	// also saves on SIGTERM). Without it a restart loses every retained
	// message. After Kill, only what the last autosave caught survives.
	Persistence bool
	// Identities are the certificate CNs to issue client certificates for,
	// e.g. "node-a". Admin is always issued. Names are limited to letters,
	// digits, '.', '_' and '-', not starting with '.'.
	Identities []string
	// Prefix of the topic tree, DefaultPrefix when empty; used in the ACL
	// and in the bridge's topic line.
	Prefix string
	// UsernameAsClientID sets use_username_as_clientid on the TLS listener:
	// the broker replaces a client's id with its certificate's CN, so one
	// node cannot take over (and disconnect) another node's session by
	// claiming its client id. configs/mosquitto/mosquitto.conf sets it.
	UsernameAsClientID bool
	// BridgeTo, when set, makes this broker a "site" broker bridging
	// `<prefix>/# both 1` to BridgeTo's Plain listener (clean session; the
	// bridge retries every 1 to 3 seconds while BridgeTo is down). Start
	// BridgeTo first; its ports stay fixed, so it may be stopped and started
	// while this broker runs. The bridge also carries WaitBridge's probe
	// topic, mqtttest/bridge-probe/#, which subscribers to "#" will see.
	BridgeTo *Broker
}

// Broker is one mosquitto process and its files. The exported fields do not
// change after Start; the listeners keep their ports across Stop and Start.
type Broker struct {
	Dir     string // the broker's temp dir: config, certificates, log, persistence DB
	Plain   string // "tcp://127.0.0.1:PORT": anonymous, no ACL
	TLS     string // "ssl://127.0.0.1:PORT": client certificate required, CN = username, ACLFile applies
	WS      string // "ws://127.0.0.1:PORT": websockets, anonymous, no ACL; "" when the broker lacks websockets (Debian's 2.0.11 has them)
	CAFile  string // PEM of the CA that signed the server certificate and the client certificates
	ACLFile string
	LogFile string // mosquitto's own log (log_type all)

	bin      string
	opts     Options
	conf     string
	outFile  string // the process's stdout and stderr: errors from before the log opens
	bridgeID string // the bridge's client id on BridgeTo
	ports    ports
	ca       *x509.CertPool
	clients  map[string][2]string // identity -> cert file, key file

	mu      sync.Mutex
	proc    *os.Process
	done    chan struct{} // closed when proc has been waited for
	state   *os.ProcessState
	waitErr error
	asked   bool // Stop or Kill asked proc to exit
}

// ports of the listeners; 0 for one the config lacks.
type ports struct{ plain, tls, ws int }

// noWebsockets records that this mosquitto refused a websockets listener;
// later brokers start without one.
var noWebsockets atomic.Bool

var identityRE = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]*$`)

// Start starts a broker for t and registers a t.Cleanup that kills it (by
// pid) and reports a broker that died on its own. It returns once every
// listener accepts connections and, with BridgeTo running, once the bridge
// carries messages both ways. Failures end the test with the broker's log.
func Start(t testing.TB, o Options) *Broker {
	t.Helper()
	bin := Require(t)
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(o.Prefix, "+#\x00 \t\r\n") || strings.HasPrefix(o.Prefix, "/") || strings.HasSuffix(o.Prefix, "/") {
		t.Fatalf("mqtttest: bad topic prefix %q: no wildcards, blanks or leading/trailing '/'", o.Prefix)
	}
	if o.BridgeTo != nil && o.BridgeTo.Plain == "" {
		t.Fatalf("mqtttest: Options.BridgeTo is not a started broker")
	}
	dir := t.TempDir()
	b := &Broker{
		Dir:     dir,
		CAFile:  filepath.Join(dir, "ca.crt"),
		ACLFile: filepath.Join(dir, "acl"),
		LogFile: filepath.Join(dir, "mosquitto.log"),
		bin:     bin,
		opts:    o,
		conf:    filepath.Join(dir, "mosquitto.conf"),
		outFile: filepath.Join(dir, "mosquitto.out"),
		clients: map[string][2]string{},
	}
	if err := b.writeCerts(); err != nil {
		t.Fatalf("mqtttest: %v", err)
	}
	if err := os.WriteFile(b.ACLFile, []byte(aclFile(o.Prefix)), 0o600); err != nil {
		t.Fatalf("mqtttest: %v", err)
	}
	// Registered after t.TempDir, so it runs before the directory is removed.
	t.Cleanup(func() { b.cleanup(t) })

	for attempt := 1; ; attempt++ {
		p, err := loopback.FreePorts(3)
		if err != nil {
			t.Fatalf("mqtttest: %v", err)
		}
		b.ports = ports{plain: p[0], tls: p[1], ws: p[2]}
		if noWebsockets.Load() {
			b.ports.ws = 0
		}
		if err := b.writeConfig(); err != nil {
			t.Fatalf("mqtttest: %v", err)
		}
		// Each attempt's output alone decides whether to retry.
		os.Remove(b.LogFile)
		os.Remove(b.outFile)
		err = b.start()
		if err == nil {
			break
		}
		out := b.output()
		switch {
		case b.ports.ws != 0 && strings.Contains(out, "Websockets support not available"):
			noWebsockets.Store(true)
		case attempt < startAttempts && strings.Contains(out, "Address already in use"):
			// Another process took a port between freePorts and the bind.
		default:
			t.Fatalf("mqtttest: %v", err)
		}
		t.Logf("mqtttest: retrying start: %v", err)
	}
	b.Plain = fmt.Sprintf("tcp://127.0.0.1:%d", b.ports.plain)
	b.TLS = fmt.Sprintf("ssl://127.0.0.1:%d", b.ports.tls)
	if b.ports.ws != 0 {
		b.WS = fmt.Sprintf("ws://127.0.0.1:%d", b.ports.ws)
	}
	b.waitBridgeIfUp(t)
	return b
}

// Start starts the broker again after Stop or Kill, with the same config on
// the same ports, and waits as the package-level Start does. Calling it on a
// running broker fails the test.
func (b *Broker) Start(t testing.TB) {
	t.Helper()
	if pid := b.Pid(); pid != 0 {
		t.Fatalf("mqtttest: Start: broker already running (pid %d)", pid)
	}
	if err := b.start(); err != nil {
		t.Fatalf("mqtttest: restart: %v", err)
	}
	b.waitBridgeIfUp(t)
}

// Stop sends SIGTERM to the broker's pid (mosquitto saves its persistence
// database on the way out) and waits up to 10s for it to exit, then SIGKILLs
// it and fails the test. Stopping a broker that is not running does nothing.
func (b *Broker) Stop(t testing.TB) {
	t.Helper()
	if err := b.signal(syscall.SIGTERM, stopTimeout); err != nil {
		t.Fatalf("mqtttest: Stop: %v", err)
	}
}

// Kill sends SIGKILL to the broker's pid and waits for it to exit: a crash,
// with no final save and no clean disconnects. Killing a broker that is not
// running does nothing.
func (b *Broker) Kill(t testing.TB) {
	t.Helper()
	if err := b.signal(syscall.SIGKILL, killTimeout); err != nil {
		t.Fatalf("mqtttest: Kill: %v", err)
	}
}

// Pid returns the running broker's pid, 0 when it is stopped (or has exited).
func (b *Broker) Pid() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc == nil {
		return 0
	}
	select {
	case <-b.done:
		return 0
	default:
		return b.proc.Pid
	}
}

// ClientCert returns the PEM files of identity's client certificate and key,
// issued at Start. It returns "", "" for an identity that was not issued.
func (b *Broker) ClientCert(identity string) (certFile, keyFile string) {
	f, ok := b.clients[identity]
	if !ok {
		return "", ""
	}
	return f[0], f[1]
}

// TLSConfig returns a client TLS configuration for the TLS listener: the
// harness's CA as the only root, and identity's client certificate. With
// identity "" it carries no client certificate (the broker refuses such a
// client). It panics for an identity that was not issued at Start: that is a
// mistake in the test, not in the code under test.
func (b *Broker) TLSConfig(identity string) *tls.Config {
	c := &tls.Config{RootCAs: b.ca, MinVersion: tls.VersionTLS12}
	if identity == "" {
		return c
	}
	certFile, keyFile := b.ClientCert(identity)
	if certFile == "" {
		panic(fmt.Sprintf("mqtttest: no client certificate for identity %q; add it to Options.Identities", identity))
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		panic(fmt.Sprintf("mqtttest: load client certificate %s: %v", certFile, err))
	}
	c.Certificates = []tls.Certificate{cert}
	return c
}

// WaitBridge waits (up to 15s) until the bridge to Options.BridgeTo carries
// messages both ways: a probe published on the cloud reaches a subscriber on
// this broker and one published here reaches the cloud. The probes use the
// topic mqtttest/bridge-probe/<random>, outside the prefix, so subscribers
// to <prefix>/# never see them. Start calls it when BridgeTo is running;
// call it again after restarting either side.
func (b *Broker) WaitBridge(t testing.TB) {
	t.Helper()
	if b.opts.BridgeTo == nil {
		t.Fatalf("mqtttest: WaitBridge on a broker without Options.BridgeTo")
	}
	deadline := time.Now().Add(bridgeTimeout)
	if err := probe(b.opts.BridgeTo.Plain, b.Plain, deadline); err != nil {
		t.Fatalf("mqtttest: bridge %s -> %s: %v\n%s", b.opts.BridgeTo.Plain, b.Plain, err, b.output())
	}
	if err := probe(b.Plain, b.opts.BridgeTo.Plain, deadline); err != nil {
		t.Fatalf("mqtttest: bridge %s -> %s: %v\n%s", b.Plain, b.opts.BridgeTo.Plain, err, b.output())
	}
}

func (b *Broker) waitBridgeIfUp(t testing.TB) {
	t.Helper()
	if b.opts.BridgeTo != nil && b.opts.BridgeTo.Pid() != 0 {
		b.WaitBridge(t)
	}
}

// probe publishes a probe on from every 200ms until a subscriber on to gets
// it or the deadline passes.
func probe(from, to string, deadline time.Time) error {
	topic := "mqtttest/bridge-probe/" + randomHex(8)
	got := make(chan struct{}, 1)
	sub, err := connect(to, "mqtttest-probe-sub-"+randomHex(4), deadline)
	if err != nil {
		return err
	}
	defer sub.Disconnect(0)
	tok := sub.Subscribe(topic, 0, func(mqtt.Client, mqtt.Message) {
		select {
		case got <- struct{}{}:
		default:
		}
	})
	if err := waitToken(tok, deadline); err != nil {
		return fmt.Errorf("subscribe %s on %s: %w", topic, to, err)
	}
	pub, err := connect(from, "mqtttest-probe-pub-"+randomHex(4), deadline)
	if err != nil {
		return err
	}
	defer pub.Disconnect(0)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		if err := waitToken(pub.Publish(topic, 0, false, "probe"), deadline); err != nil {
			return fmt.Errorf("publish probe on %s: %w", from, err)
		}
		select {
		case <-got:
			return nil
		case <-timer.C:
			return fmt.Errorf("no probe arrived within %v", bridgeTimeout)
		case <-tick.C:
		}
	}
}

func connect(broker, clientID string, deadline time.Time) (mqtt.Client, error) {
	o := mqtt.NewClientOptions().AddBroker(broker).SetClientID(clientID).
		SetAutoReconnect(false).SetConnectTimeout(2 * time.Second)
	c := mqtt.NewClient(o)
	if err := waitToken(c.Connect(), deadline); err != nil {
		return nil, fmt.Errorf("connect to %s: %w", broker, err)
	}
	return c, nil
}

func waitToken(tok mqtt.Token, deadline time.Time) error {
	if !tok.WaitTimeout(time.Until(deadline)) {
		return errors.New("timed out")
	}
	return tok.Error()
}

func randomHex(n int) string {
	buf := make([]byte, n)
	if _, err := rand.Read(buf); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(buf)
}

// --- files -----------------------------------------------------------------

func (b *Broker) writeCerts() error {
	ca, err := newCA("mqtttest CA")
	if err != nil {
		return err
	}
	if err := ca.writeCA(b.CAFile); err != nil {
		return err
	}
	b.ca = x509.NewCertPool()
	b.ca.AddCert(ca.cert)
	if err := ca.issueFiles("localhost", true, b.serverCert(), b.serverKey()); err != nil {
		return err
	}
	clientDir := filepath.Join(b.Dir, "clients")
	if err := os.Mkdir(clientDir, 0o700); err != nil {
		return err
	}
	for _, id := range append([]string{Admin}, b.opts.Identities...) {
		if _, done := b.clients[id]; done {
			continue
		}
		if !identityRE.MatchString(id) {
			return fmt.Errorf("bad identity %q: use letters, digits, '.', '_' and '-', not starting with '.'", id)
		}
		certFile, keyFile := filepath.Join(clientDir, id+".crt"), filepath.Join(clientDir, id+".key")
		if err := ca.issueFiles(id, false, certFile, keyFile); err != nil {
			return err
		}
		b.clients[id] = [2]string{certFile, keyFile}
	}
	return nil
}

func (b *Broker) serverCert() string { return filepath.Join(b.Dir, "server.crt") }
func (b *Broker) serverKey() string  { return filepath.Join(b.Dir, "server.key") }

// aclFile: every node reads and writes its own subtree, %u being the
// username, which the TLS listener takes from the certificate's CN; Admin
// reads and writes the whole prefix.
func aclFile(prefix string) string {
	return fmt.Sprintf(`# Written by mqlet's internal/mqtttest.
pattern readwrite %[1]s/nodes/%%u/#

user %[2]s
topic readwrite %[1]s/#
`, prefix, Admin)
}

func (b *Broker) writeConfig() error {
	var c strings.Builder
	fmt.Fprintf(&c, `# Written by mqlet's internal/mqtttest for one test.
# Listener settings (anonymous access, ACL) apply per listener.
per_listener_settings true
# Stay root when started as root, so the broker can write its files in a
# root-owned temporary directory (ignored when not started as root).
user root
log_dest file %s
log_type all
log_timestamp_format %%Y-%%m-%%dT%%H:%%M:%%S
connection_messages true
max_queued_messages 10000
`, b.LogFile)
	if b.opts.Persistence {
		fmt.Fprintf(&c, "persistence true\npersistence_location %s/\npersistence_file mosquitto.db\nautosave_interval 1\n", b.Dir)
	} else {
		c.WriteString("persistence false\n")
	}
	fmt.Fprintf(&c, `
# Plain: anonymous, no ACL.
listener %d 127.0.0.1
allow_anonymous true

# TLS: a client certificate from our CA is required; its CN is the username
# the ACL's %%u stands for.
listener %d 127.0.0.1
cafile %s
certfile %s
keyfile %s
require_certificate true
use_identity_as_username true
allow_anonymous false
acl_file %s
`, b.ports.plain, b.ports.tls, b.CAFile, b.serverCert(), b.serverKey(), b.ACLFile)
	if b.opts.UsernameAsClientID {
		c.WriteString("use_username_as_clientid true\n")
	}
	if b.ports.ws != 0 {
		// libwebsockets in Debian's 2.0.11 binds to every address when given
		// 127.0.0.1, but to the loopback only when given the interface name.
		fmt.Fprintf(&c, `
# Websockets: anonymous, no ACL.
listener %d lo
protocol websockets
allow_anonymous true
`, b.ports.ws)
	}
	if br := b.opts.BridgeTo; br != nil {
		u, err := url.Parse(br.Plain)
		if err != nil {
			return fmt.Errorf("BridgeTo.Plain %q: %w", br.Plain, err)
		}
		if b.bridgeID == "" {
			b.bridgeID = "mqtttest-site-" + randomHex(4)
		}
		fmt.Fprintf(&c, `
# Bridge to the "cloud" broker; the probe topic lets WaitBridge check it.
connection cloud
address %s
remote_clientid %s
topic %s/# both 1
topic mqtttest/bridge-probe/# both 0
cleansession true
start_type automatic
# A base and a cap: before 2.0.15 a single value leaves the default 5-30s
# backoff in force.
restart_timeout 1 2
`, u.Host, b.bridgeID, b.opts.Prefix)
	}
	return os.WriteFile(b.conf, []byte(c.String()), 0o600)
}

// --- the process -----------------------------------------------------------

// start runs mosquitto and waits until every listener accepts; on failure
// the process is gone and the error carries the end of its log.
func (b *Broker) start() error {
	out, err := os.OpenFile(b.outFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close() // the child has its own copy
	cmd := exec.Command(b.bin, "-c", b.conf)
	cmd.Dir = b.Dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	// See sysProcAttr: fork from a goroutine that is not locked to its thread.
	errc := make(chan error, 1)
	go func() { errc <- cmd.Start() }()
	if err := <-errc; err != nil {
		return fmt.Errorf("start %s: %w", b.bin, err)
	}
	done := make(chan struct{})
	b.mu.Lock()
	b.proc, b.done, b.state, b.waitErr, b.asked = cmd.Process, done, nil, nil, false
	b.mu.Unlock()
	go func() {
		err := cmd.Wait()
		b.mu.Lock()
		b.state, b.waitErr = cmd.ProcessState, err
		b.mu.Unlock()
		close(done)
	}()

	var addrs []string
	for _, p := range []int{b.ports.plain, b.ports.tls, b.ports.ws} {
		if p != 0 {
			addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", p))
		}
	}
	deadline := time.Now().Add(readyTimeout)
	for {
		select {
		case <-done:
			b.mu.Lock()
			b.proc = nil
			b.mu.Unlock()
			return fmt.Errorf("mosquitto (pid %d) exited during start-up: %v\n%s", cmd.Process.Pid, b.exitStatus(), b.output())
		default:
		}
		if allAccept(addrs) {
			return nil
		}
		if time.Now().After(deadline) {
			err := fmt.Errorf("mosquitto (pid %d) did not accept on %v within %v\n%s", cmd.Process.Pid, addrs, readyTimeout, b.output())
			b.signal(syscall.SIGKILL, killTimeout)
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func allAccept(addrs []string) bool {
	for _, a := range addrs {
		c, err := net.DialTimeout("tcp", a, 200*time.Millisecond)
		if err != nil {
			return false
		}
		c.Close()
	}
	return true
}

// signal sends sig to the broker and waits up to timeout for it to exit;
// after that it SIGKILLs it and returns an error.
func (b *Broker) signal(sig syscall.Signal, timeout time.Duration) error {
	b.mu.Lock()
	proc, done := b.proc, b.done
	b.asked = true
	b.mu.Unlock()
	if proc == nil {
		return nil
	}
	defer func() {
		b.mu.Lock()
		if b.proc == proc {
			b.proc = nil
		}
		b.mu.Unlock()
	}()
	select {
	case <-done:
		return nil // already gone
	default:
	}
	// Signal the pid we started; Wait has not reaped it (done is open), so
	// the pid cannot have been reused.
	if err := proc.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %v to mosquitto pid %d: %w", sig, proc.Pid, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(timeout):
	}
	_ = proc.Kill()
	select {
	case <-done:
		return fmt.Errorf("mosquitto pid %d did not exit within %v of %v; killed it", proc.Pid, timeout, sig)
	case <-time.After(killTimeout):
		return fmt.Errorf("mosquitto pid %d did not exit within %v of %v, nor %v after SIGKILL", proc.Pid, timeout, sig, killTimeout)
	}
}

// cleanup kills the broker at the end of the test; a broker that had exited
// without being asked to is reported, with its log.
func (b *Broker) cleanup(t testing.TB) {
	b.mu.Lock()
	proc, done, asked := b.proc, b.done, b.asked
	b.mu.Unlock()
	if proc != nil && !asked {
		select {
		case <-done:
			t.Errorf("mqtttest: mosquitto (pid %d) exited on its own during the test: %v\n%s", proc.Pid, b.exitStatus(), b.output())
		default:
		}
	}
	if err := b.signal(syscall.SIGKILL, killTimeout); err != nil {
		t.Errorf("mqtttest: cleanup: %v", err)
	}
}

func (b *Broker) exitStatus() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != nil {
		return b.state.String()
	}
	if b.waitErr != nil {
		return b.waitErr.Error()
	}
	return "unknown status"
}

// output returns the ends of the process's stderr and of its log file, for
// error messages.
func (b *Broker) output() string {
	return fmt.Sprintf("--- %s (tail):\n%s--- %s (tail):\n%s", b.outFile, tail(b.outFile, 20), b.LogFile, tail(b.LogFile, 40))
}

func tail(file string, lines int) string {
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Sprintf("(%v)\n", err)
	}
	data = bytes.TrimRight(data, "\n")
	if len(data) == 0 {
		return "(empty)\n"
	}
	ls := bytes.Split(data, []byte("\n"))
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return string(bytes.Join(ls, []byte("\n"))) + "\n"
}
