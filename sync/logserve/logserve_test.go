package logserve

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/sync/ctlclient"
	"github.com/mqlet/mqlet/sync/protocol"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

const (
	node        = "n1"
	testTimeout = 10 * time.Second
)

var tp = protocol.MustTopics(protocol.DefaultPrefix)

// pahoPub is the Publisher of these tests: QoS 1 on a real broker, counting publishes in flight
// per topic to check that a stream waits for each acknowledgement.
type pahoPub struct {
	c        mqtt.Client
	mu       sync.Mutex
	inFlight map[string]int
	maxSeen  int
	// stall, when set and true for a payload, makes Publish wait for ctx after the PUBACK, as if
	// the acknowledgement were slow to come back.
	stall func(payload []byte) bool
}

func (p *pahoPub) Publish(ctx context.Context, topic string, payload []byte) error {
	p.mu.Lock()
	p.inFlight[topic]++
	p.maxSeen = max(p.maxSeen, p.inFlight[topic])
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.inFlight[topic]--
		p.mu.Unlock()
	}()
	tok := p.c.Publish(topic, 1, false, payload)
	select {
	case <-tok.Done():
	case <-ctx.Done():
		return ctx.Err()
	}
	if p.stall != nil && p.stall(payload) {
		<-ctx.Done()
		return ctx.Err()
	}
	return tok.Error()
}

// finder maps namespace/name/container to log files, and counts lookups.
type finder struct {
	mu    sync.Mutex
	paths map[string]string
	calls int
}

func (f *finder) LogPath(namespace, name, container string, previous bool) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	p, ok := f.paths[namespace+"/"+name+"/"+container]
	if !ok {
		return "", fmt.Errorf("pod %s/%s not found", namespace, name)
	}
	return p, nil
}

func (f *finder) set(key, path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.paths[key] = path
}

// rig is a broker, a running Server for node n1 fed by a subscription to its logs/req topic like
// the node's link, and a collector of every reply chunk.
type rig struct {
	b      *mqtttest.Broker
	srv    *Server
	pub    *pahoPub
	find   *finder
	req    mqtt.Client
	cancel context.CancelFunc
	done   chan error

	mu     sync.Mutex
	chunks map[string]chan *protocol.LogsChunk
}

func raw(t *testing.T, b *mqtttest.Broker, id string) mqtt.Client {
	t.Helper()
	cl := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(b.Plain).SetClientID(id).SetAutoReconnect(false).SetConnectTimeout(testTimeout))
	if tok := cl.Connect(); !tok.WaitTimeout(testTimeout) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", id, tok.Error())
	}
	t.Cleanup(func() { cl.Disconnect(100) })
	return cl
}

func newRig(t *testing.T, o Options) *rig {
	t.Helper()
	r := &rig{b: mqtttest.Start(t, mqtttest.Options{}), find: &finder{paths: map[string]string{}}, chunks: map[string]chan *protocol.LogsChunk{}}
	nodeClient := raw(t, r.b, "node")
	r.pub = &pahoPub{c: nodeClient, inFlight: map[string]int{}}
	o.Node, o.Topics, o.Finder, o.Pub = node, tp, r.find, r.pub
	r.srv = New(o)
	sub := func(cl mqtt.Client, filter string, h mqtt.MessageHandler) {
		if tok := cl.Subscribe(filter, 1, h); !tok.WaitTimeout(testTimeout) || tok.Error() != nil {
			t.Fatalf("subscribe %s: %v", filter, tok.Error())
		}
	}
	sub(nodeClient, tp.LogsRequest(node), func(_ mqtt.Client, m mqtt.Message) { r.srv.Handle(m.Payload()) })
	r.req = raw(t, r.b, "requester")
	sub(r.req, tp.LogsReply(node, "+"), func(_ mqtt.Client, m mqtt.Message) {
		ch, err := protocol.DecodeLogsChunk(m.Payload(), 0)
		if err != nil {
			t.Errorf("reply on %s: %v", m.Topic(), err)
			return
		}
		if !strings.HasSuffix(m.Topic(), "/"+ch.ID) {
			t.Errorf("chunk for %s on %s", ch.ID, m.Topic())
		}
		r.stream(ch.ID) <- ch
	})
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan error, 1)
	go func() { r.done <- r.srv.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop ends Run and waits for it (bounded).
func (r *rig) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		r.done <- nil // later calls return at once
	case <-time.After(testTimeout):
		t.Fatalf("Run did not return after its context ended")
	}
}

