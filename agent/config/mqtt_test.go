package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/admission"
)

// writePEM writes a self-signed certificate and its key into dir and returns their paths.
func writePEM(t *testing.T, dir, name string) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath
}

func writeMode(t *testing.T, path, content string, mode os.FileMode) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
	return path
}

const testPassword = "s3cret-Pa55"

// mqttFixture is a TLS broker setup whose files all exist and are good.
type mqttFixture struct {
	dir, ca, cert, key, otherKey, password string
}

func newMQTTFixture(t *testing.T) mqttFixture {
	t.Helper()
	dir := t.TempDir()
	ca, _ := writePEM(t, dir, "ca")
	cert, key := writePEM(t, dir, "node")
	_, otherKey := writePEM(t, dir, "other")
	pw := writeMode(t, filepath.Join(dir, "password"), testPassword+"\n", 0o600)
	return mqttFixture{dir: dir, ca: ca, cert: cert, key: key, otherKey: otherKey, password: pw}
}

func (f mqttFixture) config() Config {
	c := Defaults()
	c.NodeName = "node-1"
	c.MQTTBroker = "ssl://broker.local:8883"
	c.MQTTCAFile, c.MQTTCertFile, c.MQTTKeyFile = f.ca, f.cert, f.key
	c.MQTTUsername, c.MQTTPasswordFile = "node-1", f.password
	return c
}

func TestMQTTSettingsValid(t *testing.T) {
	f := newMQTTFixture(t)
	c := f.config()
	c.MQTTPolicy = MQTTPolicy{AllowPrivileged: true, AllowDebugPtrace: true, AllowedHostPaths: []string{"/data", "/var/log/app"}}
	if err := c.Validate(); err != nil {
		t.Fatalf("valid MQTT settings refused: %v", err)
	}
	if got := c.MQTTBrokerURL(); got != "ssl://broker.local:8883" || !c.MQTTTLS() {
		t.Errorf("MQTTBrokerURL() = %q, MQTTTLS() = %v", got, c.MQTTTLS())
	}
	pw, err := c.MQTTPassword()
	if err != nil || pw != testPassword {
		t.Errorf("MQTTPassword() = %q, %v; want the file's content without its newline", pw, err)
	}
	want := admission.Policy{AllowPrivileged: true, AllowDebugPtrace: true, AllowedHostPaths: []string{"/data", "/var/log/app"}}
	if got := c.AdmissionPolicy(); !reflect.DeepEqual(got, want) {
		t.Errorf("AdmissionPolicy() = %+v, want %+v", got, want)
	}

	standalone := Defaults()
	if standalone.MQTTBrokerURL() != "" || standalone.MQTTTLS() {
		t.Errorf("standalone: broker URL %q, TLS %v", standalone.MQTTBrokerURL(), standalone.MQTTTLS())
	}
	if pw, err := standalone.MQTTPassword(); pw != "" || err != nil {
		t.Errorf("standalone MQTTPassword() = %q, %v", pw, err)
	}
}

