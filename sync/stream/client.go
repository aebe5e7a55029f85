package stream

import (
	"context"
	"crypto/ecdh"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"
)

const (
	// AnswerTimeout bounds the wait for the node's first frame: a node that is offline (or has no
	// exec server) is reported then, not after the caller's own deadline.
	AnswerTimeout = 10 * time.Second
	// LeaseEvery is how often the client renews its session; DefaultLease on the node is three
	// times that, so two renewals in a row may be lost.
	LeaseEvery = 10 * time.Second
	// SilentLimit ends a session the node has sent nothing on for this long, though the node
	// answers every lease: the node lost it (its agent killed and restarted, the frames lost with
	// a broker that restarted), and the command is killed there when its lease runs out.
	SilentLimit = 3 * LeaseEvery
	// requestLife is how long a signed open stays valid (the node opens an id once anyway).
	requestLife = 2 * time.Minute
	// cancelTimeout bounds the publish of a cancel once the caller's context has ended.
	cancelTimeout = 2 * time.Second
)

// Exec runs req.Command in req.Pod's container on node through the broker, with stdin (nil: none),
// stdout and stderr (with req.TTY everything comes on stdout) and terminal sizes from resize
// (may be nil), and returns the command's exit code. signer signs the open (nil sends it unsigned,
// which only nodes without trust anchors serve); nodeKey is the node's sealing public key, which
// the session's keys are agreed with (sync/sealing: read it from the node's status, attested
// where the fleet CA is known). req.ID is made up when empty. When ctx ends, the session is
// cancelled (the node kills the command) and ctx's error returned.
func Exec(ctx context.Context, t Transport, topics protocol.Topics, signer ed25519.PrivateKey, node string, nodeKey *ecdh.PublicKey,
	req protocol.ExecRequest, stdin io.Reader, stdout, stderr io.Writer, resize <-chan protocol.TermSize) (int, error) {
	return execTimed(ctx, timing{lease: LeaseEvery, silent: SilentLimit}, t, topics, signer, node, nodeKey, req, stdin, stdout, stderr, resize)
}

// timing is how often a client renews its lease, and how long it hears nothing before it gives
// the session up (tests shorten both).
type timing struct{ lease, silent time.Duration }

func execTimed(ctx context.Context, tm timing, t Transport, topics protocol.Topics, signer ed25519.PrivateKey, node string, nodeKey *ecdh.PublicKey,
	req protocol.ExecRequest, stdin io.Reader, stdout, stderr io.Writer, resize <-chan protocol.TermSize) (int, error) {
	if err := protocol.ValidateNodeName(node); err != nil {
		return -1, err
	}
	if nodeKey == nil {
		return -1, fmt.Errorf("exec on node %s: the node's sealing key is unknown", node)
	}
	if req.ID == "" {
		var b [8]byte
		rand.Read(b[:])
		req.ID = "exec-" + hex.EncodeToString(b[:])
	}
	if req.Namespace == "" {
		req.Namespace = "default"
	}
	what := fmt.Sprintf("exec in pod %s/%s on node %s", req.Namespace, req.Pod, node)
	eph, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return -1, fmt.Errorf("%s: %w", what, err)
	}
	req.APIVersion, req.Op = protocol.APIVersion, protocol.ExecOpen
	req.Stdin = stdin != nil
	req.ClientKey = base64.StdEncoding.EncodeToString(eph.PublicKey().Bytes())
	req.NodeKeyID = sealing.KeyID(nodeKey)
	if req.Window <= 0 {
		req.Window = DefaultWindow
	}
	if signer != nil {
		// Whole seconds in UTC: the node re-encodes the decoded request to check the signature.
		now := time.Now().UTC().Truncate(time.Second)
		req.Issued, req.Expires = now, now.Add(requestLife)
		protocol.SignExecRequest(node, &req, signer)
	}
	open, err := protocol.Encode(&req)
	if err != nil {
		return -1, fmt.Errorf("%s: %w", what, err)
	}
	if _, err := protocol.DecodeExecRequest(open, protocol.DefaultMaxPayload); err != nil {
		return -1, fmt.Errorf("%s: %w", what, err)
	}
	shared, err := eph.ECDH(nodeKey)
	if err != nil {
		return -1, fmt.Errorf("%s: %w", what, err)
	}
	var c *clientSession
	c = &clientSession{
		t: t, topic: topics.ExecRequest(node), what: what, window: req.Window, timing: tm,
		// The keys wait for the node's nonce, on its first frame; nothing is sent before it.
		keys: func(nodeNonce []byte) error {
			aeadOut, aeadIn, err := sessionKeys(shared, req.ID, eph.PublicKey(), nodeKey, nodeNonce)
			if err != nil {
				return err
			}
			c.sendMu.Lock()
			c.seal = &sealer{aead: aeadOut, id: req.ID, dir: dirToNode}
			c.sendMu.Unlock()
			c.open = &opener{aead: aeadIn, id: req.ID, dir: dirToClient}
			return nil
		},
		// The node may have Window bytes of data in flight, plus small control frames; a node
		// that sends past this is broken or not the node.
		maxQueued: 2*int(req.Window) + 1<<20,
		ready:     make(chan struct{}, 1),
	}
	unsub, err := t.Subscribe(ctx, topics.ExecReply(node, req.ID), c.handle)
	if err != nil {
		return -1, fmt.Errorf("%s: subscribe: %w", what, err)
	}
	defer unsub()
	if err := t.Publish(ctx, c.topic, open); err != nil {
		return -1, fmt.Errorf("%s: %w", what, err)
	}
	return c.run(ctx, node, stdin, stdout, stderr, resize)
}