func (r *rig) stream(id string) chan *protocol.LogsChunk {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.chunks[id] == nil {
		r.chunks[id] = make(chan *protocol.LogsChunk, 1024)
	}
	return r.chunks[id]
}

// send publishes a request like a control plane.
func (r *rig) send(t *testing.T, req any) {
	t.Helper()
	var payload []byte
	switch x := req.(type) {
	case string:
		payload = []byte(x)
	case *protocol.LogsRequest:
		payload, _ = protocol.Encode(x)
	}
	if tok := r.req.Publish(tp.LogsRequest(node), 1, false, payload); !tok.WaitTimeout(testTimeout) || tok.Error() != nil {
		t.Fatalf("publish request: %v", tok.Error())
	}
}

// next waits for the next chunk of stream id and checks its Seq.
func (r *rig) next(t *testing.T, id string, seq int64) *protocol.LogsChunk {
	t.Helper()
	select {
	case ch := <-r.stream(id):
		if ch.Seq != seq {
			t.Fatalf("stream %s: chunk seq %d, want %d", id, ch.Seq, seq)
		}
		if len(ch.Data) > protocol.MaxLogChunk {
			t.Fatalf("stream %s: chunk of %d bytes", id, len(ch.Data))
		}
		return ch
	case <-time.After(testTimeout):
		t.Fatalf("stream %s: no chunk #%d within %s", id, seq, testTimeout)
		return nil
	}
}

// readAll collects stream id from chunk #from up to its EOF chunk: the data, and the last chunk's
// error.
func (r *rig) readAll(t *testing.T, id string, from int64) (string, string) {
	t.Helper()
	var out bytes.Buffer
	for seq := from; ; seq++ {
		ch := r.next(t, id, seq)
		out.Write(ch.Data)
		if ch.EOF {
			return out.String(), ch.Error
		}
	}
}

// waitFor polls cond for up to testTimeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func open(id, pod string, tail int64, follow bool) *protocol.LogsRequest {
	return &protocol.LogsRequest{ID: id, Op: protocol.LogsOpen, Namespace: "default", Pod: pod, Container: "c", Tail: tail, Follow: follow}
}

func writeLog(t *testing.T, r *rig, pod, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), pod+".log")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	r.find.set("default/"+pod+"/c", path)
	return path
}

