package logs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// ReadOptions select what Read writes, as kubectl logs' flags do.
type ReadOptions struct {
	// Tail is how many of the last lines to write; negative means all of them, 0 none (with Follow:
	// only what comes next).
	Tail int64
	// Since drops lines stamped before it; zero keeps all. It applies after Tail, as kubelet's does.
	Since time.Time
	// Timestamps puts each line's RFC 3339 nano timestamp first.
	Timestamps bool
	// Follow keeps writing what the log grows by, across rotations, until ctx ends or Idle says so.
	Follow bool
	// Poll is how often a followed log is looked at for more (default DefaultPoll).
	Poll time.Duration
	// Idle, when set, is called whenever a followed log has been read to its end. An error ends
	// Read with that error, except ErrEnded, which ends it without one (the log will not grow).
	Idle func() error
}

// DefaultPoll is ReadOptions.Poll's default.
const DefaultPoll = 200 * time.Millisecond

// busyPoll is how soon a followed log that just grew is looked at again.
const busyPoll = 10 * time.Millisecond

// ErrEnded tells Read, from ReadOptions.Idle, that the followed log has ended.
var ErrEnded = errors.New("log ended")

// All is ReadOptions.Tail for the whole log.
const All = -1

// Read writes the log at path (its rotated files first, then the current one) to w as kubectl
// logs shows it: records joined into lines, the CRI prefix dropped. Lines that are not CRI records
// (a file an older mqlet wrote raw) are written as they are. When w has a Flush method it is called
// whenever Read has caught up with the log, so a followed log reaches its reader at once.
func Read(ctx context.Context, path string, o ReadOptions, w io.Writer) error {
	if o.Poll <= 0 {
		o.Poll = DefaultPoll
	}
	r := &reader{path: path, o: o, out: bufio.NewWriterSize(w, 32<<10), flushTo: w, inLine: map[string]bool{}, skip: map[string]bool{}}
	err := r.run(ctx)
	return errors.Join(err, r.flush())
}

type reader struct {
	path    string
	o       ReadOptions
	out     *bufio.Writer
	flushTo io.Writer

	files []*os.File // still to read, oldest first; the last is the one being followed
	in    *bufio.Reader
	carry []byte // a record whose newline has not been read yet
	raw   bool   // in the middle of a raw line longer than the read buffer
	busy  bool   // the log grew since the last wait

	inLine map[string]bool // stream -> its last record was P
	skip   map[string]bool // stream -> the line going on is dropped (Since)
}