// clientSession is the client's end of one session.
type clientSession struct {
	t           Transport
	topic       string
	what        string
	window      int64 // output bytes the node may have in flight (ours)
	stdinWindow int64 // stdin bytes we may have in flight (the node's)
	timing      timing

	sendMu sync.Mutex // serialises seal+publish: frames leave in Seq order
	seal   *sealer
	open   *opener
	keys   func(nodeNonce []byte) error // sets seal and open, at the node's first frame

	qmu       sync.Mutex
	queue     [][]byte
	queued    int
	maxQueued int
	overrun   bool
	ready     chan struct{}
}

// handle queues a message from the node; it never blocks (the transport's reader calls it).
func (c *clientSession) handle(p []byte) {
	c.qmu.Lock()
	if c.queued+len(p) > c.maxQueued {
		c.overrun = true
	} else {
		c.queue = append(c.queue, p)
		c.queued += len(p)
	}
	c.qmu.Unlock()
	signal(c.ready)
}

func (c *clientSession) take() ([][]byte, bool) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	q := c.queue
	c.queue, c.queued = nil, 0
	return q, c.overrun
}

func (c *clientSession) send(ctx context.Context, kind byte, payload []byte) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if c.seal == nil {
		return errors.New("no session keys yet: the node has not answered")
	}
	b, err := c.seal.seal(kind, payload)
	if err != nil {
		return err
	}
	return c.t.Publish(ctx, c.topic, b)
}

