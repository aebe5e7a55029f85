// Package kubeletapi serves the kubelet API of the nodes mqlet-bridge serves, so that an
// unmodified kube-apiserver reaches the bridge as if it were each node's kubelet (kubectl logs,
// kubectl top, exec once a Streamer is wired): HTTPS on one port per node (the API server dials
// InternalIP:kubeletEndpoint.Port, and paths like /stats/summary do not name the node),
// authentication by client certificate or bearer token (TokenReview) and authorization by
// SubjectAccessReview with kubelet's mapping (RequestAttributes). See docs/kubernetes.md.
package kubeletapi

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
)

// DefaultPorts is the default --kubelet-ports.
const DefaultPorts = "10300-10399"

// Nodes is what the server needs of the nodes controller: whether the bridge vouches for a node
// being online now.
type Nodes interface {
	Online(node string) bool
}

// Streamer serves the interactive endpoints (exec, attach, portForward) of a node; nil answers
// 501 Not Implemented.
type Streamer interface {
	ServeStream(w http.ResponseWriter, r *http.Request, node string)
}

// Options configure New.
type Options struct {
	// Ports assigns each node its port, on the address the API server reaches the bridge on (the
	// pod IP), which is listened on.
	Ports *Ports
	// CertFile and KeyFile are the serving certificate; empty: a self-signed one made at start.
	CertFile, KeyFile string
	// ClientCAFile verifies client certificates (the cluster's client CA, which issues the API
	// server's kubelet client certificate); empty: only bearer tokens authenticate.
	ClientCAFile string
	Kube         kubernetes.Interface
	Nodes        Nodes
	// Logs streams a container's log from node to w (sync/logsclient over the bridge's MQTT).
	Logs func(ctx context.Context, node string, req protocol.LogsRequest, w io.Writer) error
	// NodePods returns the pods bound to node (informer cache).
	NodePods func(node string) []*v1.Pod
	// Usage reads node's CPU and memory use (sync/logsclient.Usage over the bridge's MQTT): the
	// source of /stats/summary and /metrics/resource; nil answers them 501.
	Usage    func(ctx context.Context, node string) (*protocol.Usage, error)
	Streamer Streamer
	Log      *slog.Logger
}

// Server serves the kubelet API of every served node.
type Server struct {
	o     Options
	ip    net.IP
	ports *Ports
	auth  *Auth
	tls   *tls.Config
	usage usageCache

	mu        sync.Mutex
	listeners map[string]*listener // by node
}

type listener struct {
	port int32
	srv  *http.Server
	done chan struct{}
}

// New checks o and loads the certificates; nothing listens before Run.
func New(o Options) (*Server, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Ports == nil || o.Nodes == nil || o.Logs == nil {
		return nil, errors.New("kubelet API: Ports, Nodes and Logs are required")
	}
	ip := net.ParseIP(o.Ports.Address())
	s := &Server{o: o, ip: ip, ports: o.Ports, auth: &Auth{Kube: o.Kube},
		listeners: map[string]*listener{}}
	var cert tls.Certificate
	var err error
	switch {
	case o.CertFile != "" && o.KeyFile != "":
		if cert, err = tls.LoadX509KeyPair(o.CertFile, o.KeyFile); err != nil {
			return nil, fmt.Errorf("kubelet serving certificate %s / key %s: %w", o.CertFile, o.KeyFile, err)
		}
	case o.CertFile != "" || o.KeyFile != "":
		return nil, errors.New("--kubelet-tls-cert and --kubelet-tls-key go together: give both or neither")
	default:
		if cert, err = selfSigned(ip); err != nil {
			return nil, err
		}
	}
	if o.ClientCAFile != "" {
		pem, err := os.ReadFile(o.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("kubelet client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kubelet client CA %s: no PEM certificate in it", o.ClientCAFile)
		}
		s.auth.ClientCAs = pool
	}
	// The certificate is asked for but verified in the handler, so a wrong one is answered 401
	// (as kubelet does) rather than with a failed handshake the API server reports vaguely.
	s.tls = &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert, MinVersion: tls.VersionTLS12}
	return s, nil
}

// selfSigned makes a serving certificate for ip, valid a year: the API server does not verify
// kubelets' certificates unless told to (--kubelet-certificate-authority).
func selfSigned(ip net.IP) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("kubelet serving key: %w", err)
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "mqlet-bridge kubelet API"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{ip},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("kubelet serving certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// Run keeps one listener per node with a port until ctx ends: new assignments get a listener,
// released ones (Ports.Release: the Node was deleted or left the selector) lose theirs. It
// returns once every listener has stopped.
func (s *Server) Run(ctx context.Context) error {
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	defer s.closeAll()
	for {
		s.reconcile(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-s.ports.Changed():
		case <-tick.C:
		}
	}
}

func (s *Server) reconcile(ctx context.Context) {
	assigned := s.ports.Assigned()
	for node, port := range assigned {
		s.mu.Lock()
		l := s.listeners[node]
		s.mu.Unlock()
		if l != nil && l.port == port {
			continue
		}
		if l != nil {
			s.close(node)
		}
		if err := s.listen(ctx, node, port); err != nil {
			s.o.Log.Error("kubelet API listener failed; retrying", "node", node, "err", err)
		}
	}
	s.mu.Lock()
	var stale []string
	for node := range s.listeners {
		if _, ok := assigned[node]; !ok {
			stale = append(stale, node)
		}
	}
	s.mu.Unlock()
	for _, node := range stale {
		s.close(node)
	}
}

func (s *Server) listen(ctx context.Context, node string, port int32) error {
	addr := net.JoinHostPort(s.ports.Address(), strconv.Itoa(int(port)))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s for node %s: %w", addr, node, err)
	}
	srv := &http.Server{
		Handler:           s.handler(node),
		TLSConfig:         s.tls,
		ReadHeaderTimeout: 30 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          slog.NewLogLogger(s.o.Log.Handler(), slog.LevelDebug),
	}
	l := &listener{port: port, srv: srv, done: make(chan struct{})}
	s.mu.Lock()
	s.listeners[node] = l
	s.mu.Unlock()
	go func() {
		defer close(l.done)
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.o.Log.Error("kubelet API server stopped", "node", node, "addr", addr, "err", err)
		}
	}()
	s.o.Log.Info("serving the kubelet API", "node", node, "addr", addr)
	return nil
}

// close stops node's listener and its open requests (a followed log ends).
func (s *Server) close(node string) {
	s.mu.Lock()
	l := s.listeners[node]
	delete(s.listeners, node)
	s.mu.Unlock()
	if l == nil {
		return
	}
	l.srv.Close()
	<-l.done
}

func (s *Server) closeAll() {
	s.mu.Lock()
	var nodes []string
	for n := range s.listeners {
		nodes = append(nodes, n)
	}
	s.mu.Unlock()
	for _, n := range nodes {
		s.close(n)
	}
}
