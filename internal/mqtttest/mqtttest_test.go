package mqtttest

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Bounds for the waits below. A message that should arrive gets `arrive`;
// one that must not is given `absent` to show up (and, where the protocol
// allows, a later message on the same connection proves it by order).
const (
	arrive = 5 * time.Second
	absent = time.Second
)

var clientSeq atomic.Int64

// dial connects a paho client (no auto-reconnect) or fails the test. An empty
// clientID picks a unique one.
func dial(t *testing.T, broker, clientID string, tlsConf *tls.Config) mqtt.Client {
	t.Helper()
	c, err := tryDial(broker, clientID, tlsConf)
	if err != nil {
		t.Fatalf("connect %s as %q: %v", broker, clientID, err)
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}

func tryDial(broker, clientID string, tlsConf *tls.Config) (mqtt.Client, error) {
	if clientID == "" {
		clientID = fmt.Sprintf("test-%d-%s", clientSeq.Add(1), randomHex(3))
	}
	o := mqtt.NewClientOptions().AddBroker(broker).SetClientID(clientID).
		SetAutoReconnect(false).SetConnectTimeout(arrive).SetCleanSession(true)
	if tlsConf != nil {
		o.SetTLSConfig(tlsConf)
	}
	c := mqtt.NewClient(o)
	if err := waitToken(c.Connect(), time.Now().Add(2*arrive)); err != nil {
		return nil, err
	}
	return c, nil
}

// subscribe subscribes c to filter at QoS 1 and returns the messages it
// delivers, in order, and the QoS the broker granted (0x80 is a refusal).
func subscribe(t *testing.T, c mqtt.Client, filter string) (<-chan mqtt.Message, byte) {
	t.Helper()
	ch := make(chan mqtt.Message, 1000)
	tok := c.Subscribe(filter, 1, func(_ mqtt.Client, m mqtt.Message) {
		select {
		case ch <- m:
		default:
			t.Errorf("subscriber to %s: buffer full, dropped %s", filter, m.Topic())
		}
	})
	if err := waitToken(tok, time.Now().Add(arrive)); err != nil {
		t.Fatalf("subscribe %s: %v", filter, err)
	}
	granted, ok := tok.(*mqtt.SubscribeToken).Result()[filter]
	if !ok {
		t.Fatalf("subscribe %s: no result in SUBACK", filter)
	}
	return ch, granted
}

func publish(t *testing.T, c mqtt.Client, topic string, retained bool, payload string) {
	t.Helper()
	if err := waitToken(c.Publish(topic, 1, retained, payload), time.Now().Add(arrive)); err != nil {
		t.Fatalf("publish %s: %v", topic, err)
	}
}

// expect waits up to `arrive` for a message on topic with payload, skipping
// others, and returns it.
func expect(t *testing.T, ch <-chan mqtt.Message, topic, payload string) mqtt.Message {
	t.Helper()
	timer := time.NewTimer(arrive)
	defer timer.Stop()
	for {
		select {
		case m := <-ch:
			if m.Topic() == topic && string(m.Payload()) == payload {
				return m
			}
		case <-timer.C:
			t.Fatalf("no message %q on %s within %v", payload, topic, arrive)
			return nil
		}
	}
}

// expectNone fails if anything arrives on ch within d.
func expectNone(t *testing.T, ch <-chan mqtt.Message, d time.Duration, why string) {
	t.Helper()
	select {
	case m := <-ch:
		t.Fatalf("%s: got %s %q (retained=%v)", why, m.Topic(), m.Payload(), m.Retained())
	case <-time.After(d):
	}
}

func TestPlainRetained(t *testing.T) {
	b := Start(t, Options{})
	pub := dial(t, b.Plain, "", nil)
	publish(t, pub, "mqlet/v2/nodes/n1/desired/pods/p1", true, "gen 1")

	sub := dial(t, b.Plain, "", nil)
	ch, _ := subscribe(t, sub, "mqlet/v2/#")
	if m := expect(t, ch, "mqlet/v2/nodes/n1/desired/pods/p1", "gen 1"); !m.Retained() {
		t.Errorf("a new subscriber got the message without the retained flag")
	}
}

func TestWebsockets(t *testing.T) {
	b := Start(t, Options{})
	if b.WS == "" {
		t.Skipf("this mosquitto has no websockets support (see %s)", b.LogFile)
	}
	pub := dial(t, b.Plain, "", nil)
	publish(t, pub, "mqlet/v2/nodes/n1/status", true, "up")
	ws := dial(t, b.WS, "", nil)
	ch, _ := subscribe(t, ws, "mqlet/v2/nodes/+/status")
	expect(t, ch, "mqlet/v2/nodes/n1/status", "up")
}

// The TLS listener's ACL: the certificate's CN is the username, and a node
// only reads and writes mqlet/v2/nodes/<CN>/#.
func TestTLSACL(t *testing.T) {
	b := Start(t, Options{Identities: []string{"node-a", "node-b"}})
	admin := dial(t, b.TLS, Admin, b.TLSConfig(Admin))
	nodeA := dial(t, b.TLS, "node-a", b.TLSConfig("node-a"))
	nodeB := dial(t, b.TLS, "node-b", b.TLSConfig("node-b"))

	// node-a uses its own subtree both ways.
	ownCh, granted := subscribe(t, nodeA, "mqlet/v2/nodes/node-a/#")
	if granted != 1 {
		t.Errorf("node-a subscribing to its own subtree: granted %#x, want 1", granted)
	}
	publish(t, nodeA, "mqlet/v2/nodes/node-a/status", true, "a is up")
	expect(t, ownCh, "mqlet/v2/nodes/node-a/status", "a is up")

	// Admin writes node-b's desired state: node-b reads it (the positive
	// control), node-a does not, although its subscription is granted.
	publish(t, admin, "mqlet/v2/nodes/node-b/desired", true, "for b only")
	bCh, _ := subscribe(t, nodeB, "mqlet/v2/nodes/node-b/#")
	expect(t, bCh, "mqlet/v2/nodes/node-b/desired", "for b only")

	spyCh, granted := subscribe(t, nodeA, "mqlet/v2/nodes/node-b/#")
	t.Logf("node-a SUBSCRIBE mqlet/v2/nodes/node-b/#: SUBACK grants %#x", granted)
	// Order: retained messages for a new subscription are queued before
	// anything published after its SUBACK, so node-a's marker on its own
	// subtree arriving proves the retained message was never queued...
	publish(t, nodeA, "mqlet/v2/nodes/node-a/marker", false, "after the spy subscription")
	expect(t, ownCh, "mqlet/v2/nodes/node-a/marker", "after the spy subscription")
	// ...and a bounded wait covers a late delivery.
	expectNone(t, spyCh, absent, "node-a read node-b's subtree")

	// node-a writing into node-b's subtree is dropped. Admin sees all of
	// mqlet/v2/#: node-a's later publish on its own subtree arriving without
	// the forbidden one before it proves the drop (one publisher, one
	// subscriber, QoS 1: delivered in order).
	allCh, _ := subscribe(t, admin, "mqlet/v2/#")
	publish(t, nodeA, "mqlet/v2/nodes/node-b/desired", false, "forged by a")
	publish(t, nodeA, "mqlet/v2/nodes/node-a/status", false, "sent after the forgery")
	timer := time.NewTimer(arrive)
	defer timer.Stop()
	for done := false; !done; {
		select {
		case m := <-allCh:
			switch {
			case string(m.Payload()) == "forged by a":
				t.Fatalf("admin received node-a's publish to %s: the ACL let it through", m.Topic())
			case m.Topic() == "mqlet/v2/nodes/node-a/status" && string(m.Payload()) == "sent after the forgery":
				done = true
			}
		case <-timer.C:
			t.Fatalf("admin never received node-a's publish to its own subtree within %v", arrive)
		}
	}
	// The retained desired state of node-b is still admin's.
	check := dial(t, b.TLS, "node-b-check", b.TLSConfig("node-b"))
	checkCh, _ := subscribe(t, check, "mqlet/v2/nodes/node-b/desired")
	expect(t, checkCh, "mqlet/v2/nodes/node-b/desired", "for b only")
}

// A node that claims another node's client id takes over that node's
// session (the broker disconnects the first holder) unless the broker
// replaces client ids with the certificate's CN.
func TestClientIDTakeover(t *testing.T) {
	for _, asCN := range []bool{false, true} {
		t.Run(map[bool]string{false: "client id as sent", true: "username as client id"}[asCN], func(t *testing.T) {
			b := Start(t, Options{Identities: []string{"node-a", "node-b"}, UsernameAsClientID: asCN})
			lost := make(chan error, 1)
			o := mqtt.NewClientOptions().AddBroker(b.TLS).SetClientID("node-b").SetAutoReconnect(false).
				SetTLSConfig(b.TLSConfig("node-b")).
				SetConnectionLostHandler(func(_ mqtt.Client, err error) { lost <- err })
			nodeB := mqtt.NewClient(o)
			if err := waitToken(nodeB.Connect(), time.Now().Add(arrive)); err != nil {
				t.Fatalf("node-b: %v", err)
			}
			t.Cleanup(func() { nodeB.Disconnect(100) })
			// node-a connects claiming node-b's client id.
			impostor := dial(t, b.TLS, "node-b", b.TLSConfig("node-a"))
			if asCN {
				// Proof by order that node-b kept its connection: a message
				// node-b sends after the impostor connected reaches admin.
				admin := dial(t, b.TLS, Admin, b.TLSConfig(Admin))
				ch, _ := subscribe(t, admin, "mqlet/v2/nodes/#")
				publish(t, nodeB, "mqlet/v2/nodes/node-b/status", false, "still here")
				publish(t, impostor, "mqlet/v2/nodes/node-a/status", false, "renamed")
				expect(t, ch, "mqlet/v2/nodes/node-b/status", "still here")
				expect(t, ch, "mqlet/v2/nodes/node-a/status", "renamed")
				select {
				case err := <-lost:
					t.Fatalf("node-b lost its connection although the broker uses the CN as client id: %v", err)
				default:
				}
				return
			}
			select {
			case err := <-lost:
				t.Logf("node-b was disconnected by the impostor's session takeover: %v", err)
			case <-time.After(arrive):
				t.Fatalf("node-b kept its connection although another client took its client id")
			}
		})
	}
}

func TestTLSRefusesClientWithoutTrustedCert(t *testing.T) {
	b := Start(t, Options{})
	// Positive control: admin's certificate is accepted.
	dial(t, b.TLS, Admin, b.TLSConfig(Admin))

	if c, err := tryDial(b.TLS, "anonymous", b.TLSConfig("")); err == nil {
		c.Disconnect(0)
		t.Fatalf("a client without a certificate connected to the TLS listener")
	} else {
		t.Logf("without a certificate: %v", err)
	}

	// A certificate with the right CN but from another CA.
	other, err := newCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key")
	if err := other.issueFiles(Admin, false, certFile, keyFile); err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	conf := b.TLSConfig("")
	conf.Certificates = []tls.Certificate{cert}
	if c, err := tryDial(b.TLS, Admin, conf); err == nil {
		c.Disconnect(0)
		t.Fatalf("a client with a certificate from another CA connected to the TLS listener")
	} else {
		t.Logf("with a certificate from another CA: %v", err)
	}
}

func TestPersistence(t *testing.T) {
	for _, persist := range []bool{true, false} {
		name := map[bool]string{true: "persistence", false: "no persistence"}[persist]
		t.Run(name, func(t *testing.T) {
			b := Start(t, Options{Persistence: persist})
			pub := dial(t, b.Plain, "", nil)
			publish(t, pub, "mqlet/v2/nodes/n1/desired/pods/p1", true, "gen 7")
			pub.Disconnect(100)
			pid := b.Pid()
			b.Stop(t)
			if b.Pid() != 0 {
				t.Fatalf("Pid() = %d after Stop", b.Pid())
			}
			b.Stop(t) // idempotent
			_, err := os.Stat(filepath.Join(b.Dir, "mosquitto.db"))
			if persist && err != nil {
				t.Errorf("no persistence database after Stop: %v", err)
			}
			if !persist && err == nil {
				t.Errorf("a persistence database was written without Persistence")
			}
			b.Start(t)
			if b.Pid() == 0 || b.Pid() == pid {
				t.Fatalf("Pid() = %d after restart (was %d)", b.Pid(), pid)
			}

			sub := dial(t, b.Plain, "", nil)
			ch, _ := subscribe(t, sub, "mqlet/v2/#")
			if persist {
				if m := expect(t, ch, "mqlet/v2/nodes/n1/desired/pods/p1", "gen 7"); !m.Retained() {
					t.Errorf("the restored message lost its retained flag")
				}
				return
			}
			// The marker, published after the SUBACK, must be the first message:
			// a retained message for the subscription would be queued before it.
			marker := dial(t, b.Plain, "", nil)
			publish(t, marker, "mqlet/v2/marker", false, "marker")
			select {
			case m := <-ch:
				if m.Topic() != "mqlet/v2/marker" {
					t.Fatalf("first message after a restart without persistence: %s %q (retained=%v), want the marker", m.Topic(), m.Payload(), m.Retained())
				}
			case <-time.After(arrive):
				t.Fatalf("no marker within %v", arrive)
			}
			expectNone(t, ch, absent, "a retained message survived a restart without persistence")
		})
	}
}

func TestKillAndStart(t *testing.T) {
	b := Start(t, Options{})
	pid := b.Pid()
	b.Kill(t)
	if b.Pid() != 0 {
		t.Fatalf("Pid() = %d after Kill", b.Pid())
	}
	if err := pidAlive(pid); err == nil {
		t.Fatalf("mosquitto pid %d still exists after Kill", pid)
	}
	if c, err := tryDial(b.Plain, "", nil); err == nil {
		c.Disconnect(0)
		t.Fatalf("connected to %s after Kill", b.Plain)
	}
	b.Kill(t) // idempotent
	b.Start(t)
	c := dial(t, b.Plain, "", nil)
	publish(t, c, "mqlet/v2/x", false, "alive")
}

// pidAlive returns nil when /proc has pid and it is not a zombie.
func pidAlive(pid int) error {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return err
	}
	// The state follows the parenthesised command name.
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) && s[i+2] == 'Z' {
		return os.ErrNotExist
	}
	return nil
}

