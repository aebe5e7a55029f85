package kubeletapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/mqlet/mqlet/sync/logsclient"
	"github.com/mqlet/mqlet/sync/protocol"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// handler is node's kubelet API: every request authenticated and authorized first.
func (s *Server) handler(node string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	mux.HandleFunc("GET /pods", func(w http.ResponseWriter, r *http.Request) { s.pods(w, r, node) })
	mux.HandleFunc("GET /pods/", func(w http.ResponseWriter, r *http.Request) { s.pods(w, r, node) })
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", func(w http.ResponseWriter, r *http.Request) {
		s.containerLogs(w, r, node)
	})
	mux.HandleFunc("GET /stats/summary", func(w http.ResponseWriter, r *http.Request) { s.summary(w, r, node) })
	mux.HandleFunc("GET /stats/summary/", func(w http.ResponseWriter, r *http.Request) { s.summary(w, r, node) })
	mux.HandleFunc("GET /metrics/resource", func(w http.ResponseWriter, r *http.Request) { s.resourceMetrics(w, r, node) })
	for _, p := range []string{"/exec/", "/attach/", "/portForward/", "/run/"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) { s.stream(w, r, node) })
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, err := s.auth.Authenticate(r.Context(), r)
		if err != nil {
			s.o.Log.Debug("kubelet API: unauthenticated", "node", node, "path", r.URL.Path, "err", err)
			if errors.Is(err, errUnauthenticated) {
				http.Error(w, "Unauthorized", http.StatusUnauthorized)
			} else {
				http.Error(w, "authentication failed: "+err.Error(), http.StatusInternalServerError)
			}
			return
		}
		at := RequestAttributes(r.Method, r.URL.Path, node)
		ok, reason, err := s.auth.Authorize(r.Context(), u, at)
		if err != nil {
			http.Error(w, "authorization failed: "+err.Error(), http.StatusInternalServerError)
			return
		}
		if !ok {
			msg := fmt.Sprintf("Forbidden (user=%s, verb=%s, resource=nodes, subresource=%s)", u.Name, at.Verb, at.Subresource)
			if reason != "" {
				msg += ": " + reason
			}
			http.Error(w, msg, http.StatusForbidden)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// offline answers 503 when node is offline: the bridge cannot reach it, and waiting for a timeout
// would tell the client nothing more.
func (s *Server) offline(w http.ResponseWriter, node string) bool {
	return s.offlineStatus(w, node, http.StatusServiceUnavailable)
}

// offlineStatus is offline with another status: the API server passes a kubelet's 400 on to
// kubectl with its text ("Error from server (BadRequest): node edge-1 is offline ..."), but turns
// a 503 into "the server is currently unable to handle the request", so the endpoints a person
// reads through kubectl (logs, exec) answer 400, as kubelet does for a container whose log it
// cannot serve now; machine clients of stats keep the 503.
func (s *Server) offlineStatus(w http.ResponseWriter, node string, code int) bool {
	if s.o.Nodes.Online(node) {
		return false
	}
	http.Error(w, fmt.Sprintf("node %s is offline: the bridge has no connection to it over MQTT", node), code)
	return true
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// pods answers the pods the bridge knows bound to node, as kubelet's /pods does (a PodList).
func (s *Server) pods(w http.ResponseWriter, r *http.Request, node string) {
	list := v1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}}
	if s.o.NodePods != nil {
		for _, p := range s.o.NodePods(node) {
			list.Items = append(list.Items, *p)
		}
	}
	if list.Items == nil {
		list.Items = []v1.Pod{}
	}
	writeJSON(w, &list)
}

// stream hands exec, attach, portForward and run to the Streamer.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, node string) {
	if s.o.Streamer == nil {
		what := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 2)[0]
		http.Error(w, what+" over the bridge is not implemented yet", http.StatusNotImplemented)
		return
	}
	if s.offlineStatus(w, node, http.StatusBadRequest) {
		return
	}
	s.o.Streamer.ServeStream(w, r, node)
}

// logOptions are the query parameters of /containerLogs (kubelet takes PodLogOptions' fields).
type logOptions struct {
	follow, previous, timestamps bool
	sinceSeconds                 *int64
	sinceTime                    *time.Time
	tailLines, limitBytes        *int64
}

