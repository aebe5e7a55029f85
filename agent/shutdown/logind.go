//go:build !nologind

package shutdown

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/godbus/dbus/v5"
	"golang.org/x/sys/unix"
)

// systemd-logind's and systemd's D-Bus names (see org.freedesktop.login1(5)).
const (
	logindService   = "org.freedesktop.login1"
	logindPath      = dbus.ObjectPath("/org/freedesktop/login1")
	logindInterface = "org.freedesktop.login1.Manager"
	systemdService  = "org.freedesktop.systemd1"
	systemdPath     = dbus.ObjectPath("/org/freedesktop/systemd1")
	systemdManager  = "org.freedesktop.systemd1.Manager"
)

// dropInName is the logind drop-in mqlet writes (LogindDropIn).
const dropInName = LogindDropIn

// How long to wait for logind to show a raised InhibitDelayMaxUSec after it was told to reload
// (the reload is a SIGHUP: it happens after the call returns).
const (
	reloadWait = 2 * time.Second
	reloadPoll = 100 * time.Millisecond
)

// busSignal is what the bus delivers on logind.signals.
type busSignal = dbus.Signal

// logind follows systemd-logind over the system bus the way its inhibitor-lock protocol asks
// (https://systemd.io/INHIBITOR_LOCKS/): hold a "delay" lock on shutdown; on
// PrepareForShutdown(true) do the work, then close the lock's file descriptor to let the shutdown
// go on; on PrepareForShutdown(false) take a new lock.
type logind struct {
	conn *dbus.Conn
	log  *slog.Logger
	lock int // the inhibitor lock's fd; -1 when none is held
	// signals carries PrepareForShutdown; closed when the connection is.
	signals chan *busSignal
}

// connectLogind connects to the bus at address (empty: the system bus), makes sure logind will
// wait long enough for a shutdown of grace, takes the inhibitor lock and subscribes to
// PrepareForShutdown. The connection ends with ctx.
func connectLogind(ctx context.Context, address string, grace time.Duration, confDir string, log *slog.Logger) (*logind, error) {
	var conn *dbus.Conn
	var err error
	if address == "" {
		conn, err = dbus.ConnectSystemBus(dbus.WithContext(ctx))
	} else {
		conn, err = dbus.Connect(address, dbus.WithContext(ctx))
	}
	if err != nil {
		return nil, fmt.Errorf("connect to the system bus: %w", err)
	}
	l := &logind{conn: conn, log: log, lock: -1}
	if err := l.setUp(grace, confDir); err != nil {
		conn.Close()
		return nil, err
	}
	return l, nil
}

func (l *logind) setUp(grace time.Duration, confDir string) error {
	delay, err := l.inhibitDelay()
	if err != nil {
		return err
	}
	if delay < grace {
		delay = l.raiseInhibitDelay(grace, delay, confDir)
	}
	if delay < grace {
		l.log.Warn("systemd-logind will not wait for the whole shutdownGracePeriod: pods may be killed by the shutdown before they stop; "+
			"set InhibitDelayMaxSec in /etc/systemd/logind.conf to at least shutdownGracePeriod",
			"InhibitDelayMaxSec", delay, "shutdownGracePeriod", grace)
	}
	if err := l.inhibit(); err != nil {
		return err
	}
	if err := l.conn.AddMatchSignal(dbus.WithMatchObjectPath(logindPath), dbus.WithMatchInterface(logindInterface),
		dbus.WithMatchMember("PrepareForShutdown")); err != nil {
		l.release()
		return fmt.Errorf("subscribe to logind's PrepareForShutdown: %w", err)
	}
	l.signals = make(chan *dbus.Signal, 8)
	l.conn.Signal(l.signals)
	l.log.Info("holding a systemd-logind delay inhibitor lock for shutdown", "InhibitDelayMaxSec", delay)
	return nil
}

