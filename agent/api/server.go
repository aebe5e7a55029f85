// Package api is the agent's local HTTP API, served on a unix socket, and
// its client. It is read-only and speaks Kubernetes shapes (v1.Pod,
// v1.PodList, v1.Node, metav1.Status) so that the local CLI and kubectl-style
// tools can read what the agent is running without a control plane.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/mqlet/mqlet/core/logs"
	"github.com/mqlet/mqlet/core/source"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Provider is what the agent exposes to the API; the agent implements it.
type Provider interface {
	// Pods returns the current pods: desired spec with the latest status
	// merged (copies; caller may keep them).
	Pods() []v1.Pod
	// Ready returns nil when the agent is ready (containerd reachable,
	// initial sync done), else why not.
	Ready() error
}

// RejectionProvider is implemented by providers that refuse manifests or messages: what was
// refused, from where and why, so the user sees it without reading the log.
type RejectionProvider interface {
	Rejected() []source.Rejection
}

// Rejected is one refused manifest or message, as the API serves it.
type Rejected struct {
	Source string `json:"source"`           // the source's kind: file, mqtt
	Origin string `json:"origin,omitempty"` // file path, topic
	// Document is the 0-based document index in a file, -1 for the whole file.
	Document int    `json:"document"`
	Line     int    `json:"line,omitempty"`
	Pod      string `json:"pod,omitempty"` // namespace/name when known
	Reason   string `json:"reason"`
	// Kept says the pods stored from this origin keep running as they were.
	Kept bool `json:"kept,omitempty"`
}

// RejectedList is the body of GET /api/v1/rejected.
type RejectedList struct {
	Items []Rejected `json:"items"`
}

// NodeProvider is implemented by providers that compute the node's status.
type NodeProvider interface {
	// Node returns the node's latest status (a copy the caller may keep), nil before the first.
	Node() *v1.Node
}

// LogProvider is implemented by providers that keep container logs in files.
type LogProvider interface {
	// LogPath returns the log file of a container of a pod (its current attempt, or the one
	// before with previous). An empty container means the pod's only container.
	LogPath(namespace, name, container string, previous bool) (string, error)
}

// Server serves the API for one Provider.
type Server struct {
	p   Provider
	log *slog.Logger
	mux *http.ServeMux

	onListening func() // see OnListening
}

// shutdownTimeout bounds how long Serve waits for in-flight requests once
// its context is done; requests are small reads, so a few seconds is ample.
const shutdownTimeout = 5 * time.Second

// NewServer returns a Server reading from p. A nil log discards.
func NewServer(p Provider, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{p: p, log: log, mux: http.NewServeMux()}
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.mux.HandleFunc("GET /api/v1/pods", s.listPods)
	s.mux.HandleFunc("GET /api/v1/namespaces/{ns}/pods", s.listPods)
	s.mux.HandleFunc("GET /api/v1/namespaces/{ns}/pods/{name}", s.getPod)
	s.mux.HandleFunc("GET /api/v1/namespaces/{ns}/pods/{name}/log", s.getLog)
	s.mux.HandleFunc("POST /api/v1/namespaces/{ns}/pods/{name}/exec", s.exec)
	s.mux.HandleFunc("GET /api/v1/rejected", s.listRejected)
	s.mux.HandleFunc("GET /api/v1/nodes", s.listNodes)
	s.mux.HandleFunc("GET /api/v1/nodes/{name}", s.getNode)
	s.mux.HandleFunc("/", s.fallback)
	return s
}

// Handler returns the HTTP handler, for callers that serve it themselves.
func (s *Server) Handler() http.Handler { return s.mux }

// Handle adds a route (the agent's /metrics) to the API; call it before Serve. pattern is
// http.ServeMux's, e.g. "GET /metrics".
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// OnListening sets f to be called once Serve's socket accepts connections (the agent's READY to
// systemd waits for it, so that `mqlet pods` works as soon as `systemctl start` returns). Call it
// before Serve.
func (s *Server) OnListening(f func()) { s.onListening = f }