func (c *clientSession) run(ctx context.Context, node string, stdin io.Reader, stdout, stderr io.Writer, resize <-chan protocol.TermSize) (int, error) {
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(done)
	cancel := func() {
		cctx, stop := context.WithTimeout(context.WithoutCancel(ctx), cancelTimeout)
		defer stop()
		c.send(cctx, kindCancel, nil) // best effort: the node's lease is the backstop
	}

	answer := time.NewTimer(AnswerTimeout)
	defer answer.Stop()
	silence := time.NewTicker(c.timing.lease)
	defer silence.Stop()
	lastHeard := time.Now()
	accepted := false
	var inCredit *credit // stdin the node takes
	consumed := 0        // output written and not yet granted back
	sendErr := make(chan error, 1)
	fail := func(err error) {
		select {
		case sendErr <- err:
		default:
		}
	}
	for {
		select {
		case <-ctx.Done():
			if accepted {
				cancel()
			}
			return -1, ctx.Err()
		case <-answer.C:
			if !accepted {
				return -1, fmt.Errorf("%s: node %s did not answer within %s (is it online?)", c.what, node, AnswerTimeout)
			}
		case err := <-sendErr:
			cancel()
			return -1, fmt.Errorf("%s: %w", c.what, err)
		case <-silence.C:
			if accepted && time.Since(lastHeard) > c.timing.silent {
				cancel()
				return -1, fmt.Errorf("%s: node %s sent nothing for %s, not even an answer to the lease: the session is lost (the node restarted, or its link or the broker went away)",
					c.what, node, c.timing.silent)
			}
			continue
		case <-c.ready:
		}
		msgs, over := c.take()
		if over {
			cancel()
			return -1, fmt.Errorf("%s: the node sent more than its window allows", c.what)
		}
		for _, m := range msgs {
			f, err := protocol.DecodeExecSealed(m, protocol.DefaultMaxPayload)
			if err != nil {
				cancel()
				return -1, fmt.Errorf("%s: %w", c.what, err)
			}
			if f.Error != "" && len(f.Box) == 0 {
				if accepted {
					continue // a refusal after the node accepted is not the node's: ignore it
				}
				return -1, fmt.Errorf("%s: the node refused: %s", c.what, f.Error)
			}
			if c.open == nil {
				if f.Seq != 0 || len(f.Nonce) != protocol.ExecNonceSize {
					return -1, fmt.Errorf("%s: the node's first frame carries no nonce", c.what)
				}
				if err := c.keys(f.Nonce); err != nil {
					return -1, fmt.Errorf("%s: %w", c.what, err)
				}
			}
			kind, p, err := c.open.open(f)
			if errors.Is(err, errDuplicate) {
				continue
			}
			if err != nil {
				cancel()
				return -1, fmt.Errorf("%s: %w", c.what, err)
			}
			lastHeard = time.Now()
			switch kind {
			case kindAlive:
			case kindAccepted:
				if accepted || len(p) != 4 {
					cancel()
					return -1, fmt.Errorf("%s: a second or malformed accept", c.what)
				}
				accepted = true
				answer.Stop()
				win := int64(binary.BigEndian.Uint32(p))
				inCredit = newCredit(win)
				c.start(ctx, &wg, done, stdin, inCredit, resize, fail)
				// stdin credit granted later is checked against this window.
				c.stdinWindow = win
			case kindStdout, kindStderr:
				w := stdout
				if kind == kindStderr {
					w = stderr
				}
				if _, err := w.Write(p); err != nil {
					cancel()
					return -1, fmt.Errorf("%s: write output: %w", c.what, err)
				}
				consumed += len(p)
				if consumed >= int(c.window)/4 {
					if err := c.send(ctx, kindCredit, u32(consumed)); err != nil {
						return -1, fmt.Errorf("%s: grant credit: %w", c.what, err)
					}
					consumed = 0
				}
			case kindCredit:
				if inCredit == nil || len(p) != 4 || inCredit.grant(int64(binary.BigEndian.Uint32(p)), c.stdinWindow) != nil {
					cancel()
					return -1, fmt.Errorf("%s: the node granted more stdin credit than its window", c.what)
				}
			case kindExit:
				if len(p) != 4 {
					return -1, fmt.Errorf("%s: malformed exit frame", c.what)
				}
				return int(int32(binary.BigEndian.Uint32(p))), nil
			case kindError:
				return -1, fmt.Errorf("%s: %s", c.what, p)
			default:
				cancel()
				return -1, fmt.Errorf("%s: unknown frame kind %q from the node", c.what, kind)
			}
		}
	}
}

// start runs the client's senders once the node accepted: stdin within the node's credit,
// resizes, and the lease.
func (c *clientSession) start(ctx context.Context, wg *sync.WaitGroup, done chan struct{}, stdin io.Reader, cr *credit, resize <-chan protocol.TermSize, fail func(error)) {
	if stdin != nil {
		// Not in wg: a Read blocked on the caller's stdin cannot be interrupted; the goroutine
		// ends at its next return (the caller closes what it reads) or at once if done closed.
		go func() {
			buf := make([]byte, maxData)
			for {
				k, err := cr.take(maxData, done)
				if err != nil {
					return
				}
				n, rerr := stdin.Read(buf[:k])
				select {
				case <-done:
					return
				default:
				}
				if n > 0 {
					if err := c.send(ctx, kindStdin, buf[:n]); err != nil {
						fail(fmt.Errorf("send stdin: %w", err))
						return
					}
				}
				cr.giveBack(int64(k - n)) // what was taken and not used
				if rerr == io.EOF {
					if err := c.send(ctx, kindStdinEOF, nil); err != nil {
						fail(fmt.Errorf("send stdin EOF: %w", err))
					}
					return
				}
				if rerr != nil {
					fail(fmt.Errorf("read stdin: %w", rerr))
					return
				}
			}
		}()
	}
	wg.Go(func() {
		lease := time.NewTicker(c.timing.lease)
		defer lease.Stop()
		for {
			select {
			case <-done:
				return
			case <-lease.C:
				if err := c.send(ctx, kindLease, nil); err != nil {
					fail(fmt.Errorf("renew the lease: %w", err))
					return
				}
			case sz, ok := <-resize:
				if !ok {
					resize = nil
					continue
				}
				b := make([]byte, 4)
				binary.BigEndian.PutUint16(b, sz.Width)
				binary.BigEndian.PutUint16(b[2:], sz.Height)
				if err := c.send(ctx, kindResize, b); err != nil {
					fail(fmt.Errorf("send resize: %w", err))
					return
				}
			}
		}
	})
}
