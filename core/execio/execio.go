// Package execio holds the shapes an interactive exec is described with, shared by the runtime
// that runs it (agent/ctrd), the local API that serves it (agent/api) and the MQTT stream that
// carries it (sync/stream), none of which should import another for them.
package execio

import "io"

// TermSize is a terminal's size in character cells.
type TermSize struct {
	Width  uint16 `json:"width"`
	Height uint16 `json:"height"`
}

// Streams is where an interactive exec's input comes from and its output goes.
type Streams struct {
	// Stdin, if not nil, is copied to the command's stdin; its EOF closes the command's stdin.
	// A Read blocked when the command ends is not waited for: the caller closes what it reads.
	Stdin io.Reader
	// Stdout and Stderr receive the command's output; with TTY everything goes to Stdout.
	// Either may be nil (the output is discarded).
	Stdout, Stderr io.Writer
	// TTY gives the command a terminal of Size, resized to each size that arrives on Resize.
	TTY    bool
	Size   TermSize
	Resize <-chan TermSize
}
