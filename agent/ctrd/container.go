package ctrd

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/distribution/reference"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/core/logs"
	v1 "k8s.io/api/core/v1"
)

// State of a container as containerd reports it.
type State int

const (
	StateCreated State = iota // container exists, task not started (or gone without exit info)
	StateRunning
	StateExited
)

// Container is what mqlet finds in containerd for one pod container.
type Container struct {
	ID           string
	PodUID       string
	PodName      string
	PodNamespace string
	Name         string
	Hash         string
	RestartCount int
	Image        string // image name as created from
	ImageID      string // image digest
	LogPath      string
	CreatedAt    time.Time
	State        State
	Pid          uint32
	ExitCode     int32
	ExitedAt     time.Time
	Grace        time.Duration // the pod's terminationGracePeriodSeconds when it was created (LabelGracePeriod)
	// ResizeBase, Resources and QOSClass are what an in-place resize needs to know (resize.go);
	// empty for a container made before mqlet resized in place.
	ResizeBase, Resources, QOSClass string
}

// ContainerID names the containerd container for attempt n of a pod container. It is derived, not
// random, so that a crash between create and record cannot leave an orphan nobody recognises.
func ContainerID(podUID, name string, attempt int) string {
	short := ContainerIDPrefix(podUID)
	if len(name) > 48 { // containerd ids stop at 76 characters
		sum := sha256.Sum256([]byte(name))
		name = name[:40] + "-" + hex.EncodeToString(sum[:])[:7]
	}
	return fmt.Sprintf("%s%s-%d", short, name, attempt)
}

// ContainerIDPrefix is the part of every container id of a pod that names the pod, so a containerd
// event can be routed to its pod without a lookup. It is a hash of the whole UID: manifests may set
// UIDs that share long prefixes ("app-uid-0001", "app-uid-0002"), and a collision here would let one
// pod remove another's containers.
func ContainerIDPrefix(podUID string) string {
	sum := sha256.Sum256([]byte(podUID))
	return hex.EncodeToString(sum[:])[:12] + "-"
}

// StartError carries kubelet's waiting reason for a container that could not be started.
type StartError struct {
	Reason string // ErrImagePull, ErrImageNeverPull, InvalidImageName, CreateContainerConfigError, CreateContainerError, RunContainerError
	Err    error
}

func (e *StartError) Error() string { return e.Reason + ": " + e.Err.Error() }
func (e *StartError) Unwrap() error { return e.Err }

