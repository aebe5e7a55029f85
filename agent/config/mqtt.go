package config

import (
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/sync/broker"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/signing"
)

// MQTTTrustAnchors reads the trusted public keys; call it on a validated Config.
func (c Config) MQTTTrustAnchors() ([]ed25519.PublicKey, error) {
	keys, err := signing.LoadPublicKeys(c.MQTTTrustedKeys)
	if err != nil {
		return nil, fmt.Errorf("mqttTrustedKeys (--mqtt-trusted-key): %w", err)
	}
	return keys, nil
}

// Limits of the MQTT settings. The protocol's own: the keepalive is a 16-bit number of seconds and
// the largest packet is 268435455 bytes (the Remaining Length field's maximum).
const (
	minKeepalive       = 5 * time.Second
	maxKeepalive       = 65535 * time.Second
	minReconnectMax    = time.Second
	minMaxPayload      = 1024
	maxMaxPayload      = 268435455
	minOutboxMaxBytes  = 64 << 10
	privateFileBadMode = 0o077 // password file, TLS key: any access for group or others
)

// parseBroker checks the broker URL with the rules of sync/broker, and that it names its port: in
// a node's config the port is written down rather than left to a default.
func parseBroker(s string) (broker.URL, error) {
	u, err := broker.Parse(s)
	if err == nil && u.Port == "" {
		return u, errors.New("port is missing (write it out: 1883 for tcp, 8883 for ssl are usual)")
	}
	return u, err
}

// MQTTBrokerURL is the broker URL as the MQTT client takes it (mqtt:// written as tcp://, mqtts://
// as ssl://); empty for a standalone node. Call it on a validated Config.
func (c Config) MQTTBrokerURL() string {
	u, err := parseBroker(c.MQTTBroker)
	if c.MQTTBroker == "" || err != nil {
		return ""
	}
	return u.Dial
}

// MQTTTLS reports whether the broker is reached over TLS (ssl, tls, mqtts, wss).
func (c Config) MQTTTLS() bool {
	u, err := parseBroker(c.MQTTBroker)
	return c.MQTTBroker != "" && err == nil && u.TLS
}

// MQTTPassword reads the password file; one trailing newline (what `echo` and editors leave) is not
// part of the password. It returns "" when no file is set. Neither the password nor any part of the
// file appears in an error.
func (c Config) MQTTPassword() (string, error) {
	if c.MQTTPasswordFile == "" {
		return "", nil
	}
	pw, err := ReadPasswordFile(c.MQTTPasswordFile)
	if err != nil {
		return "", fmt.Errorf("mqttPasswordFile (--mqtt-password-file): %w", err)
	}
	return pw, nil
}

// ReadPasswordFile reads an MQTT password file (the agent's and mqlet ctl's): one trailing
// newline, "\n" or "\r\n" (what `echo` and editors leave), is not part of the password. Its errors
// name the file, never any of its content.
func ReadPasswordFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r"), nil
}

// AdmissionPolicy is MQTTPolicy as the admission step takes it.
func (c Config) AdmissionPolicy() admission.Policy {
	return admission.Policy{
		AllowPrivileged:     c.MQTTPolicy.AllowPrivileged,
		AllowHostNamespaces: c.MQTTPolicy.AllowHostNamespaces,
		AllowDebugPtrace:    c.MQTTPolicy.AllowDebugPtrace,
		AllowedHostPaths:    append([]string(nil), c.MQTTPolicy.AllowedHostPaths...),
	}
}

