package link

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mqlet/mqlet/sync/broker"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

const (
	// stableAfter is how long a connection must have stayed up for the back-off to start over.
	stableAfter = time.Minute
	// offlineAckTimeout bounds the wait for the PUBACK of Offline(session) before a clean
	// DISCONNECT (which suppresses the Will, so the Offline must have reached the broker).
	offlineAckTimeout = 2 * time.Second
	// quiesce is what paho's Disconnect may take to write the DISCONNECT packet.
	quiesce = 250 * time.Millisecond
	// pahoStopTimeout bounds the wait for paho's goroutines after Disconnect closed the socket.
	pahoStopTimeout = 5 * time.Second
)

// Message is one PUBLISH received on a subscription.
type Message struct {
	Topic     string
	Payload   []byte
	Retained  bool
	Duplicate bool
	Session   int64 // the session of the connection it arrived on
}

// Link is one MQTT connection, kept up by Run. Its methods are safe for concurrent use.
type Link struct {
	o      Options
	broker string      // normalised URL, as paho dials it
	tls    *tls.Config // nil for tcp and ws
	subs   map[string]bool

	inbox    chan Message
	dropped  atomic.Uint64
	overflow chan struct{} // 1-buffered: an overflow OnOverflow has not heard of yet

	inboundLimit int           // InboundLimit(o.MaxPayload); 0: no guard on the connection
	oversized    atomic.Uint64 // connections dropped at an oversized (or malformed) packet header

	running     atomic.Bool
	lastSession int64 // only touched by Run's goroutine

	mu      sync.Mutex
	cur     *conn         // the connection Publish uses; nil when there is none
	changed chan struct{} // closed and replaced whenever cur changes
}

// New checks o, reads the TLS files and returns a Link that is not connected yet (see Run).
func New(o Options) (*Link, error) {
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("mqtt link: %w", err)
	}
	u, err := broker.Parse(o.Broker)
	if err != nil {
		return nil, fmt.Errorf("mqtt link: broker URL %q: %w", broker.Shown(o.Broker), err)
	}
	l := &Link{
		broker:   u.Dial,
		subs:     map[string]bool{},
		inbox:    make(chan Message, o.InboxSize),
		overflow: make(chan struct{}, 1),
		changed:  make(chan struct{}),
	}
	switch {
	case u.TLS:
		if l.tls, err = broker.TLSConfig(o.CAFile, o.CertFile, o.KeyFile); err != nil {
			return nil, fmt.Errorf("mqtt link %s: %w", u.Dial, err)
		}
	case o.CAFile != "" || o.CertFile != "" || o.KeyFile != "":
		return nil, fmt.Errorf("mqtt link %s: TLS files are set but the broker URL's scheme is not ssl, tls, mqtts or wss", u.Dial)
	}
	o.Subscriptions = slices.Clone(o.Subscriptions)
	for _, f := range o.Subscriptions {
		l.subs[f] = true
	}
	l.inboundLimit = InboundLimit(o.MaxPayload)
	l.o = o
	return l, nil
}

// Oversized is the number of connections dropped because the broker sent a packet over the
// inbound limit (Options.MaxPayload) or with a malformed length.
func (l *Link) Oversized() uint64 { return l.oversized.Load() }

// Inbox delivers the messages received on the subscriptions. It is never closed. paho's handler
// never waits for it: when it is full a message is dropped, counted in Dropped and OnOverflow is
// told. Messages arrive in the broker's order: the handler only does a non-blocking send, so
// paho can run it on its router goroutine (OrderMatters on) without any risk of stalling it, and
// an index published after its objects is then seen after them.
func (l *Link) Inbox() <-chan Message { return l.inbox }

// Dropped is the number of messages dropped because the inbox was full.
func (l *Link) Dropped() uint64 { return l.dropped.Load() }

