package link

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"
)

// Why the inbound side needs a guard: paho's packets.ReadPacket reads a packet's fixed header,
// then allocates the whole remaining length (make([]byte, RemainingLength)) and reads the packet
// into it before anyone can look at its size. A broker, or anyone who can publish a message the
// broker forwards, can so make a node allocate up to 256 MiB per packet with five bytes of header
// and, by holding the body back, keep it allocated. The caller's own payload check only runs on a
// message paho has read in full. guardedConn sits between the network connection (after TLS or
// websockets) and paho, follows the MQTT framing of what it hands over, and fails the read that
// would complete a fixed header announcing more than the limit: paho never sees that length, and
// nothing of the packet's body is read from the network.

const (
	// MaxRemainingLength is MQTT's largest remaining length (four length bytes of 7 bits).
	MaxRemainingLength = 268435455
	// PublishOverhead is what an MQTT 3.1.1 PUBLISH carries besides its payload at most: the
	// topic's 2-byte length, the longest topic (65535 bytes) and the 2-byte packet id. A packet
	// whose remaining length is above payload limit + PublishOverhead cannot be a PUBLISH the
	// caller would accept, nor any other packet a client receives (those are a few bytes).
	PublishOverhead = 2 + 65535 + 2
)

// InboundLimit is the largest remaining length accepted when payloads up to maxPayload bytes are:
// maxPayload + PublishOverhead, capped at MaxRemainingLength. 0 (no limit) for maxPayload <= 0.
func InboundLimit(maxPayload int) int {
	if maxPayload <= 0 {
		return 0
	}
	return min(maxPayload, MaxRemainingLength-PublishOverhead) + PublishOverhead
}

// ErrMalformedLength is a remaining length whose fourth byte still has the continuation bit.
var ErrMalformedLength = errors.New("inbound MQTT packet with a malformed remaining length (more than 4 bytes)")

// TooLargeError is an inbound packet whose fixed header announced more than the limit. The
// connection is dropped at its header: none of the body was read.
type TooLargeError struct {
	Length  int  // the remaining length, or what was decoded of it so far when AtLeast
	AtLeast bool // Length is a lower bound: the header was refused before its last length byte
	Limit   int  // the largest remaining length accepted
	Type    byte // the MQTT control packet type (3 = PUBLISH)
}

func (e *TooLargeError) Error() string {
	at := ""
	if e.AtLeast {
		at = "at least "
	}
	return fmt.Sprintf("inbound MQTT packet (type %d) of %s%d bytes is over the limit of %d bytes (payload limit + %d for topic and packet id); "+
		"the connection is dropped at its header, before the packet is read", e.Type, at, e.Length, e.Limit, PublishOverhead)
}

// Parser states.
const (
	wantHeader uint8 = iota // the next byte is a fixed header's first byte
	wantLength              // reading the remaining length's bytes
	inBody                  // passing a packet's body
)

// frameGuard follows MQTT framing over a byte stream fed to it in pieces of any size. scan fails
// on the byte that makes a remaining length larger than limit (or malformed), so a reader can
// refuse to hand that byte over. It costs O(1) per piece for bodies and O(1) per header byte.
type frameGuard struct {
	limit  int
	state  uint8
	typ    byte
	length int  // remaining length decoded so far (wantLength) or announced (inBody)
	shift  uint // 0, 7, 14, 21: the next length byte's weight
	left   int  // body bytes still to come (inBody)
	err    error
}

func newFrameGuard(limit int) *frameGuard { return &frameGuard{limit: limit} }

// scan follows p, the next bytes of the stream. Once it failed it fails again for any input.
func (g *frameGuard) scan(p []byte) error {
	if g.err != nil {
		return g.err
	}
	for i := 0; i < len(p); {
		switch g.state {
		case wantHeader:
			g.typ, g.length, g.shift = p[i]>>4, 0, 0
			g.state = wantLength
			i++
		case wantLength:
			b := p[i]
			i++
			g.length |= int(b&0x7f) << g.shift
			more := b&0x80 != 0
			if g.length > g.limit {
				g.err = &TooLargeError{Length: g.length, AtLeast: more, Limit: g.limit, Type: g.typ}
				return g.err
			}
			if more {
				if g.shift == 21 {
					g.err = ErrMalformedLength
					return g.err
				}
				g.shift += 7
				continue
			}
			if g.length == 0 {
				g.state = wantHeader
			} else {
				g.state, g.left = inBody, g.length
			}
		case inBody:
			n := min(g.left, len(p)-i)
			g.left -= n
			i += n
			if g.left == 0 {
				g.state = wantHeader
			}
		}
	}
	return nil
}

// guardedConn is a net.Conn whose reads pass through a frameGuard. A read that brings the byte
// completing an oversized (or malformed) fixed header returns the guard's error and none of its
// bytes, closes the connection, and so does every later read. Only one goroutine may Read at a
// time (paho's reader); the other methods are the embedded connection's.
type guardedConn struct {
	net.Conn
	guard   *frameGuard
	refused func(error) // told once, on the read that failed
	failed  atomic.Bool
}

func newGuardedConn(c net.Conn, limit int, refused func(error)) *guardedConn {
	return &guardedConn{Conn: c, guard: newFrameGuard(limit), refused: refused}
}

func (c *guardedConn) Read(p []byte) (int, error) {
	if c.failed.Load() {
		return 0, c.guard.err
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		if gerr := c.guard.scan(p[:n]); gerr != nil {
			c.failed.Store(true)
			// The bytes already in p are not handed over (n = 0): paho never sees the length.
			clear(p[:n])
			_ = c.Conn.Close()
			if c.refused != nil {
				c.refused(gerr)
			}
			return 0, gerr
		}
	}
	return n, err
}