func TestMQTTBroker(t *testing.T) {
	tests := []struct {
		broker string
		dial   string   // MQTTBrokerURL when valid
		wants  []string // error parts when invalid
	}{
		{"tcp://broker.local:1883", "tcp://broker.local:1883", nil},
		{"mqtt://broker.local:1883", "tcp://broker.local:1883", nil},
		{"mqtts://broker.local:8883", "ssl://broker.local:8883", nil},
		{"tls://10.0.0.1:8883", "ssl://10.0.0.1:8883", nil}, // paho dials tls:// as ssl://; one spelling for agent, link and ctl
		{"ws://broker.local:80/mqtt", "ws://broker.local:80/mqtt", nil},
		{"wss://[fd00::1]:443/mqtt", "wss://[fd00::1]:443/mqtt", nil},
		{"TCP://broker.local:1883", "tcp://broker.local:1883", nil},
		{"broker.local:1883", "", []string{"scheme://host:port"}},
		{"http://broker.local:80", "", []string{`scheme "http" is not supported`, "tcp, ssl, tls, ws or wss"}},
		{"tcp://broker.local", "", []string{"port is missing"}},
		{"tcp://:1883", "", []string{"host is missing"}},
		{"tcp://broker.local:0", "", []string{`port "0"`}},
		{"tcp://broker.local:70000", "", []string{`port "70000"`}},
		{"tcp://broker.local:1883/mqtt", "", []string{"path", "ws:// and wss://"}},
		{"ssl://broker.local:8883?x=1", "", []string{"query"}},
		{"tcp://broker.local:port", "", []string{"port"}},
	}
	for _, tt := range tests {
		t.Run(tt.broker, func(t *testing.T) {
			c := Defaults()
			c.NodeName = "node-1"
			c.MQTTBroker = tt.broker
			err := c.Validate()
			if tt.wants == nil {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				if got := c.MQTTBrokerURL(); got != tt.dial {
					t.Errorf("MQTTBrokerURL() = %q, want %q", got, tt.dial)
				}
				return
			}
			requireErr(t, err, append([]string{"mqttBroker", "--mqtt-broker"}, tt.wants...)...)
			if c.MQTTBrokerURL() != "" {
				t.Errorf("MQTTBrokerURL() of an invalid broker = %q, want empty", c.MQTTBrokerURL())
			}
		})
	}

	// Credentials in the URL are refused, and the password is not repeated in the message.
	c := Defaults()
	c.NodeName = "node-1"
	c.MQTTBroker = "tcp://node:" + testPassword + "@broker.local:1883"
	c.MQTTCAFile = "/etc/ssl/ca.pem"
	err := c.Validate()
	requireErr(t, err, "mqttBroker", "mqttUsername and mqttPasswordFile")
	if strings.Contains(err.Error(), testPassword) {
		t.Errorf("error shows the password in the URL: %v", err)
	}
}