// Connected returns the current connection's session and a channel closed when that connection
// is lost, or ok false when there is none.
func (l *Link) Connected() (session int64, lost <-chan struct{}, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.live(); c != nil {
		return c.session, c.lost, true
	}
	return 0, nil, false
}

// WaitConnected waits until the link is connected (see Connected) or ctx ends.
func (l *Link) WaitConnected(ctx context.Context) (session int64, lost <-chan struct{}, err error) {
	for {
		l.mu.Lock()
		c, changed := l.live(), l.changed
		l.mu.Unlock()
		if c != nil {
			return c.session, c.lost, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return 0, nil, fmt.Errorf("mqtt %s: waiting for a connection: %w", l.broker, context.Cause(ctx))
		}
	}
}

// live returns the current connection unless it is over. l.mu must be held.
func (l *Link) live() *conn {
	if l.cur == nil {
		return nil
	}
	select {
	case <-l.cur.lost:
		return nil
	default:
		return l.cur
	}
}

func (l *Link) current() *conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.live()
}

func (l *Link) setCurrent(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cur = c
	close(l.changed)
	l.changed = make(chan struct{})
}

// Publish sends payload to topic with QoS 1. It never queues: without a connection the receipt
// has failed with ErrNotConnected already. The receipt completes with nil only once the broker's
// PUBACK for this very publish was seen. It may block while paho's writer is stuck, at most
// ConnectTimeout (paho's write timeout).
func (l *Link) Publish(topic string, payload []byte, retained bool) *Receipt {
	if topic == "" || strings.ContainsAny(topic, "+#") {
		return failed(topic, fmt.Errorf("topic name %q is empty or has wildcards", topic))
	}
	c := l.current()
	if c == nil {
		return failed(topic, ErrNotConnected)
	}
	return c.publish(topic, payload, retained)
}

// Resubscribe unsubscribes filter and subscribes it again, so the broker resends every retained
// message under it: a full resend of desired state, e.g. after an inbox overflow. filter must be
// one of Options.Subscriptions. Non-retained messages published between the UNSUBACK and the
// SUBACK are missed (desired state is retained, so it is not). If either half fails the
// connection is dropped, so that the next one subscribes afresh rather than this one carrying on
// without the subscription.
func (l *Link) Resubscribe(filter string) error {
	if !l.subs[filter] {
		return fmt.Errorf("mqtt resubscribe %q: not one of the link's subscriptions %q", filter, l.o.Subscriptions)
	}
	c := l.current()
	if c == nil {
		return fmt.Errorf("mqtt resubscribe %q: %w", filter, ErrNotConnected)
	}
	if err := c.await(c.client.Unsubscribe(filter)); err != nil {
		err = fmt.Errorf("mqtt unsubscribe %q: %w", filter, err)
		c.abandon(err) // the subscription's state at the broker is unknown
		return err
	}
	tok := c.client.Subscribe(filter, 1, nil)
	err := c.await(tok)
	if err == nil {
		err = subackError(tok)
	}
	if err != nil {
		err = fmt.Errorf("mqtt subscribe %q: %w", filter, err)
		c.abandon(err)
		return err
	}
	return nil
}

// Run keeps the link connected until ctx ends, then publishes Offline (with liveness),
// disconnects and returns nil once every goroutine it started has ended and paho reported its
// own as stopped (Store.Close or OnConnectionLost; paho's last goroutines are then past their
// final action). Connection failures are logged and retried with back-off; Run only returns an
// error when it is already running.
func (l *Link) Run(ctx context.Context) error {
	if !l.running.CompareAndSwap(false, true) {
		return fmt.Errorf("mqtt link %s: Run is already running", l.broker)
	}
	defer l.running.Store(false)

	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() { l.reportOverflows(stop) })
	defer func() {
		close(stop)
		wg.Wait()
	}()

	b := newBackoff(l.o.ReconnectMin, l.o.ReconnectMax, rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())))
	for {
		up, err := l.connection(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if up >= stableAfter {
			b.reset()
		}
		delay := b.next()
		l.o.Log.Warn("mqtt link down; retrying", "broker", l.broker, "client_id", l.o.ClientID,
			"up", up.Round(time.Millisecond), "err", err, "retry_in", delay.Round(time.Millisecond))
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// reportOverflows calls OnOverflow for each overflow signal, off paho's goroutines.
func (l *Link) reportOverflows(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-l.overflow:
			if l.o.OnOverflow != nil {
				l.o.OnOverflow()
			}
		}
	}
}