// The site broker bridges mqlet/v2/# both ways to the cloud broker, and a
// retained message arrives retained on the other side.
func TestBridge(t *testing.T) {
	cloud := Start(t, Options{})
	site := Start(t, Options{BridgeTo: cloud})

	cloudPub := dial(t, cloud.Plain, "", nil)
	publish(t, cloudPub, "mqlet/v2/nodes/n1/desired/pods/p1", true, "from the cloud")
	expectRetained(t, site, "mqlet/v2/nodes/n1/desired/pods/p1", "from the cloud")

	sitePub := dial(t, site.Plain, "", nil)
	publish(t, sitePub, "mqlet/v2/nodes/n1/status", true, "from the site")
	expectRetained(t, cloud, "mqlet/v2/nodes/n1/status", "from the site")

	// The uplink is down: the site keeps serving what it has, and catches up
	// with what the cloud published meanwhile once the bridge is back.
	cloud.Stop(t)
	expectRetained(t, site, "mqlet/v2/nodes/n1/desired/pods/p1", "from the cloud")
	cloud.Start(t)
	site.WaitBridge(t)
	// The cloud has no persistence, so it lost its retained messages; what
	// it publishes now reaches the site again.
	cloudPub = dial(t, cloud.Plain, "", nil)
	publish(t, cloudPub, "mqlet/v2/nodes/n1/desired/pods/p1", true, "gen 2 from the cloud")
	expectRetained(t, site, "mqlet/v2/nodes/n1/desired/pods/p1", "gen 2 from the cloud")
}

