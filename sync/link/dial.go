package link

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"golang.org/x/net/proxy"
)

// openConnection is paho's OpenConnectionFunc for a Link with an inbound limit: it opens the
// connection as paho v1.5.1's own openConnection does (netconn.go: the same schemes, the same
// proxies from the environment, TLS over the options' dialer) and wraps it in a guardedConn,
// above TLS and websockets, where the MQTT bytes are. paho has no other hook between the network
// and its packet reader.
func (c *conn) openConnection(uri *url.URL, o mqtt.ClientOptions) (net.Conn, error) {
	nc, err := dialBroker(uri, o)
	if err != nil {
		return nil, err
	}
	return newGuardedConn(nc, c.l.inboundLimit, c.refusedPacket), nil
}

// dialBroker opens the network connection (tcp, TLS or websockets) for uri; no MQTT yet.
func dialBroker(uri *url.URL, o mqtt.ClientOptions) (net.Conn, error) {
	dialer := o.Dialer
	if dialer == nil {
		dialer = &net.Dialer{Timeout: o.ConnectTimeout}
	}
	switch uri.Scheme {
	case "ws", "wss":
		dialURI := *uri // gorilla/websocket refuses a URL with user info
		dialURI.User = nil
		var tlsc *tls.Config
		if uri.Scheme == "wss" {
			tlsc = o.TLSConfig
		}
		return mqtt.NewWebsocket(dialURI.String(), tlsc, o.ConnectTimeout, o.HTTPHeaders, o.WebsocketOptions)
	case "mqtt", "tcp":
		return proxy.FromEnvironmentUsing(dialer).Dial("tcp", uri.Host)
	case "ssl", "tls", "mqtts", "mqtt+ssl", "tcps":
		if os.Getenv("all_proxy") == "" {
			return tls.DialWithDialer(dialer, "tcp", uri.Host, o.TLSConfig)
		}
		raw, err := proxy.FromEnvironment().Dial("tcp", uri.Host)
		if err != nil {
			return nil, err
		}
		tlsc := o.TLSConfig.Clone()
		if tlsc.ServerName == "" { // as tls.DialWithDialer does
			if host, _, err := net.SplitHostPort(uri.Host); err == nil {
				tlsc.ServerName = host
			}
		}
		tc := tls.Client(raw, tlsc)
		if err := tc.Handshake(); err != nil {
			_ = raw.Close()
			return nil, err
		}
		return tc, nil
	}
	return nil, fmt.Errorf("unknown protocol %q", uri.Scheme)
}