func TestMQTTFiles(t *testing.T) {
	f := newMQTTFixture(t)
	notPEM := writeMode(t, filepath.Join(f.dir, "not.pem"), "hello\n", 0o644)
	missing := filepath.Join(f.dir, "missing.pem")
	tests := []struct {
		name   string
		mutate func(*Config)
		wants  []string
	}{
		{"all good", func(*Config) {}, nil},
		{"wss broker", func(c *Config) { c.MQTTBroker = "wss://broker.local:443/mqtt" }, nil},
		{"CA only, no client cert", func(c *Config) { c.MQTTCertFile, c.MQTTKeyFile = "", "" }, nil},
		{"no TLS files over ssl", func(c *Config) { c.MQTTCAFile, c.MQTTCertFile, c.MQTTKeyFile = "", "", "" }, nil},
		{"user without password", func(c *Config) { c.MQTTPasswordFile = "" }, nil},
		{"CA with tcp broker", func(c *Config) { c.MQTTBroker, c.MQTTCertFile, c.MQTTKeyFile = "tcp://broker.local:1883", "", "" },
			[]string{"mqttCAFile", "--mqtt-ca-file", "only used with an ssl://", "tcp://broker.local:1883"}},
		{"client cert with ws broker", func(c *Config) { c.MQTTBroker, c.MQTTCAFile = "ws://broker.local:80", "" },
			[]string{"mqttCertFile", "mqttKeyFile", "only used with an ssl://"}},
		{"TLS files without broker", func(c *Config) { c.MQTTBroker, c.MQTTUsername, c.MQTTPasswordFile = "", "", "" },
			[]string{"mqttCAFile", "mqttCertFile", "mqttKeyFile", "has no effect without mqttBroker"}},
		{"relative CA", func(c *Config) { c.MQTTCAFile = "ca.pem" }, []string{"mqttCAFile", `"ca.pem"`, "absolute"}},
		{"missing CA", func(c *Config) { c.MQTTCAFile = missing }, []string{"mqttCAFile", missing, "no such file"}},
		{"CA not PEM", func(c *Config) { c.MQTTCAFile = notPEM }, []string{"mqttCAFile", notPEM, "no PEM certificate"}},
		{"cert without key", func(c *Config) { c.MQTTKeyFile = "" }, []string{"mqttCertFile", "--mqtt-cert-file", "needs mqttKeyFile", "both or neither"}},
		{"key without cert", func(c *Config) { c.MQTTCertFile = "" }, []string{"mqttKeyFile", "--mqtt-key-file", "needs mqttCertFile"}},
		{"missing key", func(c *Config) { c.MQTTKeyFile = missing }, []string{"mqttKeyFile", missing, "no such file"}},
		{"key of another cert", func(c *Config) { c.MQTTKeyFile = f.otherKey }, []string{"mqttCertFile", f.otherKey, "not a usable certificate and key pair"}},
		{"cert not PEM", func(c *Config) { c.MQTTCertFile = notPEM }, []string{"mqttCertFile", "not a usable"}},
		{"username without broker", func(c *Config) {
			c.MQTTBroker, c.MQTTCAFile, c.MQTTCertFile, c.MQTTKeyFile, c.MQTTPasswordFile = "", "", "", "", ""
		}, []string{"mqttUsername", "--mqtt-username", "has no effect without mqttBroker"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := f.config()
			tt.mutate(&c)
			err := c.Validate()
			if tt.wants == nil {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			requireErr(t, err, tt.wants...)
		})
	}
}

// A TLS client key that group or others can read or write is refused at start, naming the file
// and its mode, as the password file is.
func TestMQTTKeyFileMode(t *testing.T) {
	f := newMQTTFixture(t)
	key, err := os.ReadFile(f.key)
	if err != nil {
		t.Fatal(err)
	}
	open := writeMode(t, filepath.Join(f.dir, "open.key"), string(key), 0o644)
	group := writeMode(t, filepath.Join(f.dir, "group.key"), string(key), 0o640)
	othersWrite := writeMode(t, filepath.Join(f.dir, "writable.key"), string(key), 0o602)
	owner := writeMode(t, filepath.Join(f.dir, "owner.key"), string(key), 0o400)
	link := filepath.Join(f.dir, "link.key")
	if err := os.Symlink(open, link); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		key   string
		wants []string
	}{
		{"owner read-write", f.key, nil},
		{"owner read-only", owner, nil},
		{"readable by all", open, []string{"mqttKeyFile", "--mqtt-key-file", open, "group or others", "mode 0644", "chmod 600 " + open}},
		{"readable by group", group, []string{"mqttKeyFile", group, "mode 0640", "chmod 600 " + group}},
		{"writable by others", othersWrite, []string{"mqttKeyFile", "mode 0602"}},
		{"a link to a loose key", link, []string{"mqttKeyFile", link, "mode 0644"}},
		{"a directory", f.dir, []string{"mqttKeyFile", f.dir, "not a regular file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := f.config()
			c.MQTTKeyFile = tt.key
			err := c.Validate()
			if tt.wants == nil {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			requireErr(t, err, tt.wants...)
			if strings.Contains(err.Error(), "PRIVATE KEY") {
				t.Errorf("error shows the key: %v", err)
			}
		})
	}
}

func TestMQTTPasswordFile(t *testing.T) {
	f := newMQTTFixture(t)
	open := writeMode(t, filepath.Join(f.dir, "open-password"), testPassword, 0o644)
	groupOnly := writeMode(t, filepath.Join(f.dir, "group-password"), testPassword, 0o640)
	othersWrite := writeMode(t, filepath.Join(f.dir, "writable-password"), testPassword, 0o602)
	empty := writeMode(t, filepath.Join(f.dir, "empty-password"), "\n", 0o600)
	owner := writeMode(t, filepath.Join(f.dir, "owner-password"), testPassword, 0o400)
	tests := []struct {
		name   string
		mutate func(*Config)
		wants  []string
	}{
		{"owner read-only", func(c *Config) { c.MQTTPasswordFile = owner }, nil},
		{"readable by all", func(c *Config) { c.MQTTPasswordFile = open },
			[]string{"mqttPasswordFile", "--mqtt-password-file", open, "group or others", "0644", "chmod 600 " + open}},
		{"readable by group", func(c *Config) { c.MQTTPasswordFile = groupOnly }, []string{"0640", "chmod 600 " + groupOnly}},
		{"writable by others", func(c *Config) { c.MQTTPasswordFile = othersWrite }, []string{"0602", "chmod 600"}},
		{"missing", func(c *Config) { c.MQTTPasswordFile = filepath.Join(f.dir, "nope") }, []string{"mqttPasswordFile", "no such file"}},
		{"a directory", func(c *Config) { c.MQTTPasswordFile = f.dir }, []string{"mqttPasswordFile", "not a regular file"}},
		{"empty", func(c *Config) { c.MQTTPasswordFile = empty }, []string{"mqttPasswordFile", empty, "is empty"}},
		{"relative", func(c *Config) { c.MQTTPasswordFile = "password" }, []string{"mqttPasswordFile", "absolute"}},
		{"no user name", func(c *Config) { c.MQTTUsername = "" }, []string{"mqttPasswordFile", "needs mqttUsername"}},
		{"no broker", func(c *Config) { c.MQTTBroker, c.MQTTCAFile, c.MQTTCertFile, c.MQTTKeyFile = "", "", "", "" },
			[]string{"mqttPasswordFile", "has no effect without mqttBroker"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := f.config()
			tt.mutate(&c)
			err := c.Validate()
			if tt.wants == nil {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			requireErr(t, err, tt.wants...)
			if strings.Contains(err.Error(), testPassword) {
				t.Errorf("error shows the password: %v", err)
			}
		})
	}
}

func TestMQTTLimits(t *testing.T) {
	base := Defaults()
	base.NodeName = "node-1"
	tests := []struct {
		name   string
		mutate func(*Config)
		wants  []string
	}{
		{"keepalive 5s", func(c *Config) { c.MQTTKeepalive = Duration{5 * time.Second} }, nil},
		{"keepalive max", func(c *Config) { c.MQTTKeepalive = Duration{65535 * time.Second} }, nil},
		{"keepalive 4s", func(c *Config) { c.MQTTKeepalive = Duration{4 * time.Second} }, []string{"mqttKeepalive", "--mqtt-keepalive", `"4s"`, "at least 5s"}},
		{"keepalive too long", func(c *Config) { c.MQTTKeepalive = Duration{65536 * time.Second} }, []string{"mqttKeepalive", "at most", "16-bit"}},
		{"keepalive fraction", func(c *Config) { c.MQTTKeepalive = Duration{7500 * time.Millisecond} }, []string{"mqttKeepalive", `"7.5s"`, "whole seconds"}},
		{"reconnect 1s", func(c *Config) { c.MQTTReconnectMax = Duration{time.Second} }, nil},
		{"reconnect fast", func(c *Config) { c.MQTTReconnectMax = Duration{500 * time.Millisecond} }, []string{"mqttReconnectMax", "--mqtt-reconnect-max", `"500ms"`, "at least 1s"}},
		{"payload min", func(c *Config) { c.MQTTMaxPayload = 1024 }, nil},
		{"payload max", func(c *Config) { c.MQTTMaxPayload = 268435455 }, nil},
		{"payload small", func(c *Config) { c.MQTTMaxPayload = 1023 }, []string{"mqttMaxPayload", "--mqtt-max-payload", `"1023"`, "from 1024 to 268435455"}},
		{"payload large", func(c *Config) { c.MQTTMaxPayload = 268435456 }, []string{"mqttMaxPayload", `"268435456"`}},
		{"outbox min", func(c *Config) { c.OutboxMaxBytes = 65536 }, nil},
		{"outbox small", func(c *Config) { c.OutboxMaxBytes = 65535 }, []string{"outboxMaxBytes", "--outbox-max-bytes", `"65535"`, "at least 65536"}},
		{"prefix one level", func(c *Config) { c.MQTTTopicPrefix = "factory" }, nil},
		{"prefix unicode", func(c *Config) { c.MQTTTopicPrefix = "werk-münchen/mqlet" }, nil},
		{"prefix empty", func(c *Config) { c.MQTTTopicPrefix = "" }, []string{"mqttTopicPrefix", "--mqtt-topic-prefix", "must not be empty"}},
		{"prefix plus", func(c *Config) { c.MQTTTopicPrefix = "mqlet/+/v1" }, []string{"mqttTopicPrefix", `"mqlet/+/v1"`, "wildcards"}},
		{"prefix hash", func(c *Config) { c.MQTTTopicPrefix = "mqlet/#" }, []string{"wildcards"}},
		{"prefix leading slash", func(c *Config) { c.MQTTTopicPrefix = "/mqlet/v2" }, []string{"start or end with '/'"}},
		{"prefix trailing slash", func(c *Config) { c.MQTTTopicPrefix = "mqlet/v2/" }, []string{"start or end with '/'"}},
		{"prefix empty level", func(c *Config) { c.MQTTTopicPrefix = "mqlet//v1" }, []string{"empty levels"}},
		{"prefix NUL", func(c *Config) { c.MQTTTopicPrefix = "mqlet\x00v1" }, []string{"NUL"}},
		{"prefix not UTF-8", func(c *Config) { c.MQTTTopicPrefix = "mqlet\xffv1" }, []string{"UTF-8"}},
		{"prefix $SYS", func(c *Config) { c.MQTTTopicPrefix = "$SYS/mqlet" }, []string{"'$'"}},
		{"prefix 128 bytes", func(c *Config) { c.MQTTTopicPrefix = strings.Repeat("a", 128) }, nil},
		{"prefix too long", func(c *Config) { c.MQTTTopicPrefix = strings.Repeat("a", 129) }, []string{"129 bytes, longer than 128"}},
		{"node name with +", func(c *Config) { c.NodeName = "node+1" }, []string{"nodeName", `"node+1"`, "MQTT client id"}},
		{"node name with #", func(c *Config) { c.NodeName = "node#1" }, []string{"nodeName", "MQTT client id"}},
		{"node name with /", func(c *Config) { c.NodeName = "site/node" }, []string{"nodeName", "topic level"}},
		{"policy paths", func(c *Config) { c.MQTTPolicy.AllowedHostPaths = []string{"/data", "/var/log/app"} }, nil},
		// A directory holding what the agent trusts would let a pod from MQTT rewrite it.
		{"policy path holds the state", func(c *Config) { c.MQTTPolicy.AllowedHostPaths = []string{"/var/lib"} },
			[]string{"mqttPolicy.allowedHostPaths", `"/var/lib"`, "holds stateDir /var/lib/mqlet"}},
		{"policy path is the root", func(c *Config) { c.MQTTPolicy.AllowedHostPaths = []string{"/"} }, []string{`"/"`, "holds stateDir"}},
		{"policy path holds the node key", func(c *Config) { c.MQTTPolicy.AllowedHostPaths = []string{"/etc"} }, []string{`"/etc"`, "holds secretKeyFile"}},
		{"policy path holds a trusted key", func(c *Config) {
			c.MQTTTrustedKeys = []string{"/srv/keys/ctl.pub"}
			c.MQTTPolicy.AllowedHostPaths = []string{"/srv"}
		}, []string{`"/srv"`, "holds an mqttTrustedKeys file /srv/keys/ctl.pub"}},
		{"policy path holds the containerd socket", func(c *Config) { c.MQTTPolicy.AllowedHostPaths = []string{"/run/containerd"} }, []string{"holds containerdAddress"}},
		{"policy relative path", func(c *Config) { c.MQTTPolicy.AllowedHostPaths = []string{"data"} },
			[]string{"mqttPolicy.allowedHostPaths", "--mqtt-allowed-host-path", `"data"`, "absolute, clean"}},
		{"policy unclean path", func(c *Config) { c.MQTTPolicy.AllowedHostPaths = []string{"/data/../etc"} }, []string{`"/data/../etc"`, "e.g. /etc"}},
		{"policy trailing slash", func(c *Config) { c.MQTTPolicy.AllowedHostPaths = []string{"/data/"} }, []string{`"/data/"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base
			tt.mutate(&c)
			err := c.Validate()
			if tt.wants == nil {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			requireErr(t, err, tt.wants...)
		})
	}
}

func TestSecretKeyFile(t *testing.T) {
	tmp := t.TempDir()
	state := filepath.Join(tmp, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	// /etc/mqlet as a link into the state dir, as on a read-only root with one writable partition.
	link := filepath.Join(tmp, "etc-mqlet")
	if err := os.Symlink(state, link); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, stateDir, key string
		wants               []string
	}{
		{"default", "/var/lib/mqlet", "/etc/mqlet/node.key", nil},
		{"beside the state dir", "/var/lib/mqlet", "/var/lib/mqlet-keys/node.key", nil},
		{"inside", "/var/lib/mqlet", "/var/lib/mqlet/node.key", []string{"secretKeyFile", "--secret-key-file", `"/var/lib/mqlet/node.key"`, "inside stateDir /var/lib/mqlet", "apart from the data it protects"}},
		{"deep inside", "/var/lib/mqlet/", "/var/lib/mqlet/keys/node.key", []string{"secretKeyFile", "inside stateDir"}},
		{"the state dir itself", "/var/lib/mqlet", "/var/lib/mqlet", []string{"secretKeyFile", "inside stateDir"}},
		{"unclean path into it", "/var/lib/mqlet", "/var/lib/other/../mqlet/node.key", []string{"secretKeyFile", "inside stateDir"}},
		{"through a symlink", state, filepath.Join(link, "node.key"), []string{"secretKeyFile", "inside stateDir"}},
		{"relative", "/var/lib/mqlet", "node.key", []string{"secretKeyFile", `"node.key"`, "absolute"}},
		{"empty", "/var/lib/mqlet", "", []string{"secretKeyFile", "must not be empty"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Defaults()
			c.NodeName = "node-1"
			c.StateDir, c.SecretKeyFile = tt.stateDir, tt.key
			err := c.Validate()
			if tt.wants == nil {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			requireErr(t, err, tt.wants...)
		})
	}
}

// The MQTT settings load from each layer, the policy as a mapping in the file, and errors name the
// setting as the user wrote it.
func TestLoadMQTTSettings(t *testing.T) {
	f := newMQTTFixture(t)
	file := writeFile(t, `mqttBroker: mqtts://broker.local:8883
mqttCAFile: `+f.ca+`
mqttUsername: file-user
mqttPasswordFile: `+f.password+`
mqttKeepalive: 30s
mqttTopicPrefix: factory/mqlet
mqttMaxPayload: 65536
outboxMaxBytes: 4194304
secretKeyFile: /etc/mqlet/keys/node.key
mqttPolicy:
  allowHostNamespaces: true
  allowedHostPaths: [/data]
`)
	flags := mustParseFlags(t, "--config="+file, "--node-name=node-1", "--mqtt-username=flag-user",
		"--mqtt-allowed-host-path=/srv/a,/srv/b", "--mqtt-allowed-host-path", "/srv/c", "--mqtt-reconnect-max=30s", "--mqtt-allow-privileged", "--mqtt-allow-debug-ptrace")
	c, err := Load(flags, []string{"MQLET_MQTT_MAX_PAYLOAD=2048", "MQLET_MQTT_ALLOW_HOST_NAMESPACES=false", "MQLET_MQTT_ALLOWED_HOST_PATHS=/env"})
	if err != nil {
		t.Fatal(err)
	}
	want := Defaults()
	want.NodeName = "node-1"
	want.MQTTBroker = "mqtts://broker.local:8883"
	want.MQTTCAFile = f.ca
	want.MQTTUsername = "flag-user"
	want.MQTTPasswordFile = f.password
	want.MQTTKeepalive = Duration{30 * time.Second}
	want.MQTTTopicPrefix = "factory/mqlet"
	want.MQTTReconnectMax = Duration{30 * time.Second}
	want.MQTTMaxPayload = 2048
	want.OutboxMaxBytes = 4194304
	want.SecretKeyFile = "/etc/mqlet/keys/node.key"
	want.MQTTPolicy = MQTTPolicy{AllowPrivileged: true, AllowHostNamespaces: false, AllowDebugPtrace: true, AllowedHostPaths: []string{"/srv/a", "/srv/b", "/srv/c"}}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Load() =\n%+v\nwant\n%+v", c, want)
	}
	if c.MQTTBrokerURL() != "ssl://broker.local:8883" {
		t.Errorf("MQTTBrokerURL() = %q", c.MQTTBrokerURL())
	}

	c, err = Load(Flags{NodeName: ptr("node-1")}, []string{"MQLET_MQTT_ALLOWED_HOST_PATHS=/data, /var/log/app,"})
	if err != nil || !reflect.DeepEqual(c.MQTTPolicy.AllowedHostPaths, []string{"/data", "/var/log/app"}) {
		t.Errorf("MQLET_MQTT_ALLOWED_HOST_PATHS: %q, %v", c.MQTTPolicy.AllowedHostPaths, err)
	}
}

func TestLoadMQTTErrors(t *testing.T) {
	fileTests := []struct {
		name, yaml string
		wants      []string
	}{
		{"policy not a mapping", "mqttPolicy: true\n", []string{"key mqttPolicy", "a bool (true)", "want a mapping"}},
		{"policy list", "mqttPolicy: [a]\n", []string{"key mqttPolicy", "want a mapping"}},
		{"policy bad bool", "mqttPolicy:\n  allowPrivileged: sometimes\n", []string{"key mqttPolicy.allowPrivileged", "true or false"}},
		{"policy unknown key", "mqttPolicy:\n  allowPrivleged: true\n", []string{`unknown key "mqttPolicy.allowPrivleged"`}},
		{"policy wrong case", "mqttpolicy:\n  allowPrivileged: true\n", []string{`unknown key "mqttpolicy"`, `did you mean "mqttPolicy"`}},
		{"policy paths not a list", "mqttPolicy:\n  allowedHostPaths: /data\n", []string{"key mqttPolicy.allowedHostPaths", "list of strings"}},
		{"policy path relative", "mqttPolicy:\n  allowedHostPaths: [data]\n",
			[]string{`invalid mqttPolicy.allowedHostPaths (--mqtt-allowed-host-path) "data" (from config file`}},
		{"payload with unit", "mqttMaxPayload: 1Mi\n", []string{"key mqttMaxPayload", "whole number"}},
		{"payload fraction", "outboxMaxBytes: 1.5\n", []string{"key outboxMaxBytes", "whole number"}},
		{"keepalive number", "mqttKeepalive: 60\n", []string{"mqttKeepalive", "quoted Go duration"}},
		{"broker as number", "mqttBroker: 1883\n", []string{"mqttBroker", "want a string"}},
	}
	for _, tt := range fileTests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, tt.yaml)
			_, err := Load(Flags{Config: p, NodeName: ptr("n1")}, nil)
			requireErr(t, err, append(tt.wants, p)...)
		})
	}
	t.Run("null policy keeps defaults", func(t *testing.T) {
		p := writeFile(t, "mqttPolicy:\n")
		c, err := Load(Flags{Config: p, NodeName: ptr("n1")}, nil)
		if err != nil || !reflect.DeepEqual(c.MQTTPolicy, MQTTPolicy{}) {
			t.Errorf("got %+v, %v", c.MQTTPolicy, err)
		}
	})

	envTests := []struct {
		name    string
		environ []string
		wants   []string
	}{
		{"payload", []string{"MQLET_MQTT_MAX_PAYLOAD=1k"}, []string{"MQLET_MQTT_MAX_PAYLOAD", `"1k"`, "mqttMaxPayload", "--mqtt-max-payload", "whole number"}},
		{"keepalive range", []string{"MQLET_MQTT_KEEPALIVE=2s"},
			[]string{`invalid mqttKeepalive (--mqtt-keepalive) "2s" (from environment variable MQLET_MQTT_KEEPALIVE): must be at least 5s`}},
		{"broker", []string{"MQLET_MQTT_BROKER=http://broker:80"}, []string{"mqttBroker", "from environment variable MQLET_MQTT_BROKER", "not supported"}},
		{"policy bool", []string{"MQLET_MQTT_ALLOW_PRIVILEGED=maybe"}, []string{"MQLET_MQTT_ALLOW_PRIVILEGED", "mqttPolicy.allowPrivileged", "not a bool"}},
		{"policy path", []string{"MQLET_MQTT_ALLOWED_HOST_PATHS=/data,tmp"}, []string{`"tmp"`, "from environment variable MQLET_MQTT_ALLOWED_HOST_PATHS"}},
		{"secret key in state dir", []string{"MQLET_STATE_DIR=/srv/mqlet", "MQLET_SECRET_KEY_FILE=/srv/mqlet/node.key"},
			[]string{`invalid secretKeyFile (--secret-key-file) "/srv/mqlet/node.key" (from environment variable MQLET_SECRET_KEY_FILE)`, "inside stateDir /srv/mqlet"}},
	}
	for _, tt := range envTests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(Flags{NodeName: ptr("n1")}, tt.environ)
			requireErr(t, err, tt.wants...)
		})
	}

	t.Run("flags", func(t *testing.T) {
		_, err := parseFlags(t, "--mqtt-max-payload=big")
		requireErr(t, err, "--mqtt-max-payload")
		f := mustParseFlags(t, "--node-name=n1", "--mqtt-topic-prefix=a/#", "--outbox-max-bytes=1000")
		_, err = Load(f, nil)
		requireErr(t, err, `invalid mqttTopicPrefix (--mqtt-topic-prefix) "a/#" (from flag --mqtt-topic-prefix)`,
			`invalid outboxMaxBytes (--outbox-max-bytes) "1000" (from flag --outbox-max-bytes)`)
	})
}
