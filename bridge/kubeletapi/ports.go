package kubeletapi

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
)

// ParsePorts reads a port list: ranges and single ports separated by commas
// ("10300-10399", "10300,10302-10310"). Ports are kept in the order given, without duplicates.
func ParsePorts(spec string) ([]int32, error) {
	var out []int32
	seen := map[int32]bool{}
	for part := range strings.SplitSeq(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := parsePort(lo)
		if err != nil {
			return nil, fmt.Errorf("port list %q: %w", spec, err)
		}
		b := a
		if isRange {
			if b, err = parsePort(hi); err != nil {
				return nil, fmt.Errorf("port list %q: %w", spec, err)
			}
			if b < a {
				return nil, fmt.Errorf("port list %q: range %s ends before it starts", spec, part)
			}
		}
		for p := a; p <= b; p++ {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("port list %q: no port", spec)
	}
	return out, nil
}

func parsePort(s string) (int32, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("%q is not a port (1-65535)", s)
	}
	return int32(n), nil
}

// Ports gives each served node a port of its own from a pool. The Node's
// status.daemonEndpoints.kubeletEndpoint.Port, which the leader writes and the API server dials,
// is the durable record: a new leader (or a restarted one) first takes back every port the served
// Nodes already name (Seed), so assignments survive restarts and leader changes, and only then
// hands out free ones.
type Ports struct {
	ip      string
	mu      sync.Mutex
	pool    []int32
	byNode  map[string]int32
	byPort  map[int32]string
	seeded  bool
	list    func() []*v1.Node // the served Nodes (informer cache)
	changed chan struct{}     // 1-buffered: an assignment was made or released
}

// NewPorts makes an allocator over pool for the kubelet API served on ip (the address the API
// server reaches the bridge on); list returns the served Nodes, read once on first use.
func NewPorts(ip string, pool []int32, list func() []*v1.Node) (*Ports, error) {
	if net.ParseIP(ip) == nil {
		return nil, fmt.Errorf("kubelet address %q is not an IP address (the API server dials the Node's InternalIP)", ip)
	}
	if len(pool) == 0 {
		return nil, fmt.Errorf("kubelet ports: the pool is empty")
	}
	return &Ports{ip: ip, pool: slices.Clone(pool), byNode: map[string]int32{}, byPort: map[int32]string{},
		list: list, changed: make(chan struct{}, 1)}, nil
}

// Address is the IP the kubelet API is served on.
func (p *Ports) Address() string { return p.ip }

// Endpoint returns the address and port the API server must dial for node's kubelet API, given the
// port its Node records now (0: none): the nodes controller writes them into the Node's status.
func (p *Ports) Endpoint(node string, recorded int32) (ip string, port int32, err error) {
	port, err = p.Port(node, recorded)
	return p.ip, port, err
}

// seed takes back the ports the served Nodes record. p.mu held; reads only the informer cache.
func (p *Ports) seed() {
	if p.seeded {
		return
	}
	p.seeded = true
	if p.list == nil {
		return
	}
	nodes := p.list()
	// By name, so two Nodes that name the same port (an edit by hand) resolve the same way on
	// every leader.
	slices.SortFunc(nodes, func(a, b *v1.Node) int { return strings.Compare(a.Name, b.Name) })
	for _, n := range nodes {
		p.claim(n.Name, n.Status.DaemonEndpoints.KubeletEndpoint.Port)
	}
}

// claim gives node port if port is in the pool and free. p.mu held.
func (p *Ports) claim(node string, port int32) bool {
	if port == 0 || !slices.Contains(p.pool, port) {
		return false
	}
	if owner, taken := p.byPort[port]; taken {
		return owner == node
	}
	if old, ok := p.byNode[node]; ok {
		delete(p.byPort, old)
	}
	p.byNode[node], p.byPort[port] = port, node
	p.notify()
	return true
}

func (p *Ports) notify() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// Port returns node's port: the one it has, else recorded (the port its Node names now) when that
// is in the pool and free, else the first free one. It fails when the pool is used up.
func (p *Ports) Port(node string, recorded int32) (int32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seed()
	if port, ok := p.byNode[node]; ok {
		return port, nil
	}
	if p.claim(node, recorded) {
		return recorded, nil
	}
	for _, port := range p.pool {
		if p.claim(node, port) {
			return port, nil
		}
	}
	return 0, fmt.Errorf("no free kubelet port for node %s: all %d ports of the pool are taken (widen --kubelet-ports)", node, len(p.pool))
}

// Release frees node's port (its Node is gone or no longer served).
func (p *Ports) Release(node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if port, ok := p.byNode[node]; ok {
		delete(p.byNode, node)
		delete(p.byPort, port)
		p.notify()
	}
}

// Assigned returns node -> port.
func (p *Ports) Assigned() map[string]int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seed()
	out := make(map[string]int32, len(p.byNode))
	for n, port := range p.byNode {
		out[n] = port
	}
	return out
}

// Changed is signalled when an assignment was made or released.
func (p *Ports) Changed() <-chan struct{} { return p.changed }
