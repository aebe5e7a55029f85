package logsclient

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"
)

var topics = protocol.MustTopics(protocol.DefaultPrefix)

// fakeNode is a Broker with a node behind it: each open or usage request it takes is answered on
// the reply topic by reply(req), chunk by chunk, on another goroutine (as a broker would).
type fakeNode struct {
	mu       sync.Mutex
	subs     map[string]func([]byte)
	requests []*protocol.LogsRequest
	reply    func(req *protocol.LogsRequest) []protocol.LogsChunk
}

func (f *fakeNode) Subscribe(_ context.Context, topic string, h func([]byte)) (func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.subs == nil {
		f.subs = map[string]func([]byte){}
	}
	f.subs[topic] = h
	return func() {
		f.mu.Lock()
		delete(f.subs, topic)
		f.mu.Unlock()
	}, nil
}

func (f *fakeNode) Publish(_ context.Context, topic string, payload []byte) error {
	req, err := protocol.DecodeLogsRequest(payload, protocol.DefaultMaxPayload)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.requests = append(f.requests, req)
	h := f.subs[topics.LogsReply("n1", req.ID)]
	f.mu.Unlock()
	if req.Op == protocol.LogsRenew || req.Op == protocol.LogsCancel {
		return nil
	}
	if h == nil {
		return errors.New("published before subscribing to the reply")
	}
	go func() {
		for _, ch := range f.reply(req) {
			ch.APIVersion, ch.ID = protocol.APIVersion, req.ID
			b, _ := protocol.Encode(&ch)
			h(b)
		}
	}()
	return nil
}

func (f *fakeNode) ops() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, r := range f.requests {
		out = append(out, r.Op)
	}
	return out
}

func opts() Options {
	return Options{Topics: topics, Timeout: 5 * time.Second, IDPrefix: "t-"}
}

func TestStreamInOrderAndSigned(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(nil)
	f := &fakeNode{reply: func(req *protocol.LogsRequest) []protocol.LogsChunk {
		return []protocol.LogsChunk{{Seq: 0, Data: []byte("a\n")}, {Seq: 0, Data: []byte("a\n")}, {Seq: 1, Data: []byte("b\n"), EOF: true}}
	}}
	o := opts()
	o.SigningKey = key
	var out bytes.Buffer
	err := Stream(context.Background(), f, o, "n1", protocol.LogsRequest{Pod: "web", Container: "c", SinceTime: time.Unix(1700000000, 0).UTC()}, &out)
	if err != nil || out.String() != "a\nb\n" {
		t.Fatalf("Stream: %q %v, want a, b once each (the duplicate dropped)", out.String(), err)
	}
	r := f.requests[0]
	if r.Op != protocol.LogsOpen || r.Namespace != "default" || !strings.HasPrefix(r.ID, "t-") || r.Signature == nil ||
		protocol.VerifyLogsRequest("n1", r, []ed25519.PublicKey{key.Public().(ed25519.PublicKey)}, time.Now()) != nil {
		t.Errorf("request %+v: want a signed open of namespace default", r)
	}
}

func TestStreamStopsOnErrStopAndGaps(t *testing.T) {
	f := &fakeNode{reply: func(*protocol.LogsRequest) []protocol.LogsChunk {
		return []protocol.LogsChunk{{Seq: 0, Data: []byte("abc")}, {Seq: 1, Data: []byte("def")}, {Seq: 2, EOF: true}}
	}}
	n := 0
	stop := writerFunc(func(p []byte) (int, error) {
		if n++; n == 2 {
			return len(p), ErrStop
		}
		return len(p), nil
	})
	if err := Stream(context.Background(), f, opts(), "n1", protocol.LogsRequest{Pod: "web"}, stop); err != nil {
		t.Errorf("Stream stopped by its writer: %v, want nil", err)
	}
	if ops := f.ops(); len(ops) != 2 || ops[1] != protocol.LogsCancel {
		t.Errorf("requests %v: want open then cancel", ops)
	}

	gap := &fakeNode{reply: func(*protocol.LogsRequest) []protocol.LogsChunk {
		return []protocol.LogsChunk{{Seq: 0, Data: []byte("a")}, {Seq: 2, Data: []byte("c")}}
	}}
	err := Stream(context.Background(), gap, opts(), "n1", protocol.LogsRequest{Pod: "web"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "chunk #1 is missing") {
		t.Errorf("a gap: %v", err)
	}
	refused := &fakeNode{reply: func(*protocol.LogsRequest) []protocol.LogsChunk {
		return []protocol.LogsChunk{{Seq: 0, EOF: true, Error: "pod default/web not found"}}
	}}
	err = Stream(context.Background(), refused, opts(), "n1", protocol.LogsRequest{Pod: "web"}, &bytes.Buffer{})
	var ne *NodeError
	if !errors.As(err, &ne) || ne.Msg != "pod default/web not found" {
		t.Errorf("a refusal: %v, want a NodeError with the node's words", err)
	}
}

func TestUsage(t *testing.T) {
	want := `{"time":"2026-01-01T00:00:00Z","node":{"cpuSeconds":1.5,"cpus":2,"memoryWorkingSetBytes":3,"memoryCapacityBytes":4},"containers":[]}`
	f := &fakeNode{reply: func(req *protocol.LogsRequest) []protocol.LogsChunk {
		if req.Op != protocol.LogsUsage {
			return []protocol.LogsChunk{{Seq: 0, EOF: true, Error: "not a usage request"}}
		}
		return []protocol.LogsChunk{{Seq: 0, Data: []byte(want[:20])}, {Seq: 1, Data: []byte(want[20:]), EOF: true}}
	}}
	u, err := Usage(context.Background(), f, opts(), "n1")
	if err != nil || u.Node.CPUSeconds != 1.5 || u.Node.CPUs != 2 || u.Node.MemoryCapacityBytes != 4 {
		t.Errorf("Usage: %+v %v", u, err)
	}
}

type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

// A usage answer without end (a broken or hostile node, or the broker) is cut at MaxUsage and
// refused, instead of being held whole in the bridge's memory (found by review: 24 MiB were).
func TestUsageAnswerIsBounded(t *testing.T) {
	junk := bytes.Repeat([]byte("x"), 16<<10)
	n := MaxUsage/len(junk) + 64
	f := &fakeNode{reply: func(req *protocol.LogsRequest) []protocol.LogsChunk {
		var out []protocol.LogsChunk
		for i := range n {
			out = append(out, protocol.LogsChunk{Seq: int64(i), Data: junk})
		}
		return append(out, protocol.LogsChunk{Seq: int64(n), EOF: true})
	}}
	o := opts()
	o.Timeout = 20 * time.Second
	_, err := Usage(context.Background(), pacedBroker{f}, o, "n1")
	if want := fmt.Sprintf("the answer is over %d bytes", MaxUsage); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("usage answer of %d MiB: %v, want it refused as too large", n*len(junk)>>20, err)
	}
}

// pacedBroker hands chunks one by one, so the client's queue bound is not what stops them.
type pacedBroker struct{ *fakeNode }

func (s pacedBroker) Subscribe(ctx context.Context, topic string, h func([]byte)) (func(), error) {
	return s.fakeNode.Subscribe(ctx, topic, func(p []byte) { h(p); time.Sleep(100 * time.Microsecond) })
}
