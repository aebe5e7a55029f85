package logserve

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/mqlet/mqlet/core/logs"
	"github.com/mqlet/mqlet/sync/protocol"
)

// sender numbers and publishes the chunks of one stream.
type sender struct {
	s   *Server
	id  string
	seq int64
}

// send publishes one chunk and waits for the broker's acknowledgement.
func (t *sender) send(ctx context.Context, data []byte, eof bool, errMsg string) error {
	ch := protocol.LogsChunk{ID: t.id, Seq: t.seq, Data: data, EOF: eof, Error: errMsg}
	// The number is used up even when the wait for the acknowledgement failed: the chunk may have
	// reached the broker all the same (a cancel arriving while its PUBACK is on the way), and a
	// later chunk with the same number would be taken for a duplicate and dropped. A chunk that
	// was really lost shows as a gap, which the requester reports.
	t.seq++
	return t.s.publish(ctx, &ch)
}

// finish sends the last chunk. It is bounded on its own: the stream's context may be what ended.
func (t *sender) finish(ctx context.Context, errMsg string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalTimeout)
	defer cancel()
	if err := t.send(ctx, nil, true, errMsg); err != nil {
		t.s.o.Log.Warn("logs stream: last chunk not sent", "id", t.id, "err", err)
	}
}

// serve runs one stream to its end; the last chunk is always attempted.
func (s *Server) serve(ctx context.Context, st *stream) {
	req := st.req
	t := &sender{s: s, id: req.ID}
	what := fmt.Sprintf("log of pod %s/%s", req.Namespace, req.Pod)
	if req.Container != "" {
		what += " container " + req.Container
	}
	log := s.o.Log.With("id", req.ID, "pod", req.Namespace+"/"+req.Pod, "container", req.Container)
	path, err := s.o.Finder.LogPath(req.Namespace, req.Pod, req.Container, req.Previous)
	if err != nil {
		t.finish(ctx, err.Error())
		return
	}
	if _, err := os.Stat(path); err != nil {
		// The path is the node's business; the requester gets what failed without it.
		log.Warn("logs stream: open log file", "err", err)
		t.finish(ctx, fmt.Sprintf("%s: cannot open the log file: %v", what, errors.Unwrap(err)))
		return
	}
	o := logs.ReadOptions{Tail: logs.All, Timestamps: req.Timestamps, Follow: req.Follow, Poll: s.o.Poll}
	if req.Tail > 0 {
		o.Tail = req.Tail
	}
	if req.SinceSeconds > 0 {
		o.Since = time.Now().Add(-time.Duration(req.SinceSeconds) * time.Second)
	}
	if !req.SinceTime.IsZero() {
		o.Since = req.SinceTime
	}
	polls := 0
	o.Idle = func() error {
		if time.Now().UnixNano() > st.deadline.Load() {
			return errExpired
		}
		if polls++; polls%recheckEvery == 0 {
			// The container restarted (a new log file) or the pod is gone: this log has ended for
			// good once what the old file still got is sent.
			if now, err := s.o.Finder.LogPath(req.Namespace, req.Pod, req.Container, req.Previous); err != nil || now != path {
				return logs.ErrEnded
			}
		}
		return nil
	}
	cw := &chunkWriter{ctx: ctx, t: t, follow: req.Follow, buf: make([]byte, 0, protocol.MaxLogChunk)}
	err = logs.Read(ctx, path, o, cw)
	if err == nil {
		err = cw.Flush()
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errCancelled):
		t.finish(ctx, "")
	case ctx.Err() != nil:
		t.finish(ctx, errStopping.Error())
	case errors.Is(err, errExpired):
		t.finish(ctx, fmt.Sprintf("stream %s expired: no renew within %s", req.ID, s.o.RenewTimeout))
	case err != nil && !cw.sendFailed:
		log.Warn("logs stream failed", "err", err)
		t.finish(ctx, fmt.Sprintf("%s: reading the log file failed", what))
	case err != nil:
		log.Warn("logs stream failed", "err", err)
		t.finish(ctx, err.Error())
	default:
		t.finish(ctx, "")
	}
}

// errExpired ends a followed stream that got no renew in time.
var errExpired = errors.New("no renew in time")

// chunkWriter cuts what the log reader writes into chunks of at most protocol.MaxLogChunk bytes,
// each sent (and acknowledged) before the next. The reader flushes it whenever it has caught up
// with the log, so a followed log's new lines go out at once.
type chunkWriter struct {
	ctx        context.Context
	t          *sender
	follow     bool
	buf        []byte
	sendFailed bool
}

func (c *chunkWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := copy(c.buf[len(c.buf):cap(c.buf)], p)
		c.buf, p = c.buf[:len(c.buf)+k], p[k:]
		if len(c.buf) == cap(c.buf) {
			if err := c.send(); err != nil {
				return n - len(p), err
			}
		}
	}
	return n, nil
}

// Flush sends what is gathered. A followed stream's first flush sends a chunk even when empty: it
// tells the requester that the node is there.
func (c *chunkWriter) Flush() error {
	if len(c.buf) == 0 && !(c.follow && c.t.seq == 0) {
		return nil
	}
	return c.send()
}

func (c *chunkWriter) send() error {
	err := c.t.send(c.ctx, c.buf, false, "")
	c.buf = c.buf[:0]
	if err != nil {
		c.sendFailed = true
	}
	return err
}
