// Package hw reads facts about the machine the agent runs on: processors, memory, board,
// temperatures, Raspberry Pi throttling, addresses. Every reader takes the machine's root
// directory ("/" in production), so fixture trees under testdata/ stand in for a Raspberry Pi's
// or a server's /proc, /sys and /etc, and each degrades cleanly when a file is absent.
package hw

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// Interface is a network interface and its addresses, as net.Interfaces and Addrs report them.
type Interface struct {
	Name  string
	Flags net.Flags
	Addrs []net.IP
}

// Interfaces is the machine's interface list; SystemInterfaces in production, a fake in tests
// (interfaces are not files under a root).
type Interfaces func() ([]Interface, error)

// SystemInterfaces lists this machine's interfaces with net.Interfaces.
func SystemInterfaces() ([]Interface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	out := make([]Interface, 0, len(ifs))
	for _, ifc := range ifs {
		i := Interface{Name: ifc.Name, Flags: ifc.Flags}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				i.Addrs = append(i.Addrs, n.IP)
			}
		}
		out = append(out, i)
	}
	return out, nil
}

// HostIP is this machine's address: HostIPOf("/", SystemInterfaces).
func HostIP() string { return HostIPOf("/", SystemInterfaces) }

// HostIPOf is the IPv4 address of the interface that holds the default route (root/proc/net/route),
// which is what kubelet reports when no node IP is configured; failing that, the first
// non-loopback IPv4 address of an interface that is up. It reads the route table rather than
// probing the network, so it works offline. Empty when there is no such address.
func HostIPOf(root string, list Interfaces) string {
	ifs, err := list()
	if err != nil {
		return ""
	}
	if name := defaultRouteInterface(filepath.Join(root, "proc/net/route")); name != "" {
		for _, ifc := range ifs {
			if ifc.Name == name {
				if ip := firstIPv4(ifc, false); ip != "" {
					return ip
				}
			}
		}
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		if ip := firstIPv4(ifc, true); ip != "" {
			return ip
		}
	}
	return ""
}

func firstIPv4(ifc Interface, skipLoopback bool) string {
	for _, ip := range ifc.Addrs {
		if ip.To4() != nil && !(skipLoopback && ip.IsLoopback()) {
			return ip.String()
		}
	}
	return ""
}

func defaultRouteInterface(routeFile string) string {
	f, err := os.Open(routeFile)
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 2 && fields[1] == "00000000" {
			return fields[0]
		}
	}
	return ""
}