// Serve listens on socketPath and serves until ctx is done, then shuts down
// gracefully and removes the socket file. It returns nil after a clean
// shutdown.
//
// The socket is created with mode 0600 without a window where it is more
// open: it is bound inside a fresh 0700 directory next to socketPath,
// chmodded there, and renamed into place. Chmod-after-listen would not be
// enough, because the kernel completes connect() for queued clients before
// Accept is ever called, and setting the umask is process-wide and so races
// with every other goroutine creating files.
func (s *Server) Serve(ctx context.Context, socketPath string) error {
	ln, err := listenUnix0600(socketPath)
	if err != nil {
		return err
	}
	// Remember which inode is ours so that shutdown never removes a socket
	// that someone else put at the same path in the meantime.
	ours, statErr := os.Lstat(socketPath)

	srv := &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		// Requests end with the agent: a followed log (mqlet logs -f) must not hold up shutdown.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	s.log.Info("api listening", "socket", socketPath)
	if s.onListening != nil {
		s.onListening()
	}

	var serveErr error
	select {
	case serveErr = <-served:
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		if err := srv.Shutdown(sctx); err != nil {
			s.log.Warn("api shutdown did not finish cleanly; closing connections", "err", err)
			srv.Close()
		}
		cancel()
		serveErr = <-served
	}

	if statErr == nil {
		if cur, err := os.Lstat(socketPath); err == nil && os.SameFile(ours, cur) {
			if err := os.Remove(socketPath); err != nil {
				s.log.Warn("removing api socket", "socket", socketPath, "err", err)
			}
		}
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("serving api on %s: %w", socketPath, serveErr)
	}
	return nil
}

// listenUnix0600 returns a listener on socketPath whose socket file has mode
// 0600 from the moment it is reachable at that path.
func listenUnix0600(socketPath string) (*net.UnixListener, error) {
	dir := filepath.Dir(socketPath)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("creating api socket directory %s: %w", dir, err)
		}
		// MkdirAll is subject to the umask; the socket's own 0600 is what
		// guards access, the directory only needs to be traversable.
		if err := os.Chmod(dir, 0o755); err != nil {
			return nil, fmt.Errorf("chmod 0755 api socket directory %s: %w", dir, err)
		}
	}
	if err := checkExisting(socketPath); err != nil {
		return nil, err
	}

	// MkdirTemp creates the directory 0700, so nobody but us can reach the
	// socket while it still has the umask-derived mode.
	tmpDir, err := os.MkdirTemp(dir, ".mqlet-api-")
	if err != nil {
		return nil, fmt.Errorf("creating temporary directory for api socket in %s: %w", dir, err)
	}
	defer os.RemoveAll(tmpDir)
	tmpPath := filepath.Join(tmpDir, "s")

	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmpPath, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening on api socket %s (bound first at %s): %w", socketPath, tmpPath, err)
	}
	// The file moves away from tmpPath, so the listener must not try to
	// unlink it on Close; Serve removes the final path itself.
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(tmpPath, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod 0600 api socket %s: %w", tmpPath, err)
	}
	// rename(2) replaces a stale socket atomically, so clients see either
	// the old dead socket or the new one, never a missing file.
	if err := os.Rename(tmpPath, socketPath); err != nil {
		ln.Close()
		return nil, fmt.Errorf("moving api socket into place at %s: %w", socketPath, err)
	}
	return ln, nil
}

