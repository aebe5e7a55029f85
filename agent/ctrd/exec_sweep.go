package ctrd

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"golang.org/x/sys/unix"
)

// An exec (a probe, `mqlet exec`, a session over MQTT or the bridge) is a process of the
// container's shim, not of the agent: an agent killed while one runs leaves it running, with nobody
// reading its output or waiting for it, until its container stops. Exec ids carry the pid of the
// agent that started them (exec-<pid>-<random>), as mount stages do, so the next Runtime finds those
// of agents no longer running and kills them. A second Runtime beside a running agent (a CLI
// command) leaves that agent's execs alone.

const execIDPrefix = "exec-"

// ownerAlive says whether the agent that started exec id is still running (or the id is not one
// of ours: left alone).
func ownerAlive(execID string) bool {
	rest, ok := strings.CutPrefix(execID, execIDPrefix)
	if !ok {
		return true
	}
	pidStr, _, ok := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(pidStr)
	if !ok || err != nil || pid <= 0 {
		return true // an id of an older mqlet, without a pid: its owner is unknown
	}
	return pid == os.Getpid() || !errors.Is(unix.Kill(pid, 0), unix.ESRCH)
}

// sweepExecs kills and deletes the execs agents no longer running left in the namespace's tasks.
func (r *Runtime) sweepExecs(ctx context.Context) {
	ctx = r.ctx(ctx)
	ctrs, err := r.client.Containers(ctx)
	if err != nil {
		r.log.Warn("execs left by a killed agent not swept: list containers", "err", err)
		return
	}
	for _, c := range ctrs {
		task, err := c.Task(ctx, nil)
		if err != nil {
			continue // no task: no exec
		}
		procs, err := task.Pids(ctx)
		if err != nil {
			continue
		}
		for _, p := range procs {
			id := execIDOf(p)
			if id == "" || ownerAlive(id) {
				continue
			}
			r.killStrayExec(ctx, task, id)
		}
	}
}

func (r *Runtime) killStrayExec(ctx context.Context, task containerd.Task, id string) {
	proc, err := task.LoadProcess(ctx, id, nil)
	if err != nil {
		if !errdefs.IsNotFound(err) {
			r.log.Warn("exec left by a killed agent not killed", "exec", id, "err", err)
		}
		return
	}
	// Killed and waited for by hand: WithProcessKill's kill of the whole group is refused for a
	// loaded exec ("process must be stopped before deletion").
	exited, err := proc.Wait(ctx)
	if err == nil {
		err = proc.Kill(ctx, unix.SIGKILL)
	}
	if err == nil {
		select {
		case <-exited:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	if err == nil {
		_, err = proc.Delete(ctx)
	}
	if err != nil && !errdefs.IsNotFound(err) {
		r.log.Warn("exec left by a killed agent not killed", "exec", id, "err", err)
		return
	}
	r.log.Info("killed an exec left by a killed agent", "exec", id)
}

// execIDOf is the exec id of one of a task's processes (runc's shims report it), "" for the
// container's own process or a shim that does not say.
func execIDOf(p containerd.ProcessInfo) string {
	if p.Info == nil {
		return ""
	}
	v, err := typeurl.UnmarshalAny(p.Info)
	if err != nil {
		return ""
	}
	if d, ok := v.(*runcoptions.ProcessDetails); ok {
		return d.GetExecID()
	}
	return ""
}
