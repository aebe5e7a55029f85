package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/mqlet/mqlet/internal/sdnotify"
	"github.com/mqlet/mqlet/internal/startbackoff"
)

// startBackoff makes the restarts of an agent that cannot start (a bad config, containerd down, a
// state dir it cannot write) grow apart under systemd of any version: after a failed start the
// agent waits startbackoff.Delay(consecutive failures) before it exits, and the unit's fixed
// RestartSec comes on top. The wait is after the attempt, never before one: an operator who fixes
// the cause and runs `systemctl restart mqlet` gets an attempt at once. A stop (SIGTERM, SIGINT)
// ends the wait at once and forgets the count, as systemd forgets its own restart counter on a
// manual stop: the operator's next start that fails again answers at once instead of holding
// `systemctl start` for minutes. Only under systemd ($NOTIFY_SOCKET): run by hand, the agent
// prints its error and exits at once, and other supervisors have their own back-off.
type startBackoff struct {
	counter startbackoff.Counter
	notify  *sdnotify.Notifier // nil when $NOTIFY_SOCKET is unusable: the wait holds without it
}

// newStartBackoff returns nil (no back-off) outside systemd.
func newStartBackoff(getenv func(string) string) *startBackoff {
	if getenv("NOTIFY_SOCKET") == "" {
		return nil
	}
	// A bad $NOTIFY_SOCKET only costs the STATUS line; the node warns about it once it is built.
	n, _ := sdnotify.New(getenv)
	return &startBackoff{counter: startbackoff.Counter{Path: startbackoff.Path(getenv)}, notify: n}
}

// ready forgets the failed starts: the agent told systemd READY=1.
func (b *startBackoff) ready(log *slog.Logger) {
	if b != nil {
		b.forget(log)
	}
}

func (b *startBackoff) forget(log *slog.Logger) {
	if err := b.counter.Reset(); err != nil {
		log.Warn("the next failed start may wait longer than it should", "err", err)
	}
}

// failed counts a failed start, logs it with its attempt number and wait, and waits, unless ctx
// (the agent's SIGTERM/SIGINT) ends first. A file that cannot be kept is a warning, not a failure
// of its own.
func (b *startBackoff) failed(ctx context.Context, log *slog.Logger, startErr error) {
	if b == nil {
		return
	}
	if ctx.Err() != nil { // stopped during the attempt itself
		b.forget(log)
		return
	}
	n, err := b.counter.Failed()
	if err != nil {
		log.Warn("cannot keep the count of failed starts; the wait after this one may be shorter than it should", "file", b.counter.Path, "err", err)
	}
	wait := startbackoff.Delay(n)
	log.Error("mqlet agent failed to start; systemd restarts it after this wait and its RestartSec",
		"attempt", n, "wait", wait, "err", startErr)
	status := fmt.Sprintf("STATUS=start failed (attempt %d, next after %s and RestartSec): %s", n, wait, firstLine(startErr.Error()))
	if wait > 0 {
		// The wait must not run into TimeoutStartSec (the unit is still starting while it lasts).
		status = fmt.Sprintf("EXTEND_TIMEOUT_USEC=%d\n%s", (wait + 30*time.Second).Microseconds(), status)
	}
	if err := b.notify.Notify(status); err != nil {
		log.Warn("cannot tell systemd why the start failed", "err", err)
	}
	if wait == 0 {
		return
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		log.Info("start back-off over; exiting for systemd to restart the agent", "attempt", n)
	case <-ctx.Done():
		log.Info("stopped while waiting after a failed start; the count of failed starts starts again", "attempt", n)
		b.forget(log)
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
