package link

import (
	"fmt"
	"slices"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Subscribe subscribes filters on the current connection only, with h receiving the messages that
// match them instead of Inbox: for short reads such as a marker snapshot of retained state
// (docs/protocol.md, "Reading retained state"), made by a long-lived client that must not open a
// second connection (with use_username_as_clientid two connections of one identity disconnect
// each other). h runs on paho's goroutine, in arrival order, and must not block.
//
// A message that matches both these filters and Options.Subscriptions goes to h only (paho hands
// a message to the default handler only when no subscription of its own matches), so filters
// should not overlap the link's subscriptions.
//
// The subscription ends with the returned unsubscribe (bounded by ConnectTimeout) or with the
// connection; lost is closed when the connection it was made on is over, so a reader waiting for
// a message can stop waiting.
func (l *Link) Subscribe(filters []string, h func(Message)) (unsubscribe func() error, lost <-chan struct{}, err error) {
	if len(filters) == 0 {
		return nil, nil, fmt.Errorf("mqtt subscribe: no topic filter")
	}
	for _, f := range filters {
		if err := validFilter(f); err != nil {
			return nil, nil, fmt.Errorf("mqtt subscribe: %w", err)
		}
	}
	c := l.current()
	if c == nil {
		return nil, nil, fmt.Errorf("mqtt subscribe %q: %w", filters, ErrNotConnected)
	}
	subs := make(map[string]byte, len(filters))
	for _, f := range filters {
		subs[f] = 1
	}
	tok := c.client.SubscribeMultiple(subs, func(_ mqtt.Client, m mqtt.Message) {
		h(Message{Topic: m.Topic(), Payload: m.Payload(), Retained: m.Retained(), Duplicate: m.Duplicate(), Session: c.session})
	})
	err = c.await(tok)
	if err == nil {
		err = subackError(tok)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("mqtt subscribe %q: %w", filters, err)
	}
	filters = slices.Clone(filters)
	return func() error {
		if err := c.await(c.client.Unsubscribe(filters...)); err != nil {
			return fmt.Errorf("mqtt unsubscribe %q: %w", filters, err)
		}
		return nil
	}, c.lost, nil
}

// SubscribeInbox subscribes filters on the current connection, their messages going to Inbox like
// those of Options.Subscriptions, until UnsubscribeInbox or the end of the connection (a new
// connection starts with Options.Subscriptions only). Subscribing a filter that is already
// subscribed makes the broker send its retained messages again (MQTT 3.1.1, 3.8.4): that is how a
// node fetches one desired object it lacks without replaying the whole desired set.
func (l *Link) SubscribeInbox(filters []string) error {
	if len(filters) == 0 {
		return nil
	}
	for _, f := range filters {
		if err := validFilter(f); err != nil {
			return fmt.Errorf("mqtt subscribe: %w", err)
		}
	}
	c := l.current()
	if c == nil {
		return fmt.Errorf("mqtt subscribe %d filters (first %q): %w", len(filters), filters[0], ErrNotConnected)
	}
	subs := make(map[string]byte, len(filters))
	for _, f := range filters {
		subs[f] = 1
	}
	tok := c.client.SubscribeMultiple(subs, nil) // nil: the link's default handler, i.e. Inbox
	err := c.await(tok)
	if err == nil {
		err = subackError(tok)
	}
	if err != nil {
		return fmt.Errorf("mqtt subscribe %d filters (first %q): %w", len(filters), filters[0], err)
	}
	return nil
}

// UnsubscribeSession is UnsubscribeInbox on connection session only: nothing when another
// connection (which subscribed again) is current.
func (l *Link) UnsubscribeSession(session int64, filters []string) error {
	c := l.current()
	if c == nil || c.session != session || len(filters) == 0 {
		return nil
	}
	return c.unsubscribe(filters)
}

// UnsubscribeInbox ends subscriptions made with SubscribeInbox on the current connection.
func (l *Link) UnsubscribeInbox(filters []string) error {
	if len(filters) == 0 {
		return nil
	}
	c := l.current()
	if c == nil {
		return fmt.Errorf("mqtt unsubscribe %d filters (first %q): %w", len(filters), filters[0], ErrNotConnected)
	}
	return c.unsubscribe(filters)
}

func (c *conn) unsubscribe(filters []string) error {
	if err := c.await(c.client.Unsubscribe(filters...)); err != nil {
		return fmt.Errorf("mqtt unsubscribe %d filters (first %q): %w", len(filters), filters[0], err)
	}
	return nil
}
