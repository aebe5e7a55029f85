package logs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// rotatedSuffix is the UTC time a file was rotated at, appended to its name: kubelet's
// "20060102-150405" plus nanoseconds, since a writer that floods its output can fill a small
// file more than once a second. The width is fixed, so names sort in rotation order.
const rotatedSuffix = "20060102-150405.000000000"

// Writer appends records to a container attempt's log file and rotates it by size. It is safe
// for the two streams of a container to write at once; a record is never split across files.
type Writer struct {
	path     string
	maxSize  int64
	maxFiles int
	now      func() time.Time

	mu   sync.Mutex
	f    *os.File
	size int64
	buf  []byte // records formatted, not yet written; only while mu is held
}

// OpenWriter opens (appending) or creates the log file at path. A file reaching maxSize bytes is
// rotated; at most maxFiles files stay, the current one included (maxFiles < 2 counts as 2, as
// kubelet requires; maxSize <= 0 never rotates).
func OpenWriter(path string, maxSize int64, maxFiles int) (*Writer, error) {
	w := &Writer{path: path, maxSize: maxSize, maxFiles: max(maxFiles, 2), now: time.Now}
	if err := w.open(); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *Writer) open() error {
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("open log file: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("open log file: %w", err)
	}
	w.f, w.size = f, fi.Size()
	return nil
}

// batchFlush is how many formatted bytes a write gathers before it goes to the file.
const batchFlush = 64 << 10

// write formats records through add and writes them, rotating between records as needed.
func (w *Writer) write(add func(buf []byte, flush func([]byte) []byte) []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return errors.New("log file closed")
	}
	var err error
	flush := func(b []byte) []byte {
		if len(b) < batchFlush {
			return b
		}
		err = errors.Join(err, w.flushLocked(b))
		return b[:0]
	}
	w.buf = add(w.buf[:0], flush)
	err = errors.Join(err, w.flushLocked(w.buf))
	if cap(w.buf) > 2*batchFlush {
		w.buf = nil // a burst of tiny lines must not pin a large buffer
	}
	return err
}

// WriteRecord appends one record stamped now.
func (w *Writer) WriteRecord(stream string, partial bool, content []byte) error {
	return w.write(func(buf []byte, _ func([]byte) []byte) []byte {
		return appendRecord(buf, w.now(), stream, partial, content)
	})
}

// flushLocked writes whole records from b, rotating before the file would pass maxSize.
func (w *Writer) flushLocked(b []byte) error {
	for len(b) > 0 {
		room := w.maxSize - w.size
		if w.maxSize <= 0 || int64(len(b)) <= room {
			return w.writeLocked(b)
		}
		cut := 0
		if room > 0 {
			cut = bytes.LastIndexByte(b[:room], '\n') + 1
		}
		if cut == 0 && w.size == 0 {
			// A record larger than a whole file (maxSize below MaxLineSize): it goes alone.
			cut = bytes.IndexByte(b, '\n') + 1
			if cut == 0 {
				cut = len(b)
			}
		}
		if cut > 0 {
			if err := w.writeLocked(b[:cut]); err != nil {
				return err
			}
			b = b[cut:]
		}
		if err := w.rotateLocked(); err != nil {
			// Keep writing to the current file: a lost rotation costs disk, a lost line is gone.
			err2 := w.writeLocked(b)
			return errors.Join(err, err2)
		}
	}
	return nil
}

func (w *Writer) writeLocked(b []byte) error {
	n, err := w.f.Write(b)
	w.size += int64(n)
	if err != nil {
		return fmt.Errorf("write log file %s: %w", w.path, err)
	}
	return nil
}

// rotateLocked renames the current file aside, starts a new one and removes the oldest rotated
// files beyond maxFiles. Readers following the old file see the rename and move on to the new one
// after reading what the old one holds (Read).
func (w *Writer) rotateLocked() error {
	rotated := w.path + "." + w.now().UTC().Format(rotatedSuffix)
	if _, err := os.Lstat(rotated); err == nil {
		return fmt.Errorf("rotate log file %s: %s exists", w.path, rotated)
	}
	if err := os.Rename(w.path, rotated); err != nil {
		return fmt.Errorf("rotate log file: %w", err)
	}
	old := w.f
	if err := w.open(); err != nil {
		// Put the file back, so the container's output keeps a home.
		os.Rename(rotated, w.path)
		return err
	}
	old.Close()
	return w.pruneLocked()
}

// pruneLocked removes the oldest rotated files so that maxFiles stay with the current one.
func (w *Writer) pruneLocked() error {
	files, err := RotatedFiles(w.path)
	if err != nil {
		return err
	}
	var errs []error
	for len(files) > w.maxFiles-1 {
		if err := os.Remove(files[0]); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		files = files[1:]
	}
	return errors.Join(errs...)
}

// Close closes the file; later writes fail.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}

// RotatedFiles lists the rotated files of the log at path, oldest first.
func RotatedFiles(path string) ([]string, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list rotated logs of %s: %w", path, err)
	}
	var out []string
	for _, e := range ents {
		suffix, ok := strings.CutPrefix(e.Name(), base+".")
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if _, err := time.Parse(rotatedSuffix, suffix); err != nil {
			continue
		}
		out = append(out, filepath.Join(dir, e.Name()))
	}
	sort.Strings(out)
	return out, nil
}

// Remove deletes the log at path and its rotated files; missing ones are fine.
func Remove(path string) error {
	files, err := RotatedFiles(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	errs := []error{err}
	for _, f := range append(files, path) {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