// inhibitDelay is logind's InhibitDelayMaxUSec: the longest a delay lock holds a shutdown back.
func (l *logind) inhibitDelay() (time.Duration, error) {
	v, err := l.conn.Object(logindService, logindPath).GetProperty(logindInterface + ".InhibitDelayMaxUSec")
	if err != nil {
		return 0, fmt.Errorf("read logind's InhibitDelayMaxUSec: %w", err)
	}
	us, ok := v.Value().(uint64)
	if !ok {
		return 0, fmt.Errorf("logind's InhibitDelayMaxUSec is a %s, not a uint64", v.Signature())
	}
	return time.Duration(us) * time.Microsecond, nil
}

// raiseInhibitDelay does what kubelet does when logind would not wait for the whole grace period:
// writes a logind drop-in with InhibitDelayMaxSec set to it and has systemd send logind SIGHUP to
// reload. It returns the delay logind shows afterwards (the old one when that failed, with a
// warning).
func (l *logind) raiseInhibitDelay(grace, delay time.Duration, confDir string) time.Duration {
	path := filepath.Join(confDir, dropInName)
	content := fmt.Sprintf(LogindDropInMark+": systemd-logind waits this long for mqlet to stop pods at a shutdown (shutdownGracePeriod).\n[Login]\nInhibitDelayMaxSec=%d\n",
		int64((grace+time.Second-1)/time.Second))
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		l.log.Warn("cannot raise logind's InhibitDelayMaxSec", "dir", confDir, "err", err)
		return delay
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		l.log.Warn("cannot raise logind's InhibitDelayMaxSec", "file", path, "err", err)
		return delay
	}
	call := l.conn.Object(systemdService, systemdPath).Call(systemdManager+".KillUnit", 0, "systemd-logind.service", "all", int32(unix.SIGHUP))
	if call.Err != nil {
		l.log.Warn("wrote logind's InhibitDelayMaxSec but could not make logind reload it", "file", path, "err", call.Err)
		return delay
	}
	l.log.Info("raised logind's InhibitDelayMaxSec to shutdownGracePeriod", "file", path, "was", delay, "want", grace)
	deadline := time.Now().Add(reloadWait)
	for {
		now, err := l.inhibitDelay()
		if err == nil && now >= grace || time.Now().After(deadline) {
			if err != nil {
				return delay
			}
			return now
		}
		time.Sleep(reloadPoll)
	}
}

// inhibit takes a delay lock on shutdown, replacing the one held.
func (l *logind) inhibit() error {
	var fd dbus.UnixFD
	err := l.conn.Object(logindService, logindPath).Call(logindInterface+".Inhibit", 0,
		"shutdown", "mqlet", "mqlet stops pods gracefully before the node shuts down", "delay").Store(&fd)
	if err != nil {
		return fmt.Errorf("take a shutdown inhibitor lock from logind: %w", err)
	}
	l.release()
	l.lock = int(fd)
	return nil
}

// release closes the lock's fd, which lets a pending shutdown go on.
func (l *logind) release() {
	if l.lock < 0 {
		return
	}
	if err := unix.Close(l.lock); err != nil {
		l.log.Warn("release the shutdown inhibitor lock", "err", err)
	}
	l.lock = -1
}

// close releases the lock and ends the connection (which closes signals).
func (l *logind) close() {
	l.release()
	l.conn.Close()
}

// prepareForShutdown reads a PrepareForShutdown signal: true when the shutdown begins, false when
// it was called off; an error for a signal that is not one.
func prepareForShutdown(s *dbus.Signal) (bool, error) {
	if s == nil || s.Name != logindInterface+".PrepareForShutdown" || len(s.Body) == 0 {
		return false, errors.New("not a PrepareForShutdown signal")
	}
	active, ok := s.Body[0].(bool)
	if !ok {
		return false, fmt.Errorf("PrepareForShutdown carries a %T, not a bool", s.Body[0])
	}
	return active, nil
}
