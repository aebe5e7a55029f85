package agent

import (
	"context"
	"errors"
	"fmt"
	"github.com/mqlet/mqlet/agent/podspec"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

// RunOnce is kubelet's --runonce: read each source that can be read once (the manifest dir), start
// its pods, wait until each is running or finished (or has failed to start), and return them. The
// pods are left as they are; every goroutine started has ended on return.
func (a *Agent) RunOnce(ctx context.Context, timeout time.Duration) ([]v1.Pod, error) {
	defer a.shutdown()
	if err := a.start(ctx); err != nil {
		return nil, err
	}
	ctx = a.runCtx
	a.wg.Add(1)
	go func() { defer a.wg.Done(); a.followEvents(ctx) }()
	for _, s := range a.sources {
		o, ok := s.(OneShot)
		if !ok {
			continue
		}
		c, err := o.Once()
		if err != nil {
			return nil, fmt.Errorf("source %s: %w", s.Kind(), err)
		}
		a.Apply(s.Kind(), c)
	}

	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		pods := a.Pods()
		settled := true
		for i := range pods {
			if _, done := OnceOutcome(&pods[i]); !done {
				settled = false
			}
		}
		if settled {
			return pods, onceErr(pods)
		}
		select {
		case <-ctx.Done():
			return pods, ctx.Err()
		case <-deadline.C:
			return pods, fmt.Errorf("--once: pods not settled after %s", timeout)
		case <-tick.C:
		}
	}
}

// OnceOutcome says whether a pod has settled for --once and whether it failed.
func OnceOutcome(p *v1.Pod) (failed, done bool) {
	switch p.Status.Phase {
	case v1.PodSucceeded:
		return false, true
	case v1.PodFailed:
		return true, true
	}
	all := podspec.AllStatuses(&p.Status)
	if len(all) == 0 {
		return false, false
	}
	running := true
	for _, cs := range all {
		if w := cs.State.Waiting; w != nil {
			if w.Reason != "ContainerCreating" && w.Reason != "PodInitializing" {
				return true, true // a start failure: ErrImagePull, CreateContainerConfigError, CrashLoopBackOff...
			}
			running = false
		}
	}
	ready := true
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running == nil && cs.State.Terminated == nil {
			ready = false
		}
	}
	return false, running && ready && len(p.Status.ContainerStatuses) == len(p.Spec.Containers)
}

func onceErr(pods []v1.Pod) error {
	var failed []string
	for i := range pods {
		if f, _ := OnceOutcome(&pods[i]); f {
			failed = append(failed, pods[i].Namespace+"/"+pods[i].Name)
		}
	}
	if len(failed) > 0 {
		return errors.New("--once: pods failed: " + strings.Join(failed, ", "))
	}
	return nil
}
