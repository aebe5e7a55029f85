package pod

import (
	"context"
	"errors"
	"fmt"

	"github.com/mqlet/mqlet/agent/cgroup"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/core/event"
	v1 "k8s.io/api/core/v1"
)

// ReasonOOMKilled is the reason of a container the kernel's OOM killer ended, in its terminated
// state and in the Warning event emitted for it.
const ReasonOOMKilled = "OOMKilled"

// OOMChecker is a runtime that can tell from a container's cgroup whether the kernel OOM-killed a
// process of it (ctrd.Runtime.OOMKilled). containerd's OOM event says so while the agent runs;
// the cgroup's counters say so for a kill nobody saw, as long as the container is not removed.
type OOMChecker interface {
	OOMKilled(ctx context.Context, c ctrd.Container) (bool, error)
}

// checkOOM looks, once per exited attempt with no OOM event, at its cgroup's OOM counters. It runs
// at the first look at the exit, before anything removes the container (and its cgroup).
func (w *Worker) checkOOM(ctx context.Context, name string, cur *ctrd.Container) {
	r := w.rec(name)
	if r.oomIDs[cur.ID] || r.oomChecked == cur.ID {
		return
	}
	r.oomChecked = cur.ID
	oc, ok := w.env.Runtime.(OOMChecker)
	if !ok {
		return
	}
	killed, err := oc.OOMKilled(ctx, *cur)
	switch {
	case errors.Is(err, cgroup.ErrNoCgroup):
		w.env.Log.Debug("no cgroup left to tell an OOM kill from", "container", cur.ID)
	case err != nil:
		w.env.Log.Warn("cannot read the container's OOM counters", "container", cur.ID, "err", err)
	case killed:
		w.env.Log.Info("container was OOM-killed (seen in its cgroup's counters, no event)", "container", cur.ID, "exit", cur.ExitCode)
		r.oomIDs[cur.ID] = true
	}
}

// reportOOM emits one Warning event per OOM-killed attempt, from a live event or the counters.
func (w *Worker) reportOOM(pod *v1.Pod, c *v1.Container, cur *ctrd.Container) {
	r := w.rec(c.Name)
	if !r.oomIDs[cur.ID] || r.oomReported == cur.ID {
		return
	}
	r.oomReported = cur.ID
	limit := "it has no memory limit of its own, so the pod's or the node's was reached"
	if m, ok := c.Resources.Limits[v1.ResourceMemory]; ok && !m.IsZero() {
		limit = "memory limit " + m.String()
	}
	msg := fmt.Sprintf("Memory cgroup out of memory: the kernel killed a process of container %s (%s)", c.Name, limit)
	if cur.State == ctrd.StateExited {
		msg = fmt.Sprintf("Container %s was OOM-killed (%s); exit code %d", c.Name, limit, cur.ExitCode)
	}
	// About the container (its field path), so the event and the OOM metric name it.
	w.emitContainer(pod, c.Name, event.Warning, ReasonOOMKilled, msg)
}
