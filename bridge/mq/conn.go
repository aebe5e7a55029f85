// Package mq is mqlet-bridge's MQTT connection: one persistent, reconnecting client (sync/link:
// clean session, jittered back-off, PUBACK receipts) subscribed on every connection to the uplink
// topics of every node, which it routes to a handler without ever blocking paho, plus Publish
// (waits for the PUBACK) and Snapshot (retained state by the marker technique of docs/protocol.md
// section 10) for the parts of the bridge that write desired state.
package mq

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mqlet/mqlet/core/prom"
	"github.com/mqlet/mqlet/sync/broker"
	"github.com/mqlet/mqlet/sync/link"
	"github.com/mqlet/mqlet/sync/protocol"
)

// Defaults for the zero values of Options.
const (
	DefaultTimeout   = 10 * time.Second
	DefaultQueueSize = 32768
	DefaultShards    = 4
	// resyncEvery bounds how often an overflow makes the broker resend every retained uplink
	// message: a resend of a large fleet is itself a burst, and must not feed an overflow loop.
	resyncEvery = 10 * time.Second
)

// Message is one uplink message, its topic parsed.
type Message struct {
	Topic    protocol.Topic
	Name     string // the topic as received
	Payload  []byte
	Retained bool
	// Session numbers the bridge's own connection the message arrived on (1, 2, ... per process),
	// so a receiver can tell state confirmed on the current connection from state that may have
	// changed while the bridge was away from the broker (see Conn.Connected).
	Session int64
}

// Options configure New.
type Options struct {
	// Broker is the broker's URL in the agent's forms: tcp://, ssl://, tls://, ws://, wss://,
	// mqtt:// (= tcp) or mqtts:// (= ssl).
	Broker                    string
	CAFile, CertFile, KeyFile string
	Username                  string
	// PasswordFile holds the password (one trailing newline is not part of it). It must be a
	// regular file that no group or other user can read or write (chmod 600); its content is never
	// logged.
	PasswordFile string
	// ClientID defaults to mqlet-bridge-<hostname>-<random hex>. With use_username_as_clientid the
	// broker replaces it with the identity anyway, which is why each replica needs its own identity.
	ClientID    string
	TopicPrefix string // default protocol.DefaultPrefix
	// Timeout bounds the connect, each subscribe, and a Snapshot's wait for its marker (default
	// DefaultTimeout). Publish is bounded by its ctx.
	Timeout                    time.Duration
	ReconnectMin, ReconnectMax time.Duration // back-off between attempts (defaults of sync/link)
	// QueueSize bounds the messages received but not yet handled (default DefaultQueueSize),
	// split between the link's inbox and Shards per-node queues.
	QueueSize int
	// Shards is the number of goroutines that call Handler; a node's messages always go to the
	// same one, in arrival order, so one node's burst delays only the nodes that share its shard.
	Shards int
	// Handler is called for every uplink message whose topic parses (online, status/node,
	// status/pods, events, acks, resync of every node). It runs on one of the Shards goroutines:
	// it may take a little time, but a handler that blocks stalls its shard, whose queue then
	// overflows (counted, and answered with a full resend of the retained uplink state).
	Handler func(Message)
	Log     *slog.Logger
	// Metrics, when set, gets the bridge_mqtt_* metrics.
	Metrics *prom.Registry
}

// Conn is the bridge's MQTT connection. Its methods are safe for concurrent use.
type Conn struct {
	o      Options
	topics protocol.Topics
	link   *link.Link
	filter []string // the uplink subscriptions
	marker string   // <prefix>/ctl/<identity>/marker

	shards []chan Message

	snapMu  sync.Mutex // snapshots share the marker topic: one at a time
	markerN atomic.Uint64

	resync chan struct{} // 1-buffered: a full resend is due
	// stray holds live uplink messages that arrived on a Snapshot's subscription (paho gives a
	// message to the default handler only when no subscription of its own matches).
	stray chan link.Message

	messages   *prom.CounterVec
	refused    *prom.CounterVec
	overflows  *prom.Counter
	resyncs    *prom.Counter
	publishes  *prom.CounterVec
	shardDrops atomic.Uint64
}

// Uplink classes the bridge subscribes to, for every node.
var uplink = []protocol.Class{protocol.ClassLiveness, protocol.ClassNodeStatus, protocol.ClassPodStatus,
	protocol.ClassEvents, protocol.ClassAcks, protocol.ClassResync}

