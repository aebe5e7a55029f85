// Package startbackoff spaces out the restarts of an agent that cannot start. systemd restarts
// the unit a fixed RestartSec after each exit; its own growing delay (RestartSteps,
// RestartMaxDelaySec) needs systemd 254, and Debian 12 and Raspberry Pi OS bookworm ship 252. So
// the agent counts its consecutive failed starts in a small file that outlives each process but
// not a reboot (under /run, a tmpfs), and after a failed start waits Delay(count) before it exits:
// systemd's RestartSec adds to that wait.
package startbackoff

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mqlet/mqlet/internal/atomicfile"
)

const (
	// First is the wait after the second failure in a row. The first failure gets none: one
	// failure is often passing (containerd restarted in the same transaction, a boot race), and
	// the unit's RestartSec already spaces the retry.
	First = 5 * time.Second
	// Max caps the wait: a problem fixed without an operator (containerd back, a disk freed, a
	// config pushed by configuration management) is picked up within Max plus RestartSec. It is
	// kept well below the unit's TimeoutStartSec (10 min), which the wait extends anyway.
	Max = 5 * time.Minute
)

// Delay is how long the agent waits after its failures-th consecutive failed start before it
// exits: nothing after the first, then First doubling up to Max (5 s, 10 s, 20 s, 40 s, 80 s,
// 160 s, then 5 min from the 8th on).
func Delay(failures int) time.Duration {
	if failures < 2 {
		return 0
	}
	d := First
	for i := 2; i < failures && d < Max; i++ {
		d *= 2
	}
	return min(d, Max)
}

// FileName is the counter's file in its directory.
const FileName = "start-failures"

// defaultDir is where the counter lives unless systemd names a runtime directory: beside the
// agent's default API socket, in /run (a tmpfs, so a reboot starts the count again).
const defaultDir = "/run/mqlet"

// Path is the counter file: in $RUNTIME_DIRECTORY (the first of its directories) when systemd
// sets it for a unit with RuntimeDirectory=, otherwise in /run/mqlet.
func Path(getenv func(string) string) string {
	dir := defaultDir
	if rd, _, _ := strings.Cut(getenv("RUNTIME_DIRECTORY"), ":"); rd != "" {
		dir = rd
	}
	return filepath.Join(dir, FileName)
}

// Counter is the count of consecutive failed starts, kept in the file at Path.
type Counter struct {
	Path string
}

// Failed records one more failed start and returns the new count. When the file cannot be read it
// counts from 0; when it cannot be written the count is still returned: the caller waits by it,
// and the next start sees the old count. The error says which went wrong; it is for a warning,
// never a reason to fail.
func (c Counter) Failed() (int, error) {
	n, readErr := c.read()
	n++
	var writeErr error
	if err := os.MkdirAll(filepath.Dir(c.Path), 0o755); err != nil {
		writeErr = fmt.Errorf("record failed start %d: %w", n, err)
	} else if err := atomicfile.Write(c.Path, []byte(strconv.Itoa(n)+"\n"), 0o644); err != nil {
		writeErr = fmt.Errorf("record failed start %d in %s: %w", n, c.Path, err)
	}
	return n, errors.Join(readErr, writeErr)
}

// Reset forgets the failed starts: the agent started, or an operator stopped it.
func (c Counter) Reset() error {
	if err := os.Remove(c.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("reset the count of failed starts: %w", err)
	}
	return nil
}

// read returns the stored count; 0 when there is none or it cannot be read.
func (c Counter) read() (int, error) {
	b, err := os.ReadFile(c.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the count of failed starts: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("count of failed starts in %s is %q, not a number: counting from 0", c.Path, strings.TrimSpace(string(b)))
	}
	// A bound far above where Delay stops growing, so the count never overflows.
	return min(n, 1<<20), nil
}