func (l *Link) nextSession() (int64, error) {
	if l.o.NextSession == nil {
		l.lastSession++
		return l.lastSession, nil
	}
	s, err := l.o.NextSession()
	if err != nil {
		return 0, fmt.Errorf("next session number: %w", err)
	}
	if s <= l.lastSession {
		return 0, fmt.Errorf("next session number %d does not grow (the last was %d)", s, l.lastSession)
	}
	l.lastSession = s
	return s, nil
}

// connection makes one connection attempt and serves the connection until it is lost or ctx
// ends. It returns how long the connection was up (0 if it never was) and why it ended.
func (l *Link) connection(ctx context.Context) (up time.Duration, err error) {
	session, err := l.nextSession()
	if err != nil {
		return 0, err
	}
	c := l.newConn(session)
	c.client = mqtt.NewClient(l.clientOptions(c))

	// paho cannot abort a Connect (Disconnect waits for it), so the wait ignores ctx. The dial
	// and the handshake are each bounded by ConnectTimeout; the guard only protects from a paho
	// that would not keep to that.
	tok := c.client.Connect()
	guard := time.NewTimer(2*l.o.ConnectTimeout + 5*time.Second)
	defer guard.Stop()
	select {
	case <-tok.Done():
	case <-guard.C:
		c.client.Disconnect(0)
		return 0, fmt.Errorf("mqtt connect %s: no result from paho after %s", l.broker, 2*l.o.ConnectTimeout+5*time.Second)
	}
	if err := tok.Error(); err != nil {
		return 0, fmt.Errorf("mqtt connect %s: %w", l.broker, err)
	}

	// The OnConnect handler subscribes; then Online(session) is published and acknowledged before
	// the connection is offered to publishers.
	select {
	case err = <-c.subscribed:
	case <-c.lost:
		err = c.lostErr
	case <-ctx.Done():
	}
	if err == nil && ctx.Err() == nil && l.o.LivenessTopic != "" {
		err = c.publishWait(ctx, c.online(), l.o.ConnectTimeout)
		if err == nil {
			// Subscribed only now: what the broker retains there is this Online, or an
			// offline published after it (a late Will), never the previous session's state.
			err = c.subscribeLiveness()
		}
	}
	if err != nil || ctx.Err() != nil {
		c.close()
		return 0, err
	}

	start := time.Now()
	l.o.Log.Info("mqtt connected", "broker", l.broker, "client_id", l.o.ClientID, "session", session)
	l.setCurrent(c)
	var wg sync.WaitGroup
	if l.o.LivenessTopic != "" {
		wg.Go(c.keepOnline)
	}
	select {
	case <-ctx.Done():
		c.end(errors.New("link stopped"))
	case <-c.lost:
	}
	l.setCurrent(nil)
	wg.Wait()
	c.close()
	return time.Since(start), c.lostErr
}

