//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package store

import (
	"errors"
	"os"
	"time"
)

var errLockTimeout = errors.New("timeout")

// lockShared is a no-op where flock is unavailable; bolt.Open still takes its own lock.
func lockShared(*os.File, time.Duration) error { return nil }
