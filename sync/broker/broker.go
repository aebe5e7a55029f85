// Package broker holds the rules for reaching an MQTT broker: which URLs are accepted and how they
// are dialled, and the TLS configuration built from CA, certificate and key files. The agent's
// config, the link and ctl's client all take these rules from here, so a URL one of them accepts
// is one the others accept too. It does not import the MQTT client.
package broker

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
)

// schemes maps each accepted scheme to the one the MQTT client (paho) dials, its default port
// (only tcp and ssl have one), whether it is TLS and whether it may carry a path (websockets).
var schemes = map[string]struct {
	dial, port string
	tls, web   bool
}{
	"tcp":   {"tcp", "1883", false, false},
	"mqtt":  {"tcp", "1883", false, false},
	"ssl":   {"ssl", "8883", true, false},
	"tls":   {"ssl", "8883", true, false},
	"mqtts": {"ssl", "8883", true, false},
	"ws":    {"ws", "", false, true},
	"wss":   {"wss", "", true, true},
}

// URL is a checked broker URL.
type URL struct {
	// Dial is the URL as paho dials it: mqtt:// spelled tcp://, mqtts:// and tls:// spelled
	// ssl://, and tcp and ssl URLs without a port given 1883 and 8883.
	Dial string
	// TLS reports whether the scheme is a TLS one (ssl, tls, mqtts, wss).
	TLS bool
	// Port is the port as written in the URL; empty when it was left to the default.
	Port string
}

// Parse checks an MQTT broker URL. Its errors say what is wrong and what to write instead; they
// do not repeat the URL (see Shown for quoting it).
func Parse(s string) (URL, error) {
	if s == "" {
		return URL{}, errors.New("broker URL is empty (want e.g. tcp://host:1883 or ssl://host:8883)")
	}
	if !strings.Contains(s, "://") {
		return URL{}, errors.New("want scheme://host:port, e.g. tcp://broker.local:1883 or ssl://broker.local:8883")
	}
	u, err := url.Parse(s)
	if err != nil {
		return URL{}, fmt.Errorf("not a URL: %v", errors.Unwrap(err))
	}
	scheme, ok := schemes[u.Scheme]
	if !ok {
		return URL{}, fmt.Errorf("scheme %q is not supported: want tcp, ssl, tls, ws or wss (mqtt and mqtts mean tcp and ssl)", u.Scheme)
	}
	if u.User != nil {
		// The URL is logged and shown in errors and process listings: a password in it leaks.
		return URL{}, errors.New("must not carry a user or password: give them as the username and password settings (the agent's mqttUsername and mqttPasswordFile), not in the URL")
	}
	if u.Hostname() == "" {
		return URL{}, errors.New("host is missing (the URL names no host)")
	}
	port := u.Port()
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return URL{}, fmt.Errorf("port %q must be a number from 1 to 65535", port)
		}
	}
	if !scheme.web && ((u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "") {
		return URL{}, fmt.Errorf("a path, query or fragment only makes sense for ws:// and wss://, not %s://", u.Scheme)
	}
	u.Scheme = scheme.dial
	if port == "" && scheme.port != "" {
		u.Host = net.JoinHostPort(u.Hostname(), scheme.port)
	}
	return URL{Dial: u.String(), TLS: scheme.tls, Port: port}, nil
}

// Shown is s as messages may quote it: with any password in it masked.
func Shown(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		return u.Redacted()
	}
	return s
}

// TLSConfig builds the TLS configuration from PEM files, each error naming its file: caFile
// verifies the broker (empty: the system's roots), certFile and keyFile (both or neither) are the
// client certificate.
func TLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("read CA file: %w", err) // the *PathError names the file
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", caFile)
		}
		c.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("a client certificate needs both a certificate file and a key file: give both or neither (got cert %q, key %q)", certFile, keyFile)
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("load client certificate %s with key %s: %w", certFile, keyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// MarkerIdentity is the identity that names a control-plane client's marker topic
// <prefix>/ctl/<identity>/marker (docs/protocol.md section 10). A broker's ACL grants such clients
// their marker subtree by user name (`pattern readwrite <prefix>/ctl/%u/#`), and with
// use_identity_as_username the user name is the client certificate's CN: so the identity is the
// username, else the CN of the certificate in tc (certFile names it in errors), else (anonymous)
// the client id. Two clients of one identity share the topic; random marker values keep their
// reads apart.
func MarkerIdentity(username, clientID string, tc *tls.Config, certFile string) (string, error) {
	id, from := clientID, "client id"
	switch {
	case username != "":
		id, from = username, "username"
	case tc != nil && len(tc.Certificates) > 0:
		leaf, err := x509.ParseCertificate(tc.Certificates[0].Certificate[0])
		if err != nil {
			return "", fmt.Errorf("client certificate %s: %w", certFile, err)
		}
		if leaf.Subject.CommonName != "" {
			id, from = leaf.Subject.CommonName, "client certificate's CN"
		}
	}
	if id == "" || strings.ContainsAny(id, "/+#\x00") {
		return "", fmt.Errorf("%s %q cannot name the marker topic <prefix>/ctl/<identity>/marker: it is empty or holds '/', '+', '#' or NUL", from, id)
	}
	return id, nil
}