func parseLogOptions(q url.Values) (logOptions, error) {
	var o logOptions
	var err error
	for name, dst := range map[string]*bool{"follow": &o.follow, "previous": &o.previous, "timestamps": &o.timestamps} {
		if v := q.Get(name); v != "" {
			if *dst, err = strconv.ParseBool(v); err != nil {
				return o, fmt.Errorf("%s=%q: not a boolean", name, v)
			}
		}
	}
	for name, dst := range map[string]**int64{"sinceSeconds": &o.sinceSeconds, "tailLines": &o.tailLines, "limitBytes": &o.limitBytes} {
		if v := q.Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return o, fmt.Errorf("%s=%q: not an integer", name, v)
			}
			*dst = &n
		}
	}
	if v := q.Get("sinceTime"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return o, fmt.Errorf("sinceTime=%q: not an RFC 3339 time", v)
		}
		o.sinceTime = &t
	}
	switch {
	case o.sinceSeconds != nil && o.sinceTime != nil:
		return o, errors.New("at most one of sinceTime or sinceSeconds may be specified")
	case o.sinceSeconds != nil && *o.sinceSeconds < 1:
		return o, errors.New("sinceSeconds: must be greater than 0")
	case o.tailLines != nil && *o.tailLines < 0:
		return o, errors.New("tailLines: must be greater than or equal to 0")
	case o.limitBytes != nil && *o.limitBytes < 1:
		return o, errors.New("limitBytes: must be greater than 0")
	}
	return o, nil
}

// request turns the options into a logs request of the protocol; now converts sinceTime.
func (o logOptions) request(namespace, pod, container string, now time.Time) protocol.LogsRequest {
	req := protocol.LogsRequest{Namespace: namespace, Pod: pod, Container: container,
		Follow: o.follow, Previous: o.previous, Timestamps: o.timestamps}
	if o.tailLines != nil {
		req.Tail = *o.tailLines
	}
	if o.sinceSeconds != nil {
		req.SinceSeconds = *o.sinceSeconds
	}
	if o.sinceTime != nil {
		req.SinceTime = o.sinceTime.UTC().Truncate(time.Second) // the node re-encodes it to check a signature
	}
	return req
}

// containerLogs streams a container's log from the node over MQTT.
func (s *Server) containerLogs(w http.ResponseWriter, r *http.Request, node string) {
	ns, pod, container := r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container")
	o, err := parseLogOptions(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if s.offlineStatus(w, node, http.StatusBadRequest) {
		return
	}
	if o.tailLines != nil && *o.tailLines == 0 && !o.follow {
		// The protocol's tail 0 means the whole log; no line is what was asked.
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		return
	}
	out := &logWriter{w: w}
	if o.limitBytes != nil {
		out.limit = *o.limitBytes
	}
	if f, ok := w.(http.Flusher); ok {
		out.flush = f.Flush
	}
	req := o.request(ns, pod, container, time.Now())
	err = s.o.Logs(r.Context(), node, req, out)
	var ne *logsclient.NodeError
	if errors.As(err, &ne) && !out.started && !req.SinceTime.IsZero() && strings.Contains(ne.Msg, "sinceTime") {
		// A node older than sinceTime refuses it as an unknown field (docs/protocol.md section
		// 9): ask again with the same cut as seconds back from now.
		req.SinceSeconds = max(1, int64(math.Ceil(time.Since(req.SinceTime).Seconds())))
		req.SinceTime = time.Time{}
		err = s.o.Logs(r.Context(), node, req, out)
	}
	if err == nil || r.Context().Err() != nil {
		if !out.started {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusOK)
		}
		return
	}
	if out.started {
		// The status line is gone; the client sees the stream end.
		s.o.Log.Warn("container log stream ended with an error", "node", node, "pod", ns+"/"+pod, "container", container, "err", err)
		return
	}
	// 400 and 500 keep their text through the API server (a 404 or 503 would not): the node's
	// refusal (no such pod, no previous instance) is the client's to fix, a failure on the way
	// (timeout, broker) is not.
	if errors.As(err, &ne) {
		http.Error(w, ne.Msg, http.StatusBadRequest)
		return
	}
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

// logWriter writes log bytes to the HTTP response: the 200 status goes out with the first bytes
// (an error before them still gets its own status), each chunk is flushed (a followed log shows
// as it comes), and a byte limit cuts the stream.
type logWriter struct {
	w       http.ResponseWriter
	flush   func()
	started bool
	limit   int64 // 0: none
	written int64
}

func (l *logWriter) Write(p []byte) (int, error) {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", "text/plain")
		l.w.WriteHeader(http.StatusOK)
	}
	cut := false
	if l.limit > 0 && l.written+int64(len(p)) >= l.limit {
		p, cut = p[:l.limit-l.written], true
	}
	n, err := l.w.Write(p)
	l.written += int64(n)
	if l.flush != nil {
		l.flush()
	}
	if err != nil {
		return n, err
	}
	if cut {
		return n, logsclient.ErrStop
	}
	return n, nil
}