// validateMQTT checks the MQTT and sync settings. It reads the files they name (existence,
// permissions, that certificates parse), so a wrong path fails at start and not at the first
// connection attempt, minutes later and only in the log.
func (c Config) validateMQTT(bad func(key, value, reason string, args ...any)) {
	brokerOK, brokerTLS := false, false
	shown := broker.Shown(c.MQTTBroker) // how messages quote the broker: never with a password in it
	if c.MQTTBroker != "" {
		u, err := parseBroker(c.MQTTBroker)
		if err != nil {
			bad("mqttBroker", shown, "%v", err)
		}
		brokerOK, brokerTLS = err == nil, u.TLS
	}

	// The connection settings mean nothing without a broker, and TLS files nothing without TLS:
	// a setting that is silently ignored hides a typo in the broker URL.
	needsBroker := func(key, value string) bool {
		switch {
		case value == "":
			return false
		case c.MQTTBroker == "":
			bad(key, value, "has no effect without mqttBroker (--mqtt-broker)")
			return false
		case !brokerOK:
			return false // the broker's own error says enough
		}
		return true
	}
	needsTLS := func(key, value string) bool {
		if !needsBroker(key, value) {
			return false
		}
		if !brokerTLS {
			bad(key, value, "only used with an ssl://, tls://, mqtts:// or wss:// broker, and mqttBroker is %s", shown)
			return false
		}
		if !filepath.IsAbs(value) {
			bad(key, value, "must be an absolute path")
			return false
		}
		return true
	}
	if needsTLS("mqttCAFile", c.MQTTCAFile) {
		if pem, err := os.ReadFile(c.MQTTCAFile); err != nil {
			bad("mqttCAFile", c.MQTTCAFile, "cannot read it: %v", errors.Unwrap(err))
		} else if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			bad("mqttCAFile", c.MQTTCAFile, "holds no PEM certificate")
		}
	}
	certOK, keyOK := needsTLS("mqttCertFile", c.MQTTCertFile), needsTLS("mqttKeyFile", c.MQTTKeyFile)
	var certPEM, keyPEM []byte
	if certOK {
		var err error
		if certPEM, err = os.ReadFile(c.MQTTCertFile); err != nil {
			bad("mqttCertFile", c.MQTTCertFile, "cannot read it: %v", errors.Unwrap(err))
		}
	}
	if keyOK {
		keyPEM = c.readKeyFile(bad)
	}
	switch {
	case c.MQTTCertFile != "" && c.MQTTKeyFile == "":
		bad("mqttCertFile", c.MQTTCertFile, "needs mqttKeyFile (--mqtt-key-file) too: give both or neither")
	case c.MQTTKeyFile != "" && c.MQTTCertFile == "":
		bad("mqttKeyFile", c.MQTTKeyFile, "needs mqttCertFile (--mqtt-cert-file) too: give both or neither")
	case certPEM != nil && keyPEM != nil:
		if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
			bad("mqttCertFile", c.MQTTCertFile, "with mqttKeyFile %s: not a usable certificate and key pair: %v", c.MQTTKeyFile, err)
		}
	}

	for _, k := range c.MQTTTrustedKeys {
		if needsBroker("mqttTrustedKeys", k) {
			if _, err := signing.LoadPublicKey(k); err != nil {
				bad("mqttTrustedKeys", k, "not a usable trust anchor: %v", err)
			}
		}
	}
	needsBroker("mqttUsername", c.MQTTUsername)
	if needsBroker("mqttPasswordFile", c.MQTTPasswordFile) {
		c.validatePasswordFile(bad)
	}

	switch d := c.MQTTKeepalive.Duration; {
	case d < minKeepalive:
		bad("mqttKeepalive", c.MQTTKeepalive.String(), "must be at least %s", minKeepalive)
	case d > maxKeepalive:
		bad("mqttKeepalive", c.MQTTKeepalive.String(), "must be at most %s (65535s): MQTT sends it as a 16-bit number of seconds", maxKeepalive)
	case d%time.Second != 0:
		bad("mqttKeepalive", c.MQTTKeepalive.String(), "must be whole seconds: MQTT sends it in seconds")
	}
	if reasons := protocol.PrefixProblems(c.MQTTTopicPrefix); len(reasons) > 0 {
		bad("mqttTopicPrefix", c.MQTTTopicPrefix, "%s", strings.Join(reasons, "; "))
	}
	if c.MQTTReconnectMax.Duration < minReconnectMax {
		bad("mqttReconnectMax", c.MQTTReconnectMax.String(), "must be at least %s", minReconnectMax)
	}
	if n := c.MQTTMaxPayload; n < minMaxPayload || n > maxMaxPayload {
		bad("mqttMaxPayload", strconv.FormatInt(n, 10), "must be from %d to %d bytes (the MQTT maximum)", minMaxPayload, maxMaxPayload)
	}
	if n := c.OutboxMaxBytes; n < minOutboxMaxBytes {
		bad("outboxMaxBytes", strconv.FormatInt(n, 10), "must be at least %d bytes", minOutboxMaxBytes)
	}

	switch k := c.SecretKeyFile; {
	case k == "":
		bad("secretKeyFile", k, "must not be empty: secrets in the state store are sealed with this key")
	case !filepath.IsAbs(k):
		bad("secretKeyFile", k, "must be an absolute path")
	case filepath.IsAbs(c.StateDir) && inside(k, c.StateDir):
		bad("secretKeyFile", k, "must not be inside stateDir %s: the key must live apart from the data it protects, or a copy of the state dir (a backup, a cloned SD card) carries its own key; /etc/mqlet/node.key is the usual place", c.StateDir)
	}

	for _, p := range c.MQTTPolicy.AllowedHostPaths {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			bad("mqttPolicy.allowedHostPaths", p, "must be an absolute, clean path (no '..', '.', '//' or trailing '/'), e.g. %s", filepath.Clean("/"+p))
			continue
		}
		// A pod from MQTT that could write what the agent trusts would get past every check of
		// the channel: edit the state file (what runs), replace the trust anchors or the node
		// key, or drive containerd directly. An allowed directory must hold none of it.
		for _, g := range c.guardedPaths() {
			if g.path != "" && filepath.IsAbs(g.path) && inside(g.path, p) {
				bad("mqttPolicy.allowedHostPaths", p, "holds %s %s: a pod from MQTT could rewrite what the agent trusts; allow a directory beside it", g.what, g.path)
			}
		}
	}
}

