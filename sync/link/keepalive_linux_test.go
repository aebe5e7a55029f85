package link

import (
	"net"
	"syscall"
	"testing"
	"time"
)

// The link's sockets carry no TCP keepalive: the MQTT keepalive is the only idle traffic
// (docs/protocol.md, section 8). Checked on a socket dialed with the dialer paho is given.
func TestDialerHasNoTCPKeepalive(t *testing.T) {
	l, err := New(Options{Broker: "tcp://127.0.0.1:1883", ClientID: "node-a", ConnectTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	o := l.clientOptions(l.newConn(1))
	if o.Dialer == nil || o.Dialer.KeepAlive >= 0 || o.Dialer.Timeout != 3*time.Second {
		t.Fatalf("paho's dialer: %+v; want KeepAlive < 0 (off) and Timeout 3s", o.Dialer)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			time.Sleep(time.Second)
		}
	}()
	c, err := o.Dialer.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var on int
	var serr error
	if err := rc.Control(func(fd uintptr) { on, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE) }); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	if on != 0 {
		t.Errorf("SO_KEEPALIVE = %d on the link's socket, want 0", on)
	}
	// The same check on Go's default dialer, so the test would notice if it stopped meaning anything.
	d, err := (&net.Dialer{}).Dial("tcp", ln.Addr().String())
	if err == nil {
		defer d.Close()
		rc, _ := d.(*net.TCPConn).SyscallConn()
		rc.Control(func(fd uintptr) { on, _ = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE) })
		if on == 0 {
			t.Log("Go's default dialer no longer turns TCP keepalive on; this test only checks the link's setting now")
		}
	}
}
