package logs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestRecordRoundTrip(t *testing.T) {
	at := time.Date(2026, 3, 14, 9, 26, 53, 123456789, time.UTC)
	for _, tc := range []struct {
		stream  string
		partial bool
		content string
	}{{Stdout, false, "hello world"}, {Stderr, true, "piece"}, {Stdout, false, ""}, {Stdout, false, "a P b F"}} {
		rec := appendRecord(nil, at, tc.stream, tc.partial, []byte(tc.content))
		if rec[len(rec)-1] != '\n' {
			t.Fatalf("%q: no newline", rec)
		}
		e, err := Parse(rec[:len(rec)-1])
		if err != nil {
			t.Fatalf("%q: %v", rec, err)
		}
		if !e.Time.Equal(at) || e.Stream != tc.stream || e.Partial != tc.partial || string(e.Content) != tc.content {
			t.Errorf("%q parsed as %+v", rec, e)
		}
	}
	want := "2026-03-14T09:26:53.123456789Z stdout F hello world\n"
	if got := string(appendRecord(nil, at, Stdout, false, []byte("hello world"))); got != want {
		t.Errorf("record %q, want %q", got, want)
	}
	for _, bad := range []string{"hello", "2026-03-14T09:26:53Z stdin F x", "2026-03-14T09:26:53Z stdout X x", "yesterday stdout F x"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

// writerAt returns a Writer whose clock moves a microsecond per record, so rotated names differ.
func writerAt(t *testing.T, path string, maxSize int64, maxFiles int) *Writer {
	t.Helper()
	w, err := OpenWriter(path, maxSize, maxFiles)
	if err != nil {
		t.Fatal(err)
	}
	var tick atomic.Int64
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	w.now = func() time.Time { return base.Add(time.Duration(tick.Add(1)) * time.Microsecond) }
	t.Cleanup(func() { w.Close() })
	return w
}

func readAll(t *testing.T, path string, o ReadOptions) string {
	t.Helper()
	var b bytes.Buffer
	if err := Read(context.Background(), path, o, &b); err != nil {
		t.Fatalf("Read %s: %v", path, err)
	}
	return b.String()
}

func TestStreamCutsLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	w := writerAt(t, path, 0, 5)
	out, errs := NewStream(w, Stdout), NewStream(w, Stderr)
	long := strings.Repeat("x", MaxLineSize*2+10)
	exact := strings.Repeat("y", MaxLineSize)
	out.Write([]byte("one\ntw"))
	errs.Write([]byte("oops\r\n"))
	out.Write([]byte("o\r\n\n" + long + "\n" + exact + "\nlast words"))
	out.Close()

	raw, _ := os.ReadFile(path)
	var tags []string
	for _, rec := range strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n") {
		e, err := Parse([]byte(rec))
		if err != nil {
			t.Fatal(err)
		}
		tag := "F"
		if e.Partial {
			tag = "P"
		}
		tags = append(tags, fmt.Sprintf("%s:%s:%d", e.Stream, tag, len(e.Content)))
	}
	want := []string{"stdout:F:3", "stderr:F:4", "stdout:F:3", "stdout:F:0",
		"stdout:P:16384", "stdout:P:16384", "stdout:F:10", "stdout:F:16384", "stdout:P:10"}
	if strings.Join(tags, " ") != strings.Join(want, " ") {
		t.Errorf("records\n got %v\nwant %v", tags, want)
	}
	got := readAll(t, path, ReadOptions{Tail: All})
	if wantText := "one\noops\ntwo\n\n" + long + "\n" + exact + "\nlast words"; got != wantText {
		t.Errorf("read back %d bytes, want %d:\n%.200q", len(got), len(wantText), got)
	}
}

// numbered reads back lines "line-N" and checks they run from first to last with no gap.
func numbered(t *testing.T, text string, first, last int) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if len(lines) != last-first+1 {
		t.Fatalf("%d lines, want %d (%d..%d); starts %q, ends %q", len(lines), last-first+1, first, last, lines[0], lines[len(lines)-1])
	}
	for i, l := range lines {
		if l != "line-"+strconv.Itoa(first+i) {
			t.Fatalf("line %d is %q, want line-%d", i, l, first+i)
		}
	}
}

func TestRotationKeepsMaxFilesAndContiguousLines(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "3.log")
	const maxSize, maxFiles, n = 4 << 10, 3, 2000
	w := writerAt(t, path, maxSize, maxFiles)
	s := NewStream(w, Stdout)
	for i := range n {
		// Uneven writes, so lines are cut between reads as a pipe cuts them.
		s.Write([]byte(fmt.Sprintf("line-%d\n", i)))
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) != maxFiles {
		t.Fatalf("%d files, want %d: %v", len(files), maxFiles, files)
	}
	rotated, err := RotatedFiles(path)
	if err != nil || len(rotated) != maxFiles-1 {
		t.Fatalf("rotated %v, %v", rotated, err)
	}
	for _, f := range append(rotated, path) {
		if fi, _ := os.Stat(f); fi.Size() > maxSize {
			t.Errorf("%s is %d bytes, over %d", f, fi.Size(), maxSize)
		}
	}
	text := readAll(t, path, ReadOptions{Tail: All})
	first, _ := strconv.Atoi(strings.TrimPrefix(strings.SplitN(text, "\n", 2)[0], "line-"))
	if first == 0 {
		t.Fatalf("nothing was rotated away: %d bytes", len(text))
	}
	numbered(t, text, first, n-1)
}

