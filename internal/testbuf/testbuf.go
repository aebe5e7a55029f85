// Package testbuf holds Buffer, apart from internal/testenv: sync/ tests use it, and testenv links
// agent/ code, which sync/ may not (internal/layering).
package testbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer a test reads while something else writes it (a command's output copied
// in by other goroutines, a process's stdout).
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
