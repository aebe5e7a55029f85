// Package ctlclient is a control plane's client of mqlet's MQTT contract (sync/protocol): it reads
// the retained state of nodes (index, liveness, node and pod status, acks), applies and deletes
// desired objects with generations drawn from each node's counter, and streams container logs.
// `mqlet ctl` is built on it, and so are tests and the Kubernetes bridge.
//
// It is a short-lived client: a clean session, no automatic reconnect, QoS 1 everywhere. Every
// operation is bounded by Options.Timeout; a lost connection fails the operation in progress and
// every later one (connect again to go on).
package ctlclient

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/mqlet/mqlet/sync/broker"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// DefaultTimeout bounds each operation when Options.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// qos is the QoS of every subscription and publish: retained desired state must not be lost on the
// way to the broker, and the marker technique of Snapshot relies on one QoS for its ordering.
const qos = 1

// Options configure Connect.
type Options struct {
	// Broker is the broker's URL: tcp://, ssl://, tls://, ws://, wss://, mqtt:// (= tcp) or
	// mqtts:// (= ssl). Without a port, tcp and mqtt use 1883, ssl, tls and mqtts 8883.
	Broker string
	// CAFile verifies the broker's certificate (PEM); empty means the system's roots.
	CAFile string
	// CertFile and KeyFile are the client certificate and key (PEM), both or neither.
	CertFile, KeyFile  string
	Username, Password string
	// ClientID defaults to mqlet-ctl-<random hex>.
	ClientID string
	// TopicPrefix defaults to protocol.DefaultPrefix.
	TopicPrefix string
	// Timeout bounds each operation (connect, each publish and subscribe, each snapshot); default
	// DefaultTimeout.
	Timeout time.Duration
	// SigningKey, when set, signs every index this client writes (nodes with trust anchors take
	// only signed ones), and makes a rebuild from a node's acks verify the index the node reports.
	SigningKey ed25519.PrivateKey
	// TrustedKeys are other keys whose signed indexes this client builds on (the previous key,
	// during a rotation); with a SigningKey, an index no trusted key signed is not built on.
	TrustedKeys []ed25519.PublicKey
	// NodeTrust holds the fleet's CA, which issues the nodes' client certificates (and its CRL).
	// With it, a Secret is sealed only to a key the node's certificate vouches for
	// (sealing.NodeTrust.Attested), so a broker that put its own key in a node's status cannot
	// read what is sealed. Without it the key is taken as the broker hands it over
	// (docs/security.md).
	NodeTrust *sealing.NodeTrust
}

// Client is a connection to the broker. Its methods are safe for concurrent use; snapshots are
// taken one at a time.
type Client struct {
	o      Options
	topics protocol.Topics
	mc     mqtt.Client
	marker string // <prefix>/ctl/<identity>/marker, see broker.MarkerIdentity

	lost     chan struct{} // closed when the connection is lost
	lostOnce sync.Once
	lostErr  error // written before lost is closed

	snapMu sync.Mutex // one snapshot at a time: they share the marker topic
	// writeMu serializes applies and deletes, from reading the index to reading it back, so that
	// two of this client's writes never draw the same generation.
	writeMu sync.Mutex

	mu       sync.Mutex
	markerN  uint64
	sessions map[string]protocol.Liveness // per node, the online message of the highest session seen
}