func TestFastWriterFollowedAcrossRotations(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	const n = 100000
	// Enough files that the follower cannot fall behind by all of them; the file size is small so
	// that it rotates often (about 170 times) while the follower reads.
	w := writerAt(t, path, 64<<10, 1000)
	var wrote atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s := NewStream(w, Stdout)
		var batch []byte
		for i := range n {
			batch = fmt.Appendf(batch, "line-%d\n", i)
			if len(batch) > 3000 || i == n-1 {
				// Cut the batch at an odd place, as a pipe does.
				cut := len(batch) / 3
				s.Write(batch[:cut])
				s.Write(batch[cut:])
				batch = batch[:0]
			}
		}
		wrote.Store(true)
	}()
	var out bytes.Buffer
	rotations := 0
	err := Read(context.Background(), path, ReadOptions{Tail: All, Follow: true, Poll: time.Millisecond, Idle: func() error {
		if wrote.Load() {
			return ErrEnded
		}
		return nil
	}}, &out)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	rotated, _ := RotatedFiles(path)
	rotations = len(rotated)
	if rotations < 10 {
		t.Fatalf("only %d rotations: the test does not test rotation", rotations)
	}
	numbered(t, readAll(t, path, ReadOptions{Tail: All}), 0, n-1)
	numbered(t, out.String(), 0, n-1)
}

func TestTailSinceTimestamps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	w := writerAt(t, path, 600, 10)
	s := NewStream(w, Stdout)
	for i := range 50 {
		s.Write([]byte(fmt.Sprintf("line-%d\n", i)))
	}
	long := strings.Repeat("z", MaxLineSize+5) // two records, one line
	s.Write([]byte(long + "\nline-after\nno newline yet"))
	s.Close() // the stream ends without a newline: its last bytes become a P record
	if r, _ := RotatedFiles(path); len(r) < 3 {
		t.Fatalf("want several files, got %v", r)
	}
	for _, tc := range []struct {
		tail int64
		want string
	}{
		{0, ""},
		{1, "no newline yet"},
		{2, "line-after\nno newline yet"},
		{3, long + "\nline-after\nno newline yet"},
		{5, "line-48\nline-49\n" + long + "\nline-after\nno newline yet"},
	} {
		if got := readAll(t, path, ReadOptions{Tail: tc.tail}); got != tc.want {
			t.Errorf("tail %d: got %.80q, want %.80q", tc.tail, got, tc.want)
		}
	}
	all := readAll(t, path, ReadOptions{Tail: All})
	if !strings.HasPrefix(all, "line-0\nline-1\n") || strings.Count(all, "\n") != 52 {
		t.Errorf("whole log: %.100q... (%d lines)", all, strings.Count(all, "\n"))
	}
	if got := readAll(t, path, ReadOptions{Tail: 1000}); got != all {
		t.Errorf("tail beyond the log is not the whole log")
	}

	since := readAll(t, path, ReadOptions{Tail: All, Since: recordTime(t, path, "line-40")})
	if !strings.HasPrefix(since, "line-40\n") || strings.Count(since, "\n") != 12 {
		t.Errorf("since: %.100q", since)
	}
	stamped := readAll(t, path, ReadOptions{Tail: 2, Timestamps: true})
	want := recordTime(t, path, "line-after").Format(time.RFC3339Nano) + " line-after\n" +
		recordTime(t, path, "no newline yet").Format(time.RFC3339Nano) + " no newline yet"
	if stamped != want {
		t.Errorf("timestamps: %.120q, want %.120q", stamped, want)
	}
}

// recordTime finds the time of the record holding content in the log at path or its rotated files.
func recordTime(t *testing.T, path, content string) time.Time {
	t.Helper()
	rotated, _ := RotatedFiles(path)
	for _, f := range append(rotated, path) {
		b, _ := os.ReadFile(f)
		for _, rec := range strings.Split(string(b), "\n") {
			if e, err := Parse([]byte(rec)); err == nil && string(e.Content) == content {
				return e.Time
			}
		}
	}
	t.Fatalf("no record %q", content)
	return time.Time{}
}

func TestReadsRawLogsOfOlderMqlet(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	long := strings.Repeat("r", 100<<10) // longer than the reader's buffer
	os.WriteFile(path, []byte("one\ntwo words\n"+long+"\nlast"), 0o640)
	if got := readAll(t, path, ReadOptions{Tail: All}); got != "one\ntwo words\n"+long+"\nlast" {
		t.Errorf("raw log read as %.60q", got)
	}
	if got := readAll(t, path, ReadOptions{Tail: 2}); got != long+"\nlast" {
		t.Errorf("raw tail 2: %.60q", got)
	}
}

func TestRemoveTakesRotatedFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "1.log")
	w := writerAt(t, path, 100, 5)
	s := NewStream(w, Stdout)
	for i := range 20 {
		s.Write([]byte(fmt.Sprintf("line-%d\n", i)))
	}
	other := filepath.Join(dir, "11.log")
	os.WriteFile(other, nil, 0o640)
	if err := Remove(path); err != nil {
		t.Fatal(err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(left) != 1 || left[0] != other {
		t.Errorf("left after Remove: %v", left)
	}
}
