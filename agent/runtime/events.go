package runtime

import (
	"context"
	"fmt"
	"time"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/typeurl/v2"
)

// Event is a container lifecycle change that the pod workers care about.
type Event struct {
	ContainerID string
	OOM         bool // the container hit its memory limit (an exit event follows)
	Exited      bool
	ExitCode    uint32
	ExitedAt    time.Time
}

// Events streams task exits and OOMs of this namespace until ctx ends or the stream breaks; the
// error says why it broke so the caller can resubscribe (containerd restarts are normal).
func (r *Runtime) Events(ctx context.Context, fn func(Event)) error {
	ns := r.opts.Namespace
	ch, errs := r.client.Subscribe(ctx,
		fmt.Sprintf(`namespace==%q,topic=="/tasks/exit"`, ns),
		fmt.Sprintf(`namespace==%q,topic=="/tasks/oom"`, ns))
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errs:
			return fmt.Errorf("containerd event stream: %w", err)
		case env := <-ch:
			if env == nil || env.Event == nil {
				continue
			}
			v, err := typeurl.UnmarshalAny(env.Event)
			if err != nil {
				r.log.Debug("undecodable containerd event", "topic", env.Topic, "err", err)
				continue
			}
			switch e := v.(type) {
			case *apievents.TaskExit:
				if e.ID != e.ContainerID { // an exec'd process, not the container's init
					continue
				}
				ev := Event{ContainerID: e.ContainerID, Exited: true, ExitCode: e.ExitStatus}
				if e.ExitedAt != nil {
					ev.ExitedAt = e.ExitedAt.AsTime()
				}
				fn(ev)
			case *apievents.TaskOOM:
				fn(Event{ContainerID: e.ContainerID, OOM: true})
			}
		}
	}
}
