// Package logsclient asks a node for a container's log over MQTT (docs/protocol.md section 9) and
// copies it to a writer. It runs over any Broker, so mqlet ctl (its paho client) and mqlet-bridge
// (bridge/mq's connection, for the kubelet API's containerLogs) share one implementation.
package logsclient

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"
)

// Broker is the request/reply view of an MQTT connection: a non-retained QoS 1 publish that
// returns once the broker took it, and a subscription whose handler gets each payload. h runs on
// the MQTT library's goroutine and must not block.
type Broker interface {
	Publish(ctx context.Context, topic string, payload []byte) error
	Subscribe(ctx context.Context, topic string, h func(payload []byte)) (unsubscribe func(), err error)
}

// RenewInterval is how often a followed stream is renewed. A node ends a stream that is not
// renewed within its renew timeout (logserve's default is 60s), so two renews in a row may be lost
// before it gives up.
const RenewInterval = 20 * time.Second

// cancelTimeout bounds the publish of a cancel once the caller's context has ended.
const cancelTimeout = 2 * time.Second

// maxQueuedLog bounds the log bytes held in memory while the output (a paused pager, a slow
// pipe, a slow HTTP client) does not take them; the stream is given up beyond it rather than
// stalling the connection.
const maxQueuedLog = 8 << 20

// requestLife is how long a signed logs request stays valid: long enough for a slow link, short
// enough that a captured one is soon useless (the node also opens an ID once).
const requestLife = 2 * time.Minute

// Options configure Stream.
type Options struct {
	Topics protocol.Topics
	// Timeout bounds the wait for the node's first chunk and, without Follow, for each next one.
	Timeout time.Duration
	// SigningKey, when set, signs every request (open, renew, cancel): a node with trust anchors
	// serves only signed ones.
	SigningKey ed25519.PrivateKey
	// IDPrefix starts the ids made up for requests ("ctl-", "bridge-").
	IDPrefix string
	// Lost, when set, is closed when the connection is lost; LostErr then says how.
	Lost    <-chan struct{}
	LostErr func() error
}

// ErrStop, returned by the writer, ends the stream at once (the node is told to cancel) and
// Stream returns nil: the reader has what it wanted (e.g. a byte limit was reached).
var ErrStop = errors.New("logs: stop")

