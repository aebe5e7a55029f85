package logserve

import (
	"testing"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"
)

// Logs in the CRI format go out as kubectl logs shows them: prefixes dropped (or just the
// timestamp with timestamps), P records joined, sinceSeconds and tail applied to lines.
func TestCRILogWithSinceAndTimestamps(t *testing.T) {
	r := newRig(t, Options{})
	old := time.Now().Add(-2 * time.Hour).UTC()
	recent := time.Now().Add(-time.Minute).UTC()
	stamp := func(at time.Time) string { return at.Format(time.RFC3339Nano) }
	writeLog(t, r, "cri", stamp(old)+" stdout F old line\n"+
		stamp(recent)+" stdout P new \n"+
		stamp(recent)+" stdout F line\n"+
		stamp(recent)+" stderr F oops\n")

	for _, c := range []struct {
		id   string
		edit func(*protocol.LogsRequest)
		want string
	}{
		{"all", func(*protocol.LogsRequest) {}, "old line\nnew line\noops\n"},
		{"since", func(o *protocol.LogsRequest) { o.SinceSeconds = 3600 }, "new line\noops\n"},
		{"tail", func(o *protocol.LogsRequest) { o.Tail = 2 }, "new line\noops\n"},
		{"stamps", func(o *protocol.LogsRequest) { o.Tail, o.Timestamps = 1, true }, stamp(recent) + " oops\n"},
	} {
		req := open(c.id, "cri", 0, false)
		c.edit(req)
		r.send(t, req)
		got, errMsg := r.readAll(t, c.id, 0)
		if got != c.want || errMsg != "" {
			t.Errorf("%s: got %q (error %q), want %q", c.id, got, errMsg, c.want)
		}
	}
}
