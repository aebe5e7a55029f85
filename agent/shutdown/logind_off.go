//go:build nologind

package shutdown

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Built with -tags nologind, mqlet leaves the D-Bus client out (about 0.39 MB of binary) and
// follows only the shutdown signal: for devices without systemd, where there is no logind to ask.

type busSignal struct{}

type logind struct{ signals chan *busSignal }

func connectLogind(context.Context, string, time.Duration, string, *slog.Logger) (*logind, error) {
	return nil, errors.New("built without systemd-logind support (-tags nologind)")
}

func (l *logind) inhibit() error { return nil }
func (l *logind) release()       {}
func (l *logind) close()         {}

func prepareForShutdown(*busSignal) (bool, error) { return false, errors.New("no logind") }
