// Package hw reads facts about the machine the agent runs on.
package hw

import (
	"bufio"
	"net"
	"os"
	"strings"
)

// HostIP is the IPv4 address of the interface that holds the default route, which is what kubelet
// reports when no node IP is configured; failing that, the first non-loopback IPv4 address. It
// reads /proc/net/route rather than probing the network, so it works offline.
func HostIP() string {
	if iface := defaultRouteInterface("/proc/net/route"); iface != "" {
		if ip := interfaceIPv4(iface); ip != "" {
			return ip
		}
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
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

func interfaceIPv4(name string) string {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return ""
	}
	addrs, _ := ifc.Addrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	return ""
}