// Stream asks node for a container's log and copies it to w until the node's last chunk (EOF).
// req names the pod, container, Follow, Tail, Previous, SinceSeconds and Timestamps; its ID is
// made up when empty and its Op is set to open. The reply topic is subscribed to before the
// request is published, so no chunk can be missed; chunks are written in Seq order, and a missing
// Seq is an error (the rest of the stream would be garbled). The node must answer within
// o.Timeout, and without Follow every further chunk must come within it too. A followed stream is
// renewed every RenewInterval and cancelled when ctx ends; Stream then returns ctx's error.
func Stream(ctx context.Context, b Broker, o Options, node string, req protocol.LogsRequest, w io.Writer) error {
	if err := protocol.ValidateNodeName(node); err != nil {
		return err
	}
	if o.Timeout <= 0 {
		return errors.New("logs: no timeout")
	}
	if req.ID == "" {
		req.ID = o.IDPrefix + randomHex(8)
	}
	var what string
	if req.Op == protocol.LogsUsage {
		req.APIVersion = protocol.APIVersion
		what = "usage of node " + node
	} else {
		req.APIVersion, req.Op = protocol.APIVersion, protocol.LogsOpen
		if req.Namespace == "" {
			req.Namespace = "default"
		}
		what = fmt.Sprintf("logs of pod %s/%s on node %s", req.Namespace, req.Pod, node)
	}
	sign(o.SigningKey, node, &req)
	open, err := protocol.Encode(&req)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	// The node decodes with the same function: a request it would refuse is refused here, with
	// the same words, without a round trip.
	if _, err := protocol.DecodeLogsRequest(open, protocol.DefaultMaxPayload); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}

	// The handler must never block: the MQTT library runs it on the goroutine that also reads
	// PUBACKs and PINGRESPs, so a slow writer would stall our own renew and cancel publishes.
	// Chunks queue in memory instead, bounded by maxQueuedLog bytes; past that the stream is
	// given up.
	var (
		qmu     sync.Mutex
		queue   [][]byte
		queued  int
		overrun bool
	)
	ready := make(chan struct{}, 1)
	reply := o.Topics.LogsReply(node, req.ID)
	handle := func(p []byte) {
		qmu.Lock()
		if queued+len(p) > maxQueuedLog {
			overrun = true
		} else {
			queue = append(queue, p)
			queued += len(p)
		}
		qmu.Unlock()
		select {
		case ready <- struct{}{}:
		default:
		}
	}
	// take returns the queued chunks, or an error once the writer fell too far behind.
	take := func() ([][]byte, bool) {
		qmu.Lock()
		defer qmu.Unlock()
		out := queue
		queue, queued = nil, 0
		return out, overrun
	}
	unsub, err := b.Subscribe(ctx, reply, handle)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer unsub()
	reqTopic := o.Topics.LogsRequest(node)
	if err := b.Publish(ctx, reqTopic, open); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	// control publishes renew or cancel for the stream.
	control := func(ctx context.Context, op string) error {
		m := protocol.LogsRequest{APIVersion: protocol.APIVersion, ID: req.ID, Op: op}
		sign(o.SigningKey, node, &m)
		payload, err := protocol.Encode(&m)
		if err != nil {
			return err
		}
		return b.Publish(ctx, reqTopic, payload)
	}
	cancelStream := func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelTimeout)
		defer cancel()
		control(ctx, protocol.LogsCancel) // best effort: the node's renew timeout is the backstop
	}

	var renew <-chan time.Time
	if req.Follow {
		t := time.NewTicker(RenewInterval)
		defer t.Stop()
		renew = t.C
	}
	idle := time.NewTimer(o.Timeout)
	defer idle.Stop()
	next := int64(0)
	for {
		select {
		case <-ctx.Done():
			cancelStream()
			return ctx.Err()
		case <-o.Lost:
			err := errors.New("the connection to the broker was lost")
			if o.LostErr != nil {
				err = o.LostErr()
			}
			return fmt.Errorf("%s: %w", what, err)
		case <-idle.C:
			cancelStream()
			if next == 0 {
				return fmt.Errorf("%s: no answer within %s (is the node online?)", what, o.Timeout)
			}
			return fmt.Errorf("%s: no chunk after #%d within %s", what, next-1, o.Timeout)
		case <-renew:
			if err := control(ctx, protocol.LogsRenew); err != nil {
				return fmt.Errorf("%s: renew: %w", what, err)
			}
		case <-ready:
			ps, over := take()
			if over {
				cancelStream()
				return fmt.Errorf("%s: the output is not keeping up: more than %d bytes of log queued", what, maxQueuedLog)
			}
			for _, p := range ps {
				ch, err := protocol.DecodeLogsChunk(p, protocol.DefaultMaxPayload)
				if err != nil {
					cancelStream()
					return fmt.Errorf("%s: %w", what, err)
				}
				switch {
				case ch.ID != req.ID:
					cancelStream()
					return fmt.Errorf("%s: a chunk on %s is for request %q", what, reply, ch.ID)
				case ch.Seq < next:
					continue // a QoS 1 duplicate
				case ch.Seq > next:
					cancelStream()
					return fmt.Errorf("%s: chunk #%d is missing (the next to arrive was #%d): the log would have a hole", what, next, ch.Seq)
				}
				next++
				if len(ch.Data) > 0 {
					if _, err := w.Write(ch.Data); err != nil {
						cancelStream()
						if errors.Is(err, ErrStop) {
							return nil
						}
						return fmt.Errorf("%s: write: %w", what, err)
					}
				}
				if ch.EOF {
					if ch.Error != "" {
						return &NodeError{What: what, Msg: ch.Error}
					}
					return nil
				}
				if !req.Follow {
					idle.Reset(o.Timeout)
				} else {
					idle.Stop() // the node answered; a followed log may then be silent for as long as it likes
				}
			}
		}
	}
}

// MaxUsage bounds a usage answer: a node's is a few hundred bytes a container, and an answer
// without end (a broken or hostile node, or the broker) must not fill the bridge's memory.
const MaxUsage = 4 << 20

// Usage asks node for its CPU and memory use and its containers' (op usage on the logs channel,
// docs/protocol.md section 9). An answer over MaxUsage is cut and refused.
func Usage(ctx context.Context, b Broker, o Options, node string) (*protocol.Usage, error) {
	buf := &cappedBuffer{max: MaxUsage}
	if err := Stream(ctx, b, o, node, protocol.LogsRequest{Op: protocol.LogsUsage}, buf); err != nil {
		return nil, err
	}
	var u protocol.Usage
	if err := json.Unmarshal(buf.b.Bytes(), &u); err != nil {
		return nil, fmt.Errorf("usage of node %s: %w", node, err)
	}
	return &u, nil
}

// cappedBuffer refuses a write past max bytes, which ends the stream.
type cappedBuffer struct {
	b   bytes.Buffer
	max int
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if c.b.Len()+len(p) > c.max {
		return 0, fmt.Errorf("the answer is over %d bytes", c.max)
	}
	return c.b.Write(p)
}

// NodeError is a request the node answered with an error (no such pod, container, previous
// instance; a refused signature).
type NodeError struct {
	What string // "logs of pod ns/name on node n"
	Msg  string // the node's words
}

func (e *NodeError) Error() string { return fmt.Sprintf("%s: the node says: %s", e.What, e.Msg) }

// sign signs a logs request for node with key, if there is one.
func sign(key ed25519.PrivateKey, node string, r *protocol.LogsRequest) {
	if key == nil {
		return
	}
	// Whole seconds in UTC: the node re-encodes the decoded request to check the signature.
	r.Expires = time.Now().UTC().Add(requestLife).Truncate(time.Second)
	protocol.SignLogsRequest(node, r, key)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b)
}