func (l *Link) clientOptions(c *conn) *mqtt.ClientOptions {
	o := mqtt.NewClientOptions().
		AddBroker(l.broker).
		SetClientID(l.o.ClientID).
		SetProtocolVersion(4). // explicit: paho would otherwise retry a refused CONNECT as MQTT 3.1
		SetCleanSession(true).
		SetResumeSubs(false).
		SetAutoReconnect(false). // Run reconnects, with a new client (and Will) per attempt
		SetConnectRetry(false).
		SetOrderMatters(true). // the handler never blocks (a select with default), so order is free
		SetKeepAlive(l.o.Keepalive).
		SetPingTimeout(min(10*time.Second, l.o.Keepalive)).
		// No TCP keepalive probes: the MQTT keepalive (a PINGREQ after Keepalive of silence, the
		// link dropped when the PINGRESP is late) already finds a dead link, and Go's dialer would
		// otherwise probe every 15 s of idleness, which more than tripled an idle node's traffic
		// (measured by `make bench`: 31 KB/hour instead of 9). docs/protocol.md: an idle node sends
		// nothing but keepalive pings. Set before SetConnectTimeout, which sets the dial timeout
		// on this dialer. (ws and wss dial through gorilla/websocket's own dialer, which paho
		// does not let us configure: those links keep Go's default probes.)
		SetDialer(&net.Dialer{KeepAlive: -1}).
		SetConnectTimeout(l.o.ConnectTimeout).
		SetWriteTimeout(l.o.ConnectTimeout). // a socket that takes no data for this long is dead
		SetStore(c.store).
		SetDefaultPublishHandler(c.onMessage).
		SetOnConnectHandler(c.onConnect).
		SetConnectionLostHandler(c.onLost)
	if l.o.Username != "" {
		o.SetUsername(l.o.Username).SetPassword(l.o.Password)
	}
	if l.tls != nil {
		o.SetTLSConfig(l.tls)
	}
	if l.inboundLimit > 0 {
		o.SetCustomOpenConnectionFn(c.openConnection)
	}
	if l.o.LivenessTopic != "" {
		o.SetBinaryWill(l.o.LivenessTopic, l.o.Offline(c.session), 1, true)
	}
	return o
}

// conn is one paho client, i.e. one connection attempt and, if it succeeds, one connection.
type conn struct {
	l       *Link
	session int64
	client  mqtt.Client
	store   *store

	subscribed  chan error    // 1-buffered: the OnConnect handler's result
	handlerDone chan struct{} // closed when the OnConnect handler returned
	stale       chan struct{} // 1-buffered: a stale offline was seen on LivenessTopic
	// The latest Online payload published on this connection.
	ownOnline atomic.Pointer[[]byte]

	lost     chan struct{} // closed when the connection is over (lost, abandoned or stopped)
	lostOnce sync.Once
	lostErr  error // why; written before lost is closed

	pahoDone chan struct{} // closed when paho's comms goroutines have stopped
	pahoOnce sync.Once

	refused atomic.Pointer[error] // why the inbound guard dropped the connection, if it did
}

func (l *Link) newConn(session int64) *conn {
	c := &conn{
		l:           l,
		session:     session,
		subscribed:  make(chan error, 1),
		handlerDone: make(chan struct{}),
		stale:       make(chan struct{}, 1),
		lost:        make(chan struct{}),
		pahoDone:    make(chan struct{}),
	}
	c.store = newStore(c.pahoStopped)
	return c
}

func (c *conn) end(err error) {
	c.lostOnce.Do(func() {
		c.lostErr = err
		close(c.lost)
	})
}

func (c *conn) pahoStopped() { c.pahoOnce.Do(func() { close(c.pahoDone) }) }

// abandon ends a connection that is still up but in an unknown state; Run closes it and
// reconnects.
func (c *conn) abandon(err error) {
	c.l.o.Log.Warn("mqtt connection abandoned", "broker", c.l.broker, "session", c.session, "err", err)
	c.end(err)
}

// refusedPacket is the inbound guard's report (from paho's reader goroutine): the connection is
// closed already; paho reports the loss next.
func (c *conn) refusedPacket(err error) {
	if c.refused.CompareAndSwap(nil, &err) {
		c.l.oversized.Add(1)
		c.l.o.Log.Warn("mqtt inbound packet refused; dropping the connection", "broker", c.l.broker,
			"session", c.session, "err", err)
	}
}

