package ctlclient

import (
	"bytes"
	"context"
	"github.com/mqlet/mqlet/internal/testbuf"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/sync/protocol"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// fakeNode answers logs requests of node n1 with script(request) and records every request.
type fakeNode struct {
	reqs chan *protocol.LogsRequest
}

func startFakeNode(t *testing.T, b *mqtttest.Broker, script func(req *protocol.LogsRequest) []*protocol.LogsChunk) *fakeNode {
	t.Helper()
	f := &fakeNode{reqs: make(chan *protocol.LogsRequest, 16)}
	raw := rawClient(t, b.Plain)
	handle := func(cl mqtt.Client, m mqtt.Message) {
		req, err := protocol.DecodeLogsRequest(m.Payload(), 0)
		if err != nil {
			t.Errorf("fake node: %v", err)
			return
		}
		f.reqs <- req
		if req.Op != protocol.LogsOpen {
			return
		}
		// Published from another goroutine: a paho handler must not wait for its own client.
		go func() {
			for _, ch := range script(req) {
				ch.ID = req.ID
				payload, _ := protocol.Encode(ch)
				cl.Publish(tp.LogsReply("n1", req.ID), 1, false, payload).WaitTimeout(testTimeout)
			}
		}()
	}
	if tok := raw.Subscribe(tp.LogsRequest("n1"), 1, handle); !tok.WaitTimeout(testTimeout) || tok.Error() != nil {
		t.Fatalf("fake node subscribe: %v", tok.Error())
	}
	return f
}

// next returns the next request the fake node got.
func (f *fakeNode) next(t *testing.T) *protocol.LogsRequest {
	t.Helper()
	select {
	case r := <-f.reqs:
		return r
	case <-time.After(testTimeout):
		t.Fatalf("fake node: no request within %s", testTimeout)
		return nil
	}
}

func TestLogsReassemblesChunks(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	f := startFakeNode(t, b, func(*protocol.LogsRequest) []*protocol.LogsChunk {
		return []*protocol.LogsChunk{
			{Seq: 0, Data: []byte("one\n")},
			{Seq: 1, Data: []byte("two\n")},
			{Seq: 1, Data: []byte("two\n")}, // a QoS 1 duplicate
			{Seq: 2, Data: []byte("three\n"), EOF: true},
		}
	})
	c := dial(t, b)
	var out bytes.Buffer
	err := c.Logs(testCtx(t), "n1", protocol.LogsRequest{Pod: "web", Container: "c", Tail: 3}, &out)
	if err != nil {
		t.Fatalf("Logs: %v", err)
	}
	if out.String() != "one\ntwo\nthree\n" {
		t.Errorf("Logs wrote %q", out.String())
	}
	req := f.next(t)
	if req.Op != protocol.LogsOpen || req.Namespace != "default" || req.Pod != "web" || req.Container != "c" || req.Tail != 3 || req.ID == "" {
		t.Errorf("the node got %+v", req)
	}
}

func TestLogsFailsOnAGap(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	f := startFakeNode(t, b, func(*protocol.LogsRequest) []*protocol.LogsChunk {
		return []*protocol.LogsChunk{{Seq: 0, Data: []byte("one\n")}, {Seq: 2, Data: []byte("three\n")}, {Seq: 3, EOF: true}}
	})
	c := dial(t, b)
	var out bytes.Buffer
	err := c.Logs(testCtx(t), "n1", protocol.LogsRequest{Pod: "web"}, &out)
	if err == nil || !strings.Contains(err.Error(), "chunk #1 is missing") {
		t.Fatalf("Logs over a gap = %v, want chunk #1 missing", err)
	}
	if out.String() != "one\n" {
		t.Errorf("Logs wrote %q past the gap", out.String())
	}
	open, cancel := f.next(t), f.next(t)
	if cancel.Op != protocol.LogsCancel || cancel.ID != open.ID {
		t.Errorf("after the gap the node got %+v, want a cancel of %s", cancel, open.ID)
	}
}

func TestLogsNodeError(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	startFakeNode(t, b, func(*protocol.LogsRequest) []*protocol.LogsChunk {
		return []*protocol.LogsChunk{{Seq: 0, EOF: true, Error: "pod default/web not found"}}
	})
	err := dial(t, b).Logs(testCtx(t), "n1", protocol.LogsRequest{Pod: "web"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "pod default/web not found") || !strings.Contains(err.Error(), "node n1") {
		t.Errorf("Logs = %v, want the node's error", err)
	}
}

func TestLogsFollowCancelsWhenDone(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	f := startFakeNode(t, b, func(*protocol.LogsRequest) []*protocol.LogsChunk {
		return []*protocol.LogsChunk{{Seq: 0, Data: []byte("hello\n")}}
	})
	c := dial(t, b)
	ctx, cancel := context.WithCancel(testCtx(t))
	var out testbuf.Buffer
	done := make(chan error, 1)
	go func() { done <- c.Logs(ctx, "n1", protocol.LogsRequest{Pod: "web", Follow: true}, &out) }()
	open := f.next(t)
	if !open.Follow {
		t.Errorf("open = %+v, want follow", open)
	}
	deadline := time.Now().Add(testTimeout)
	for out.String() != "hello\n" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != context.Canceled {
			t.Errorf("Logs after cancel = %v, want context.Canceled", err)
		}
	case <-time.After(testTimeout):
		t.Fatalf("Logs did not return after its context ended")
	}
	if r := f.next(t); r.Op != protocol.LogsCancel || r.ID != open.ID {
		t.Errorf("after the context ended the node got %+v, want a cancel", r)
	}
	if out.String() != "hello\n" {
		t.Errorf("Logs wrote %q", out.String())
	}
}

func TestLogsNoAnswer(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	c, err := Connect(testCtx(t), Options{Broker: b.Plain, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.Logs(testCtx(t), "n1", protocol.LogsRequest{Pod: "web", Follow: true}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "no answer") {
		t.Errorf("Logs with no node = %v, want no answer", err)
	}
	// Refused locally, with the node's own words.
	err = c.Logs(testCtx(t), "n1", protocol.LogsRequest{Pod: "../etc"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "invalid") {
		t.Errorf("Logs of a path-hostile pod name = %v", err)
	}
}
