package logserve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

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
	f, err := os.Open(path)
	if err != nil {
		// The path is the node's business; the requester gets what failed without it.
		log.Warn("logs stream: open log file", "err", err)
		t.finish(ctx, fmt.Sprintf("%s: cannot open the log file: %v", what, errors.Unwrap(err)))
		return
	}
	defer f.Close()
	if req.Tail > 0 {
		off, err := tailOffset(f, req.Tail)
		if err == nil {
			_, err = f.Seek(off, io.SeekStart)
		}
		if err != nil {
			log.Warn("logs stream: find the last lines", "err", err)
			t.finish(ctx, fmt.Sprintf("%s: reading the log file failed", what))
			return
		}
	}
	buf := make([]byte, protocol.MaxLogChunk)
	// copyNew sends what the file holds past its offset, chunk by chunk.
	copyNew := func() error {
		for {
			n, err := io.ReadFull(f, buf)
			if n > 0 {
				if err := t.send(ctx, buf[:n], false, ""); err != nil {
					return err
				}
			}
			switch {
			case err == nil:
			case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
				return nil
			default:
				log.Warn("logs stream: read log file", "err", err)
				return fmt.Errorf("%s: reading the log file failed", what)
			}
		}
	}
	// end picks the last chunk's words from why the stream stopped.
	end := func(err error) {
		switch cause := context.Cause(ctx); {
		case errors.Is(cause, errCancelled):
			t.finish(ctx, "")
		case ctx.Err() != nil:
			t.finish(ctx, errStopping.Error())
		case err != nil:
			log.Warn("logs stream failed", "err", err)
			t.finish(ctx, err.Error())
		default:
			t.finish(ctx, "")
		}
	}

	if err := copyNew(); err != nil || !req.Follow || ctx.Err() != nil {
		end(err)
		return
	}
	if t.seq == 0 {
		// Nothing to send yet: an empty first chunk tells the requester the stream is open.
		if err := t.send(ctx, nil, false, ""); err != nil {
			end(err)
			return
		}
	}

	tick := time.NewTicker(s.o.Poll)
	defer tick.Stop()
	for polls := 1; ; polls++ {
		select {
		case <-ctx.Done():
			end(nil)
			return
		case <-tick.C:
		}
		if time.Now().UnixNano() > st.deadline.Load() {
			t.finish(ctx, fmt.Sprintf("stream %s expired: no renew within %s", req.ID, s.o.RenewTimeout))
			return
		}
		if err := rewindIfTruncated(f); err != nil {
			end(fmt.Errorf("%s: %w", what, err))
			return
		}
		if err := copyNew(); err != nil {
			end(err)
			return
		}
		if polls%recheckEvery == 0 {
			// The container restarted (a new log file) or the pod is gone: this log has ended for
			// good. Send what the old file still got, then end.
			now, err := s.o.Finder.LogPath(req.Namespace, req.Pod, req.Container, req.Previous)
			if err != nil || now != path {
				end(copyNew())
				return
			}
		}
	}
}

// rewindIfTruncated starts f over when it became shorter than the offset read so far (truncated in
// place by a log rotation that copies and truncates).
func rewindIfTruncated(f *os.File) error {
	off, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() < off {
		_, err = f.Seek(0, io.SeekStart)
	}
	return err
}

// tailBlock is how much tailOffset reads at a time, from the end backwards.
const tailBlock = 32 << 10

// tailOffset is the offset where the last n lines of f begin. A last line without a newline counts
// as a line; a newline at the very end does not start another one.
func tailOffset(f *os.File, n int64) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	end := fi.Size()
	if end == 0 {
		return 0, nil
	}
	last := make([]byte, 1)
	if _, err := f.ReadAt(last, end-1); err != nil {
		return 0, err
	}
	if last[0] == '\n' {
		end-- // the final newline ends the last line
	}
	buf := make([]byte, tailBlock)
	for pos := end; pos > 0; {
		size := min(int64(tailBlock), pos)
		pos -= size
		b := buf[:size]
		if _, err := f.ReadAt(b, pos); err != nil {
			return 0, err
		}
		for i := bytes.LastIndexByte(b, '\n'); i >= 0; i = bytes.LastIndexByte(b, '\n') {
			if n--; n == 0 {
				return pos + int64(i) + 1, nil
			}
			b = b[:i]
		}
	}
	return 0, nil
}
