package sdnotify

import (
	"net"
	"path/filepath"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// listen is a fake $NOTIFY_SOCKET: a unixgram socket whose datagrams the test reads.
func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func read(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 4096)
	c.SetReadDeadline(time.Now().Add(10 * time.Second)) // a bound on a hang, not a speed check
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("read from the notify socket: %v", err)
	}
	return string(buf[:n])
}

func TestNotifyPathAndAbstract(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	for _, tc := range []struct{ env, listen string }{
		{path, path},
		{"@mqlet-sdnotify-test-" + filepath.Base(t.TempDir()), ""},
	} {
		l := tc.listen
		if l == "" {
			l = "\x00" + tc.env[1:]
		}
		c := listen(t, l)
		n, err := New(env(map[string]string{"NOTIFY_SOCKET": tc.env}))
		if err != nil || n == nil {
			t.Fatalf("New(%q) = %v, %v", tc.env, n, err)
		}
		if err := n.Notify("READY=1\nSTATUS=up"); err != nil {
			t.Fatal(err)
		}
		if got := read(t, c); got != "READY=1\nSTATUS=up" {
			t.Errorf("%s got %q", tc.env, got)
		}
	}
}

func TestNoSocketNoop(t *testing.T) {
	n, err := New(env(nil))
	if n != nil || err != nil {
		t.Fatalf("New without NOTIFY_SOCKET = %v, %v; want nil, nil", n, err)
	}
	if err := n.Notify("READY=1"); err != nil {
		t.Errorf("nil Notifier: %v", err)
	}
	if _, err := New(env(map[string]string{"NOTIFY_SOCKET": "relative/x"})); err == nil {
		t.Error("a relative NOTIFY_SOCKET was accepted")
	}
}

func TestNotifyGoneSocket(t *testing.T) {
	n, _ := New(env(map[string]string{"NOTIFY_SOCKET": filepath.Join(t.TempDir(), "none")}))
	if err := n.Notify("WATCHDOG=1"); err == nil {
		t.Error("no error for a socket that does not exist")
	}
}

func TestWatchdog(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want time.Duration
		err  bool
	}{
		{nil, 0, false},
		{map[string]string{"WATCHDOG_USEC": "60000000"}, 30 * time.Second, false},
		{map[string]string{"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "42"}, 30 * time.Second, false},
		{map[string]string{"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "7"}, 0, false}, // another process's
		{map[string]string{"WATCHDOG_USEC": "x"}, 0, true},
		{map[string]string{"WATCHDOG_USEC": "0"}, 0, true},
		{map[string]string{"WATCHDOG_USEC": "1", "WATCHDOG_PID": "me"}, 0, true},
	} {
		got, err := Watchdog(env(tc.env), 42)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("Watchdog(%v) = %v, %v; want %v, error %v", tc.env, got, err, tc.want, tc.err)
		}
	}
}
