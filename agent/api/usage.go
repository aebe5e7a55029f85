package api

import (
	"context"
	"net/http"

	"github.com/mqlet/mqlet/agent/usage"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HandleUsage adds GET /api/v1/usage, served from read (usage.Reader.Read): a fresh reading of the
// node's and each running container's cumulative CPU seconds and memory working set, as JSON
// (usage.Snapshot). `mqlet top` takes two and shows the rates between them. Call it before Serve.
func (s *Server) HandleUsage(read func(ctx context.Context) (usage.Snapshot, error)) {
	s.mux.HandleFunc("GET /api/v1/usage", func(w http.ResponseWriter, r *http.Request) {
		snap, err := read(r.Context())
		if err != nil {
			s.writeJSON(w, http.StatusInternalServerError, failure(http.StatusInternalServerError, metav1.StatusReasonInternalError, err.Error()))
			return
		}
		if snap.Containers == nil {
			snap.Containers = []usage.Container{}
		}
		s.writeJSON(w, http.StatusOK, snap)
	})
}

// Usage reads the node's and its containers' use now (GET /api/v1/usage).
func (c *Client) Usage(ctx context.Context) (usage.Snapshot, error) {
	var s usage.Snapshot
	err := c.getJSON(ctx, "/api/v1/usage", &s)
	return s, err
}
