package cni

import (
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// listenIn opens listeners inside the network namespace at path: sockets belong to the namespace
// they are made in, and keep working from any thread afterwards.
func listenIn(t *testing.T, path string, open func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		// The thread is left in the pod's namespace and thrown away when the goroutine ends locked.
		runtime.LockOSThread()
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- open()
	}()
	if err := <-errc; err != nil {
		t.Fatalf("listen in %s: %v", path, err)
	}
}

// serveTCP answers every connection with reply.
func serveTCP(t *testing.T, l net.Listener, reply string) {
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(reply))
			c.Close()
		}
	}()
}

// freePort finds a port that nothing on the host listens on (TCP and UDP).
func freePort(t *testing.T) int32 {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if u, err := net.ListenPacket("udp", fmt.Sprintf(":%d", port)); err == nil {
			u.Close()
			return int32(port)
		}
	}
	t.Fatal("no free port")
	return 0
}

// askTCP connects to addr and returns what it answers, retrying briefly (rules may take a moment
// to apply); "" if it never answers.
func askTCP(addr string, tries int) string {
	for range tries {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.SetDeadline(time.Now().Add(2 * time.Second))
			b, _ := io.ReadAll(c)
			c.Close()
			if len(b) > 0 {
				return string(b)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return ""
}

func askUDP(addr string, tries int) string {
	for range tries {
		c, err := net.Dial("udp", addr)
		if err != nil {
			return ""
		}
		c.SetDeadline(time.Now().Add(300 * time.Millisecond))
		c.Write([]byte("ping"))
		b := make([]byte, 64)
		n, err := c.Read(b)
		c.Close()
		if err == nil {
			return string(b[:n])
		}
	}
	return ""
}

// Host ports reach the pod through portmap from the host's loopback: TCP and UDP, a port bound to
// every address answers on 127.0.0.1 and 127.0.0.2, one bound to 127.0.0.1 only there. DEL takes
// them away.
func TestHostPortsTCPAndUDP(t *testing.T) {
	n := testNet(t)
	state := t.TempDir()
	ns := filepath.Join(state, "ns")
	pinNetns(t, ns)
	wild, udp, local := freePort(t), freePort(t), freePort(t)
	pod := testPod("web",
		v1.ContainerPort{ContainerPort: 80, HostPort: wild},
		v1.ContainerPort{ContainerPort: 5353, HostPort: udp, Protocol: v1.ProtocolUDP},
		v1.ContainerPort{ContainerPort: 81, HostPort: local, HostIP: "127.0.0.1"})
	m := testManager(t, n, filepath.Join(state, "cni"))
	ctx := context.Background()
	ips, err := m.Setup(ctx, pod, ns, true)
	if err != nil {
		t.Fatal(err)
	}
	listenIn(t, ns, func() error {
		l80, err := net.Listen("tcp", ":80")
		if err != nil {
			return err
		}
		serveTCP(t, l80, "tcp-80")
		l81, err := net.Listen("tcp", ":81")
		if err != nil {
			return err
		}
		serveTCP(t, l81, "tcp-81")
		u, err := net.ListenPacket("udp", ":5353")
		if err != nil {
			return err
		}
		t.Cleanup(func() { u.Close() })
		go func() {
			b := make([]byte, 64)
			for {
				n, from, err := u.ReadFrom(b)
				if err != nil {
					return
				}
				u.WriteTo([]byte("udp-pong:"+string(b[:n])), from)
			}
		}()
		return nil
	})
	if got := askTCP(net.JoinHostPort(ips[0], "80"), 20); got != "tcp-80" {
		t.Fatalf("pod address %s:80 from the host answers %q", ips[0], got)
	}
	for _, c := range []struct{ addr, want string }{
		{fmt.Sprintf("127.0.0.1:%d", wild), "tcp-80"},
		{fmt.Sprintf("127.0.0.2:%d", wild), "tcp-80"},
		{fmt.Sprintf("127.0.0.1:%d", local), "tcp-81"},
	} {
		if got := askTCP(c.addr, 20); got != c.want {
			t.Errorf("hostPort %s answers %q, want %q", c.addr, got, c.want)
		}
	}
	if got := askUDP(fmt.Sprintf("127.0.0.1:%d", udp), 20); got != "udp-pong:ping" {
		t.Errorf("UDP hostPort 127.0.0.1:%d answers %q", udp, got)
	}
	// Bound to 127.0.0.1: another loopback address of the host is not forwarded.
	if got := askTCP(fmt.Sprintf("127.0.0.2:%d", local), 3); got != "" {
		t.Errorf("hostPort bound to 127.0.0.1 answers on 127.0.0.2: %q", got)
	}
	if err := m.Teardown(ctx, string(pod.UID), ns); err != nil {
		t.Fatal(err)
	}
	if got := askTCP(fmt.Sprintf("127.0.0.1:%d", wild), 2); got != "" {
		t.Errorf("hostPort still answers after DEL: %q", got)
	}
	if r := n.Rules(t); len(r) != 0 {
		t.Errorf("rules left after DEL:\n%s", strings.Join(r, "\n"))
	}
}
