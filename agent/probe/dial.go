package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

var noDeadline time.Time

// A probe of a pod with its own network namespace connects from inside that namespace, so it
// reaches the pod whether or not the pod has an address the host can route to (before CNI a pod has
// only loopback; with CNI it has its address in there too). Only the socket has to be made there:
// a socket stays in the namespace it was made in, so the connect and everything after it (TLS,
// HTTP, gRPC) run on any goroutine, through Go's poller. Making the socket takes a short-lived
// locked thread that enters the namespace and comes back; it never blocks while switched.

// route says where a connection is made from: the pod's network namespace, or the agent's own.
type route struct {
	netns string
	ns    *os.File // netns, already open (a probe keeps it open while it runs); nil: open it
	home  *os.File // the agent's own network namespace, to come back to
}

// dial is the one dialer of every probe and hook connection (HTTP, gRPC, tcpSocket): a TCP
// connection to addr by route r, bounded by ctx's deadline.
func dial(ctx context.Context, r route, addr string) (net.Conn, error) {
	if r.netns == "" {
		d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error { return control(c, lingerShort) }}
		return d.DialContext(ctx, "tcp", addr)
	}
	return dialInNetNS(ctx, r, addr)
}

// lingerShort makes a probe's close end the connection within a second instead of leaving the
// socket in TIME_WAIT for a minute, as kubelet's prober does: a probe every second of many pods
// would pile them up.
func lingerShort(fd int) error {
	return unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 1})
}

func control(c syscall.RawConn, f func(fd int) error) error {
	var ferr error
	if err := c.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// dialInNetNS connects to addr (an IP literal and port: a name would be resolved in the agent's
// namespace) from inside the route's network namespace.
func dialInNetNS(ctx context.Context, r route, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s in pod network namespace: not an IP address and port", addr)
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	var sa unix.Sockaddr
	family := unix.AF_INET
	if ap.Addr().Is4() {
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	} else {
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	fd, err := socketIn(r, family)
	if err != nil {
		return nil, err
	}
	if err := lingerShort(fd); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	// FileConn registers the socket with Go's poller (it works on a duplicate; ours is closed).
	f := os.NewFile(uintptr(fd), "probe-socket")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	if err := connect(ctx, c, sa); err != nil {
		c.Close()
		return nil, fmt.Errorf("dial tcp %s: %w", addr, err)
	}
	return c, nil
}

// connect connects the non-blocking socket under c to sa, waiting for it through the poller
// until ctx's deadline.
func connect(ctx context.Context, c net.Conn, sa unix.Sockaddr) error {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return errors.New("not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	err = control(rc, func(fd int) error { return unix.Connect(fd, sa) })
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINPROGRESS) {
		return os.NewSyscallError("connect", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetWriteDeadline(dl)
		defer c.SetWriteDeadline(noDeadline)
	}
	var cerr error
	werr := rc.Write(func(fd uintptr) bool {
		if v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR); err != nil {
			cerr = err
			return true
		} else if v != 0 {
			cerr = os.NewSyscallError("connect", unix.Errno(v))
			return true
		}
		// The poller may say writable before the connect ends (a socket registered before its
		// connect reads as writable): only a peer address says it is connected.
		return connected(int(fd))
	})
	if werr != nil {
		if errors.Is(werr, os.ErrDeadlineExceeded) {
			return fmt.Errorf("connect: %w", context.DeadlineExceeded)
		}
		return werr
	}
	return cerr
}

// socketIn makes a non-blocking TCP socket in the route's network namespace. The thread that
// makes it enters the namespace and comes back; if it cannot come back, its goroutine ends still
// locked and the Go runtime throws the thread away rather than reuse it in the pod's namespace.
func socketIn(r route, family int) (int, error) {
	target := r.ns
	if target == nil {
		f, err := os.Open(r.netns)
		if err != nil {
			return -1, fmt.Errorf("pod network namespace: %w", err)
		}
		defer f.Close()
		target = f
	}
	if r.home == nil {
		return -1, errors.New("the agent's own network namespace is unknown")
	}
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		fd, err, restored := socketOnThread(int(target.Fd()), int(r.home.Fd()), family)
		if restored {
			runtime.UnlockOSThread()
		}
		done <- result{fd, err}
	}()
	res := <-done
	return res.fd, res.err
}

func socketOnThread(target, self, family int) (fd int, err error, restored bool) {
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		return -1, fmt.Errorf("enter pod network namespace: %w", err), true
	}
	fd, err = unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if serr := unix.Setns(self, unix.CLONE_NEWNET); serr != nil {
		if err == nil {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("return from pod network namespace: %w", serr), false
	}
	if err != nil {
		return -1, fmt.Errorf("socket in pod network namespace: %w", err), true
	}
	return fd, nil, true
}

// connected reports whether the socket has a peer (getpeername succeeds), without the allocations
// of unix.Getpeername.
func connected(fd int) bool {
	var sa unix.RawSockaddrAny
	n := uint32(unix.SizeofSockaddrAny)
	_, _, e := unix.Syscall(unix.SYS_GETPEERNAME, uintptr(fd), uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&n)))
	return e != unix.ENOTCONN
}

// deadlineCtx is ctx with a deadline but no timer of its own: for connections, whose sockets
// enforce the deadline (the dialers and roundTrip set it on them). It saves the timer and context
// that context.WithTimeout would make for every probe attempt.
type deadlineCtx struct {
	context.Context
	at time.Time
}

func withDeadline(ctx context.Context, at time.Time) context.Context {
	if d, ok := ctx.Deadline(); ok && d.Before(at) {
		return ctx
	}
	return deadlineCtx{ctx, at}
}

func (d deadlineCtx) Deadline() (time.Time, bool) { return d.at, true }

// DialInPod connects to addr (an IP literal and port) from inside the network namespace at netns,
// as probes do: `mqlet ctl port-forward` reaches a pod's 127.0.0.1 this way.
func (p *Prober) DialInPod(ctx context.Context, netns, addr string) (net.Conn, error) {
	return dialInNetNS(ctx, route{netns: netns, home: p.home}, addr)
}