// expectRetained polls b with fresh subscribers until one receives payload
// on topic with the retained flag (bounded by 2*arrive): the message is
// stored retained on b, not merely passing through.
func expectRetained(t *testing.T, b *Broker, topic, payload string) {
	t.Helper()
	deadline := time.Now().Add(2 * arrive)
	for {
		c, err := tryDial(b.Plain, "", nil)
		if err != nil {
			t.Fatalf("connect %s: %v", b.Plain, err)
		}
		ch := make(chan mqtt.Message, 100)
		tok := c.Subscribe(topic, 1, func(_ mqtt.Client, m mqtt.Message) {
			select {
			case ch <- m:
			default:
			}
		})
		if err := waitToken(tok, time.Now().Add(arrive)); err != nil {
			c.Disconnect(0)
			t.Fatalf("subscribe %s on %s: %v", topic, b.Plain, err)
		}
		var last string
		timer := time.NewTimer(200 * time.Millisecond)
	wait:
		for {
			select {
			case m := <-ch:
				if m.Retained() && string(m.Payload()) == payload {
					timer.Stop()
					c.Disconnect(0)
					return
				}
				last = string(m.Payload())
			case <-timer.C:
				break wait
			}
		}
		c.Disconnect(0)
		if time.Now().After(deadline) {
			t.Fatalf("%s on %s: no retained %q within %v (last seen %q)", topic, b.Plain, payload, 2*arrive, last)
		}
	}
}