func appendLog(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

func TestTailAndWholeLog(t *testing.T) {
	r := newRig(t, Options{})
	writeLog(t, r, "five", "l1\nl2\nl3\nl4\nl5\n")
	big := strings.Repeat("0123456789abcdef", 5000) // 80,000 bytes: five chunks
	writeLog(t, r, "big", big)

	for _, c := range []struct {
		id, pod string
		tail    int64
		want    string
	}{
		{"t2", "five", 2, "l4\nl5\n"},
		{"t0", "five", 0, "l1\nl2\nl3\nl4\nl5\n"},
		{"t9", "five", 9, "l1\nl2\nl3\nl4\nl5\n"},
		{"big", "big", 0, big},
		{"big1", "big", 1, big}, // one line without a newline
	} {
		r.send(t, open(c.id, c.pod, c.tail, false))
		got, errMsg := r.readAll(t, c.id, 0)
		if got != c.want || errMsg != "" {
			t.Errorf("%s: got %d bytes %.40q, error %q; want %.40q", c.id, len(got), got, errMsg, c.want)
		}
	}
	r.pub.mu.Lock()
	defer r.pub.mu.Unlock()
	if r.pub.maxSeen != 1 {
		t.Errorf("%d chunks of one stream were in flight at once, want 1 (each waits for the previous PUBACK)", r.pub.maxSeen)
	}
}

func TestFollowAndCancel(t *testing.T) {
	r := newRig(t, Options{Poll: 20 * time.Millisecond})
	path := writeLog(t, r, "web", "")
	r.send(t, open("f", "web", 0, true))
	if ch := r.next(t, "f", 0); len(ch.Data) != 0 || ch.EOF {
		t.Fatalf("first chunk of an empty followed log = %+v, want an empty one", ch)
	}
	appendLog(t, path, "hello\n")
	if ch := r.next(t, "f", 1); string(ch.Data) != "hello\n" {
		t.Fatalf("after an append: %+v", ch)
	}
	appendLog(t, path, "world\n")
	if ch := r.next(t, "f", 2); string(ch.Data) != "world\n" {
		t.Fatalf("after a second append: %+v", ch)
	}
	r.send(t, &protocol.LogsRequest{ID: "f", Op: protocol.LogsCancel})
	if ch := r.next(t, "f", 3); !ch.EOF || ch.Error != "" {
		t.Fatalf("after cancel: %+v, want EOF without error", ch)
	}
}

// A chunk whose acknowledgement is still awaited when the stream is cancelled may have reached the
// requester: the last chunk must not reuse its number, or the requester would drop it as a
// duplicate and wait forever.
func TestCancelWhileAChunkIsUnacknowledged(t *testing.T) {
	r := newRig(t, Options{Poll: 20 * time.Millisecond})
	r.pub.stall = func(payload []byte) bool { return strings.Contains(string(payload), `"seq":0`) }
	writeLog(t, r, "web", "x\n")
	r.send(t, open("f", "web", 0, true))
	if ch := r.next(t, "f", 0); string(ch.Data) != "x\n" {
		t.Fatalf("first chunk: %+v", ch)
	}
	r.send(t, &protocol.LogsRequest{ID: "f", Op: protocol.LogsCancel})
	if ch := r.next(t, "f", 1); !ch.EOF || ch.Error != "" {
		t.Fatalf("after cancel: %+v", ch)
	}
}

func TestFollowWithTail(t *testing.T) {
	r := newRig(t, Options{Poll: 20 * time.Millisecond})
	path := writeLog(t, r, "web", "old1\nold2\nold3\n")
	r.send(t, open("f", "web", 1, true))
	if ch := r.next(t, "f", 0); string(ch.Data) != "old3\n" {
		t.Fatalf("first chunk = %q, want the last line", ch.Data)
	}
	appendLog(t, path, "new\n")
	if ch := r.next(t, "f", 1); string(ch.Data) != "new\n" {
		t.Fatalf("after an append: %q", ch.Data)
	}
}

func TestRenewTimeout(t *testing.T) {
	r := newRig(t, Options{Poll: 20 * time.Millisecond, RenewTimeout: 2 * time.Second})
	writeLog(t, r, "web", "x\n")

	// Without renew the stream expires.
	r.send(t, open("lonely", "web", 0, true))
	r.next(t, "lonely", 0)
	ch := r.next(t, "lonely", 1)
	if !ch.EOF || !strings.Contains(ch.Error, "no renew within 2s") {
		t.Fatalf("unrenewed stream ended with %+v", ch)
	}

	// With renews it lives past the timeout, until cancelled: the chunk after the cancel is a
	// clean EOF, where an expired stream would have ended with the renew error.
	r.send(t, open("kept", "web", 0, true))
	r.next(t, "kept", 0)
	for range 12 { // 3s, more than the timeout
		time.Sleep(250 * time.Millisecond)
		r.send(t, &protocol.LogsRequest{ID: "kept", Op: protocol.LogsRenew})
	}
	select {
	case ch := <-r.stream("kept"):
		t.Fatalf("renewed stream sent %+v", ch)
	default:
	}
	r.send(t, &protocol.LogsRequest{ID: "kept", Op: protocol.LogsCancel})
	if ch := r.next(t, "kept", 1); !ch.EOF || ch.Error != "" {
		t.Fatalf("after cancel: %+v", ch)
	}
}

func TestMaxStreams(t *testing.T) {
	r := newRig(t, Options{MaxStreams: 2, Poll: 20 * time.Millisecond})
	writeLog(t, r, "web", "x\n")
	for _, id := range []string{"s1", "s2"} {
		r.send(t, open(id, "web", 0, true))
		r.next(t, id, 0)
	}
	r.send(t, open("s3", "web", 0, true))
	if ch := r.next(t, "s3", 0); !ch.EOF || !strings.Contains(ch.Error, "too many log streams") {
		t.Fatalf("third stream: %+v, want a refusal", ch)
	}
	// A duplicate open (QoS 1 may deliver twice) is neither a new stream nor a refusal.
	r.send(t, open("s1", "web", 0, true))
	r.send(t, &protocol.LogsRequest{ID: "s1", Op: protocol.LogsCancel})
	if ch := r.next(t, "s1", 1); !ch.EOF {
		t.Fatalf("s1 after cancel: %+v", ch)
	}
	// The slot is free again once s1 ended (Run learns of it asynchronously).
	waitFor(t, "a free stream slot", func() bool {
		id := fmt.Sprintf("s4-%d", time.Now().UnixNano())
		r.send(t, open(id, "web", 0, true))
		ch := r.next(t, id, 0)
		return !ch.EOF
	})
}

func TestRefusals(t *testing.T) {
	r := newRig(t, Options{})
	writeLog(t, r, "web", "x\n")
	for _, c := range []struct {
		id   string
		req  *protocol.LogsRequest
		want string
	}{
		{"up", &protocol.LogsRequest{ID: "up", Op: protocol.LogsOpen, Namespace: "default", Pod: "../../etc"}, "invalid"},
		{"ns", &protocol.LogsRequest{ID: "ns", Op: protocol.LogsOpen, Namespace: "..", Pod: "web"}, "namespace"},
		{"ctr", &protocol.LogsRequest{ID: "ctr", Op: protocol.LogsOpen, Namespace: "default", Pod: "web", Container: "a/../../b"}, "container"},
		{"op", &protocol.LogsRequest{ID: "op", Op: "rm"}, "unknown op"},
		{"nopod", open("nopod", "nope", 0, false), "pod default/nope not found"},
	} {
		r.send(t, c.req)
		ch := r.next(t, c.id, 0)
		if !ch.EOF || !strings.Contains(ch.Error, c.want) {
			t.Errorf("%s: %+v, want an EOF chunk with %q", c.id, ch, c.want)
		}
	}
	r.send(t, `{"apiVersion":"mqlet.io/v2","id":"extra","op":"open","namespace":"default","pod":"web","rm":"-rf"}`)
	if ch := r.next(t, "extra", 0); !ch.EOF || !strings.Contains(ch.Error, "unknown field") {
		t.Errorf("unknown field: %+v", ch)
	}
	// Without a usable ID nobody can be answered; the server only logs it and goes on.
	r.send(t, `{"id":"../x","op":"open"}`)
	r.send(t, `not json`)
	r.send(t, open("after", "web", 0, false))
	if got, errMsg := r.readAll(t, "after", 0); got != "x\n" || errMsg != "" {
		t.Errorf("after the junk: %q, %q", got, errMsg)
	}
	r.find.mu.Lock()
	defer r.find.mu.Unlock()
	if r.find.calls != 2 { // nopod and after; never a refused name
		t.Errorf("the finder was asked %d times, want 2", r.find.calls)
	}
}

func TestStreamEndsWithItsLog(t *testing.T) {
	r := newRig(t, Options{Poll: 10 * time.Millisecond})
	old := writeLog(t, r, "web", "first attempt\n")
	r.send(t, open("f", "web", 0, true))
	if ch := r.next(t, "f", 0); string(ch.Data) != "first attempt\n" {
		t.Fatalf("first chunk: %q", ch.Data)
	}
	// The container restarts: its log moves to a new file, the old one gets a last line.
	appendLog(t, old, "bye\n")
	writeLog(t, r, "web", "second attempt\n")
	out, errMsg := r.readAll(t, "f", 1)
	if out != "bye\n" || errMsg != "" {
		t.Errorf("after the restart the stream sent %q, error %q; want the old file's end and EOF", out, errMsg)
	}
}

func TestRunEndsEveryStream(t *testing.T) {
	r := newRig(t, Options{Poll: 20 * time.Millisecond})
	writeLog(t, r, "web", "x\n")
	for _, id := range []string{"a", "b"} {
		r.send(t, open(id, "web", 0, true))
		r.next(t, id, 0)
	}
	r.stop(t)
	for _, id := range []string{"a", "b"} {
		if ch := r.next(t, id, 1); !ch.EOF || !strings.Contains(ch.Error, "stopping") {
			t.Errorf("stream %s after Run ended: %+v", id, ch)
		}
	}
}

// The requester side of sync/ctlclient against this server, end to end over the broker.
func TestWithCtlClient(t *testing.T) {
	r := newRig(t, Options{Poll: 20 * time.Millisecond})
	path := writeLog(t, r, "web", "a\nb\nc\n")
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	c, err := ctlclient.Connect(ctx, ctlclient.Options{Broker: r.b.Plain})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var out bytes.Buffer
	if err := c.Logs(ctx, node, protocol.LogsRequest{Pod: "web", Container: "c", Tail: 2}, &out); err != nil || out.String() != "b\nc\n" {
		t.Errorf("Logs --tail 2 = %q, %v", out.String(), err)
	}
	err = c.Logs(ctx, node, protocol.LogsRequest{Pod: "nope"}, &out)
	if err == nil || !strings.Contains(err.Error(), "pod default/nope not found") {
		t.Errorf("Logs of a missing pod = %v", err)
	}

	fctx, fcancel := context.WithCancel(ctx)
	pr, pw := newPipe()
	done := make(chan error, 1)
	go func() { done <- c.Logs(fctx, node, protocol.LogsRequest{Pod: "web", Container: "c", Follow: true}, pw) }()
	waitFor(t, "the whole log", func() bool { return pr.String() == "a\nb\nc\n" })
	appendLog(t, path, "d\n")
	waitFor(t, "the appended line", func() bool { return pr.String() == "a\nb\nc\nd\n" })
	fcancel()
	if err := <-done; err != context.Canceled {
		t.Errorf("followed Logs after cancel = %v", err)
	}
}

// pipe is a concurrency-safe buffer.
type pipe struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func newPipe() (*pipe, *pipe) { p := &pipe{}; return p, p }

func (p *pipe) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.b.Write(b)
}

