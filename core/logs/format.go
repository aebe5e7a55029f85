// Package logs keeps container output in kubelet's CRI log format, rotated by size, and reads it
// back as `kubectl logs` does.
//
// A log file holds one record per line:
//
//	<RFC 3339 nano timestamp> <stdout|stderr> <P|F> <content>
//
// F ends a line of the container's output; P is a piece of a line that goes on in the next record
// of the same stream: a line longer than MaxLineSize, or the last bytes a stream wrote without a
// newline. Readers join P records up to the next F.
//
// Rotation renames the current file <n>.log to <n>.log.<UTC time> and starts a new <n>.log, as
// kubelet's log manager does; the oldest rotated files are removed so that at most maxFiles files
// (the current one included) stay. Rotated files are not compressed: on the boards mqlet targets
// the CPU is dearer than a few MiB of disk, and readers can then treat every file alike.
package logs

import (
	"bytes"
	"errors"
	"fmt"
	"time"
)

// Streams a record may belong to.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// MaxLineSize is the longest content of one record, as containerd's CRI plugin sets it by default
// (max_container_log_line_size): longer lines are cut into P records of this size.
const MaxLineSize = 16 << 10

// Entry is one record of a log file.
type Entry struct {
	Time    time.Time
	Stream  string
	Partial bool // a P record: the line goes on in the next record of the stream
	Content []byte
}

// errNotCRI marks a record that is not in the CRI format (a log written raw by an older mqlet).
var errNotCRI = errors.New("not a CRI log record")

// appendRecord appends one record, newline included, to dst.
func appendRecord(dst []byte, t time.Time, stream string, partial bool, content []byte) []byte {
	dst = t.UTC().AppendFormat(dst, time.RFC3339Nano)
	dst = append(dst, ' ')
	dst = append(dst, stream...)
	if partial {
		dst = append(dst, " P "...)
	} else {
		dst = append(dst, " F "...)
	}
	dst = append(dst, content...)
	return append(dst, '\n')
}

// Parse reads one record, without its newline. Content aliases rec.
func Parse(rec []byte) (Entry, error) {
	var e Entry
	ts, rest, ok := bytes.Cut(rec, []byte{' '})
	if !ok {
		return e, fmt.Errorf("%w: no timestamp", errNotCRI)
	}
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return e, fmt.Errorf("%w: timestamp: %v", errNotCRI, err)
	}
	stream, rest, ok := bytes.Cut(rest, []byte{' '})
	if !ok || (string(stream) != Stdout && string(stream) != Stderr) {
		return e, fmt.Errorf("%w: stream %q", errNotCRI, stream)
	}
	// The content may be empty, and then the space after the tag is all that follows.
	tag, content, _ := bytes.Cut(rest, []byte{' '})
	switch string(tag) {
	case "P":
		e.Partial = true
	case "F":
	default:
		return e, fmt.Errorf("%w: tag %q", errNotCRI, tag)
	}
	e.Time, e.Stream, e.Content = t, string(stream), content
	return e, nil
}