// StartContainer pulls if needed, creates and starts attempt `restarts` of container c of pod, in
// the pod's sandbox (EnsureSandbox): the sandbox's namespaces, files and cgroup are used, not made.
func (r *Runtime) StartContainer(ctx context.Context, pod *v1.Pod, sb *Sandbox, c *v1.Container, restarts int) (Container, error) {
	ctx = r.ctx(ctx)
	if sb == nil || sb.Ref.UID != pod.UID {
		return Container{}, &StartError{"CreateContainerError", fmt.Errorf("container %q of pod %s/%s: no sandbox for this pod", c.Name, pod.Namespace, pod.Name)}
	}
	img, err := r.EnsureImage(r.withPullSecrets(ctx, pod), c.Image, c.ImagePullPolicy)
	if err != nil {
		return Container{}, pullFailure(err)
	}
	if err := r.setUpImageVolumes(ctx, pod, sb, c); err != nil { // imagevolume.go
		return Container{}, err
	}
	// ephemeral.go: kubectl debug --target. The target's namespace is held open until runc has
	// joined it, when the task is created.
	targetOpts, releaseTarget, err := r.targetPIDOpts(ctx, pod, c)
	if err != nil {
		return Container{}, err
	}
	defer releaseTarget()
	id := ContainerID(string(pod.UID), c.Name, restarts)
	opts, stage, err := r.specOpts(pod, sb, c, img, id)
	if err != nil {
		return Container{}, startErr(err)
	}
	opts = append(opts, targetOpts...) // replaces the pod's PID namespace (a new one) with the target's
	// The hostPath and subPath mounts come from this stage (mountstage.go), which runc reads when
	// it creates the task: it stays until then, and goes however this returns.
	defer stage.Release()
	devOpts, err := r.deviceOpts(pod, sb, c)
	if err != nil {
		return Container{}, err
	}
	opts = append(opts, devOpts...) // after securityOpts: a privileged container's host devices are replaced, not doubled
	// termination.go; after the volumes, since the file may sit in one of them
	tmOpts, err := r.terminationMessageOpts(pod, c, restarts)
	if err != nil {
		return Container{}, err
	}
	opts = append(opts, tmOpts...)
	logPath, err := r.logPath(pod, c.Name, restarts)
	if err != nil {
		return Container{}, &StartError{"CreateContainerConfigError", err}
	}
	if err := mkPrivateDir(filepath.Dir(logPath)); err != nil {
		return Container{}, &StartError{"CreateContainerError", err}
	}
	labels := map[string]string{
		LabelPodUID:        string(pod.UID),
		LabelPodName:       pod.Name,
		LabelPodNamespace:  pod.Namespace,
		LabelContainerName: c.Name,
		LabelSpecHash:      ctrspec.SpecHash(pod, c),
		LabelRestartCount:  strconv.Itoa(restarts),
		LabelLogPath:       logPath,
		LabelImageID:       imageID(img),
		LabelGracePeriod:   strconv.FormatInt(int64(PodGrace(pod)/time.Second), 10),
	}
	// What an attach needs to know (attach.go): the container has a stdin, closed after the first
	// attach with stdinOnce, and a terminal.
	if c.Stdin {
		labels[LabelStdin] = "open"
		if c.StdinOnce {
			labels[LabelStdin] = "once"
		}
	}
	if c.TTY {
		labels[LabelTTY] = "true"
		opts = append(opts, oci.WithTTY)
	}
	for k, v := range resizeLabels(pod, c) { // resize.go
		labels[k] = v
	}
	create := func() (containerd.Container, error) {
		return r.client.NewContainer(ctx, id,
			containerd.WithImage(img),
			containerd.WithNewSnapshot(id, img),
			containerd.WithNewSpec(opts...),
			containerd.WithContainerLabels(labels),
			containerd.WithImageStopSignal(img, "SIGTERM"), // nginx and friends want SIGQUIT
		)
	}
	ctr, err := create()
	if errdefs.IsAlreadyExists(err) {
		// A leftover with this id (agent killed between create and start) is ours and stale.
		if rerr := r.removeByID(ctx, id); rerr != nil {
			return Container{}, &StartError{"CreateContainerError", rerr}
		}
		// The snapshot can outlive its container record when a delete was cut short.
		if rerr := r.client.SnapshotService(r.opts.Snapshotter).Remove(ctx, id); rerr != nil && !errdefs.IsNotFound(rerr) {
			return Container{}, &StartError{"CreateContainerError", fmt.Errorf("remove stale snapshot %s: %w", id, rerr)}
		}
		ctr, err = create()
	}
	if err != nil {
		var ce *ctrspec.ConfigError
		if errors.As(err, &ce) {
			return Container{}, &StartError{"CreateContainerConfigError", err}
		}
		return Container{}, &StartError{"CreateContainerError", fmt.Errorf("create container %s: %w", id, err)}
	}
	notifyCreated(ctx, c.Name)
	ioCreator, releaseIO, err := r.newContainerIO(string(pod.UID), id, logPath, c.Stdin, c.TTY) // logio.go
	if err != nil {
		ctr.Delete(ctx, containerd.WithSnapshotCleanup)
		return Container{}, &StartError{"RunContainerError", err}
	}
	task, err := ctr.NewTask(ctx, ioCreator)
	// Once the task exists (or failed) runc has copied the staged mounts into the container, which
	// keeps its copies: the stage is not needed any more, and must not outlive the create.
	if rerr := stage.Release(); rerr != nil {
		r.log.Warn("volume mount stage not released", "container", id, "err", rerr)
	}
	releaseIO()
	if err != nil {
		r.releaseContainerIO(ctx, ctr)
		ctr.Delete(ctx, containerd.WithSnapshotCleanup)
		return Container{}, &StartError{"RunContainerError", fmt.Errorf("create task %s: %w", id, err)}
	}
	if err := task.Start(ctx); err != nil {
		task.Delete(ctx, containerd.WithProcessKill)
		r.releaseContainerIO(ctx, ctr)
		ctr.Delete(ctx, containerd.WithSnapshotCleanup)
		return Container{}, &StartError{"RunContainerError", fmt.Errorf("start task %s: %w", id, err)}
	}
	notifyStarted(ctx, c.Name)
	// The record's creation time (the one ListContainers reports) is the attempt's start time, so
	// that an agent restarted before the status was stored reports the same startedAt as before.
	created := time.Now()
	if info, err := ctr.Info(ctx); err == nil && !info.CreatedAt.IsZero() {
		created = info.CreatedAt
	}
	// Keep this attempt's log and the one before (kubectl logs --previous); a crash-looping
	// container must not fill the disk with one file per restart.
	if restarts >= 2 {
		if old, err := r.logPath(pod, c.Name, restarts-2); err == nil {
			logs.Remove(old)
		}
	}
	return Container{
		ID: id, PodUID: string(pod.UID), PodName: pod.Name, PodNamespace: pod.Namespace, Name: c.Name,
		Hash: labels[LabelSpecHash], RestartCount: restarts, Image: img.Name(), ImageID: labels[LabelImageID],
		LogPath: logPath, CreatedAt: created, State: StateRunning, Pid: task.Pid(), Grace: PodGrace(pod),
	}, nil
}

