package mqtttest

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/mqlet/mqlet/internal/loopback"
)

// The example broker configurations in configs/mosquitto run on the real
// broker. The tests change only paths, ports and the cloud's address, and
// check what the files' comments promise.

const examplesDir = "../../configs/mosquitto"

// fleet is a CA and the certificates the examples name: the server's and
// one per client identity, in one directory that stands in for
// /etc/mosquitto/certs.
type fleet struct {
	dir  string
	pool *x509.CertPool
	ca   *certAuthority

	crlNumber int64
}

func newFleet(t *testing.T, identities ...string) *fleet {
	t.Helper()
	Require(t)
	dir := t.TempDir()
	ca, err := newCA("example fleet CA")
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.writeCA(filepath.Join(dir, "ca.crt")); err != nil {
		t.Fatal(err)
	}
	if err := ca.issueFiles("localhost", true, filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")); err != nil {
		t.Fatal(err)
	}
	for _, id := range identities {
		if err := ca.issueFiles(id, false, filepath.Join(dir, id+".crt"), filepath.Join(dir, id+".key")); err != nil {
			t.Fatal(err)
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	f := &fleet{dir: dir, pool: pool, ca: ca}
	// mosquitto.conf names a CRL (crlfile); a new CA's revokes nothing.
	f.writeCRL(t, time.Now().Add(24*time.Hour))
	return f
}

// writeCRL writes the CA's CRL, ca.crl, revoking the certificates of identities, valid until
// nextUpdate.
func (f *fleet) writeCRL(t *testing.T, nextUpdate time.Time, identities ...string) {
	t.Helper()
	var revoked []x509.RevocationListEntry
	for _, id := range identities {
		data, err := os.ReadFile(filepath.Join(f.dir, id+".crt"))
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(data)
		if block == nil {
			t.Fatalf("%s.crt holds no PEM", id)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		revoked = append(revoked, x509.RevocationListEntry{SerialNumber: cert.SerialNumber, RevocationTime: time.Now().Add(-time.Minute)})
	}
	f.crlNumber++
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{
		Number:                    big.NewInt(f.crlNumber),
		ThisUpdate:                time.Now().Add(-time.Hour),
		NextUpdate:                nextUpdate,
		RevokedCertificateEntries: revoked,
	}, f.ca.cert, f.ca.key)
	if err != nil {
		t.Fatal(err)
	}
	if err := writePEM(filepath.Join(f.dir, "ca.crl"), "X509 CRL", der); err != nil {
		t.Fatal(err)
	}
}

func (f *fleet) tlsConfig(t *testing.T, identity string) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(filepath.Join(f.dir, identity+".crt"), filepath.Join(f.dir, identity+".key"))
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: f.pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}

// startExample runs mosquitto with configs/mosquitto/<name>, its paths moved
// into a temporary directory and its listener onto a free loopback port;
// more holds further replacements. Each replacement must match, so a change
// to the example's shape fails here instead of going untested.
func startExample(t *testing.T, f *fleet, name string, more map[string]string) *Broker {
	t.Helper()
	bin := Require(t)
	src, err := os.ReadFile(filepath.Join(examplesDir, name))
	if err != nil {
		t.Fatal(err)
	}
	// The broker reads the shipped ACL file itself, not a copy: what the tests prove of it holds
	// for the file in the repository.
	acl, err := filepath.Abs(filepath.Join(examplesDir, "acl"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(acl); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	b := &Broker{
		Dir:     dir,
		ACLFile: acl,
		CAFile:  filepath.Join(f.dir, "ca.crt"),
		LogFile: filepath.Join(dir, "mosquitto.log"),
		bin:     bin,
		conf:    filepath.Join(dir, name),
		outFile: filepath.Join(dir, "mosquitto.out"),
	}
	p, err := loopback.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	b.ports.tls = p[0]
	b.TLS = fmt.Sprintf("ssl://127.0.0.1:%d", p[0])
	repl := map[string]string{
		"/etc/mosquitto/certs/":                    f.dir + "/",
		"/etc/mosquitto/acl":                       b.ACLFile,
		"persistence_location /var/lib/mosquitto/": "persistence_location " + dir + "/",
		"/var/log/mosquitto/mosquitto.log":         b.LogFile,
		"\nlistener 8883\n":                        fmt.Sprintf("\nlistener %d 127.0.0.1\n", p[0]),
	}
	for k, v := range more {
		repl[k] = v
	}
	conf := string(src)
	for old, new := range repl {
		if !strings.Contains(conf, old) {
			t.Fatalf("configs/mosquitto/%s no longer contains %q; update the test", name, old)
		}
		conf = strings.ReplaceAll(conf, old, new)
	}
	for _, line := range strings.Split(conf, "\n") {
		// The ACL is the repository's file, wherever the checkout lives.
		line = strings.ReplaceAll(line, b.ACLFile, "")
		if !strings.HasPrefix(line, "#") && (strings.Contains(line, "/etc/") || strings.Contains(line, "/var/")) {
			t.Fatalf("configs/mosquitto/%s: a path the test did not move: %q", name, line)
		}
	}
	// Stay root when run as root, as the harness does (the example leaves
	// mosquitto's default, dropping to the mosquitto user).
	conf = "user root\n" + conf
	if err := os.WriteFile(b.conf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.cleanup(t) })
	if err := b.start(); err != nil {
		t.Fatalf("configs/mosquitto/%s: %v", name, err)
	}
	return b
}

func TestExampleBrokerConfig(t *testing.T) {
	f := newFleet(t, "node-a", "node-b", Admin)
	b := startExample(t, f, "mosquitto.conf", nil)

	admin := dial(t, b.TLS, "ctl-1", f.tlsConfig(t, Admin))
	all, _ := subscribe(t, admin, "mqlet/v2/#")

	// node-a, whatever client id it sends, is confined to its subtree.
	nodeA := dial(t, b.TLS, "not-node-a", f.tlsConfig(t, "node-a"))
	publish(t, nodeA, "mqlet/v2/nodes/node-b/status", false, "forged")
	publish(t, nodeA, "mqlet/v2/nodes/node-a/status", true, "up")
	for {
		m := expectAny(t, all)
		if string(m.Payload()) == "forged" {
			t.Fatalf("node-a wrote into node-b's subtree")
		}
		if string(m.Payload()) == "up" {
			break
		}
	}
	if !strings.Contains(tail(b.LogFile, 200), "as node-a ") {
		t.Errorf("the broker did not replace node-a's client id with its CN:\n%s", tail(b.LogFile, 40))
	}

	// No certificate, no connection.
	conf := f.tlsConfig(t, "node-b")
	conf.Certificates = nil
	if c, err := tryDial(b.TLS, "node-b", conf); err == nil {
		c.Disconnect(0)
		t.Fatalf("a client without a certificate connected")
	}

	// message_size_limit: 1 MiB passes, one byte more is dropped; the small
	// message sent after it arrives first.
	own, _ := subscribe(t, nodeA, "mqlet/v2/nodes/node-a/desired/#")
	publish(t, admin, "mqlet/v2/nodes/node-a/desired/big", false, strings.Repeat("x", 1<<20))
	if m := expectAny(t, own); len(m.Payload()) != 1<<20 {
		t.Fatalf("got %d bytes on %s, want the 1 MiB message", len(m.Payload()), m.Topic())
	}
	publish(t, admin, "mqlet/v2/nodes/node-a/desired/big", false, strings.Repeat("x", 1<<20+1))
	publish(t, admin, "mqlet/v2/nodes/node-a/desired/small", false, "small")
	if m := expectAny(t, own); m.Topic() != "mqlet/v2/nodes/node-a/desired/small" {
		t.Fatalf("got %d bytes on %s, want the message that followed the oversized one", len(m.Payload()), m.Topic())
	}

	// Retained state survives a restart.
	b.Stop(t)
	b.Start(t)
	check := dial(t, b.TLS, "", f.tlsConfig(t, Admin))
	ch, _ := subscribe(t, check, "mqlet/v2/nodes/node-a/status")
	expect(t, ch, "mqlet/v2/nodes/node-a/status", "up")
}

func TestExampleSiteBridgeConfig(t *testing.T) {
	f := newFleet(t, nodeA1, nodeB1, Admin, siteA)
	cloud := startExample(t, f, "mosquitto.conf", nil)
	site := startExample(t, f, "site-bridge.conf", map[string]string{
		"address broker.example:8883": "address " + strings.TrimPrefix(cloud.TLS, "ssl://"),
		// Faster reconnects for the test.
		"restart_timeout 5 60": "restart_timeout 1 2",
	})

	// Admin on the cloud keeps a persistent session (it receives what is
	// published while it is away, as long as the cloud runs or persists).
	admin, _ := dialSession(t, cloud.TLS, f.tlsConfig(t, Admin))
	all, _ := subscribe(t, admin, "mqlet/v2/#")

	// Cloud to site: desired state published retained on the cloud reaches factory1-line1 on
	// the site (polled: the bridge connects in the background).
	publish(t, admin, "mqlet/v2/nodes/"+nodeA1+"/desired/pods/p1", true, "gen 1")
	nodeA := dial(t, site.TLS, nodeA1, f.tlsConfig(t, nodeA1))
	mine, _ := subscribe(t, nodeA, "mqlet/v2/nodes/"+nodeA1+"/#")
	waitFor(t, mine, 3*arrive, "mqlet/v2/nodes/"+nodeA1+"/desired/pods/p1", "gen 1")

	// Site to cloud: factory1-line1's status reaches admin on the cloud.
	publish(t, nodeA, "mqlet/v2/nodes/"+nodeA1+"/status", true, "running")
	waitFor(t, all, arrive, "mqlet/v2/nodes/"+nodeA1+"/status", "running")

	// The cloud's ACL confines the site's bridge to the site's nodes (configs/mosquitto/acl):
	// another site's node, even when it connects to this site's broker, gets nothing from the
	// cloud, and what it publishes here does not reach the cloud.
	// (One observer of the whole tree on the site and one on the cloud: the bridge keeps the
	// order, so what crossed would arrive before the message that follows it.)
	siteAll, _ := subscribe(t, dial(t, site.TLS, "", f.tlsConfig(t, Admin)), "mqlet/v2/#")
	publish(t, admin, "mqlet/v2/nodes/"+nodeB1+"/desired/pods/p1", true, "for site 2")
	publish(t, admin, "mqlet/v2/nodes/"+nodeA1+"/desired/pods/p2", true, "for site 1")
	for {
		m := expectAny(t, siteAll)
		if strings.Contains(m.Topic(), nodeB1) {
			t.Fatalf("another site's desired state crossed this site's bridge: %s %q", m.Topic(), m.Payload())
		}
		if string(m.Payload()) == "for site 1" {
			break
		}
	}
	nodeB := dial(t, site.TLS, nodeB1, f.tlsConfig(t, nodeB1))
	publish(t, nodeB, "mqlet/v2/nodes/"+nodeB1+"/status", true, "forged at site 1")
	publish(t, nodeA, "mqlet/v2/nodes/"+nodeA1+"/status", true, "running again")
	for {
		m := expectAny(t, all)
		if strings.Contains(m.Topic(), nodeB1) && string(m.Payload()) == "forged at site 1" {
			t.Fatalf("site 1's bridge wrote %s on the cloud", m.Topic())
		}
		if string(m.Payload()) == "running again" {
			break
		}
	}

	// The uplink goes down. The site keeps serving its nodes, and queues
	// what they publish for the cloud (cleansession false).
	admin.Disconnect(100)
	cloud.Stop(t)
	publish(t, nodeA, "mqlet/v2/nodes/"+nodeA1+"/events", false, "while the uplink was down")
	waitFor(t, mine, arrive, "mqlet/v2/nodes/"+nodeA1+"/events", "while the uplink was down")
	cloud.Start(t)
	_, all = dialSession(t, cloud.TLS, f.tlsConfig(t, Admin))
	waitFor(t, all, 3*arrive, "mqlet/v2/nodes/"+nodeA1+"/events", "while the uplink was down")
}

// dialSession connects as admin with a persistent session (clean session
// false) and returns the messages that arrive for subscriptions the session
// already had: paho hands those to the default handler.
func dialSession(t *testing.T, broker string, conf *tls.Config) (mqtt.Client, <-chan mqtt.Message) {
	t.Helper()
	ch := make(chan mqtt.Message, 100)
	o := mqtt.NewClientOptions().AddBroker(broker).SetClientID(Admin).SetCleanSession(false).
		SetAutoReconnect(false).SetConnectTimeout(arrive).SetTLSConfig(conf).
		SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) {
			select {
			case ch <- m:
			default:
			}
		})
	c := mqtt.NewClient(o)
	if err := waitToken(c.Connect(), time.Now().Add(2*arrive)); err != nil {
		t.Fatalf("connect %s with a persistent session: %v", broker, err)
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return c, ch
}

// expectAny returns the next message on ch, waiting up to `arrive`.
func expectAny(t *testing.T, ch <-chan mqtt.Message) mqtt.Message {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(arrive):
		t.Fatalf("no message within %v", arrive)
		return nil
	}
}

// waitFor is expect with its own bound.
func waitFor(t *testing.T, ch <-chan mqtt.Message, d time.Duration, topic, payload string) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case m := <-ch:
			if m.Topic() == topic && string(m.Payload()) == payload {
				return
			}
		case <-timer.C:
			t.Fatalf("no %q on %s within %v", payload, topic, d)
		}
	}
}
