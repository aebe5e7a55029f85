package cni

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// missingAddrs says what of the attachment the namespace pinned at netns lacks: the interface
// ifName, or some of the addresses ips on it; "" when nothing is missing. It reads the interface
// from a thread that enters the namespace and leaves it again; a thread that cannot leave it is
// not given back to the Go scheduler.
func missingAddrs(netns, ifName string, ips []string) (string, error) {
	target, err := os.Open(netns)
	if err != nil {
		return "", err
	}
	defer target.Close()
	home, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return "", err
	}
	defer home.Close()
	type result struct {
		have []string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("enter the pod's network namespace: %w", err)}
			return
		}
		have, err := addrsOf(ifName)
		if serr := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); serr != nil {
			// The thread stays locked and ends with this goroutine: it is in the wrong namespace.
			done <- result{err: fmt.Errorf("leave the pod's network namespace: %w", serr)}
			return
		}
		runtime.UnlockOSThread()
		done <- result{have, err}
	}()
	r := <-done
	if r.err != nil {
		return "", r.err
	}
	if r.have == nil {
		return "interface " + ifName, nil
	}
	var lost []string
	for _, ip := range ips {
		if !slices.Contains(r.have, ip) {
			lost = append(lost, ip)
		}
	}
	if len(lost) > 0 {
		return fmt.Sprintf("address %s on %s", strings.Join(lost, ", "), ifName), nil
	}
	return "", nil
}

// addrsOf lists the addresses on interface name in the calling thread's namespace; nil (and no
// error) when there is no such interface.
func addrsOf(name string) ([]string, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		// The net package's "no such network interface" error is not exported.
		if strings.Contains(err.Error(), "no such network interface") {
			return nil, nil
		}
		return nil, err
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return nil, fmt.Errorf("addresses of %s: %w", name, err)
	}
	have := []string{}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			have = append(have, n.IP.String())
		}
	}
	return have, nil
}

// restoreForDel puts the recorded addresses back on ifName in the namespace pinned at netns, on a
// stand-in interface made for the purpose when ifName is gone (an empty bridge: the bridge module
// is loaded wherever pods are attached, unlike dummy's), so that DEL finds what ADD made: the
// bridge plugin learns the addresses whose NAT rules it removes from the interface it deletes, and
// with the interface gone it would leave those rules behind, and a later DEL of the same pod
// would then fail to delete the chain they jump to.
func restoreForDel(netns, ifName string, addrs []*net.IPNet) error {
	target, err := os.Open(netns)
	if err != nil {
		return err
	}
	defer target.Close()
	home, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return err
	}
	defer home.Close()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("enter the pod's network namespace: %w", err)
			return
		}
		err := restoreOnThread(ifName, addrs)
		if serr := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); serr != nil {
			done <- fmt.Errorf("leave the pod's network namespace: %w", serr)
			return
		}
		runtime.UnlockOSThread()
		done <- err
	}()
	return <-done
}

func restoreOnThread(ifName string, addrs []*net.IPNet) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	ifc, err := net.InterfaceByName(ifName)
	if err != nil {
		link := make([]byte, unix.SizeofIfInfomsg) // family AF_UNSPEC, everything else zero (down)
		link = append(link, rtattr(unix.IFLA_IFNAME, append([]byte(ifName), 0))...)
		link = append(link, rtattr(unix.IFLA_LINKINFO|unix.NLA_F_NESTED, rtattr(unix.IFLA_INFO_KIND, []byte("bridge")))...)
		if err := netlinkDo(fd, unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL, link); err != nil {
			return fmt.Errorf("make a stand-in %s: %w", ifName, err)
		}
		if ifc, err = net.InterfaceByName(ifName); err != nil {
			return err
		}
	}
	for _, a := range addrs {
		ip, family := a.IP.To4(), unix.AF_INET
		if ip == nil {
			ip, family = a.IP.To16(), unix.AF_INET6
		}
		ones, _ := a.Mask.Size()
		msg := make([]byte, unix.SizeofIfAddrmsg)
		msg[0], msg[1] = byte(family), byte(ones)
		hostEndian.PutUint32(msg[4:], uint32(ifc.Index))
		msg = append(msg, rtattr(unix.IFA_LOCAL, ip)...)
		msg = append(msg, rtattr(unix.IFA_ADDRESS, ip)...)
		if err := netlinkDo(fd, unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, msg); err != nil {
			return fmt.Errorf("put %s on %s: %w", a, ifName, err)
		}
	}
	return nil
}

var hostEndian = binary.NativeEndian

// rtattr is one netlink route attribute, padded to 4 bytes.
func rtattr(typ uint16, data []byte) []byte {
	l := unix.SizeofRtAttr + len(data)
	b := make([]byte, (l+unix.RTA_ALIGNTO-1) & ^(unix.RTA_ALIGNTO-1))
	hostEndian.PutUint16(b[0:], uint16(l))
	hostEndian.PutUint16(b[2:], typ)
	copy(b[unix.SizeofRtAttr:], data)
	return b
}

// netlinkDo sends one request and waits for its acknowledgement.
func netlinkDo(fd int, typ, flags uint16, body []byte) error {
	msg := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(body))
	hostEndian.PutUint32(msg[0:], uint32(unix.NLMSG_HDRLEN+len(body)))
	hostEndian.PutUint16(msg[4:], typ)
	hostEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK|flags)
	hostEndian.PutUint32(msg[8:], 1) // sequence
	msg = append(msg, body...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 8192)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
				continue
			}
			if errno := int32(hostEndian.Uint32(m.Data)); errno != 0 {
				return syscall.Errno(-errno)
			}
			return nil
		}
	}
}