// LogPath is the file attempt `restarts` of container name of pod writes its output to; "" when
// the pod's names cannot make a path (they never can for a pod that ran).
func (r *Runtime) LogPath(pod *v1.Pod, name string, restarts int) string {
	p, _ := r.logPath(pod, name, restarts)
	return p
}

func (r *Runtime) logPath(pod *v1.Pod, name string, restarts int) (string, error) {
	dir, err := r.dirs().podLogDir(pod)
	if err != nil {
		return "", err
	}
	return joinUnder(dir, name, strconv.Itoa(restarts)+".log")
}

// DefaultGrace is kubelet's termination grace period when a pod sets none.
const DefaultGrace = 30 * time.Second

// pullFailure is a failed EnsureImage as the container's waiting reason, kubelet's words.
func pullFailure(err error) *StartError {
	reason := "ErrImagePull"
	switch {
	case errors.Is(err, ErrImageNeverPull):
		reason = "ErrImageNeverPull"
	case errors.Is(err, ErrInvalidImage):
		reason = "InvalidImageName"
	}
	return &StartError{reason, err}
}

// PodGrace is the pod's terminationGracePeriodSeconds, or kubelet's default.
func PodGrace(pod *v1.Pod) time.Duration {
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil && *g >= 0 {
		return time.Duration(*g) * time.Second
	}
	return DefaultGrace
}

// parseGrace reads LabelGracePeriod; containers made before the label existed get kubelet's default.
func parseGrace(v string) time.Duration {
	if s, err := strconv.ParseInt(v, 10, 64); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	return DefaultGrace
}

// ListContainers returns the mqlet containers in the namespace (of one pod when podUID is set, else
// all) with their task state, in two calls to containerd however many containers there are.
func (r *Runtime) ListContainers(ctx context.Context, podUID string) ([]Container, error) {
	ctx = r.ctx(ctx)
	filter := fmt.Sprintf("labels.%q", LabelPodUID)
	if podUID != "" {
		filter = fmt.Sprintf("labels.%q==%q", LabelPodUID, podUID)
	}
	ctrs, err := r.client.ContainerService().List(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	byID, err := r.tasks(ctx, podUID, ctrs)
	if err != nil {
		return nil, err
	}
	out := make([]Container, 0, len(ctrs))
	for _, c := range ctrs {
		l := c.Labels
		rc, _ := strconv.Atoi(l[LabelRestartCount])
		ct := Container{
			ID: c.ID, PodUID: l[LabelPodUID], PodName: l[LabelPodName], PodNamespace: l[LabelPodNamespace],
			Name: l[LabelContainerName], Hash: l[LabelSpecHash], RestartCount: rc, Image: c.Image, ImageID: l[LabelImageID],
			LogPath: l[LabelLogPath], CreatedAt: c.CreatedAt, State: StateCreated, Grace: parseGrace(l[LabelGracePeriod]),
			ResizeBase: l[LabelResizeBase], Resources: l[LabelResources], QOSClass: l[LabelQOSClass],
		}
		if t, ok := byID[c.ID]; ok {
			r.attachLogs(&ct) // logio.go: after an agent restart, resume copying its output
			ct.Pid = t.Pid
			switch t.Status {
			case tasktypes.Status_RUNNING, tasktypes.Status_PAUSED, tasktypes.Status_PAUSING:
				ct.State = StateRunning
			case tasktypes.Status_STOPPED:
				ct.State = StateExited
				ct.ExitCode = int32(t.ExitStatus)
				if t.ExitedAt != nil {
					ct.ExitedAt = t.ExitedAt.AsTime()
				}
			}
		}
		out = append(out, ct)
	}
	if podUID == "" {
		r.pruneCopiers(ids(out))
	}
	return out, nil
}

// tasks fetches the task of each container: one list of every task for a relist of the whole
// namespace, one lookup per container for a single pod, so a pod's sync costs the same however
// many pods the node runs.
func (r *Runtime) tasks(ctx context.Context, podUID string, ctrs []containers.Container) (map[string]*tasktypes.Process, error) {
	byID := make(map[string]*tasktypes.Process, len(ctrs))
	if podUID == "" {
		resp, err := r.client.TaskService().List(ctx, &tasks.ListTasksRequest{})
		if err != nil {
			return nil, fmt.Errorf("list tasks: %w", err)
		}
		for _, t := range resp.Tasks {
			byID[t.ID] = t
		}
		return byID, nil
	}
	for _, c := range ctrs {
		resp, err := r.client.TaskService().Get(ctx, &tasks.GetRequest{ContainerID: c.ID})
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if !errdefs.IsNotFound(errgrpc.ToNative(err)) {
				// A dead or stuck shim: read the container as having no task (as the namespace
				// listing does), so the worker replaces or removes it instead of failing forever.
				r.log.Warn("task state unreadable; treating the container as stopped", "container", c.ID, "err", err)
			}
			continue
		}
		byID[c.ID] = resp.Process
	}
	return byID, nil
}