// New checks o, reads the password and TLS files, and returns a Conn that is not connected yet
// (see Run).
func New(o Options) (*Conn, error) {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.QueueSize <= 0 {
		o.QueueSize = DefaultQueueSize
	}
	if o.Shards <= 0 {
		o.Shards = DefaultShards
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Handler == nil {
		return nil, errors.New("mqtt: no message handler")
	}
	topics, err := protocol.NewTopics(o.TopicPrefix)
	if err != nil {
		return nil, fmt.Errorf("mqtt: %w", err)
	}
	u, err := broker.Parse(o.Broker)
	if err != nil {
		return nil, fmt.Errorf("mqtt broker URL %q: %w", broker.Shown(o.Broker), err)
	}
	if o.ClientID == "" {
		host, _ := os.Hostname()
		o.ClientID = "mqlet-bridge-" + clientIDPart(host) + randomHex(4)
	}
	var password string
	if o.PasswordFile != "" {
		if o.Username == "" {
			return nil, fmt.Errorf("mqtt password file %s: a password needs a username (MQTT 3.1.1)", o.PasswordFile)
		}
		if password, err = ReadPasswordFile(o.PasswordFile); err != nil {
			return nil, fmt.Errorf("mqtt password file: %w", err)
		}
	}
	id, err := markerIdentity(o, u.TLS)
	if err != nil {
		return nil, fmt.Errorf("mqtt: %w", err)
	}
	c := &Conn{o: o, topics: topics, marker: topics.Marker(id), resync: make(chan struct{}, 1), stray: make(chan link.Message, 256)}
	for _, cl := range uplink {
		c.filter = append(c.filter, topics.AllNodes(cl))
	}
	// Half the queue in the link's inbox (where paho's handler puts messages without waiting),
	// half spread over the shards.
	per := max(o.QueueSize/2/o.Shards, 16)
	c.shards = make([]chan Message, o.Shards)
	for i := range c.shards {
		c.shards[i] = make(chan Message, per)
	}
	c.link, err = link.New(link.Options{
		Broker:         o.Broker,
		CAFile:         o.CAFile,
		CertFile:       o.CertFile,
		KeyFile:        o.KeyFile,
		Username:       o.Username,
		Password:       password,
		ClientID:       o.ClientID,
		ConnectTimeout: o.Timeout,
		ReconnectMin:   o.ReconnectMin,
		ReconnectMax:   o.ReconnectMax,
		Subscriptions:  c.filter,
		InboxSize:      max(o.QueueSize/2, 16),
		OnOverflow:     c.askResync,
		Log:            o.Log,
	})
	if err != nil {
		return nil, err
	}
	c.registerMetrics(o.Metrics)
	return c, nil
}

func (c *Conn) registerMetrics(r *prom.Registry) {
	if r == nil {
		r = prom.NewRegistry() // counted but not exposed
	}
	c.messages = r.CounterVec("bridge_mqtt_messages_total", "Uplink messages received, by topic class.", "class")
	c.refused = r.CounterVec("bridge_mqtt_topics_refused_total", "Messages refused because their topic does not parse (outside the tree, unknown class, invalid name).", "reason")
	c.overflows = r.Counter("bridge_mqtt_queue_overflows_total", "Uplink messages dropped because a receive queue was full (each leads to a full resend of retained uplink state).")
	c.resyncs = r.Counter("bridge_mqtt_resyncs_total", "Full resends of retained uplink state asked of the broker after an overflow.")
	c.publishes = r.CounterVec("bridge_mqtt_publishes_total", "Publishes by result (ok: the broker's PUBACK was seen).", "result")
	r.Func("bridge_mqtt_connected", "1 while the bridge is connected to the broker.", prom.GaugeType, nil, func(emit prom.Emit) {
		_, ok := c.Connected()
		emit(b2f(ok))
	})
	r.Func("bridge_mqtt_queued_messages", "Uplink messages received and not yet handled.", prom.GaugeType, nil, func(emit prom.Emit) {
		n := 0
		for _, s := range c.shards {
			n += len(s)
		}
		emit(float64(n + len(c.link.Inbox())))
	})
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Topics is the topic tree the connection uses.
func (c *Conn) Topics() protocol.Topics { return c.topics }

// ClientID is the MQTT client id asked for.
func (c *Conn) ClientID() string { return c.o.ClientID }

// Connected returns the session number of the current connection (as in Message.Session), or ok
// false while the bridge has no connection to the broker. A node state learnt on an older session
// cannot be vouched for: it may have changed while the bridge was away.
func (c *Conn) Connected() (session int64, ok bool) {
	s, _, ok := c.link.Connected()
	return s, ok
}

// WaitConnected waits for a connection to the broker (or ctx's end) and returns its session and a
// channel closed when that connection is lost.
func (c *Conn) WaitConnected(ctx context.Context) (session int64, lost <-chan struct{}, err error) {
	return c.link.WaitConnected(ctx)
}

// Run connects and keeps the connection up until ctx ends, handing messages to Handler; it
// returns once every goroutine it started has ended.
func (c *Conn) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, s := range c.shards {
		wg.Go(func() { c.handle(ctx, s) })
	}
	wg.Go(func() { c.dispatch(ctx) })
	wg.Go(func() { c.resyncLoop(ctx) })
	err := c.link.Run(ctx)
	cancel()
	wg.Wait()
	return err
}

// dispatch parses each received topic and queues the message on its node's shard, never
// waiting: a full shard counts an overflow and asks for a resend.
func (c *Conn) dispatch(ctx context.Context) {
	in := c.link.Inbox()
	for {
		var m link.Message
		select {
		case <-ctx.Done():
			return
		case m = <-in:
		case m = <-c.stray:
		}
		t, err := c.topics.Parse(m.Topic)
		if err != nil {
			c.refused.With("unparseable").Inc()
			c.o.Log.Warn("mqtt message refused: its topic does not parse", "topic", m.Topic, "err", err)
			continue
		}
		c.messages.With(string(t.Class)).Inc()
		msg := Message{Topic: t, Name: m.Topic, Payload: m.Payload, Retained: m.Retained, Session: m.Session}
		select {
		case c.shards[shardOf(t.Node, len(c.shards))] <- msg:
		default:
			c.shardDrops.Add(1)
			c.askResync()
		}
	}
}

func shardOf(node string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(node))
	return int(h.Sum32() % uint32(n))
}

