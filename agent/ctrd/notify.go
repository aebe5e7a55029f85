package ctrd

import (
	"context"
	"fmt"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/mqlet/mqlet/core/event"
)

// Notifier is told what StartContainer does that kubelet reports as events about the container
// (Pulling, Pulled, Created, Started, a failed pull). The pod worker passes one in the context of
// each StartContainer call (WithNotifier), so the runtime needs no knowledge of pods' events. It
// must not block.
type Notifier func(typ event.Type, reason, message string)

type notifierKey struct{}

// WithNotifier returns ctx carrying n for the runtime calls made with it.
func WithNotifier(ctx context.Context, n Notifier) context.Context {
	return context.WithValue(ctx, notifierKey{}, n)
}

func notify(ctx context.Context, typ event.Type, reason, message string) {
	if n, ok := ctx.Value(notifierKey{}).(Notifier); ok && n != nil {
		n(typ, reason, message)
	}
}

// notifyPresent: the image was found on the node, nothing pulled (kubelet's wording).
func notifyPresent(ctx context.Context, image string) {
	notify(ctx, event.Normal, event.ReasonPulled, fmt.Sprintf("Container image %q already present on machine", image))
}

func notifyCreated(ctx context.Context, name string) {
	notify(ctx, event.Normal, event.ReasonCreated, "Created container: "+name)
}

func notifyStarted(ctx context.Context, name string) {
	notify(ctx, event.Normal, event.ReasonStarted, "Started container "+name)
}

// pullNotified is pullShared with kubelet's pull events around it. A pull shared with another
// container reports the time this caller waited, which is what its pod was held up by.
func (r *Runtime) pullNotified(ctx context.Context, image, ref string) (containerd.Image, error) {
	notify(ctx, event.Normal, event.ReasonPulling, fmt.Sprintf("Pulling image %q", image))
	start := time.Now()
	img, err := r.pullShared(ctx, ref)
	if err != nil {
		notify(ctx, event.Warning, event.ReasonFailed, fmt.Sprintf("Failed to pull image %q: %v", image, err))
		return img, err
	}
	took := time.Since(start).Round(time.Millisecond)
	msg := fmt.Sprintf("Successfully pulled image %q in %s (%s including waiting).", image, took, took)
	if size, serr := img.Size(ctx); serr == nil {
		msg += fmt.Sprintf(" Image size: %d bytes.", size)
	}
	notify(ctx, event.Normal, event.ReasonPulled, msg)
	return img, nil
}
