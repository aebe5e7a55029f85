package ctrd

import (
	"errors"
	"io"
	"sync"
)

// execSpoolLimit bounds what an exec's output spool holds per stream.
const execSpoolLimit = 1 << 20

// spool passes an exec's output on to a writer that may be slow (a client far away, with flow
// control) while taking it from containerd at once, up to its limit. containerd 1.6's shim drops
// the output of an exec still in its pipes when the exec exits (seen here: ~50 KiB lost behind a
// slow reader; containerd#5741), so the pipes must be kept empty: the spool holds what the
// writer has not taken yet, and only when it is full does containerd's copy wait.
type spool struct {
	w     io.Writer
	limit int

	mu     sync.Mutex
	buf    []byte
	closed bool
	err    error // the writer's, or errSpoolAborted: later writes fail with it

	data  chan struct{} // signalled when buf grew or closed was set
	space chan struct{} // signalled when buf was taken
	done  chan struct{} // closed when run has written everything out (or failed)
}

var errSpoolAborted = errors.New("exec output abandoned")

func newSpool(w io.Writer, limit int) *spool {
	s := &spool{w: w, limit: limit, data: make(chan struct{}, 1), space: make(chan struct{}, 1), done: make(chan struct{})}
	go s.run()
	return s
}

func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (s *spool) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		s.mu.Lock()
		if s.err != nil {
			err := s.err
			s.mu.Unlock()
			return n, err
		}
		room := s.limit - len(s.buf)
		if room <= 0 {
			s.mu.Unlock()
			<-s.space
			continue
		}
		k := min(room, len(p))
		s.buf = append(s.buf, p[:k]...)
		s.mu.Unlock()
		wake(s.data)
		n += k
		p = p[k:]
	}
	return n, nil
}

func (s *spool) run() {
	defer close(s.done)
	for {
		s.mu.Lock()
		chunk, closed, failed := s.buf, s.closed, s.err != nil
		s.buf = nil
		s.mu.Unlock()
		if failed {
			return
		}
		if len(chunk) > 0 {
			wake(s.space)
			if _, err := s.w.Write(chunk); err != nil {
				s.fail(err)
				return
			}
			continue
		}
		if closed {
			return
		}
		<-s.data
	}
}

func (s *spool) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	wake(s.space)
	wake(s.data)
}

// close says no more output comes; done closes once the rest is written out.
func (s *spool) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	wake(s.data)
}

// abort drops what is left: writes fail and run ends after its current Write returns.
func (s *spool) abort() { s.fail(errSpoolAborted) }