// checkExisting returns nil when socketPath is absent or is a socket nobody
// answers on (left by an agent that died), and an error when something is
// still serving there or the path is not a socket at all.
func checkExisting(socketPath string) error {
	fi, err := os.Lstat(socketPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("checking existing api socket %s: %w", socketPath, err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("api socket path %s exists and is not a socket (%s); refusing to replace it", socketPath, fi.Mode().Type())
	}
	conn, err := net.DialTimeout("unix", socketPath, 2*time.Second)
	if err == nil {
		conn.Close()
		return fmt.Errorf("another process (probably another mqlet agent) is already serving on %s; stop it or use a different --api-socket", socketPath)
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return nil // stale: the rename in listenUnix0600 replaces it
	}
	return fmt.Errorf("probing existing api socket %s: %w", socketPath, err)
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeText(w, http.StatusOK, "ok")
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if err := s.p.Ready(); err != nil {
		writeText(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	writeText(w, http.StatusOK, "ok")
}

func (s *Server) listPods(w http.ResponseWriter, r *http.Request) {
	ns := r.PathValue("ns")
	if ns == "" {
		ns = r.URL.Query().Get("namespace")
	}
	items := []v1.Pod{}
	for _, p := range s.p.Pods() {
		if ns != "" && p.Namespace != ns {
			continue
		}
		p.TypeMeta = podTypeMeta
		items = append(items, p)
	}
	sort.Slice(items, func(i, j int) bool {
		if items[i].Namespace != items[j].Namespace {
			return items[i].Namespace < items[j].Namespace
		}
		return items[i].Name < items[j].Name
	})
	s.writeJSON(w, http.StatusOK, &v1.PodList{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodList"},
		Items:    items,
	})
}

func (s *Server) listRejected(w http.ResponseWriter, r *http.Request) {
	list := RejectedList{Items: []Rejected{}}
	if rp, ok := s.p.(RejectionProvider); ok {
		for _, x := range rp.Rejected() {
			list.Items = append(list.Items, Rejected{Source: string(x.Ref.Kind), Origin: x.Ref.Origin, Document: x.Ref.Doc,
				Line: x.Line, Pod: x.Key, Reason: x.Reason, Kept: x.Keep})
		}
	}
	s.writeJSON(w, http.StatusOK, &list)
}

func (s *Server) getPod(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("ns"), r.PathValue("name")
	for _, p := range s.p.Pods() {
		if p.Namespace == ns && p.Name == name {
			p.TypeMeta = podTypeMeta
			s.writeJSON(w, http.StatusOK, &p)
			return
		}
	}
	st := failure(http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("pod %s/%s not found", ns, name))
	st.Details = &metav1.StatusDetails{Name: name, Kind: "pods"}
	s.writeJSON(w, http.StatusNotFound, st)
}

// node is the provider's node status, nil when it has none (yet).
func (s *Server) node() *v1.Node {
	np, ok := s.p.(NodeProvider)
	if !ok {
		return nil
	}
	n := np.Node()
	if n != nil {
		n.TypeMeta = nodeTypeMeta
	}
	return n
}

// listNodes answers with a list of the one node the agent is, empty until its status exists.
func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) {
	list := &v1.NodeList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "NodeList"}, Items: []v1.Node{}}
	if n := s.node(); n != nil {
		list.Items = append(list.Items, *n)
	}
	s.writeJSON(w, http.StatusOK, list)
}

func (s *Server) getNode(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	n := s.node()
	if n != nil && n.Name == name {
		s.writeJSON(w, http.StatusOK, n)
		return
	}
	msg := fmt.Sprintf("node %s not found", name)
	switch {
	case n != nil:
		msg += fmt.Sprintf(" (this agent is node %s)", n.Name)
	case s.hasNodes():
		msg += " (the agent has not computed its status yet)"
	}
	st := failure(http.StatusNotFound, metav1.StatusReasonNotFound, msg)
	st.Details = &metav1.StatusDetails{Name: name, Kind: "nodes"}
	s.writeJSON(w, http.StatusNotFound, st)
}

func (s *Server) hasNodes() bool {
	_, ok := s.p.(NodeProvider)
	return ok
}

// fallback turns what ServeMux would answer with plain text into Status
// bodies. A method-specific pattern shadows "/" only for its own method, so a
// POST to a GET route lands here; it is recognised by asking the mux which
// pattern the same request would match as a GET.
func (s *Server) fallback(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		probe := r.Clone(r.Context())
		probe.Method = http.MethodGet
		if _, pattern := s.mux.Handler(probe); pattern != "/" && pattern != "" {
			w.Header().Set("Allow", "GET, HEAD")
			s.writeJSON(w, http.StatusMethodNotAllowed, failure(http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed,
				fmt.Sprintf("method %s not allowed on %s; the mqlet api is read-only", r.Method, r.URL.Path)))
			return
		}
	}
	s.writeJSON(w, http.StatusNotFound, failure(http.StatusNotFound, metav1.StatusReasonNotFound,
		fmt.Sprintf("no api route for %s %s", r.Method, r.URL.Path)))
}

var (
	podTypeMeta  = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
	nodeTypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}
)

