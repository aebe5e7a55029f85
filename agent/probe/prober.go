// Package probe runs what a pod spec asks the node to check or do inside a container: liveness,
// readiness and startup probes (exec, httpGet, tcpSocket, grpc) and the postStart and preStop
// lifecycle hooks (exec, httpGet, sleep), with kubelet's semantics. A Prober is shared by every pod
// of the node (one HTTP transport); a Set runs the probes of one pod, each on a goroutine of its
// own, so one pod's slow probe never delays another's.
package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Result of one probe attempt.
type Result int8

const (
	Unknown Result = iota
	Success
	// Warning is a success with something to say: an HTTP redirect to another host was not followed.
	Warning
	Failure
)

func (r Result) String() string {
	switch r {
	case Success:
		return "success"
	case Warning:
		return "warning"
	case Failure:
		return "failure"
	}
	return "unknown"
}

// maxBody bounds what is read of an HTTP probe's response (kubelet reads 10 KiB).
const maxBody = 10 << 10

// maxRedirects is how many redirects to the same host a probe follows, as net/http's default.
const maxRedirects = 10

// Execer runs a command in a running container (ctrd.Runtime.Exec).
type Execer interface {
	Exec(ctx context.Context, containerID string, cmd []string, timeout time.Duration) (ctrd.ExecResult, error)
}

// Target is the container a probe or hook acts on, and how to reach it.
type Target struct {
	Pod         *v1.Pod
	Container   *v1.Container
	ContainerID string
	// NetNS is the pod's network namespace, which connections are made from; "" makes them from
	// the agent's (hostNetwork pods).
	NetNS string
	// PodIP is the pod's primary address, the host a probe without one connects to. "" means
	// loopback inside NetNS: a pod with no pod network yet.
	PodIP string
	Exec  Execer // nil: exec handlers fail with a clear error

	ns    *os.File // NetNS opened by the probe that runs against this target, for its lifetime
	cache *cache   // what that probe keeps between attempts
}

// Prober holds what every probe of the node shares.
type Prober struct {
	home    *os.File // the agent's network namespace, held open to come back to after a socket is made in a pod's
	version string   // "1.37": the Kubernetes release the node speaks, for User-Agent
	readers sync.Pool
}

// NewProber makes the node's Prober.
func NewProber() *Prober {
	// The main thread's: it never leaves the agent's namespace (agent/ctrd's init keeps
	// goroutines that switch namespaces off it).
	home, _ := os.Open("/proc/self/ns/net")
	return &Prober{home: home, version: kubeVersion}
}

// kubeVersion is the Kubernetes release whose API the node speaks (k8s.io/api v0.37.x is 1.37),
// for the User-Agent kubelet's probes send; a test keeps it in step with go.mod.
const kubeVersion = "1.37"

func (p *Prober) userAgent(purpose string) string { return "kube-" + purpose + "/" + p.version }

// Run runs one attempt of probe handler h against t, bounded by timeout. It returns the result
// and its output (the command's output, the response body or what went wrong); err is a probe that
// could not be run at all (a named port the container does not have), which kubelet does not count
// as a failure.
func (p *Prober) Run(ctx context.Context, t Target, h *v1.ProbeHandler, timeout time.Duration) (Result, string, error) {
	switch {
	case h.HTTPGet != nil:
		return p.httpGet(withDeadline(ctx, time.Now().Add(timeout)), t, h.HTTPGet, timeout)
	case h.TCPSocket != nil:
		return p.tcp(withDeadline(ctx, time.Now().Add(timeout)), t, h.TCPSocket)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case h.Exec != nil:
		return p.exec(ctx, t, h.Exec.Command, timeout)
	case h.GRPC != nil:
		return p.grpc(ctx, t, h.GRPC, timeout)
	}
	return Unknown, "", errors.New("probe has no handler (exec, httpGet, tcpSocket or grpc)")
}