// onLost is paho's OnConnectionLost handler. paho calls it once its comms goroutines stopped.
func (c *conn) onLost(_ mqtt.Client, err error) {
	if r := c.refused.Load(); r != nil && !errors.Is(err, *r) {
		err = *r // the guard's reason, not a write error on the socket it closed
	}
	c.store.fail(ErrConnectionLost)
	c.pahoStopped() // before end: whoever wakes on lost must see that paho has stopped
	c.end(fmt.Errorf("mqtt connection to %s lost: %w", c.l.broker, err))
}

// onMessage is paho's default publish handler: it never blocks.
func (c *conn) onMessage(_ mqtt.Client, m mqtt.Message) {
	l := c.l
	if l.o.LivenessTopic != "" && m.Topic() == l.o.LivenessTopic {
		p := c.ownOnline.Load()
		if p == nil || !bytes.Equal(m.Payload(), *p) {
			// The subscription was made after this connection's Online: an older session's
			// offline here was published after it (a late Will).
			if l.o.IsStaleOffline(m.Payload(), c.session) {
				select {
				case c.stale <- struct{}{}:
				default: // a republish is already due
				}
			}
			return
		}
		// This connection's own Online (retained, on subscribing, or an echo of a republish)
		// goes to the inbox too: it came after every retained message of the subscriptions
		// made before it, which tells the reader that they are all in (see
		// Options.LivenessTopic).
	}
	msg := Message{Topic: m.Topic(), Payload: m.Payload(), Retained: m.Retained(), Duplicate: m.Duplicate(), Session: c.session}
	select {
	case l.inbox <- msg:
	default:
		l.dropped.Add(1)
		select {
		case l.overflow <- struct{}{}:
		default: // OnOverflow will be called anyway
		}
	}
}

// onConnect is paho's OnConnect handler, run on its own goroutine once per client: the one
// place where subscriptions survive any reconnect, since each connection has its own client.
func (c *conn) onConnect(cl mqtt.Client) {
	defer close(c.handlerDone)
	c.subscribed <- c.subscribeAll(cl)
}

// subscribeLiveness subscribes to the liveness topic, after Online was published.
func (c *conn) subscribeLiveness() error {
	topic := c.l.o.LivenessTopic
	tok := c.client.Subscribe(topic, 1, nil)
	err := c.await(tok)
	if err == nil {
		err = subackError(tok)
	}
	if err != nil {
		return fmt.Errorf("mqtt subscribe %q: %w", topic, err)
	}
	return nil
}

func (c *conn) subscribeAll(cl mqtt.Client) error {
	filters := map[string]byte{}
	for _, f := range c.l.o.Subscriptions {
		filters[f] = 1
	}
	if len(filters) == 0 {
		return nil
	}
	tok := cl.SubscribeMultiple(filters, nil)
	err := c.await(tok)
	if err == nil {
		err = subackError(tok)
	}
	if err != nil {
		names := make([]string, 0, len(filters))
		for f := range filters {
			names = append(names, f)
		}
		sort.Strings(names)
		return fmt.Errorf("mqtt subscribe %q: %w", names, err)
	}
	return nil
}

// await waits, at most ConnectTimeout, for a SUBSCRIBE or UNSUBSCRIBE token.
func (c *conn) await(tok mqtt.Token) error {
	t := time.NewTimer(c.l.o.ConnectTimeout)
	defer t.Stop()
	select {
	case <-tok.Done():
		return tok.Error()
	case <-c.lost:
		return c.lostErr
	case <-t.C:
		return fmt.Errorf("no acknowledgement within %s", c.l.o.ConnectTimeout)
	}
}

// subackError reports the filters a SUBACK refused (return code 0x80, e.g. an ACL's denial).
func subackError(tok mqtt.Token) error {
	st, ok := tok.(*mqtt.SubscribeToken)
	if !ok {
		return nil
	}
	var refused []string
	for f, code := range st.Result() {
		if code == 0x80 {
			refused = append(refused, f)
		}
	}
	if len(refused) == 0 {
		return nil
	}
	sort.Strings(refused)
	return fmt.Errorf("broker refused %q", refused)
}

