package logs

import (
	"bytes"
)

// Stream cuts one output stream of a container (stdout or stderr) into records for a Writer. It
// is an io.Writer fed with whatever the stream's reads return, in order; bytes after the last
// newline wait for the rest of their line (at most MaxLineSize of them, then they go out as a P
// record). One goroutine writes to a Stream; the two Streams of a container share the Writer.
type Stream struct {
	w       *Writer
	name    string
	pending []byte // the start of a line whose end has not arrived yet
}

// NewStream returns the Stream that writes records of stream (Stdout or Stderr) to w.
func NewStream(w *Writer, stream string) *Stream { return &Stream{w: w, name: stream} }

// Write turns p into records. Like containerd's CRI logger it drops the "\n" or "\r\n" that ends
// each line, and cuts a line longer than MaxLineSize into P records of MaxLineSize bytes.
func (s *Stream) Write(p []byte) (int, error) {
	n := len(p)
	err := s.w.write(func(buf []byte, flush func([]byte) []byte) []byte {
		for len(p) > 0 {
			i := bytes.IndexByte(p, '\n')
			if i < 0 {
				if len(s.pending)+len(p) <= MaxLineSize {
					s.pending = append(s.pending, p...)
					return buf
				}
				room := MaxLineSize - len(s.pending)
				buf = s.emit(buf, p[:room], true)
				p = p[room:]
				buf = flush(buf)
				continue
			}
			line := p[:i]
			if len(s.pending)+len(line) > MaxLineSize {
				room := MaxLineSize - len(s.pending)
				buf = s.emit(buf, line[:room], true)
				p = p[room:]
				buf = flush(buf)
				continue
			}
			if len(line) > 0 && line[len(line)-1] == '\r' {
				line = line[:len(line)-1]
			} else if len(line) == 0 && len(s.pending) > 0 && s.pending[len(s.pending)-1] == '\r' {
				s.pending = s.pending[:len(s.pending)-1]
			}
			buf = s.emit(buf, line, false)
			p = p[i+1:]
			buf = flush(buf)
		}
		return buf
	})
	return n, err
}

// emit appends the record made of what is pending and more, and empties pending.
func (s *Stream) emit(buf, more []byte, partial bool) []byte {
	now := s.w.now()
	if len(s.pending) == 0 {
		return appendRecord(buf, now, s.name, partial, more)
	}
	s.pending = append(s.pending, more...)
	buf = appendRecord(buf, now, s.name, partial, s.pending)
	if cap(s.pending) > 4<<10 {
		s.pending = nil // long lines are rare: do not keep their buffer for the container's life
	} else {
		s.pending = s.pending[:0]
	}
	return buf
}

// Close writes what is pending as a P record: the stream ended (or its reader stops) in the middle
// of a line. A reader joins it with whatever the next record of the stream brings, so a line cut by
// an agent restart reads whole. It does not close the Writer.
func (s *Stream) Close() error {
	if len(s.pending) == 0 {
		return nil
	}
	return s.w.write(func(buf []byte, _ func([]byte) []byte) []byte {
		return s.emit(buf, nil, true)
	})
}
