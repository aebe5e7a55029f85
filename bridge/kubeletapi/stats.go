package kubeletapi

import (
	"net/http"
)

// summary answers /stats/summary. Not built yet: the nodes do not report usage over MQTT.
func (s *Server) summary(w http.ResponseWriter, r *http.Request, node string) {
	if s.offline(w, node) {
		return
	}
	http.Error(w, "/stats/summary over the bridge is not implemented yet", http.StatusNotImplemented)
}

// resourceMetrics answers /metrics/resource. Not built yet (see summary).
func (s *Server) resourceMetrics(w http.ResponseWriter, r *http.Request, node string) {
	if s.offline(w, node) {
		return
	}
	http.Error(w, "/metrics/resource over the bridge is not implemented yet", http.StatusNotImplemented)
}
