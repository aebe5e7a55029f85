package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// PodEventSource lists the events recorded about a pod (podevents.Recorder implements it).
type PodEventSource interface {
	// Events returns the events of the pod with uid, least recently seen first; the caller may
	// keep them.
	Events(uid types.UID) []v1.Event
}

// HandleEvents adds GET /api/v1/namespaces/{ns}/pods/{name}/events, served from src: the pod's
// events as a v1.EventList (what `mqlet describe pod` shows), or a 404 Status for a pod the agent
// does not have. Call it before Serve.
func (s *Server) HandleEvents(src PodEventSource) {
	s.mux.HandleFunc("GET /api/v1/namespaces/{ns}/pods/{name}/events", func(w http.ResponseWriter, r *http.Request) {
		ns, name := r.PathValue("ns"), r.PathValue("name")
		for _, p := range s.p.Pods() {
			if p.Namespace == ns && p.Name == name {
				items := src.Events(p.UID)
				if items == nil {
					items = []v1.Event{}
				}
				s.writeJSON(w, http.StatusOK, &v1.EventList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "EventList"}, Items: items})
				return
			}
		}
		st := failure(http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("pod %s/%s not found", ns, name))
		st.Details = &metav1.StatusDetails{Name: name, Kind: "pods"}
		s.writeJSON(w, http.StatusNotFound, st)
	})
}

// PodEvents returns the events recorded about a pod; an unknown pod gives an error matching
// ErrNotFound.
func (c *Client) PodEvents(ctx context.Context, namespace, name string) (*v1.EventList, error) {
	var list v1.EventList
	path := "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods/" + url.PathEscape(name) + "/events"
	if err := c.getJSON(ctx, path, &list); err != nil {
		return nil, err
	}
	return &list, nil
}
