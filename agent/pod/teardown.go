package pod

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
)

// MinGrace is kubelet's floor for a termination grace period: even a pod that asks for 0 gets a
// SIGTERM and this long to act on it before SIGKILL.
const MinGrace = 2 * time.Second

// ErrSandboxLeft marks a Teardown whose containers are all gone but whose sandbox (namespaces, pod
// dir, logs, cgroup) could not all be removed; a later Teardown or sweep retries it.
var ErrSandboxLeft = errors.New("sandbox not fully removed")

// Teardown is the one way a pod leaves the node, whether deleted, found orphaned after a crash, or
// swept as a leftover: every container is stopped in parallel (stop signal, grace period, SIGKILL)
// and removed, then the sandbox is removed. With grace nil each container gets the grace its pod
// had when it was created (ctrd.Container.Grace). The sandbox stays while any container may
// still run in it; the returned error then says which container failed.
func Teardown(ctx context.Context, rt Runtime, ref ctrd.PodRef, ctrs []ctrd.Container, grace *time.Duration, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	var wg sync.WaitGroup
	errs := make([]error, len(ctrs))
	for i, c := range ctrs {
		g := c.Grace
		if grace != nil {
			g = *grace
		}
		g = max(g, MinGrace)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rt.StopContainer(ctx, c.ID, g); err != nil {
				errs[i] = fmt.Errorf("pod %s: stop container %s (%s): %w", ref, c.Name, c.ID, err)
				return
			}
			if err := rt.RemoveContainer(ctx, c.ID); err != nil {
				errs[i] = fmt.Errorf("pod %s: remove container %s (%s): %w", ref, c.Name, c.ID, err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := rt.RemoveSandbox(ctx, ref); err != nil {
		return fmt.Errorf("%w: %w", ErrSandboxLeft, err)
	}
	log.Debug("pod torn down", "pod", ref.String(), "containers", len(ctrs))
	return nil
}
