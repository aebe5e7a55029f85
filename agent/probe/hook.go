package probe

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

// RunHook runs a postStart or preStop handler against t until it ends or ctx does (the caller bounds
// a preStop hook by the grace period). The error says what failed, in words fit for the
// FailedPostStartHook/FailedPreStopHook event.
func (p *Prober) RunHook(ctx context.Context, t Target, h *v1.LifecycleHandler) error {
	switch {
	case h.Exec != nil:
		return p.execHook(ctx, t, h.Exec.Command)
	case h.HTTPGet != nil:
		return p.httpHook(ctx, t, h.HTTPGet)
	case h.Sleep != nil:
		return sleepHook(ctx, h.Sleep.Seconds)
	case h.TCPSocket != nil:
		return errors.New("tcpSocket hooks are not supported (Kubernetes accepts them for compatibility only)")
	}
	return errors.New("hook has no handler (exec, httpGet or sleep)")
}

func (p *Prober) execHook(ctx context.Context, t Target, cmd []string) error {
	if t.Exec == nil {
		return fmt.Errorf("exec hook %q: this runtime cannot run commands in containers", cmd)
	}
	res, err := t.Exec.Exec(ctx, t.ContainerID, cmd, 0)
	if err != nil {
		return fmt.Errorf("exec hook %q: %w", cmd, err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("exec hook %q exited with %d, output: %q", cmd, res.ExitCode, strings.TrimSpace(string(res.Output)))
	}
	return nil
}

// hookHTTPTimeout bounds an httpGet hook that has no deadline of its own (postStart): the pod's
// worker waits for it.
const hookHTTPTimeout = 30 * time.Second

func sleepHook(ctx context.Context, seconds int64) error {
	t := time.NewTimer(time.Duration(seconds) * time.Second)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sleep hook of %ds ended early: %w", seconds, ctx.Err())
	}
}
