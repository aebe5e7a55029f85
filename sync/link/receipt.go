package link

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/eclipse/paho.mqtt.golang/packets"
)

var (
	// ErrNotConnected: the link had no connection when the publish (or resubscribe) was asked for.
	ErrNotConnected = errors.New("not connected")
	// ErrConnectionLost: the connection ended before the broker's PUBACK was seen; the broker may
	// or may not have the message.
	ErrConnectionLost = errors.New("connection lost before PUBACK")
	// ErrPending is what Receipt.Err says while the PUBACK is still awaited.
	ErrPending = errors.New("PUBACK not yet received")
)

// Receipt tracks one QoS 1 publish until the broker's PUBACK for it, or until it failed.
type Receipt struct {
	topic string
	done  chan struct{}
	once  sync.Once
	err   error // written once, before done is closed
}

func newReceipt(topic string) *Receipt {
	return &Receipt{topic: topic, done: make(chan struct{})}
}

// failed returns a receipt that already failed with err.
func failed(topic string, err error) *Receipt {
	r := newReceipt(topic)
	r.complete(err)
	return r
}

// complete settles the receipt; the first call wins. A non-nil err is wrapped to name the topic.
func (r *Receipt) complete(err error) {
	r.once.Do(func() {
		if err != nil {
			err = fmt.Errorf("mqtt publish %s: %w", r.topic, err)
		}
		r.err = err
		close(r.done)
	})
}

// Done is closed once the receipt is settled (acknowledged or failed).
func (r *Receipt) Done() <-chan struct{} { return r.done }

// Err is nil only when the broker's PUBACK for this publish was seen. Before Done it is
// ErrPending; after a failure it wraps ErrNotConnected, ErrConnectionLost or paho's error.
func (r *Receipt) Err() error {
	select {
	case <-r.done:
		return r.err
	default:
		return ErrPending
	}
}

// Wait blocks until the receipt is settled or ctx ends, and returns Err (or ctx's error).
func (r *Receipt) Wait(ctx context.Context) error {
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return fmt.Errorf("mqtt publish %s: waiting for PUBACK: %w", r.topic, context.Cause(ctx))
	}
}

// store is the paho Store of one client (one connection attempt). It keeps no packets: it only
// ties each outbound QoS 1 PUBLISH to its Receipt, from Put (when paho is about to send it) to
// Del (when paho handles its PUBACK). See the package comment for when paho calls what.
type store struct {
	mu       sync.Mutex
	closed   bool
	pending  map[*byte]*Receipt  // registered by expect, before paho's Publish; claimed by Put
	inflight map[uint16]*Receipt // by message id, from Put to Del
	onClose  func()              // called (once per Close) after every receipt failed
}

func newStore(onClose func()) *store {
	return &store{pending: map[*byte]*Receipt{}, inflight: map[uint16]*Receipt{}, onClose: onClose}
}

// payloadKey identifies a publish by its payload's backing array: the buffer the link allocated
// for it, which paho puts in the packet uncopied. Buffers have capacity >= 1, so even an empty
// payload has an address.
func payloadKey(b []byte) *byte {
	if cap(b) == 0 {
		return nil
	}
	return &b[:1][0]
}

// expect registers r for the publish whose payload buffer is buf. It fails r and returns false
// when the connection is already over.
func (s *store) expect(buf []byte, r *Receipt) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		r.complete(ErrConnectionLost)
		return false
	}
	s.pending[payloadKey(buf)] = r
	return true
}

// unclaimed is called after paho's Publish returned, and forgets the registration of buf. It
// reports whether Put never claimed it: paho refused the publish before storing it (not
// connected, no free message id), so no PUBACK can come.
func (s *store) unclaimed(buf []byte) bool {
	key := payloadKey(buf)
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.pending[key]
	delete(s.pending, key)
	return ok
}

// fail settles every receipt still awaiting a PUBACK with err and refuses new ones.
func (s *store) fail(err error) {
	s.mu.Lock()
	s.closed = true
	var rs []*Receipt
	for k, r := range s.pending {
		rs = append(rs, r)
		delete(s.pending, k)
	}
	for k, r := range s.inflight {
		rs = append(rs, r)
		delete(s.inflight, k)
	}
	s.mu.Unlock()
	for _, r := range rs {
		r.complete(err)
	}
}

// Open is called by Connect; the store is usable from creation.
func (s *store) Open() {}

// Put is called by Publish with the outbound PUBLISH before it is handed to the writer.
func (s *store) Put(key string, m packets.ControlPacket) {
	if !strings.HasPrefix(key, "o.") {
		return // inbound QoS 1 publish awaiting our PUBACK: nothing to track
	}
	p, ok := m.(*packets.PublishPacket)
	if !ok {
		return
	}
	k := payloadKey(p.Payload)
	s.mu.Lock()
	r, ok := s.pending[k]
	if !ok {
		s.mu.Unlock()
		return
	}
	delete(s.pending, k)
	if s.closed { // fail took it already; cannot happen since fail empties pending, kept for safety
		s.mu.Unlock()
		r.complete(ErrConnectionLost)
		return
	}
	s.inflight[p.MessageID] = r
	s.mu.Unlock()
}

// Del is called when the PUBACK (or SUBACK, UNSUBACK) for "o.<id>" arrived.
func (s *store) Del(key string) {
	if !strings.HasPrefix(key, "o.") {
		return
	}
	id, err := strconv.ParseUint(key[2:], 10, 16)
	if err != nil {
		return
	}
	s.mu.Lock()
	r := s.inflight[uint16(id)]
	delete(s.inflight, uint16(id))
	s.mu.Unlock()
	if r != nil {
		r.complete(nil)
	}
}

// Get and All serve paho's resume, which never runs with CleanSession and no ConnectRetry.
func (s *store) Get(string) packets.ControlPacket { return nil }
func (s *store) All() []string                    { return nil }

// Reset is called with CleanSession after the connection is up, concurrently with the OnConnect
// handler: failing receipts here could fail a publish that is then acknowledged. Each client is
// new, so there is nothing to forget.
func (s *store) Reset() {}

// Close is called when Connect failed and by Disconnect once paho's comms goroutines stopped.
func (s *store) Close() {
	s.fail(ErrConnectionLost)
	s.onClose()
}
