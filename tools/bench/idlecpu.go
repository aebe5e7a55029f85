package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
)

const (
	// idleCPUWindow is how long the idle agent's CPU time is measured.
	idleCPUWindow = 60 * time.Second
	// idleQuiet is how long no pod status may change before the agent counts as idle: longer than
	// the trim after activity (2 s) and one relist period (10 s in the bench), so the window starts
	// in the steady state and not in the tail of the starts.
	idleQuiet = 10 * time.Second
	// idlePoll is how often the quiet wait reads the API; nothing reads it during the window.
	idlePoll = time.Second
	// idleCPUTarget is the target, in percent of one core.
	idleCPUTarget = 0.5
)

// measureIdleCPU runs 25 pods (the 10 the figures before left, plus 15 more; all 25 with -only),
// waits until no pod's status has changed for idleQuiet, then reads the agent's CPU time (utime +
// stime from /proc/PID/stat) at both ends of a window of idleCPUWindow in which the harness leaves
// the agent alone. The run fails if a pod's container was started or exited in the window: the
// figure is for an idle agent, not one restarting containers. It leaves 10 pods running, as
// measure25 does, for the figures after it.
func (b *bench) measureIdleCPU(ctx context.Context, r *results) error {
	if b.agent == nil {
		if _, err := b.startAgent(false); err != nil {
			return err
		}
		if err := b.waitReady(ctx); err != nil {
			return err
		}
	}
	names := podNames("pods", 0, 25)
	var missing []string
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(b.manifestDir(), n+".yaml")); errors.Is(err, os.ErrNotExist) {
			missing = append(missing, n)
		} else if err != nil {
			return err
		}
	}
	if len(missing) > 0 {
		if _, err := b.putManifests(missing); err != nil {
			return err
		}
	}
	if _, err := b.waitRunning(ctx, names); err != nil {
		return err
	}
	if err := b.waitPodsSettled(ctx, names); err != nil {
		return err
	}

	pid := b.agent.pid()
	cpu0, err := cpuTime(pid, false)
	if err != nil {
		return err
	}
	t0 := time.Now()
	select {
	case <-time.After(idleCPUWindow):
	case <-ctx.Done():
		return ctx.Err()
	}
	cpu1, err := cpuTime(pid, false)
	t1 := time.Now()
	if err != nil {
		return errors.Join(err, b.agentAlive())
	}
	if err := b.agentAlive(); err != nil {
		return err
	}
	key := podKeys(names)
	for _, n := range names {
		if evs := b.rec.between(t0, t1, n, key); len(evs) > 0 {
			return fmt.Errorf("pod %s was not idle in the window: containerd saw %s for %s", n, evs[0].Topic, evs[0].ContainerID)
		}
	}
	used, wall := cpu1-cpu0, t1.Sub(t0)
	r.IdleCPUPct25Pods = round2(100 * used.Seconds() / wall.Seconds())
	r.idleCPU.cpuMs, r.idleCPU.wallS = ms(used), round1(wall.Seconds())

	if _, err := b.waitRunning(ctx, names); err != nil {
		return err
	}
	return b.removePods(ctx, names[10:])
}

// waitPodsSettled polls the API until the pods' statuses have not changed for idleQuiet.
func (b *bench) waitPodsSettled(ctx context.Context, names []string) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.step+idleQuiet)
	defer cancel()
	var last [32]byte
	since := time.Now()
	for {
		if err := b.agentAlive(); err != nil {
			return err
		}
		pods, err := b.api.ListPods(ctx, podNamespace)
		if err != nil {
			return fmt.Errorf("waiting for the agent to go idle: %w", err)
		}
		got, why := runningPods(pods, names)
		if got == nil {
			return fmt.Errorf("waiting for the agent to go idle: %s", why)
		}
		var statuses []v1.PodStatus
		for _, n := range names {
			statuses = append(statuses, got[n].Status)
		}
		data, err := json.Marshal(statuses)
		if err != nil {
			return err
		}
		if sum := sha256.Sum256(data); sum != last {
			last, since = sum, time.Now()
		} else if time.Since(since) >= idleQuiet {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod statuses still changing after %v", b.cfg.step+idleQuiet)
		case <-time.After(idlePoll):
		}
	}
}