// publish sends a QoS 1 PUBLISH on this connection; see the package comment for how the
// receipt is tied to the PUBACK.
func (c *conn) publish(topic string, payload []byte, retained bool) *Receipt {
	r := newReceipt(topic)
	buf := make([]byte, len(payload), max(len(payload), 1)) // our own copy, and an address even when empty
	copy(buf, payload)
	if !c.store.expect(buf, r) {
		return r
	}
	tok := c.client.Publish(topic, 1, retained, buf)
	if c.store.unclaimed(buf) {
		r.complete(refusal(tok))
		return r
	}
	select {
	case <-tok.Done():
		// Stored but not handed to the writer ("publish was broken by timeout"): no PUBACK can
		// come for it.
		if err := tok.Error(); err != nil {
			r.complete(err)
		}
	default:
	}
	return r
}

// refusal says why paho refused a publish before storing it.
func refusal(tok mqtt.Token) error {
	select {
	case <-tok.Done():
		if err := tok.Error(); err != nil && !errors.Is(err, mqtt.ErrNotConnected) {
			return err
		}
	default:
	}
	return ErrNotConnected
}

// publishWait publishes payload retained on the liveness topic and waits for its PUBACK, at most
// timeout.
func (c *conn) publishWait(ctx context.Context, payload []byte, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return c.publish(c.l.o.LivenessTopic, payload, true).Wait(ctx)
}

// online makes the Online payload to publish next on this connection and remembers it.
func (c *conn) online() []byte {
	p := c.l.o.Online(c.session)
	c.ownOnline.Store(&p)
	return p
}

// keepOnline republishes Online(session) whenever a stale offline shows up on the liveness topic,
// until the connection is over.
func (c *conn) keepOnline() {
	for {
		select {
		case <-c.lost:
			return
		case <-c.stale:
		}
		c.l.o.Log.Info("stale offline on the liveness topic; publishing online again",
			"topic", c.l.o.LivenessTopic, "session", c.session)
		r := c.publish(c.l.o.LivenessTopic, c.online(), true)
		select {
		case <-r.Done():
			if err := r.Err(); err != nil {
				c.l.o.Log.Warn("republishing online failed", "err", err)
			}
		case <-c.lost:
			return
		}
	}
}

// close ends a connection that got past CONNACK: Offline(session) first when the socket is still
// up (a clean DISCONNECT suppresses the Will), then DISCONNECT, then it waits (bounded) for paho's
// goroutines and the OnConnect handler to end.
func (c *conn) close() {
	l := c.l
	select {
	case <-c.pahoDone: // lost: paho has stopped already
	default:
		if l.o.LivenessTopic != "" {
			ctx, cancel := context.WithTimeout(context.Background(), offlineAckTimeout)
			r := c.publish(l.o.LivenessTopic, l.o.Offline(c.session), true)
			select {
			case <-r.Done():
			case <-ctx.Done():
			}
			cancel()
			if err := r.Err(); err != nil {
				l.o.Log.Warn("offline message not acknowledged before disconnecting", "err", err)
			}
		}
		c.client.Disconnect(uint(quiesce / time.Millisecond))
		t := time.NewTimer(pahoStopTimeout)
		select {
		case <-c.pahoDone:
		case <-t.C:
			l.o.Log.Error("paho did not stop after Disconnect", "broker", l.broker, "wait", pahoStopTimeout)
		}
		t.Stop()
	}
	c.end(errors.New("disconnected"))
	t := time.NewTimer(l.o.ConnectTimeout + time.Second)
	select {
	case <-c.handlerDone:
	case <-t.C:
		l.o.Log.Error("paho's OnConnect handler did not return", "broker", l.broker)
	}
	t.Stop()
}
