package link

import (
	"bytes"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"

	"github.com/eclipse/paho.mqtt.golang/packets"
)

// reference finds, by walking the whole stream at once (and with multiplication where the guard
// shifts), the index of the byte on which the guard must fail and why; -1 when the stream is
// fine (a packet cut short at the end included).
func reference(data []byte, limit int) (int, error) {
	i := 0
	for i < len(data) {
		typ := data[i] >> 4
		i++
		length, weight := 0, 1
		for k := 0; ; k++ {
			if i >= len(data) {
				return -1, nil
			}
			b := data[i]
			length += int(b&0x7f) * weight
			weight *= 128
			if length > limit {
				return i, &TooLargeError{Length: length, AtLeast: b&0x80 != 0, Limit: limit, Type: typ}
			}
			i++
			if b&0x80 == 0 {
				break
			}
			if k == 3 {
				return i - 1, ErrMalformedLength
			}
		}
		i += length
	}
	return -1, nil
}

func sameErr(a, b error) bool {
	var ta, tb *TooLargeError
	switch {
	case a == nil || b == nil:
		return a == b
	case errors.As(a, &ta) && errors.As(b, &tb):
		return *ta == *tb
	default:
		return errors.Is(a, b)
	}
}

// encode writes packets as paho does.
func encode(t testing.TB, cps ...packets.ControlPacket) []byte {
	t.Helper()
	var b bytes.Buffer
	for _, cp := range cps {
		if err := cp.Write(&b); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

func publishPacket(topic string, payload []byte) *packets.PublishPacket {
	p := packets.NewControlPacket(packets.Publish).(*packets.PublishPacket)
	p.TopicName, p.Qos, p.MessageID, p.Payload = topic, 1, 7, payload
	return p
}

// chunkedConn is a net.Conn whose reads return data in the pieces cuts gives (each cut byte is
// the size of the next piece, 1 to 256; cycled), however large the caller's buffer.
type chunkedConn struct {
	net.Conn // nil: only Read and Close are used
	data     []byte
	cuts     []byte
	n        int
	closed   bool
}

func (c *chunkedConn) Read(p []byte) (int, error) {
	if c.closed {
		return 0, net.ErrClosed
	}
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	size := len(c.data)
	if len(c.cuts) > 0 {
		size = int(c.cuts[c.n%len(c.cuts)]) + 1
		c.n++
	}
	size = min(size, len(p), len(c.data))
	copy(p, c.data[:size])
	c.data = c.data[size:]
	return size, nil
}

func (c *chunkedConn) Close() error { c.closed = true; return nil }

// checkStream runs data through a frameGuard in the pieces cuts gives and through a guardedConn
// read with the buffer sizes reads gives, and holds both to the reference.
func checkStream(t *testing.T, data []byte, limit int, cuts, reads []byte) {
	t.Helper()
	failAt, want := reference(data, limit)

	// The guard alone, fed in pieces: it fails in the piece that holds byte failAt, not before.
	g := newFrameGuard(limit)
	var got error
	pos, n := 0, 0
	for pos < len(data) {
		size := len(data) - pos
		if len(cuts) > 0 {
			size = min(size, int(cuts[n%len(cuts)])+1)
			n++
		}
		if got = g.scan(data[pos : pos+size]); got != nil {
			if failAt < pos || failAt >= pos+size {
				t.Fatalf("limit %d: the guard failed in the piece [%d,%d), the reference at byte %d (%v)", limit, pos, pos+size, failAt, want)
			}
			break
		}
		pos += size
	}
	if !sameErr(got, want) {
		t.Fatalf("limit %d: guard %v, reference %v (at byte %d)", limit, got, want, failAt)
	}
	if got != nil && !sameErr(g.scan([]byte{0}), want) {
		t.Fatalf("a failed guard took more input")
	}

	// The connection: what it hands over is a prefix of the stream that stops short of byte failAt.
	var refused error
	inner := &chunkedConn{data: data, cuts: cuts}
	gc := newGuardedConn(inner, limit, func(err error) {
		if refused != nil {
			t.Fatalf("refused twice")
		}
		refused = err
	})
	var handed []byte
	var err error
	for i := 0; ; i++ {
		size := 4096
		if len(reads) > 0 {
			size = int(reads[i%len(reads)]) + 1
		}
		buf := make([]byte, size)
		var k int
		k, err = gc.Read(buf)
		handed = append(handed, buf[:k]...)
		if err != nil {
			break
		}
	}
	if !bytes.Equal(handed, data[:len(handed)]) {
		t.Fatalf("the connection handed over bytes that differ from the stream's")
	}
	if want == nil {
		if err != io.EOF || len(handed) != len(data) || refused != nil {
			t.Fatalf("limit %d: a fine stream: read %d of %d bytes, ended with %v (refused %v)", limit, len(handed), len(data), err, refused)
		}
		return
	}
	if len(handed) > failAt {
		t.Fatalf("limit %d: the connection handed over %d bytes, the byte at %d that fails the header (%v) among them", limit, len(handed), failAt, want)
	}
	if !sameErr(err, want) || !sameErr(refused, want) || !inner.closed {
		t.Fatalf("limit %d: read ended with %v, refused %v, closed %v; want %v", limit, err, refused, inner.closed, want)
	}
	if k, err2 := gc.Read(make([]byte, 10)); k != 0 || !sameErr(err2, want) {
		t.Fatalf("a read after the refusal: %d, %v", k, err2)
	}
}

func TestInboundLimit(t *testing.T) {
	for _, tc := range []struct{ payload, want int }{
		{0, 0}, {-1, 0}, {1, 1 + PublishOverhead}, {1 << 20, 1<<20 + 65539},
		{MaxRemainingLength, MaxRemainingLength}, {MaxRemainingLength - PublishOverhead, MaxRemainingLength},
	} {
		if got := InboundLimit(tc.payload); got != tc.want {
			t.Errorf("InboundLimit(%d) = %d, want %d", tc.payload, got, tc.want)
		}
	}
}

func TestFrameGuard(t *testing.T) {
	const limit = 300
	small := encode(t, publishPacket("a/b", bytes.Repeat([]byte("x"), 100)))
	atLimit := encode(t, publishPacket("a/b", bytes.Repeat([]byte("x"), limit-2-3-2)))
	over := encode(t, publishPacket("a/b", bytes.Repeat([]byte("x"), limit-2-3-2+1)))
	ping := encode(t, packets.NewControlPacket(packets.Pingresp))
	connack := encode(t, packets.NewControlPacket(packets.Connack))
	for _, tc := range []struct {
		name   string
		stream []byte
		fails  bool
	}{
		{"connack, ping, small", cat(connack, ping, small), false},
		{"exactly the limit", cat(small, atLimit, ping), false},
		{"one byte over", cat(small, over), true},
		{"over after many", cat(connack, small, small, ping, small, over, small), true},
		// 0xff 0xff 0xff 0x7f: 268435455 announced; refused on the second length byte already.
		{"256 MiB header", []byte{0x30, 0xff, 0xff, 0xff, 0x7f}, true},
		{"five length bytes", []byte{0x30, 0x80, 0x80, 0x80, 0x80, 0x01}, true},
		{"cut in the header", []byte{0x30, 0x81}, false},
		{"cut in the body", small[:50], false},
		{"zero-length packets", bytes.Repeat(ping, 50), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if at, _ := reference(tc.stream, limit); (at >= 0) != tc.fails {
				t.Fatalf("reference fails at %d; the case says fails=%v", at, tc.fails)
			}
			for _, cuts := range [][]byte{nil, {0}, {1, 2}, {6, 0, 254}} {
				for _, reads := range [][]byte{nil, {0}, {3, 0, 200}} {
					checkStream(t, tc.stream, limit, cuts, reads)
				}
			}
		})
	}
	// A length refused before its last byte says so.
	g := newFrameGuard(1000)
	var tl *TooLargeError
	if err := g.scan([]byte{0x30, 0xff, 0xff}); !errors.As(err, &tl) || !tl.AtLeast || tl.Length != 16383 || tl.Type != 3 {
		t.Fatalf("scan: %v", err)
	}
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// paho's reader on a guarded connection: a header announcing 200 MiB, with no body behind it,
// costs nothing (paho alone would allocate the 200 MiB before reading); packets under the limit
// read as before.
func TestGuardedConnBeforePaho(t *testing.T) {
	const limit = 1 << 20
	stream := cat(encode(t, publishPacket("n/index", []byte("ok"))), []byte{0x30, 0x80, 0x80, 0x80, 0x64})
	gc := newGuardedConn(&chunkedConn{data: stream, cuts: []byte{0}}, InboundLimit(limit), nil)
	cp, err := packets.ReadPacket(gc)
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := cp.(*packets.PublishPacket); !ok || string(p.Payload) != "ok" {
		t.Fatalf("first packet: %v", cp)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err = packets.ReadPacket(gc)
	runtime.ReadMemStats(&after)
	var tl *TooLargeError
	if !errors.As(err, &tl) || tl.Length != 200<<20 || tl.AtLeast {
		t.Fatalf("second packet: %v, want a TooLargeError of %d bytes", err, 200<<20)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 64<<10 {
		t.Fatalf("reading the refused header allocated %d bytes", d)
	}
}

// FuzzFrameGuard: any stream, any limit, cut into any pieces and read with any buffer sizes: the
// guard agrees with the whole-stream reference, fails in the piece holding the offending byte
// and the connection never hands that byte over.
func FuzzFrameGuard(f *testing.F) {
	big := bytes.Repeat([]byte("p"), 1000)
	seeds := [][]byte{
		encode(f, packets.NewControlPacket(packets.Connack), packets.NewControlPacket(packets.Pingresp)),
		encode(f, publishPacket("mqlet/v2/nodes/edge-1/index", []byte(`{"revision":1}`))),
		encode(f, publishPacket("t", big), packets.NewControlPacket(packets.Suback), publishPacket("u", big[:10])),
		{0x30, 0xff, 0xff, 0xff, 0x7f},
		{0x30, 0x80, 0x80, 0x80, 0x80, 0x01},
		{0xd0, 0x00, 0xd0, 0x00, 0x30, 0x02, 0x00, 0x00, 0x30, 0x83, 0x01},
	}
	for i, s := range seeds {
		f.Add(s, uint32(2*1000+1), []byte{byte(i)}, []byte{0})
		f.Add(s, uint32(2*20+1), []byte{0, 3, 200}, []byte{1, 255})
		f.Add(s, uint32(2*MaxRemainingLength), []byte(nil), []byte(nil))
	}
	f.Fuzz(func(t *testing.T, data []byte, limitSeed uint32, cuts, reads []byte) {
		// Odd seeds: a small limit (the boundaries get hit); even ones: anything up to MQTT's.
		limit := int(limitSeed>>1)%MaxRemainingLength + 1
		if limitSeed&1 == 1 {
			limit = int(limitSeed>>1)%2048 + 1
		}
		checkStream(t, data, limit, cuts, reads)
	})
}