func (p *pipe) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.b.String()
}

// A node with trust anchors serves a logs request only when one of them signed it for this node
// and it has not expired; an open is served once (a captured request replayed is refused). Each
// refusal is answered with its reason, and nothing of the log goes out.
func TestTrustedNodeServesOnlySignedRequests(t *testing.T) {
	pub, key, _ := ed25519.GenerateKey(nil)
	_, other, _ := ed25519.GenerateKey(nil)
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	r := newRig(t, Options{Trusted: []ed25519.PublicKey{pub}, Now: func() time.Time { return now }})
	writeLog(t, r, "app", "secret-line\n")
	signed := func(id, forNode string, k ed25519.PrivateKey, expires time.Time) *protocol.LogsRequest {
		req := open(id, "app", 0, false)
		req.APIVersion, req.Expires = protocol.APIVersion, expires
		protocol.SignLogsRequest(forNode, req, k)
		return req
	}
	refused := func(id, want string) {
		t.Helper()
		data, errText := r.readAll(t, id, 0)
		if data != "" || !strings.Contains(errText, want) {
			t.Errorf("request %s: data %q, error %q; want no data and an error saying %q", id, data, errText, want)
		}
	}
	r.send(t, open("unsigned", "app", 0, false))
	refused("unsigned", "not signed")
	r.send(t, signed("otherkey", node, other, now.Add(time.Minute)))
	refused("otherkey", "not signed by a key this node trusts")
	r.send(t, signed("othernode", "edge-9", key, now.Add(time.Minute)))
	refused("othernode", "not signed by a key this node trusts")
	r.send(t, signed("expired", node, key, now.Add(-time.Second)))
	refused("expired", "expired")
	r.send(t, signed("farahead", node, key, now.Add(time.Hour)))
	refused("farahead", "ahead")

	good := signed("good", node, key, now.Add(time.Minute))
	r.send(t, good)
	if data, errText := r.readAll(t, "good", 0); data != "secret-line\n" || errText != "" {
		t.Fatalf("signed request: %q, %q", data, errText)
	}
	r.send(t, good) // the same bytes again
	refused("good", "already served")
}