func (p *Prober) exec(ctx context.Context, t Target, cmd []string, timeout time.Duration) (Result, string, error) {
	if t.Exec == nil {
		return Unknown, "", errors.New("exec: this runtime cannot run commands in containers")
	}
	res, err := t.Exec.Exec(ctx, t.ContainerID, cmd, timeout)
	switch {
	case errors.Is(err, ctrd.ErrExecTimeout), errors.Is(err, context.DeadlineExceeded):
		return Failure, fmt.Sprintf("command %q timed out after %s", strings.Join(cmd, " "), timeout), nil
	case err != nil:
		return Unknown, "", err
	}
	out := string(res.Output)
	if res.ExitCode != 0 {
		if out == "" {
			out = fmt.Sprintf("command %q exited with %d", strings.Join(cmd, " "), res.ExitCode)
		}
		return Failure, out, nil
	}
	return Success, out, nil
}

// endpoint is where a handler connects: the host in the URL or address, and the route to it.
// With no host given, that is the pod: its address (or loopback) from inside its network
// namespace. A host given by name or address is reached from the agent's namespace, as kubelet
// reaches it from the node.
func (p *Prober) endpoint(t Target, host string) (string, route) {
	if host != "" {
		return host, route{}
	}
	r := route{netns: t.NetNS, ns: t.ns, home: p.home}
	if t.NetNS == "" {
		r = route{}
	}
	if t.PodIP != "" {
		return t.PodIP, r
	}
	return "127.0.0.1", r
}

// port resolves a probe's port, given by number or by the name of one of the container's ports.
func port(p intstr.IntOrString, c *v1.Container) (int, error) {
	n := p.IntValue()
	if p.Type == intstr.String {
		var err error
		if n, err = strconv.Atoi(p.StrVal); err != nil {
			n = -1
			for _, cp := range c.Ports {
				if cp.Name == p.StrVal {
					n = int(cp.ContainerPort)
					break
				}
			}
			if n < 0 {
				return 0, fmt.Errorf("port %q: container %q has no port of that name", p.StrVal, c.Name)
			}
		}
	}
	if n <= 0 || n > 65535 {
		return 0, fmt.Errorf("port %s: not a port number (1-65535)", p.String())
	}
	return n, nil
}

func (p *Prober) tcp(ctx context.Context, t Target, h *v1.TCPSocketAction) (Result, string, error) {
	n, err := port(h.Port, t.Container)
	if err != nil {
		return Unknown, "", fmt.Errorf("tcpSocket %w", err)
	}
	host, r := p.endpoint(t, h.Host)
	c, err := dial(ctx, r, net.JoinHostPort(host, strconv.Itoa(n)))
	if err != nil {
		return Failure, err.Error(), nil
	}
	c.Close()
	return Success, "", nil
}

func (p *Prober) grpc(ctx context.Context, t Target, h *v1.GRPCAction, timeout time.Duration) (Result, string, error) {
	if h.Port <= 0 || h.Port > 65535 {
		return Unknown, "", fmt.Errorf("grpc port %d: not a port number (1-65535)", h.Port)
	}
	host, r := p.endpoint(t, "")
	addr := net.JoinHostPort(host, strconv.Itoa(int(h.Port)))
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUserAgent(p.userAgent("probe")),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			return dial(ctx, r, a)
		}))
	if err != nil {
		return Unknown, "", fmt.Errorf("grpc %s: %w", addr, err)
	}
	defer conn.Close()
	service := ""
	if h.Service != nil {
		service = *h.Service
	}
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		st, _ := status.FromError(err)
		switch st.Code() {
		case codes.Unimplemented:
			return Failure, fmt.Sprintf("%s does not serve the gRPC health protocol (grpc.health.v1.Health): %s", addr, st.Message()), nil
		case codes.DeadlineExceeded:
			return Failure, fmt.Sprintf("gRPC health check of %s did not finish within %s", addr, timeout), nil
		}
		return Failure, fmt.Sprintf("gRPC health check of %s failed: %v", addr, err), nil
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return Failure, fmt.Sprintf("service %q is unhealthy (responded %s)", service, resp.GetStatus()), nil
	}
	return Success, "", nil
}