type guardedPath struct{ what, path string }

// guardedPaths are the files and directories whose contents decide what the agent runs or whom
// it trusts.
func (c Config) guardedPaths() []guardedPath {
	g := []guardedPath{
		{"stateDir", c.StateDir}, {"secretKeyFile", c.SecretKeyFile}, {"manifestDir", c.ManifestDir},
		{"apiSocket", c.APISocket}, {"mqttKeyFile", c.MQTTKeyFile}, {"mqttPasswordFile", c.MQTTPasswordFile},
		{"mqttCAFile", c.MQTTCAFile}, {"imagePreloadDir", c.ImagePreloadDir},
		{"containerdAddress", strings.TrimPrefix(c.ContainerdAddress, "unix://")},
	}
	for _, k := range c.MQTTTrustedKeys {
		g = append(g, guardedPath{"an mqttTrustedKeys file", k})
	}
	return g
}

// readKeyFile reads the TLS client key, once it is known to be a regular file that no one but its
// owner can read or change (as the password file): whoever can read it can connect as this node,
// with this node's rights on the broker. It returns nil after reporting a problem; nothing of the
// key goes into a message.
func (c Config) readKeyFile(bad func(key, value, reason string, args ...any)) []byte {
	const key = "mqttKeyFile"
	path := c.MQTTKeyFile
	f, err := os.Open(path)
	if err != nil {
		bad(key, path, "cannot read it: %v", errors.Unwrap(err))
		return nil
	}
	defer f.Close()
	st, err := f.Stat() // the file opened, not the path again
	if err != nil {
		bad(key, path, "cannot read it: %v", errors.Unwrap(err))
		return nil
	}
	if !st.Mode().IsRegular() {
		bad(key, path, "is not a regular file")
		return nil
	}
	if m := st.Mode().Perm(); m&privateFileBadMode != 0 {
		bad(key, path, "is readable or writable by group or others (mode %04o): the node's private key must be private, whoever reads it can connect as this node; run chmod 600 %s", m, path)
		return nil
	}
	pem, err := io.ReadAll(f)
	if err != nil {
		bad(key, path, "cannot read it: %v", errors.Unwrap(err))
		return nil
	}
	return pem
}

// validatePasswordFile checks that the password file is a readable, non-empty regular file that no
// one but its owner can read or change. Nothing of its content goes into a message.
func (c Config) validatePasswordFile(bad func(key, value, reason string, args ...any)) {
	const key = "mqttPasswordFile"
	path := c.MQTTPasswordFile
	if !filepath.IsAbs(path) {
		bad(key, path, "must be an absolute path")
		return
	}
	if c.MQTTUsername == "" {
		// MQTT 3.1.1 sends a password only with a user name (the password flag needs the user one).
		bad(key, path, "needs mqttUsername (--mqtt-username): MQTT sends no password without a user name")
	}
	st, err := os.Stat(path)
	if err != nil {
		bad(key, path, "%v", errors.Unwrap(err))
		return
	}
	if !st.Mode().IsRegular() {
		bad(key, path, "is not a regular file")
		return
	}
	if m := st.Mode().Perm(); m&privateFileBadMode != 0 {
		bad(key, path, "is readable or writable by group or others (mode %04o): the password must be private; run chmod 600 %s", m, path)
		return
	}
	pw, err := c.MQTTPassword()
	if err != nil {
		bad(key, path, "cannot read it: %v", errors.Unwrap(err))
		return
	}
	if pw == "" {
		bad(key, path, "is empty")
	}
}

// inside reports whether path is dir or lies below it, by whole path segments, also once the
// symlinks in the part of either path that exists are resolved (/etc/mqlet may be a link into
// the state dir on a read-only root).
func inside(path, dir string) bool {
	within := func(p, d string) bool {
		p, d = filepath.Clean(p), filepath.Clean(d)
		return p == d || d == "/" || strings.HasPrefix(p, d+"/")
	}
	if within(path, dir) {
		return true
	}
	rp, rd := resolveExisting(path), resolveExisting(dir)
	return within(rp, rd)
}

// resolveExisting resolves the symlinks of the longest part of p that exists and appends the rest.
func resolveExisting(p string) string {
	p = filepath.Clean(p)
	rest := ""
	for {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Join(r, rest)
		}
		parent := filepath.Dir(p)
		if parent == p {
			return filepath.Join(p, rest)
		}
		rest = filepath.Join(filepath.Base(p), rest)
		p = parent
	}
}
