//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package store

import (
	"errors"
	"os"
	"syscall"
	"time"
)

var errLockTimeout = errors.New("timeout")

// lockShared takes a shared flock on f, as bbolt's read-only mode does, so that it excludes an
// agent holding bbolt's exclusive lock. Closing f releases it.
func lockShared(f *os.File, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return err
		}
		if time.Now().After(deadline) {
			return errLockTimeout
		}
		time.Sleep(50 * time.Millisecond)
	}
}
