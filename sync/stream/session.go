// Package stream carries interactive exec sessions over MQTT (docs/protocol.md §9a): the node's
// side (Server) runs the command and the client's side (Exec) is what `mqlet ctl exec` and the
// bridge call.
//
// A session is opened by a signed ExecRequest that carries the client's ephemeral X25519 key;
// the node agrees a secret with its sealing key, and both derive one AES-256-GCM key per
// direction (HKDF-SHA256 over the secret, salted with the session id, bound to both public keys).
// Every later frame is sealed with its direction's key and a sequence number as nonce, so the
// broker sees neither stdin nor output, and cannot reorder, replay into or alter a session: a frame
// that does not open, or skips a number, ends the session. A lower number (an MQTT QoS 1
// redelivery, or a replay) was already applied and is dropped.
//
// Flow control is by credit: each side may have at most the window the other granted in flight,
// and grants more as it consumes, so neither buffers more than its window whatever the other does.
package stream

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mqlet/mqlet/sync/protocol"
)

// Transport is how the client side reaches the broker: publish at QoS 1, not retained (returns
// when the broker took it), and subscribe with a handler that must not block. The bridge's MQTT
// connection and ctlclient.Client implement it.
type Transport interface {
	Publish(ctx context.Context, topic string, payload []byte) error
	Subscribe(ctx context.Context, topic string, h func(payload []byte)) (unsubscribe func(), err error)
}

// Frame kinds, the first byte of a frame's plaintext.
const (
	// client -> node
	kindStdin    = 'i'
	kindStdinEOF = 'I'
	kindResize   = 'r' // width, height: uint16 each, big endian
	kindLease    = 'l' // renews the session's lease; carries nothing
	kindCancel   = 'q'
	// node -> client
	kindAccepted = 'a' // the session runs; payload: the stdin window (uint32)
	kindStdout   = 'o'
	kindStderr   = 'e'
	kindAlive    = 'k' // answers a lease: the node still holds the session; carries nothing
	kindExit     = 'x' // last: the exit code (int32)
	kindError    = 'E' // last: the session failed; payload is why
	// both ways
	kindCredit = 'c' // the sender may send this many more data bytes (uint32)
)

// maxData is the most data bytes in one frame.
const maxData = 32 << 10

// direction bytes in the nonce: the two directions have keys of their own already, this only
// keeps a nonce from ever being the same bytes under both.
const (
	dirToNode   = 1
	dirToClient = 2
)

const sessionInfo = "mqlet.io/v2 exec session\n"

// sessionKeys derives the two directions' AEADs of session id from the agreed secret, both public
// keys and the node's nonce (fresh for every session it opens, so the same open replayed, after an
// agent restart forgot its id, gets other keys).
func sessionKeys(shared []byte, id string, clientPub, nodePub *ecdh.PublicKey, nodeNonce []byte) (toNode, toClient cipher.AEAD, err error) {
	info := sessionInfo + string(clientPub.Bytes()) + string(nodePub.Bytes()) + string(nodeNonce)
	k, err := hkdf.Key(sha256.New, shared, []byte(id), info, 64)
	if err != nil {
		return nil, nil, fmt.Errorf("exec session %s: derive keys: %w", id, err)
	}
	mk := func(key []byte) (cipher.AEAD, error) {
		b, err := aes.NewCipher(key)
		if err != nil {
			return nil, err
		}
		return cipher.NewGCM(b)
	}
	if toNode, err = mk(k[:32]); err != nil {
		return nil, nil, err
	}
	if toClient, err = mk(k[32:]); err != nil {
		return nil, nil, err
	}
	return toNode, toClient, nil
}

func nonce(dir byte, seq uint64) []byte {
	n := make([]byte, 12)
	n[0] = dir
	binary.BigEndian.PutUint64(n[4:], seq)
	return n
}

// sealer seals one direction's frames in order. Not safe for concurrent use: callers serialise.
// first, when set, goes in clear on frame 0 (the node's nonce).
type sealer struct {
	aead  cipher.AEAD
	id    string
	dir   byte
	seq   uint64
	first []byte
}

func (s *sealer) seal(kind byte, payload []byte) ([]byte, error) {
	pt := append([]byte{kind}, payload...)
	f := protocol.ExecSealed{ID: s.id, Op: protocol.ExecFrame, Seq: s.seq,
		Box: s.aead.Seal(nil, nonce(s.dir, s.seq), pt, []byte(s.id))}
	if s.seq == 0 {
		f.Nonce = s.first
	}
	s.seq++
	return protocol.Encode(&f)
}

// opener opens one direction's frames and checks their order.
type opener struct {
	aead cipher.AEAD
	id   string
	dir  byte
	next uint64
}

var errDuplicate = errors.New("duplicate frame")

// open returns the frame's kind and payload; errDuplicate for a number already opened (drop it);
// any other error ends the session.
func (o *opener) open(f *protocol.ExecSealed) (byte, []byte, error) {
	switch {
	case f.ID != o.id:
		return 0, nil, fmt.Errorf("exec session %s: a frame for session %q", o.id, f.ID)
	case f.Seq < o.next:
		return 0, nil, errDuplicate
	case f.Seq > o.next:
		return 0, nil, fmt.Errorf("exec session %s: frame %d arrived where %d was due (lost or reordered)", o.id, f.Seq, o.next)
	}
	pt, err := o.aead.Open(nil, nonce(o.dir, f.Seq), f.Box, []byte(o.id))
	if err != nil || len(pt) == 0 {
		return 0, nil, fmt.Errorf("exec session %s: frame %d does not open (altered, or not from the session's peer)", o.id, f.Seq)
	}
	o.next++
	return pt[0], pt[1:], nil
}

func u32(n int) []byte {
	b := make([]byte, 4)
	binary.BigEndian.PutUint32(b, uint32(n))
	return b
}

// credit is a send window: take blocks until some is granted (or done closes).
type credit struct {
	ch    chan struct{} // signalled on grant
	avail chan int64    // holds the current credit; a one-slot channel used as a lock with wake-up
}

func newCredit(initial int64) *credit {
	c := &credit{ch: make(chan struct{}, 1), avail: make(chan int64, 1)}
	c.avail <- initial
	return c
}

// grant adds n; it errors when the total would pass max (a peer granting more than it can hold
// is broken or hostile, and wrapping round would lift the bound).
func (c *credit) grant(n, max int64) error {
	a := <-c.avail
	if n <= 0 || a+n > max {
		c.avail <- a
		return fmt.Errorf("a credit of %d on top of %d passes the window %d", n, a, max)
	}
	c.avail <- a + n
	select {
	case c.ch <- struct{}{}:
	default:
	}
	return nil
}

// giveBack returns credit taken and not used.
func (c *credit) giveBack(n int64) {
	if n <= 0 {
		return
	}
	a := <-c.avail
	c.avail <- a + n
	signal(c.ch)
}

// take waits for credit and takes up to want of it.
func (c *credit) take(want int, done <-chan struct{}) (int, error) {
	for {
		a := <-c.avail
		if a > 0 {
			n := min(int64(want), a)
			c.avail <- a - n
			return int(n), nil
		}
		c.avail <- a
		select {
		case <-c.ch:
		case <-done:
			return 0, errSessionEnded
		}
	}
}

var errSessionEnded = errors.New("exec session ended")