// The harness leaves no broker behind when a test fails, nor when the test
// binary itself is killed. The test binary runs TestHelperBrokerHolder in a
// child process, which starts a broker, prints its pid and then fails or
// hangs (to be SIGKILLed).
func TestNoBrokerOutlivesItsTest(t *testing.T) {
	Require(t)
	for _, mode := range []string{"fail", "hang"} {
		t.Run(mode, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperBrokerHolder$", "-test.v", "-test.count=1")
			// The holder's temporary directories go under this test's own: the one that is
			// SIGKILLed cannot remove them itself.
			cmd.Env = append(os.Environ(), "MQTTTEST_HOLDER="+mode, "TMPDIR="+t.TempDir())
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = cmd.Stdout
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill() // a no-op once it has been waited for
			pidc := make(chan int, 1)
			var lines []string
			var linesMu sync.Mutex
			go func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					linesMu.Lock()
					lines = append(lines, sc.Text())
					linesMu.Unlock()
					if f := strings.Fields(sc.Text()); len(f) == 3 && f[1] == "BROKER-PID" {
						if pid, err := strconv.Atoi(f[2]); err == nil {
							pidc <- pid
						}
					}
				}
			}()
			var pid int
			select {
			case pid = <-pidc:
			case <-time.After(2 * arrive):
				linesMu.Lock()
				defer linesMu.Unlock()
				t.Fatalf("the holder printed no broker pid within %v:\n%s", 2*arrive, strings.Join(lines, "\n"))
			}
			if mode == "hang" {
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
			waitc := make(chan error, 1)
			go func() { waitc <- cmd.Wait() }()
			select {
			case err := <-waitc:
				if err == nil {
					t.Errorf("the holder (mode %s) exited 0, want a failure", mode)
				}
			case <-time.After(4 * arrive):
				t.Fatalf("the holder (mode %s) did not exit within %v", mode, 4*arrive)
			}
			deadline := time.Now().Add(arrive)
			for pidAlive(pid) == nil {
				if time.Now().After(deadline) {
					// Do not leave it behind either: the pid is still the
					// orphaned broker (it was never reaped).
					if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(cmdline), "mosquitto") {
						syscall.Kill(pid, syscall.SIGKILL)
					}
					t.Fatalf("broker pid %d still runs %v after its test process ended (mode %s)", pid, arrive, mode)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// TestHelperBrokerHolder is the child of TestNoBrokerOutlivesItsTest; it does
// nothing unless MQTTTEST_HOLDER is set.
func TestHelperBrokerHolder(t *testing.T) {
	mode := os.Getenv("MQTTTEST_HOLDER")
	if mode == "" {
		t.Skip("helper process for TestNoBrokerOutlivesItsTest")
	}
	b := Start(t, Options{})
	fmt.Printf("mqtttest BROKER-PID %d\n", b.Pid())
	switch mode {
	case "fail":
		t.Fatalf("failing on purpose with broker pid %d running", b.Pid())
	case "hang":
		time.Sleep(4 * arrive) // the parent SIGKILLs this process first
		t.Fatalf("not killed by the parent within %v", 4*arrive)
	}
}
