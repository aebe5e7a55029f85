package ctrd

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"golang.org/x/sys/unix"
)

// An exec (a probe, `mqlet exec`, a session over MQTT or the bridge) is a process of the
// container's shim, not of the agent: an agent killed while one runs leaves it running, with nobody
// reading its output or waiting for it, until its container stops. Exec ids carry the pid and the
// start time of the agent process that started them (exec-<pid>.<start>-<random>), so the next
// agent (SweepExecs, called at its start, never by a CLI command, which may live in another pid
// namespace) finds those of agent processes no longer running and kills them. The start time tells
// a reused pid (an agent in a container is pid 1 every time) from the process that made the exec.

const execIDPrefix = "exec-"

// ownerAlive says whether the agent process that started exec id is still running (or the id is
// not one of ours, or of an older mqlet without the start time: left alone).
func ownerAlive(execID string) bool {
	rest, ok := strings.CutPrefix(execID, execIDPrefix)
	if !ok {
		return true
	}
	owner, _, ok := strings.Cut(rest, "-")
	pidStr, start, ok2 := strings.Cut(owner, ".")
	pid, err := strconv.Atoi(pidStr)
	if !ok || !ok2 || err != nil || pid <= 0 {
		return true
	}
	_, now, err := procStat(pid) // hook_pidns.go
	if err != nil {
		return !errors.Is(err, os.ErrNotExist) // no such process: gone; unreadable: leave it
	}
	return strconv.FormatUint(now, 10) == start
}

// execOwner is this process's part of the exec ids it makes: pid.starttime.
var execOwner = sync.OnceValue(func() string {
	_, start, _ := procStat(os.Getpid())
	return strconv.Itoa(os.Getpid()) + "." + strconv.FormatUint(start, 10)
})

// SweepExecs kills and deletes the execs agent processes no longer running left in the
// namespace's tasks. The agent calls it once at start.
func (r *Runtime) SweepExecs(ctx context.Context) {
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