// Fingerprint summarises containers' identities and states, so a relist can tell a worker's view
// is stale without the worker asking containerd again.
func Fingerprint(cs []Container) string {
	ids := make([]string, 0, len(cs))
	for _, c := range cs {
		ids = append(ids, fmt.Sprintf("%s:%d:%d", c.ID, c.State, c.ExitCode))
	}
	sort.Strings(ids)
	return strings.Join(ids, ",")
}

// StopContainer sends SIGTERM, waits up to grace, then SIGKILL, and deletes the task. The container
// record and snapshot stay, so its last state can still be read; RemoveContainer deletes them.
func (r *Runtime) StopContainer(ctx context.Context, id string, grace time.Duration) error {
	ctx = r.ctx(ctx)
	ctr, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("stop %s: %w", id, err)
	}
	task, err := ctr.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("stop %s: %w", id, err)
	}
	status := r.taskStatus
	if status == nil {
		status = func(ctx context.Context, t containerd.Task) (containerd.Status, error) { return t.Status(ctx) }
	}
	// Only a task known not to run skips the graceful path: a status that cannot be read (a busy
	// shim, a timeout) may hide a running process, and SIGKILL at once would deny it its shutdown.
	st, serr := status(ctx, task)
	if serr != nil {
		r.log.Warn("task status unreadable; stopping it as if it runs", "container", id, "err", serr)
	}
	if serr != nil || st.Status == containerd.Running {
		err := r.signalAndWait(ctx, ctr, task, grace)
		switch {
		case errors.Is(err, errNoWait) && serr != nil:
			// Neither status nor exit can be read: the shim is gone or stuck, so no signal would
			// be seen either. Deleting with kill below is all that can be done.
			r.log.Warn("task unreachable; deleting it", "container", id, "err", err)
		case err != nil:
			return fmt.Errorf("stop %s: %w", id, err)
		}
	}
	if _, err := task.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
		if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("stop %s: delete task: %w", id, err)
		}
	}
	return nil
}

// errNoWait marks a task whose exit cannot be waited for.
var errNoWait = errors.New("cannot wait for the task's exit")

// signalAndWait sends the container's stop signal, waits up to grace for the task to exit, then
// sends SIGKILL and waits for that.
func (r *Runtime) signalAndWait(ctx context.Context, ctr containerd.Container, task containerd.Task, grace time.Duration) error {
	wctx, cancel := context.WithCancel(ctx) // ends the wait stream however we return
	defer cancel()
	wait, err := task.Wait(wctx)
	if err != nil {
		return fmt.Errorf("%w: %w", errNoWait, err)
	}
	sig, err := containerd.GetStopSignal(ctx, ctr, syscall.SIGTERM)
	if err != nil {
		sig = syscall.SIGTERM
	}
	if err := task.Kill(ctx, sig); err != nil {
		if errdefs.IsNotFound(err) {
			return nil // it ended meanwhile
		}
		return fmt.Errorf("%s: %w", sig, err)
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-wait:
		return nil
	case <-timer.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	r.log.Info("grace period over, killing", "container", ctr.ID(), "grace", grace)
	if err := task.Kill(ctx, syscall.SIGKILL); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("SIGKILL: %w", err)
	}
	select {
	case <-wait:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("still running 10s after SIGKILL")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// RemoveContainer stops (SIGKILL) whatever runs and deletes the container and its snapshot.
func (r *Runtime) RemoveContainer(ctx context.Context, id string) error {
	return r.removeByID(r.ctx(ctx), id)
}

func (r *Runtime) removeByID(ctx context.Context, id string) error {
	ctr, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	if task, err := ctr.Task(ctx, nil); err == nil {
		if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("remove %s: delete task: %w", id, err)
		}
	}
	if err := ctr.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	r.tidyAfterRemove(ctx, ctr)
	r.releaseContainerIO(ctx, ctr)
	return nil
}

// imageID is the repository digest the container was made from, as kubelet reports it
// ("registry/repo@sha256:..."), so two nodes running "the same tag" can be told apart.
func imageID(img containerd.Image) string {
	name := img.Name()
	if named, err := reference.ParseNormalizedNamed(name); err == nil {
		name = named.Name()
	}
	return name + "@" + img.Target().Digest.String()
}
