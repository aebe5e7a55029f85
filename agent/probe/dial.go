package probe

import (
	"context"
	"fmt"
	"net"
	"os"
	goruntime "runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// A probe of a pod with its own network namespace connects from inside that namespace, so it
// reaches the pod whether or not the pod has an address the host can route to (before CNI a pod has
// only loopback; with CNI it has its address in there too). The socket is made on an OS thread that
// has switched into the namespace; a connected socket stays in the namespace it was made in, so
// the rest of the exchange (TLS, HTTP, gRPC) runs on any goroutine.

// route says where a connection is made from: the pod's network namespace, or the agent's own.
type route struct{ netns string }

type routeKey struct{}

func withRoute(ctx context.Context, r route) context.Context {
	return context.WithValue(ctx, routeKey{}, r)
}

// dialContext is the one dialer of every probe and hook connection (the shared HTTP transport's,
// gRPC's, tcpSocket's). The route comes with ctx.
func dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	r, _ := ctx.Value(routeKey{}).(route)
	d := net.Dialer{Control: lingerShort}
	if r.netns == "" {
		return d.DialContext(ctx, network, addr)
	}
	return dialInNetNS(ctx, r.netns, &d, network, addr)
}

// lingerShort makes a probe's close send a reset after a second instead of leaving the socket in
// TIME_WAIT for a minute: a probe every second of many pods would otherwise pile them up.
func lingerShort(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 1})
	})
	if err != nil {
		return err
	}
	return serr
}

type dialResult struct {
	c   net.Conn
	err error
}

// dialInNetNS connects to addr (an IP literal: a name would be resolved on other threads, in the
// agent's namespace) from inside the network namespace at nsPath. The dial runs on a goroutine of
// its own, locked to its thread: if the thread cannot be switched back, the goroutine ends still
// locked and the Go runtime throws the thread away rather than reuse it in the pod's namespace.
func dialInNetNS(ctx context.Context, nsPath string, d *net.Dialer, network, addr string) (net.Conn, error) {
	if host, _, err := net.SplitHostPort(addr); err != nil || net.ParseIP(host) == nil {
		return nil, fmt.Errorf("dial %s in pod network namespace: not an IP address and port", addr)
	}
	target, err := os.Open(nsPath)
	if err != nil {
		return nil, fmt.Errorf("pod network namespace: %w", err)
	}
	defer target.Close()
	done := make(chan dialResult, 1)
	go func() {
		goruntime.LockOSThread()
		c, err, restored := dialOnThread(ctx, target, d, network, addr)
		if restored {
			goruntime.UnlockOSThread()
		}
		done <- dialResult{c, err}
	}()
	r := <-done // the dial ends with ctx
	return r.c, r.err
}

// dialOnThread runs on a locked thread: enter the pod's namespace, dial, come back. restored is
// false when the thread may still be in the pod's namespace.
func dialOnThread(ctx context.Context, target *os.File, d *net.Dialer, network, addr string) (c net.Conn, err error, restored bool) {
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		return nil, fmt.Errorf("agent network namespace: %w", err), true
	}
	defer self.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, fmt.Errorf("enter pod network namespace: %w", err), true
	}
	c, err = d.DialContext(ctx, network, addr)
	if serr := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); serr != nil {
		return c, err, false
	}
	return c, err, true
}