func failure(code int32, reason metav1.StatusReason, msg string) *metav1.Status {
	return &metav1.Status{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"},
		Status:   metav1.StatusFailure,
		Message:  msg,
		Reason:   reason,
		Code:     code,
	}
}

func (s *Server) writeJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		s.log.Error("encoding api response", "type", fmt.Sprintf("%T", v), "err", err)
		code = http.StatusInternalServerError
		body, _ = json.Marshal(failure(http.StatusInternalServerError, metav1.StatusReasonInternalError,
			fmt.Sprintf("encoding %T: %v", v, err)))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(body, '\n'))
}

func writeText(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	fmt.Fprintln(w, msg)
}

// followPoll is how often a followed log is checked for new output.
const followPoll = 200 * time.Millisecond

// logRecheckEvery is how many idle polls of a followed log go by between two lookups of its path.
const logRecheckEvery = 8

// getLog streams a container's log like kubectl logs, with the Kubernetes API's parameters:
// ?container=, ?previous=true, ?follow=true (until the client goes away), ?tailLines=N,
// ?sinceSeconds=N or ?sinceTime=RFC3339, ?timestamps=true.
func (s *Server) getLog(w http.ResponseWriter, r *http.Request) {
	lp, ok := s.p.(LogProvider)
	if !ok {
		s.writeJSON(w, http.StatusNotFound, failure(http.StatusNotFound, metav1.StatusReasonNotFound, "this agent keeps no logs"))
		return
	}
	q := r.URL.Query()
	o, err := logReadOptions(q, time.Now())
	if err != nil {
		s.writeJSON(w, http.StatusBadRequest, failure(http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error()))
		return
	}
	path, err := lp.LogPath(r.PathValue("ns"), r.PathValue("name"), q.Get("container"), q.Get("previous") == "true")
	if err != nil {
		s.writeJSON(w, http.StatusNotFound, failure(http.StatusNotFound, metav1.StatusReasonNotFound, err.Error()))
		return
	}
	if _, err := os.Stat(path); err != nil {
		s.writeJSON(w, http.StatusNotFound, failure(http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("log of pod %s/%s: %v", r.PathValue("ns"), r.PathValue("name"), err)))
		return
	}
	polls := 0
	o.Idle = func() error {
		// A restarted container logs to a new file: the followed one has ended.
		if polls++; polls%logRecheckEvery == 0 {
			if now, err := lp.LogPath(r.PathValue("ns"), r.PathValue("name"), q.Get("container"), q.Get("previous") == "true"); err != nil || now != path {
				return logs.ErrEnded
			}
		}
		return nil
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := logs.Read(r.Context(), path, o, w); err != nil && r.Context().Err() == nil {
		s.log.Warn("reading container log", "pod", r.PathValue("ns")+"/"+r.PathValue("name"), "err", err)
	}
}

// logReadOptions reads the log query parameters; a bad one is named in the error.
func logReadOptions(q url.Values, now time.Time) (logs.ReadOptions, error) {
	o := logs.ReadOptions{Tail: logs.All, Follow: q.Get("follow") == "true", Timestamps: q.Get("timestamps") == "true", Poll: followPoll}
	if v := q.Get("tailLines"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return o, fmt.Errorf("tailLines %q: want a number of lines, 0 or more", v)
		}
		o.Tail = n
	}
	sinceSeconds, sinceTime := q.Get("sinceSeconds"), q.Get("sinceTime")
	switch {
	case sinceSeconds != "" && sinceTime != "":
		return o, errors.New("sinceSeconds and sinceTime: give at most one")
	case sinceSeconds != "":
		n, err := strconv.ParseInt(sinceSeconds, 10, 64)
		if err != nil || n <= 0 {
			return o, fmt.Errorf("sinceSeconds %q: want a number of seconds, 1 or more", sinceSeconds)
		}
		o.Since = now.Add(-time.Duration(n) * time.Second)
	case sinceTime != "":
		t, err := time.Parse(time.RFC3339, sinceTime)
		if err != nil {
			return o, fmt.Errorf("sinceTime %q: want an RFC 3339 time: %v", sinceTime, err)
		}
		o.Since = t
	}
	return o, nil
}
