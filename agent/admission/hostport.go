package admission

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"

	v1 "k8s.io/api/core/v1"
)

// HostPort is one port a pod asks for on the host.
type HostPort struct {
	IP       string // "" or 0.0.0.0: every address
	Port     int32
	Protocol v1.Protocol
}

func (h HostPort) String() string {
	ip := h.IP
	if wildcardIP(ip) {
		ip = "*"
	}
	return fmt.Sprintf("%s:%d/%s", ip, h.Port, h.Protocol)
}

// wildcardIP is kubelet's "bind all" host IP: unset or 0.0.0.0.
func wildcardIP(ip string) bool { return ip == "" || ip == "0.0.0.0" }

// conflicts is kubelet's host port rule: the same port and protocol on the same address, or on
// any address when either side binds every address.
func (h HostPort) conflicts(o HostPort) bool {
	return h.Port == o.Port && h.Protocol == o.Protocol &&
		(wildcardIP(h.IP) || wildcardIP(o.IP) || h.IP == o.IP)
}

// HostPorts lists the host ports pod asks for: every container port with a hostPort, and, for a
// hostNetwork pod, every container port (the API server sets hostPort to containerPort there;
// manifests skip that defaulting). Sidecars count, plain init containers do not (they never run
// beside the others), as in kubelet.
func HostPorts(pod *v1.Pod) []HostPort {
	var out []HostPort
	add := func(c *v1.Container) {
		for _, p := range c.Ports {
			port := p.HostPort
			if port == 0 && pod.Spec.HostNetwork {
				port = p.ContainerPort
			}
			if port <= 0 {
				continue
			}
			proto := p.Protocol
			if proto == "" {
				proto = v1.ProtocolTCP
			}
			out = append(out, HostPort{IP: p.HostIP, Port: port, Protocol: proto})
		}
	}
	for i := range pod.Spec.InitContainers {
		if c := &pod.Spec.InitContainers[i]; c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			add(c)
		}
	}
	for i := range pod.Spec.Containers {
		add(&pod.Spec.Containers[i])
	}
	return out
}

// checkPorts refuses pod when a host port it wants is already the admitted pods'.
func checkPorts(pod *v1.Pod, admitted []*v1.Pod) *Refusal {
	want := HostPorts(pod)
	if len(want) == 0 {
		return nil
	}
	for _, other := range admitted {
		for _, theirs := range HostPorts(other) {
			for _, mine := range want {
				if mine.conflicts(theirs) {
					return &Refusal{Reason: ReasonNodePorts, Message: fmt.Sprintf("%s (hostPort %s is taken by pod %s/%s)",
						nodePortsMessage, mine, other.Namespace, other.Name)}
				}
			}
		}
	}
	return nil
}

// ProbeHostPorts binds each host port pod wants and closes it at once, to find one that a process
// outside the node's pods holds. Only "address in use" refuses the pod: an address the host does not
// have (yet: DHCP) is no proof the port is taken. SCTP ports are not probed (no SCTP sockets in Go's
// standard library). This is I/O: callers must not hold a lock others wait on.
func ProbeHostPorts(pod *v1.Pod) *Refusal {
	for _, hp := range HostPorts(pod) {
		ip := hp.IP
		if wildcardIP(ip) {
			ip = "" // every address, IPv6 too where the host has it: a listener on any of them conflicts
		}
		addr := net.JoinHostPort(ip, strconv.Itoa(int(hp.Port)))
		var err error
		switch hp.Protocol {
		case v1.ProtocolTCP:
			var l net.Listener
			if l, err = net.Listen("tcp", addr); err == nil {
				l.Close()
			}
		case v1.ProtocolUDP:
			var c net.PacketConn
			if c, err = net.ListenPacket("udp", addr); err == nil {
				c.Close()
			}
		default:
			continue
		}
		if errors.Is(err, syscall.EADDRINUSE) {
			return &Refusal{Reason: ReasonNodePorts, Message: fmt.Sprintf("%s (hostPort %s is in use on the host)", nodePortsMessage, hp)}
		}
	}
	return nil
}