func (c *Conn) handle(ctx context.Context, q <-chan Message) {
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-q:
			c.o.Handler(m)
		}
	}
}

// askResync records an overflow; called from the link's overflow reporter and from dispatch.
func (c *Conn) askResync() {
	c.overflows.Inc()
	select {
	case c.resync <- struct{}{}:
	default:
	}
}

// resyncLoop answers overflows: once the queues have room again it resubscribes to every uplink
// filter, so the broker resends every retained message (online, status, acks) and whatever was
// dropped is read again. Events and resync requests are not retained: a dropped one is lost, as
// any non-retained message is for a reader that was away (docs/protocol.md section 6.3).
func (c *Conn) resyncLoop(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.resync:
		}
		if wait := resyncEvery - time.Since(last); wait > 0 {
			if !sleep(ctx, wait) {
				return
			}
		}
		// Let the queues drain first, or the resend overflows them again.
		for c.queued() > 0 {
			if !sleep(ctx, 100*time.Millisecond) {
				return
			}
		}
		last = time.Now()
		c.resyncs.Inc()
		c.o.Log.Warn("uplink queue overflowed; asking the broker to resend retained uplink state",
			"dropped_in_link", c.link.Dropped(), "dropped_in_shards", c.shardDrops.Load())
		for _, f := range c.filter {
			if err := c.link.Resubscribe(f); err != nil {
				// The link drops the connection; the next one subscribes afresh, which resends too.
				c.o.Log.Warn("resubscribe failed", "filter", f, "err", err)
				break
			}
		}
	}
}

