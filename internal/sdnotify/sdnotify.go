// Package sdnotify tells systemd about the agent's state over $NOTIFY_SOCKET (sd_notify(3)): READY=1
// once it serves, WATCHDOG=1 while its main loop goes round, STOPPING=1 on the way out. It is the
// protocol alone (one datagram per message on a unix socket), so the binary stays free of cgo and
// of libsystemd; under any other service manager, or run by hand, there is no socket and every call
// does nothing.
package sdnotify

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Notifier sends state messages to the service manager. The zero value and a nil *Notifier send
// nothing.
type Notifier struct {
	addr *net.UnixAddr
}

// Environment variables systemd sets for a Type=notify service (systemd.exec(5)).
const (
	envSocket      = "NOTIFY_SOCKET"
	envWatchdogUS  = "WATCHDOG_USEC"
	envWatchdogPID = "WATCHDOG_PID"
)

// Env is the set of variables New and Watchdog read, for callers that hand them on to children:
// none of them is meant for a process the agent starts.
var Env = []string{envSocket, envWatchdogUS, envWatchdogPID}

// New returns the notifier for $NOTIFY_SOCKET as getenv reads it; nil when it is unset (not run by
// systemd as Type=notify). A name starting with '@' is an abstract socket, as sd_notify reads it.
func New(getenv func(string) string) (*Notifier, error) {
	path := getenv(envSocket)
	if path == "" {
		return nil, nil
	}
	switch {
	case strings.HasPrefix(path, "@"):
		path = "\x00" + path[1:]
	case strings.HasPrefix(path, "/"):
	default:
		return nil, fmt.Errorf("%s=%q is neither an absolute path nor an abstract socket name (@...)", envSocket, path)
	}
	return &Notifier{addr: &net.UnixAddr{Name: path, Net: "unixgram"}}, nil
}

// Notify sends state, one or more "KEY=value" lines (e.g. "READY=1\nSTATUS=running"), as one
// datagram. On a nil Notifier it does nothing.
func (n *Notifier) Notify(state string) error {
	if n == nil || n.addr == nil {
		return nil
	}
	// A fresh socket per message, as sd_notify does: no state to go stale when systemd is
	// re-executed, and the messages are rare (one every few tens of seconds).
	conn, err := net.DialUnix("unixgram", nil, n.addr)
	if err != nil {
		return fmt.Errorf("sd_notify: connect %s: %w", n.addr.Name, err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return fmt.Errorf("sd_notify: send %q to %s: %w", firstLine(state), n.addr.Name, err)
	}
	return nil
}

// Watchdog returns the interval at which WATCHDOG=1 must be sent to satisfy the unit's WatchdogSec:
// half of $WATCHDOG_USEC, as sd_watchdog_enabled(3) advises. It returns 0 when no watchdog is asked
// for, or when $WATCHDOG_PID names another process (the variables were inherited, not meant for
// this one).
func Watchdog(getenv func(string) string, pid int) (time.Duration, error) {
	us := getenv(envWatchdogUS)
	if us == "" {
		return 0, nil
	}
	if p := getenv(envWatchdogPID); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil {
			return 0, fmt.Errorf("%s=%q is not a process id", envWatchdogPID, p)
		}
		if n != pid {
			return 0, nil
		}
	}
	n, err := strconv.ParseUint(us, 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%s=%q is not a positive number of microseconds", envWatchdogUS, us)
	}
	if n > uint64(time.Duration(1<<62)/time.Microsecond) {
		return 0, errors.New(envWatchdogUS + " is too large")
	}
	return time.Duration(n) * time.Microsecond / 2, nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