func (r *reader) run(ctx context.Context) error {
	defer func() {
		for _, f := range r.files {
			f.Close()
		}
	}()
	if err := r.openAll(); err != nil {
		return err
	}
	ending := false
	for {
		if err := r.readFile(r.files[0]); err != nil {
			return err
		}
		if len(r.files) > 1 {
			r.endFile()
			r.files[0].Close()
			r.files = r.files[1:]
			continue
		}
		if !r.o.Follow {
			r.endFile()
			return nil
		}
		if err := r.flush(); err != nil {
			return err
		}
		next, err := r.nextFile(r.files[0])
		if err != nil {
			return err
		}
		if next != nil {
			// The file was rotated: what was written to it before the rename is read first.
			r.files = append(r.files, next)
			continue
		}
		if ending {
			r.endFile()
			return nil
		}
		if r.o.Idle != nil {
			if err := r.o.Idle(); errors.Is(err, ErrEnded) {
				// What was written before the end may have gone to files rotated since the
				// look above: read on until the current file holds no more.
				ending = true
				continue
			} else if err != nil {
				return err
			}
		}
		wait := r.o.Poll
		if r.busy {
			// The log grew since the last look: look again soon, so a reader keeps up with a
			// writer that rotates faster than Poll.
			wait, r.busy = min(wait, busyPoll), false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// openAll opens the current file, then the rotated ones older than it, and seeks to where the
// last Tail lines begin.
func (r *reader) openAll() error {
	cur, err := os.Open(r.path)
	if err != nil {
		return err
	}
	curInfo, err := cur.Stat()
	if err != nil {
		cur.Close()
		return err
	}
	rotated, err := RotatedFiles(r.path)
	if err != nil {
		cur.Close()
		return err
	}
	for _, name := range rotated {
		f, err := os.Open(name)
		if errors.Is(err, os.ErrNotExist) {
			continue // removed by a rotation meanwhile
		} else if err != nil {
			cur.Close()
			return err
		}
		if fi, err := f.Stat(); err == nil && os.SameFile(fi, curInfo) {
			// The current file was rotated after we opened it: what is newer comes by following.
			f.Close()
			break
		}
		r.files = append(r.files, f)
	}
	r.files = append(r.files, cur)
	if r.o.Tail < 0 {
		return nil
	}
	ends := make([]int64, len(r.files))
	for i, f := range r.files {
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		ends[i] = fi.Size()
	}
	i, off, err := tailStart(r.files, ends, r.o.Tail)
	if err != nil {
		return fmt.Errorf("find the last %d lines: %w", r.o.Tail, err)
	}
	for _, f := range r.files[:i] {
		f.Close()
	}
	r.files = r.files[i:]
	_, err = r.files[0].Seek(off, io.SeekStart)
	return err
}

// nextFile returns the file that follows cur once cur was rotated, or nil while cur is current.
func (r *reader) nextFile(cur *os.File) (*os.File, error) {
	curInfo, err := cur.Stat()
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(r.path); err == nil && os.SameFile(fi, curInfo) {
		return nil, nil
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	// Several rotations may have happened since the last look: the next file is the one rotated
	// after cur, or the current file when cur was the last rotated. When cur was removed already
	// (the reader fell behind by maxFiles rotations) the oldest one left is next.
	for range 100 {
		rotated, err := RotatedFiles(r.path)
		if err != nil {
			return nil, err
		}
		names := append(rotated, r.path)
		next := names[0]
		for i, name := range rotated {
			if fi, err := os.Stat(name); err == nil && os.SameFile(fi, curInfo) {
				next = names[i+1]
				break
			}
		}
		f, err := os.Open(next)
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil // between a rename and the new file: look again at the next poll
		} else if err != nil || next != r.path {
			return f, err // a rotated file's name stays with its content
		}
		// The current file may have been rotated between the listing and the open, and then f is
		// a later file: take it only if cur is still the last rotated one.
		if rotated, err = RotatedFiles(r.path); err != nil {
			f.Close()
			return nil, err
		}
		if len(rotated) > 0 {
			if fi, err := os.Stat(rotated[len(rotated)-1]); err == nil && os.SameFile(fi, curInfo) {
				return f, nil
			}
		}
		f.Close()
	}
	return nil, nil // rotating faster than it can be listed: look again at the next poll
}

// readFile decodes f from where it was left to its end.
func (r *reader) readFile(f *os.File) error {
	if r.in == nil {
		r.in = bufio.NewReaderSize(f, 64<<10)
	}
	r.in.Reset(f)
	for {
		b, err := r.in.ReadSlice('\n')
		r.busy = r.busy || len(b) > 0
		switch {
		case err == nil:
			if err := r.record(b[:len(b)-1]); err != nil {
				return err
			}
		case errors.Is(err, bufio.ErrBufferFull):
			// Longer than any record: a raw line from an older mqlet. It goes out as it is.
			if err := r.rawPiece(b); err != nil {
				return err
			}
		case errors.Is(err, io.EOF):
			r.carry = append(r.carry, b...)
			return nil
		default:
			return err
		}
	}
}

// endFile treats what is left of the file without a newline as its last record. When that is not
// a CRI record, it goes out as it is, without a newline it never had.
func (r *reader) endFile() {
	rec, raw := r.carry, r.raw
	r.carry, r.raw = nil, false
	if len(rec) == 0 {
		return
	}
	if _, err := Parse(rec); err != nil || raw {
		if raw || r.o.Since.IsZero() {
			r.out.Write(rec)
		}
		return
	}
	r.record(rec)
}

func (r *reader) rawPiece(b []byte) error {
	if !r.raw {
		b = append(r.carry, b...)
		r.carry, r.raw = r.carry[:0], true
	}
	_, err := r.out.Write(b)
	return err
}

// record writes one record (without its newline).
func (r *reader) record(rec []byte) error {
	if len(r.carry) > 0 {
		rec = append(r.carry, rec...)
		r.carry = r.carry[:0]
	}
	if r.raw {
		r.raw = false
		r.out.Write(rec)
		return r.out.WriteByte('\n')
	}
	e, err := Parse(rec)
	if err != nil {
		if !r.o.Since.IsZero() {
			return nil // no time to compare with
		}
		r.out.Write(rec)
		return r.out.WriteByte('\n')
	}
	if !r.inLine[e.Stream] {
		r.skip[e.Stream] = !r.o.Since.IsZero() && e.Time.Before(r.o.Since)
		if !r.skip[e.Stream] && r.o.Timestamps {
			r.out.Write(e.Time.AppendFormat(nil, time.RFC3339Nano))
			r.out.WriteByte(' ')
		}
	}
	r.inLine[e.Stream] = e.Partial
	if r.skip[e.Stream] {
		return nil
	}
	r.out.Write(e.Content)
	if !e.Partial {
		return r.out.WriteByte('\n')
	}
	return nil
}

func (r *reader) flush() error {
	if err := r.out.Flush(); err != nil {
		return err
	}
	switch f := r.flushTo.(type) {
	case interface{ Flush() error }:
		return f.Flush()
	case interface{ Flush() }:
		f.Flush()
	}
	return nil
}

// tailBlock is how much is read at a time when looking for the last lines from the end.
const tailBlock = 32 << 10

// headLen is enough of a record to read its timestamp, stream and tag.
const headLen = 64

// tailStart finds where the last n lines of files (oldest first, read up to ends) begin: the index
// of the file and the offset in it. A line is a run of P records ended by an F record; a line still
// going on at the end (P records only) counts as one, as does each raw line.
func tailStart(files []*os.File, ends []int64, n int64) (int, int64, error) {
	last := len(files) - 1
	if n == 0 {
		return last, ends[last], nil
	}
	lines, first := int64(0), true
	for i := last; i >= 0; i-- {
		prev, found := ends[i], false
		err := scanBack(files[i], ends[i], func(start int64, head []byte) bool {
			partial := isPartial(head)
			if first {
				first = false
				if partial {
					lines, prev = 1, start
					return true
				}
			}
			if !partial {
				if lines == n {
					found = true
					return false
				}
				lines++
			}
			prev = start
			return true
		})
		if err != nil {
			return 0, 0, err
		}
		if found {
			return i, prev, nil
		}
	}
	return 0, 0, nil
}

// isPartial reports whether a record's head is that of a P record.
func isPartial(head []byte) bool {
	ts, rest, ok := bytes.Cut(head, []byte{' '})
	if !ok {
		return false
	}
	stream, rest, ok := bytes.Cut(rest, []byte{' '})
	if !ok || (string(stream) != Stdout && string(stream) != Stderr) || len(rest) < 2 || rest[0] != 'P' || (rest[1] != ' ' && rest[1] != '\n') {
		return false
	}
	_, err := time.Parse(time.RFC3339Nano, string(ts))
	return err == nil
}

// scanBack calls fn with the start offset and head of each record of f that ends before end, from
// the last to the first, until fn returns false.
func scanBack(f *os.File, end int64, fn func(start int64, head []byte) bool) error {
	if end <= 0 {
		return nil
	}
	buf := make([]byte, min(tailBlock, end))
	hb := make([]byte, headLen)
	var bpos int64 // offset of buf's block in f
	var b []byte
	head := func(start int64) ([]byte, error) {
		if i := start - bpos; i >= 0 && i+headLen <= int64(len(b)) {
			return b[i : i+headLen], nil
		}
		h := hb[:min(headLen, end-start)]
		_, err := f.ReadAt(h, start)
		return h, err
	}
	for pos := end; pos > 0; {
		size := min(int64(len(buf)), pos)
		pos -= size
		b, bpos = buf[:size], pos
		if _, err := f.ReadAt(b, pos); err != nil {
			return err
		}
		for i := len(b); ; {
			if i = bytes.LastIndexByte(b[:i], '\n'); i < 0 {
				break
			}
			start := pos + int64(i) + 1
			if start == end {
				continue // the newline that ends the last record starts none
			}
			h, err := head(start)
			if err != nil {
				return err
			}
			if !fn(start, h) {
				return nil
			}
		}
	}
	h, err := head(0)
	if err != nil {
		return err
	}
	fn(0, h)
	return nil
}