func (c *Conn) queued() int {
	n := len(c.link.Inbox())
	for _, s := range c.shards {
		n += len(s)
	}
	return n
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Publish sends payload to topic with QoS 1 and returns once the broker's PUBACK for it was seen,
// or with an error (no connection, connection lost before the PUBACK, ctx ended). It never
// queues: a publish made while the bridge is disconnected fails at once.
func (c *Conn) Publish(ctx context.Context, topic string, payload []byte, retained bool) error {
	err := c.link.Publish(topic, payload, retained).Wait(ctx)
	if err != nil {
		c.publishes.With("error").Inc()
		return err
	}
	c.publishes.With("ok").Inc()
	return nil
}

// Snapshot returns the retained messages matching filters, by topic, read with the marker
// technique (docs/protocol.md section 10): subscribe to filters and to the bridge's marker topic,
// publish a fresh random value to the marker, and everything that arrived before it came back is
// the retained state. Reaching Options.Timeout (or ctx's end, or losing the connection) is an
// error, never a partial result. A live message to a topic already read replaces its value (an
// empty one removes it). Filters may overlap the uplink subscriptions (e.g. a node's acks): live
// uplink messages that arrive on the snapshot's subscription are still routed to Handler.
func (c *Conn) Snapshot(ctx context.Context, filters ...string) (map[string][]byte, error) {
	what := "snapshot of " + strings.Join(filters, ", ")
	if len(filters) == 0 {
		return nil, errors.New("snapshot: no topic filter")
	}
	c.snapMu.Lock()
	defer c.snapMu.Unlock()
	nonce := fmt.Sprintf("%d-%s", c.markerN.Add(1), randomHex(4))

	var (
		mu      sync.Mutex
		got     = map[string][]byte{}
		closed  bool // got was handed out: late messages must not touch it
		arrived = make(chan struct{})
		once    sync.Once
	)
	handle := func(m link.Message) { // on paho's goroutine: quick, never blocks
		if m.Topic == c.marker {
			if string(m.Payload) == nonce {
				once.Do(func() { close(arrived) })
			}
			return
		}
		if !m.Retained && c.isUplink(m.Topic) {
			// A live uplink message that the snapshot's subscription took from the normal path:
			// route it as that would have.
			select {
			case c.stray <- m:
			default:
				c.askResync()
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if closed {
			return
		}
		_, known := got[m.Topic]
		switch {
		case len(m.Payload) == 0:
			delete(got, m.Topic)
		case m.Retained || known:
			got[m.Topic] = m.Payload
		}
	}
	unsub, lost, err := c.link.Subscribe(append(append([]string(nil), filters...), c.marker), handle)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer func() {
		// Unsubscribed whatever happened, so the next snapshot gets the retained messages afresh.
		if err := unsub(); err != nil {
			c.o.Log.Debug("snapshot unsubscribe failed", "err", err)
		}
	}()
	if err := c.Publish(ctx, c.marker, []byte(nonce), false); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	t := time.NewTimer(c.o.Timeout)
	defer t.Stop()
	select {
	case <-arrived:
	case <-lost:
		return nil, fmt.Errorf("%s: the connection to the broker was lost", what)
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: %w", what, ctx.Err())
	case <-t.C:
		return nil, fmt.Errorf("%s: the marker on %s did not come back within %s (may this client read and write it? are the broker's queue limits large enough?)",
			what, c.marker, c.o.Timeout)
	}
	mu.Lock()
	defer mu.Unlock()
	closed = true
	return got, nil
}

// isUplink reports whether topic is one the uplink subscriptions match.
func (c *Conn) isUplink(topic string) bool {
	t, err := c.topics.Parse(topic)
	return err == nil && slices.Contains(uplink, t.Class)
}

// ReadPasswordFile reads an MQTT password file, refusing one that is not a regular file or that
// group or others may read or write. Errors name the file, never its content.
func ReadPasswordFile(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	}
	if m := st.Mode().Perm(); m&0o077 != 0 {
		return "", fmt.Errorf("%s has mode %#o: group and others must have no access to a password (chmod 600 %s)", path, m, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	pw := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if pw == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return pw, nil
}

// markerIdentity names the marker topic as sync/ctlclient does (broker.MarkerIdentity).
func markerIdentity(o Options, useTLS bool) (string, error) {
	var tc *tls.Config
	if useTLS && o.CertFile != "" && o.Username == "" {
		var err error
		if tc, err = broker.TLSConfig(o.CAFile, o.CertFile, o.KeyFile); err != nil {
			return "", err
		}
	}
	return broker.MarkerIdentity(o.Username, o.ClientID, tc, o.CertFile)
}

// clientIDPart keeps the characters of s that are safe in a client id everywhere, plus a dash.
func clientIDPart(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			b.WriteRune(r)
		}
		if b.Len() >= 40 {
			break
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return b.String() + "-"
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Requests is the connection seen as a request/reply channel for non-retained messages (logs,
// exec): exactly Publish and Subscribe, the method set that sync/logsclient and the exec client
// are written against, so they run over this connection and over mqlet ctl's alike.
type Requests struct{ c *Conn }

// Requests returns the connection's request/reply view.
func (c *Conn) Requests() Requests { return Requests{c} }

// Publish sends payload to topic, not retained, with QoS 1, and returns once the broker's PUBACK
// was seen (see Conn.Publish).
func (r Requests) Publish(ctx context.Context, topic string, payload []byte) error {
	return r.c.Publish(ctx, topic, payload, false)
}

// Subscribe subscribes to topic (a filter that must not overlap the uplink subscriptions: a
// reply topic, say) and calls h with the payload of each message, on paho's goroutine: h must
// not block. It returns once the broker granted the subscription; unsubscribe ends it (best
// effort: the connection's end ends it too).
func (r Requests) Subscribe(ctx context.Context, topic string, h func(payload []byte)) (unsubscribe func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", topic, err)
	}
	unsub, _, err := r.c.link.Subscribe([]string{topic}, func(m link.Message) { h(m.Payload) })
	if err != nil {
		return nil, err
	}
	return func() {
		if err := unsub(); err != nil {
			r.c.o.Log.Debug("unsubscribe failed", "topic", topic, "err", err)
		}
	}, nil
}
