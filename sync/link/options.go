package link

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// Options configure a Link. Zero durations and sizes take the defaults below.
type Options struct {
	// Broker is the broker's URL: tcp://, ssl://, tls://, ws:// or wss:// (mqtt:// means tcp://,
	// mqtts:// means ssl://). A tcp or ssl URL without a port gets 1883 or 8883.
	Broker string
	// CAFile, CertFile and KeyFile configure TLS for ssl, tls and wss brokers. With CAFile empty the
	// system roots verify the broker; CertFile and KeyFile (both or neither) are the client
	// certificate. They are read once, by New.
	CAFile, CertFile, KeyFile string
	Username, Password        string
	// ClientID is the MQTT client identifier: the node name.
	ClientID string
	// Keepalive is the MQTT keepalive (default 60s); ConnectTimeout bounds the dial, the TLS and
	// MQTT handshakes, a write to the socket and each wait for a SUBACK (default 10s).
	Keepalive      time.Duration
	ConnectTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the exponential back-off between connection attempts
	// (defaults 1s and 2m). The sleep is uniform in [0, min(max, min·2^attempt)) ("full jitter":
	// a fleet that lost its broker does not come back in lockstep). The attempt count resets after
	// a connection that stayed up for at least a minute.
	ReconnectMin, ReconnectMax time.Duration
	// Subscriptions are topic filters subscribed with QoS 1 on every connection, in paho's
	// OnConnect handler.
	Subscriptions []string
	// MaxPayload, when above 0, bounds what is read from the broker: a packet whose MQTT remaining
	// length is above InboundLimit(MaxPayload) (MaxPayload + PublishOverhead: a PUBLISH with that
	// payload and the longest topic) is never read into memory. The connection is dropped at the
	// packet's fixed header (a *TooLargeError, counted in Oversized) and Run reconnects. A payload
	// up to that bound is delivered: checking MaxPayload exactly stays the caller's job. 0 reads
	// whatever the broker sends, up to MQTT's 256 MiB, as paho does.
	MaxPayload int
	// InboxSize is the capacity of Inbox() (default 1024).
	InboxSize int
	// OnOverflow, when set, is called after the inbox overflowed (messages were dropped), from a
	// goroutine of Run, never from paho's: the caller can ask for a full resend (Resubscribe) once
	// it caught up. Overflows that happen while it runs are folded into one more call. It must
	// return promptly: Run waits for it before returning.
	OnOverflow func()

	// Liveness (optional; on when LivenessTopic is set, and then Online, Offline, IsStaleOffline
	// and NextSession are required).
	//
	// Each connection attempt takes a new session number from NextSession (persistent and
	// growing, so a Will left over from before a reboot is recognisably old). The Will (retained,
	// QoS 1, on LivenessTopic) is Offline(session); once connected Online(session) is published
	// retained on LivenessTopic, after the subscriptions. The link then subscribes to
	// LivenessTopic itself; of its messages only the connection's own Online is delivered to
	// Inbox (it arrives after every retained message of the connection's subscriptions, which
	// tells a reader they are all in). When a message there is a stale offline
	// (IsStaleOffline(payload, current) is true: an older session's Will delivered late, e.g.
	// when the broker noticed the previous connection's death after this one began; subscribed
	// after the Online, the link never sees the state from before it) it republishes
	// Online(current). Before
	// any clean disconnect (Run's stop included) it publishes Offline(session) retained and waits
	// up to 2s for its PUBACK, since a clean DISCONNECT suppresses the Will.
	//
	// Without liveness, sessions are numbered from 1 in memory and no Will is set.
	LivenessTopic  string
	Online         func(session int64) []byte
	Offline        func(session int64) []byte
	IsStaleOffline func(payload []byte, current int64) bool // called on paho's goroutine: must be quick and pure
	NextSession    func() (int64, error)

	Log *slog.Logger // default: discard
}

// Defaults for the zero values of Options.
const (
	DefaultKeepalive      = 60 * time.Second
	DefaultConnectTimeout = 10 * time.Second
	DefaultReconnectMin   = time.Second
	DefaultReconnectMax   = 2 * time.Minute
	DefaultInboxSize      = 1024
)

// withDefaults returns o with zero values replaced by the defaults.
func (o Options) withDefaults() Options {
	if o.Keepalive == 0 {
		o.Keepalive = DefaultKeepalive
	}
	if o.ConnectTimeout == 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.ReconnectMin == 0 {
		o.ReconnectMin = DefaultReconnectMin
	}
	if o.ReconnectMax == 0 {
		o.ReconnectMax = DefaultReconnectMax
	}
	if o.InboxSize == 0 {
		o.InboxSize = DefaultInboxSize
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o
}

// validFilter reports what is wrong with an MQTT topic filter, or nil.
func validFilter(f string) error {
	if f == "" {
		return errors.New("empty topic filter")
	}
	levels := strings.Split(f, "/")
	for i, l := range levels {
		if strings.Contains(l, "#") && (l != "#" || i != len(levels)-1) {
			return fmt.Errorf("topic filter %q: '#' must be a whole last level", f)
		}
		if strings.Contains(l, "+") && l != "+" {
			return fmt.Errorf("topic filter %q: '+' must be a whole level", f)
		}
	}
	return nil
}

// validate checks o (after withDefaults) and reports the first problem, naming the field.
func (o Options) validate() error {
	if o.ClientID == "" {
		return errors.New("client ID (the node name) is empty")
	}
	if o.Password != "" && o.Username == "" {
		return errors.New("a password without a username is not allowed by MQTT 3.1.1")
	}
	for name, d := range map[string]time.Duration{"keepalive": o.Keepalive, "connect timeout": o.ConnectTimeout,
		"reconnect min": o.ReconnectMin, "reconnect max": o.ReconnectMax} {
		if d < 0 {
			return fmt.Errorf("%s %s is negative", name, d)
		}
	}
	if o.Keepalive < time.Second {
		return fmt.Errorf("keepalive %s is under a second (MQTT counts it in whole seconds)", o.Keepalive)
	}
	if o.ReconnectMin > o.ReconnectMax {
		return fmt.Errorf("reconnect min %s is above reconnect max %s", o.ReconnectMin, o.ReconnectMax)
	}
	if o.MaxPayload < 0 {
		return fmt.Errorf("max payload %d is negative", o.MaxPayload)
	}
	if o.InboxSize < 0 {
		return fmt.Errorf("inbox size %d is negative", o.InboxSize)
	}
	seen := map[string]bool{}
	for _, f := range o.Subscriptions {
		if err := validFilter(f); err != nil {
			return fmt.Errorf("subscriptions: %w", err)
		}
		if seen[f] {
			return fmt.Errorf("subscriptions: %q is listed twice", f)
		}
		seen[f] = true
	}
	if o.LivenessTopic != "" {
		if strings.ContainsAny(o.LivenessTopic, "+#") {
			return fmt.Errorf("liveness topic %q: a topic name has no wildcards", o.LivenessTopic)
		}
		if o.Online == nil || o.Offline == nil || o.IsStaleOffline == nil || o.NextSession == nil {
			return fmt.Errorf("liveness topic %q needs Online, Offline, IsStaleOffline and NextSession", o.LivenessTopic)
		}
	}
	return nil
}
