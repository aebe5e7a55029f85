package ctrd

import (
	"context"
	"fmt"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/typeurl/v2"
)

// Event is a container lifecycle change that the pod workers care about. It carries no exit
// details: a worker reads those from containerd when it syncs, so an event only says whom to wake.
type Event struct {
	ContainerID string
	OOM         bool // the container hit its memory limit (an exit event follows); else it exited
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
				fn(Event{ContainerID: e.ContainerID})
			case *apievents.TaskOOM:
				fn(Event{ContainerID: e.ContainerID, OOM: true})
			}
		}
	}
}