// Connect validates o and connects to the broker.
func Connect(ctx context.Context, o Options) (*Client, error) {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	u, err := broker.Parse(o.Broker)
	if err != nil {
		return nil, fmt.Errorf("broker URL %q: %w", broker.Shown(o.Broker), err)
	}
	topics, err := protocol.NewTopics(o.TopicPrefix)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", o.Broker, err)
	}
	if o.ClientID == "" {
		o.ClientID = "mqlet-ctl-" + randomHex(8)
	}
	if len(o.ClientID) > 128 || strings.ContainsAny(o.ClientID, "\x00") {
		return nil, fmt.Errorf("connect %s: client id %q: want at most 128 characters and no NUL", o.Broker, o.ClientID)
	}
	var tc *tls.Config
	if u.TLS {
		if tc, err = broker.TLSConfig(o.CAFile, o.CertFile, o.KeyFile); err != nil {
			return nil, fmt.Errorf("connect %s: %w", o.Broker, err)
		}
	} else if o.CAFile != "" || o.CertFile != "" || o.KeyFile != "" {
		// TLS files with a plain URL mean a typo in one of them; connecting without TLS would hide it.
		return nil, fmt.Errorf("connect %s: a CA file or client certificate is given but the broker URL is not TLS (use ssl://, mqtts:// or wss://)", o.Broker)
	}
	id, err := broker.MarkerIdentity(o.Username, o.ClientID, tc, o.CertFile)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", o.Broker, err)
	}
	c := &Client{
		o:        o,
		topics:   topics,
		marker:   topics.Marker(id),
		lost:     make(chan struct{}),
		sessions: map[string]protocol.Liveness{},
	}

	opts := mqtt.NewClientOptions().
		AddBroker(u.Dial).
		SetClientID(o.ClientID).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetConnectTimeout(o.Timeout).
		SetWriteTimeout(o.Timeout).
		SetOrderMatters(true). // Snapshot's marker must be handled after what came before it
		SetKeepAlive(30 * time.Second).
		// A QoS 1 message with no route is not acknowledged by paho, which would stall the
		// broker's in-flight window for this client: strays (a subscription being torn down)
		// are acknowledged and dropped here.
		SetDefaultPublishHandler(func(mqtt.Client, mqtt.Message) {}).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) {
			c.lostOnce.Do(func() {
				c.lostErr = fmt.Errorf("connection to %s lost: %w", o.Broker, err)
				close(c.lost)
			})
		})
	if o.Username != "" {
		opts.SetUsername(o.Username)
		opts.SetPassword(o.Password)
	}
	if tc != nil {
		opts.SetTLSConfig(tc)
	}
	c.mc = mqtt.NewClient(opts)
	if err := c.wait(ctx, c.mc.Connect(), "connect "+o.Broker); err != nil {
		// paho may still be dialing when ctx ends; Disconnect stops it.
		c.mc.Disconnect(0)
		return nil, err
	}
	return c, nil
}

// Close disconnects, giving in-flight packets a moment to leave.
func (c *Client) Close() {
	c.mc.Disconnect(250)
}

// Topics is the client's topic tree.
func (c *Client) Topics() protocol.Topics { return c.topics }

// Timeout is the bound of each operation.
func (c *Client) Timeout() time.Duration { return c.o.Timeout }

// wait waits for a paho token, bounded by ctx, Options.Timeout and the connection, and returns the
// token's error: a token that is done is not a success until its error has been looked at.
func (c *Client) wait(ctx context.Context, tok mqtt.Token, what string) error {
	ctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	defer cancel()
	select {
	case <-tok.Done():
	case <-c.lost:
		return fmt.Errorf("%s: %w", what, c.lostErr)
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("%s: no answer from the broker within %s", what, c.o.Timeout)
		}
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
	if err := tok.Error(); err != nil {
		select {
		case <-c.lost: // paho's "not Connected" says less than why
			return fmt.Errorf("%s: %w", what, c.lostErr)
		default:
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	if st, ok := tok.(*mqtt.SubscribeToken); ok {
		// A broker refuses a subscription (ACL) with return code 0x80 in the SUBACK, not with an
		// error: without this check a denied subscription would look like an empty snapshot.
		for filter, code := range st.Result() {
			if code == 0x80 {
				return fmt.Errorf("%s: the broker refused the subscription to %s (not allowed for this client?)", what, filter)
			}
		}
	}
	return nil
}

// publish publishes at QoS 1 and waits for the broker's PUBACK.
func (c *Client) publish(ctx context.Context, topic string, payload []byte, retained bool) error {
	return c.wait(ctx, c.mc.Publish(topic, qos, retained, payload), "publish "+topic)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b)
}
