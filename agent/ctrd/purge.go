package ctrd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/errdefs"
)

// RemoveAllContainers stops every container of the namespace (mqlet's or not: the namespace is
// mqlet's) with its pod's grace period, at most maxGrace, all at once, and deletes them with their
// snapshots. It is the first step of `mqlet uninstall --purge`; the pods' sandboxes go next. It
// returns the ids it removed; every container is tried even when one fails.
func (r *Runtime) RemoveAllContainers(ctx context.Context, maxGrace time.Duration) ([]string, error) {
	ctx = r.ctx(ctx)
	ctrs, err := r.client.Containers(ctx)
	if err != nil {
		return nil, fmt.Errorf("list containers of namespace %s: %w", r.opts.Namespace, err)
	}
	var (
		mu      sync.Mutex
		removed []string
		errs    []error
		wg      sync.WaitGroup
	)
	for _, c := range ctrs {
		wg.Go(func() {
			grace := maxGrace
			if l, err := c.Labels(ctx); err == nil {
				if g := parseGrace(l[LabelGracePeriod]); l[LabelGracePeriod] != "" && g < grace {
					grace = g
				}
			}
			err := r.StopContainer(ctx, c.ID(), grace)
			if err == nil {
				err = r.RemoveContainer(ctx, c.ID())
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			removed = append(removed, c.ID())
		})
	}
	wg.Wait()
	return removed, errors.Join(errs...)
}

// DeleteNamespace removes what is left of mqlet in containerd once its containers are gone: the
// leases (an interrupted pull's), every image, waiting for the garbage collection that frees their
// blobs and layers, then the namespace itself. It returns the images it removed.
func (r *Runtime) DeleteNamespace(ctx context.Context) ([]string, error) {
	ctx = r.ctx(ctx)
	var errs []error
	ls := r.client.LeasesService()
	all, err := ls.List(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("list leases: %w", err))
	}
	for _, l := range all {
		if err := ls.Delete(ctx, l, leases.SynchronousDelete); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete lease %s: %w", l.ID, err))
		}
	}
	is := r.client.ImageService()
	imgs, err := is.List(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("list images: %w", err))
	}
	var removed []string
	for _, img := range imgs {
		if err := is.Delete(ctx, img.Name, images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove image %s: %w", img.Name, err))
			continue
		}
		removed = append(removed, img.Name)
	}
	if len(errs) == 0 {
		err := r.client.NamespaceService().Delete(ctx, r.opts.Namespace)
		if err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete containerd namespace %s: %w", r.opts.Namespace, err))
		}
	}
	return removed, errors.Join(errs...)
}