// A usage request is answered with the node's Usage in JSON, split into chunks of at most
// MaxLogChunk bytes when it is large; a node without a usage reader refuses it.
func TestUsage(t *testing.T) {
	u := &protocol.Usage{Time: time.Unix(1700000000, 0).UTC(), Node: protocol.NodeUsage{CPUSeconds: 12.5, CPUs: 4, MemoryWorkingSetBytes: 1 << 30}}
	for i := range 300 { // ~40 KiB of JSON: three chunks
		u.Containers = append(u.Containers, protocol.ContainerUsage{Namespace: "default", Pod: fmt.Sprintf("pod-%03d", i),
			Container: "c", ID: fmt.Sprintf("id-%03d", i), CPUSeconds: float64(i), MemoryWorkingSetBytes: int64(i) << 20})
	}
	r := newRig(t, Options{Usage: func(context.Context) (*protocol.Usage, error) { return u, nil }})
	r.send(t, &protocol.LogsRequest{ID: "u1", Op: protocol.LogsUsage})
	data, errMsg := r.readAll(t, "u1", 0)
	var got protocol.Usage
	if err := json.Unmarshal([]byte(data), &got); err != nil || errMsg != "" {
		t.Fatalf("usage reply: %v %q (%d bytes)", err, errMsg, len(data))
	}
	if len(data) <= protocol.MaxLogChunk || !reflect.DeepEqual(&got, u) {
		t.Errorf("usage reply of %d bytes decodes to %+v, want %+v", len(data), got.Node, u.Node)
	}

	bare := newRig(t, Options{})
	bare.send(t, &protocol.LogsRequest{ID: "u2", Op: protocol.LogsUsage})
	if _, errMsg := bare.readAll(t, "u2", 0); !strings.Contains(errMsg, "does not report its usage") {
		t.Errorf("usage request to a node without a reader: %q", errMsg)
	}
}

// sinceTime keeps the lines logged at or after it.
func TestSinceTime(t *testing.T) {
	r := newRig(t, Options{})
	writeLog(t, r, "web", "2026-01-01T00:00:00.000000000Z stdout F old\n2026-01-01T00:00:10.000000000Z stdout F new\n")
	req := open("s1", "web", 0, false)
	req.SinceTime = time.Date(2026, 1, 1, 0, 0, 5, 0, time.UTC)
	r.send(t, req)
	if data, errMsg := r.readAll(t, "s1", 0); data != "new\n" || errMsg != "" {
		t.Errorf("sinceTime: %q %q, want only the newer line", data, errMsg)
	}
}
