package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/agent/api"
	"github.com/mqlet/mqlet/agent/ctrd"
	v1 "k8s.io/api/core/v1"
)

const (
	nodeName     = "bench"
	podNamespace = "default"
	idleWait     = 30 * time.Second
	settleWait   = 10 * time.Second
	pollAPI      = 5 * time.Millisecond
)

func (b *bench) manifestDir() string { return b.path("pods") }
func (b *bench) stagingDir() string  { return b.path("staging") }
func (b *bench) apiSocket() string   { return b.runPath("mqlet.sock") }

func (b *bench) nsctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, b.cfg.namespace)
}

// step bounds one wait, so nothing in the harness can hang.
func (b *bench) stepCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.cfg.step)
}

func (b *bench) run(ctx context.Context) (results, error) {
	var r results
	if err := b.prepare(ctx); err != nil {
		return r, fmt.Errorf("setup: %w", err)
	}
	for _, s := range b.steps() {
		if !b.cfg.only.has(s.key) {
			continue
		}
		b.logf("measuring %s", s.name)
		if err := s.fn(ctx, &r); err != nil {
			return r, fmt.Errorf("%s: %w", s.name, err)
		}
		r.ran = append(r.ran, s.key)
	}
	return r, nil
}

type step struct {
	key, name string
	fn        func(context.Context, *results) error
}

// steps are the measurements in the order they run; each starts from where the previous one left
// the agent and its pods (a step run alone with -only sets up what it needs).
func (b *bench) steps() []step {
	return []step{
		{"binaries", "binary sizes", b.measureBinaries},
		{"idle", "idle memory", b.measureIdle},
		{"start", "pod start vs ctr run", b.measurePodStart},
		{"startcni", "pod start with CNI networking vs ctr run", b.measurePodStartCNI}, // cni.go
		{"burst", "burst of 20", b.measureBurst},
		{"pods25", "memory with 25 pods", b.measure25},
		{"idlecpu", "idle CPU with 25 pods", b.measureIdleCPU},
		{"agentstart", "agent start with 10 running pods", b.measureAgentStart},
		{"recovery", "recovery of 10 pods", b.measureRecovery},
		{"mqtt", "the MQTT link (apply, idle link, reconnect)", b.measureMQTT},
		{"outbox", "bbolt commits per pod status drained through the outbox", b.measureOutbox},                     // outbox.go
		{"reconnect50", "protocol v2: the reconnect of a node with 50 MQTT pods, 1 changed", b.measureReconnect50}, // reconnect50.go
		{"acks5000", "protocol v2: the node's acks after 5,000 short-lived pods", b.measureAcksJobs},               // acksjobs.go
		{"eviction", "eviction after a memory-pressure crossing", b.measureEviction},
		{"probes", "25 pods with an httpGet readiness probe every second", b.measureProbes},
	}
}

// prepare clears what an interrupted earlier run may have left, then starts a fresh containerd,
// imports the image and subscribes to events.
func (b *bench) prepare(ctx context.Context) error {
	if err := b.cleanup(); err != nil {
		return fmt.Errorf("clearing a previous run: %w", err)
	}
	for _, d := range []string{b.cfg.libDir, b.cfg.runDir, b.manifestDir(), b.stagingDir(), b.path("preload"), b.path("agent-state")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := b.writeCNIConf(); err != nil { // cni.go
		return err
	}
	if err := b.startContainerd(ctx); err != nil {
		return err
	}
	if err := b.rec.attach(ctx, b.client); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, b.cfg.mqlet, "image", "import", "--containerd-address", b.cfg.socket,
		"--containerd-namespace", b.cfg.namespace, b.cfg.imageArchive).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mqlet image import %s: %v: %s", b.cfg.imageArchive, err, out)
	}
	img, err := b.client.GetImage(b.nsctx(ctx), b.cfg.image)
	if err != nil {
		return fmt.Errorf("image %s after importing %s: %w", b.cfg.image, b.cfg.imageArchive, err)
	}
	// ctr run unpacks on demand; unpacking first keeps that out of the floor's first sample.
	if ok, err := img.IsUnpacked(b.nsctx(ctx), defaults.DefaultSnapshotter); err != nil || !ok {
		if err := img.Unpack(b.nsctx(ctx), defaults.DefaultSnapshotter); err != nil {
			return fmt.Errorf("unpack %s: %w", b.cfg.image, err)
		}
	}
	b.api = api.NewClient(b.apiSocket())
	return nil
}

// cleanup removes everything the bench created: it is run before a run (for leftovers of a killed
// one) and after it. Processes are found through the bench's own pid files and socket only.
func (b *bench) cleanup() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	if b.agent != nil {
		errs = append(errs, b.stopAgent())
	} else if pid, ok := leftoverPid(b.runPath("agent.pid"), filepath.Base(b.cfg.mqlet)); ok {
		b.logf("stopping the agent left by an earlier run (pid %d)", pid)
		syscall.Kill(pid, syscall.SIGKILL)
		waitGone(pid, 10*time.Second)
	}
	errs = append(errs, b.stopMQTT(), cleanupCNI())
	leftover := 0
	if b.ctrd == nil {
		if pid, ok := leftoverPid(b.runPath("containerd.pid"), filepath.Base(b.cfg.containerdBin)); ok {
			leftover = pid
			c, err := containerd.New(b.cfg.socket, containerd.WithTimeout(5*time.Second))
			if err == nil {
				b.client = c
			} else {
				errs = append(errs, fmt.Errorf("connect to the containerd left by an earlier run: %w", err))
			}
		}
	}
	if b.client != nil {
		errs = append(errs, b.removeContainers(ctx, nil))
	}
	if leftover != 0 {
		b.logf("stopping the containerd left by an earlier run (pid %d)", leftover)
		if b.client != nil {
			b.client.Close()
			b.client = nil
		}
		syscall.Kill(leftover, syscall.SIGTERM)
		if !waitGone(leftover, 30*time.Second) {
			syscall.Kill(leftover, syscall.SIGKILL)
			waitGone(leftover, 10*time.Second)
		}
	} else {
		errs = append(errs, b.stopContainerd())
	}
	// Shims exit once their task is deleted; one that does not (its containerd died first) is ours
	// by the socket on its command line.
	deadline := time.Now().Add(5 * time.Second)
	for len(shimPids(b.cfg.socket)) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	for _, pid := range shimPids(b.cfg.socket) {
		b.logf("killing leftover containerd shim pid %d", pid)
		syscall.Kill(pid, syscall.SIGKILL)
		waitGone(pid, 5*time.Second)
	}
	if b.cfg.keepLogs != "" {
		if err := os.MkdirAll(b.cfg.keepLogs, 0o755); err == nil {
			for _, f := range []string{"agent.log", "containerd.log", "mqtt/agent/mosquitto.log",
				"mqtt/r50/mosquitto.log", "mqtt/r50-floor/mosquitto.log", "mqtt/eviction/mosquitto.log", "jobs-node/node.log"} {
				if data, err := os.ReadFile(b.path(f)); err == nil {
					os.WriteFile(filepath.Join(b.cfg.keepLogs, strings.ReplaceAll(f, "/", "-")), data, 0o644)
				}
			}
		}
	}
	// Cgroups: ctr's containers under /<ns>, the agent's pods under /mqlet/<ns>.
	for _, rel := range []string{"/" + b.cfg.namespace, "/mqlet/" + b.cfg.namespace} {
		errs = append(errs, ctrd.RemoveCgroupTree(rel))
	}
	if err := unmountUnder(b.cfg.libDir, b.cfg.runDir); err != nil {
		errs = append(errs, err)
	} else {
		errs = append(errs, os.RemoveAll(b.cfg.libDir), os.RemoveAll(b.cfg.runDir))
	}
	return errors.Join(errs...)
}

// removeContainers kills and deletes the containers of the bench namespace (all, or those only
// accepts) with their snapshots;
// the rest of the namespace (images, content) goes with the containerd root directory.
func (b *bench) removeContainers(ctx context.Context, only func(id string) bool) error {
	ctx = b.nsctx(ctx)
	ctrs, err := b.client.Containers(ctx)
	if err != nil {
		return fmt.Errorf("list containers in namespace %s: %w", b.cfg.namespace, err)
	}
	var errs []error
	for _, c := range ctrs {
		if only != nil && !only(c.ID()) {
			continue
		}
		if t, err := c.Task(ctx, nil); err == nil {
			if _, err := t.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("delete task %s: %w", c.ID(), err))
			}
		}
		if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete container %s: %w", c.ID(), err))
		}
	}
	return errors.Join(errs...)
}

// keepSmaps saves the agent's memory map next to the kept logs, for profiling what the RSS is.
func (b *bench) keepSmaps(label string) {
	if b.cfg.keepLogs == "" || b.agent == nil {
		return
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", b.agent.pid()))
	if err == nil && os.MkdirAll(b.cfg.keepLogs, 0o755) == nil {
		err = os.WriteFile(filepath.Join(b.cfg.keepLogs, "agent-smaps-"+label), data, 0o644)
	}
	if err != nil {
		b.logf("keeping the agent's smaps (%s): %v", label, err)
	}
}

func (b *bench) measureBinaries(_ context.Context, r *results) error {
	for _, x := range []struct {
		arch string
		dst  *float64
	}{{"amd64", &r.BinaryAmd64MB}, {"arm64", &r.BinaryArm64MB}, {"armv7", &r.BinaryArmv7MB}} {
		p := filepath.Join(b.cfg.binDir, "mqlet-linux-"+x.arch)
		st, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("%w (run `make cross` first; scripts/bench.sh does)", err)
		}
		*x.dst = round2(float64(st.Size()) / 1e6)
	}
	return nil
}

// waitReady polls /readyz until the agent has read the manifest dir and listed containerd.
func (b *bench) waitReady(ctx context.Context) error {
	ctx, cancel := b.stepCtx(ctx)
	defer cancel()
	for {
		if err := b.agentAlive(); err != nil {
			return err
		}
		err := b.api.Ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent not ready within %v: %v", b.cfg.step, err)
		case <-time.After(pollAPI):
		}
	}
}

func (b *bench) agentAlive() error {
	if b.agent == nil {
		return errors.New("agent not running")
	}
	if !b.agent.alive() {
		return b.agent.diedErr()
	}
	return nil
}

func (b *bench) measureIdle(ctx context.Context, r *results) error {
	started, err := b.startAgent(false)
	if err != nil {
		return err
	}
	if err := b.waitReady(ctx); err != nil {
		return err
	}
	m, err := b.memoryAfter(ctx, time.Until(started.Add(idleWait)), "idle")
	if err != nil {
		return err
	}
	r.IdleRSSMiB, r.IdleAnonMiB = m.rssMiB(), m.anonMiB()
	return nil
}

// podManifest is the pod every figure uses: one busybox container sleeping, nothing to pull, on the
// host's network (pod_start_cni_* measures the same pod attached to a CNI network: cni.go).
// A grace period of 0 makes removal a SIGKILL: sleep as PID 1 ignores SIGTERM.
func (b *bench) podManifest(name string) []byte { return b.podManifestCmd(name, "3600") }

// podManifestCmd is podManifest sleeping arg seconds: a different arg is a new spec.
func (b *bench) podManifestCmd(name, arg string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 0
  containers:
  - name: sleep
    image: %s
    imagePullPolicy: Never
    command: ["sleep", "%s"]
`, name, podNamespace, b.cfg.image, arg)
}

// podKeys maps a container id to the name of the bench pod it belongs to ("" for none), using the
// agent's own id scheme: pod UIDs are derived from node, namespace and name.
func podKeys(names []string) func(id string) string {
	byPrefix := map[string]string{}
	for _, n := range names {
		uid := admission.StableUID(nodeName, podNamespace, n)
		byPrefix[ctrd.ContainerIDPrefix(string(uid))] = n
	}
	return func(id string) string {
		for p, n := range byPrefix {
			if strings.HasPrefix(id, p) {
				return n
			}
		}
		return ""
	}
}

func podNames(prefix string, from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%s-%02d", prefix, i))
	}
	return out
}

// putManifests writes each pod's manifest in the staging dir, then renames them all into the
// manifest dir (an atomic appearance, as a careful writer or an OTA updater does). It returns the
// time just before the first rename: t0 of every start figure.
func (b *bench) putManifests(names []string) (time.Time, error) {
	return b.putManifestsOf(names, b.podManifest)
}

// putManifestsOf is putManifests with the manifests manifest makes.
func (b *bench) putManifestsOf(names []string, manifest func(string) []byte) (time.Time, error) {
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(b.stagingDir(), n+".yaml"), manifest(n), 0o644); err != nil {
			return time.Time{}, err
		}
	}
	t0 := time.Now()
	for _, n := range names {
		if err := os.Rename(filepath.Join(b.stagingDir(), n+".yaml"), filepath.Join(b.manifestDir(), n+".yaml")); err != nil {
			return time.Time{}, err
		}
	}
	return t0, nil
}

// removePods deletes the pods' manifests and waits until containerd holds none of their
// containers and the agent no longer lists them.
func (b *bench) removePods(ctx context.Context, names []string) error {
	for _, n := range names {
		if err := os.Remove(filepath.Join(b.manifestDir(), n+".yaml")); err != nil {
			return err
		}
	}
	return b.waitGone(ctx, names)
}

// waitGone waits until containerd holds none of the pods' containers and the agent no longer
// lists them.
func (b *bench) waitGone(ctx context.Context, names []string) error {
	ctx, cancel := b.stepCtx(ctx)
	defer cancel()
	key := podKeys(names)
	for {
		if err := b.agentAlive(); err != nil {
			return err
		}
		left, err := b.containersOf(ctx, key)
		if err == nil && len(left) == 0 {
			var pods *v1.PodList
			if pods, err = b.api.ListPods(ctx, podNamespace); err == nil {
				for _, p := range pods.Items {
					if slices.Contains(names, p.Name) {
						left = append(left, "pod "+p.Name)
					}
				}
				if len(left) == 0 {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pods not removed within %v: still there: %v (last error: %v)", b.cfg.step, left, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (b *bench) containersOf(ctx context.Context, key func(string) string) ([]string, error) {
	ctrs, err := b.client.ContainerService().List(b.nsctx(ctx))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range ctrs {
		if key(c.ID) != "" {
			out = append(out, c.ID)
		}
	}
	return out, nil
}

// waitRunning polls the agent's API until every named pod is Running with all containers running.
func (b *bench) waitRunning(ctx context.Context, names []string) (map[string]v1.Pod, error) {
	return b.waitPods(ctx, names, nil)
}

// waitPods is waitRunning with a further condition on each pod: ok returns "" when the pod is as
// wanted, else why not.
func (b *bench) waitPods(ctx context.Context, names []string, ok func(v1.Pod) string) (map[string]v1.Pod, error) {
	ctx, cancel := b.stepCtx(ctx)
	defer cancel()
	var why string
	for {
		if err := b.agentAlive(); err != nil {
			return nil, err
		}
		pods, err := b.api.ListPods(ctx, podNamespace)
		if err == nil {
			got, w := runningPods(pods, names)
			if w == "" && ok != nil {
				for _, n := range names {
					if w = ok(got[n]); w != "" {
						w = "pod " + n + ": " + w
						break
					}
				}
			}
			if w == "" {
				return got, nil
			}
			why = w
		} else {
			why = err.Error()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("pods not all Running within %v: %s", b.cfg.step, why)
		case <-time.After(pollAPI):
		}
	}
}

// runningPods returns the named pods when all are Running, else a reason why not.
func runningPods(list *v1.PodList, names []string) (map[string]v1.Pod, string) {
	got := map[string]v1.Pod{}
	for _, p := range list.Items {
		if slices.Contains(names, p.Name) {
			got[p.Name] = p
		}
	}
	for _, n := range names {
		p, ok := got[n]
		if !ok {
			return nil, "pod " + n + " not listed"
		}
		if p.Status.Phase != v1.PodRunning || len(p.Status.ContainerStatuses) == 0 {
			return nil, fmt.Sprintf("pod %s is %q", n, p.Status.Phase)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running == nil {
				return nil, fmt.Sprintf("pod %s container %s not running", n, cs.Name)
			}
		}
	}
	return got, ""
}

// sample is one timed start with the containerd events around it.
type sample struct {
	total  time.Duration // the figure: t0 -> task-start event received (agent) or ctr exited (ctr)
	events map[string]event
	t0     time.Time
}

func (b *bench) agentSample(ctx context.Context, name string) (sample, error) {
	return b.agentSampleOf(ctx, name, b.podManifest, nil)
}

// agentSampleOf is agentSample of the pod manifest makes, which must also satisfy ok once running.
func (b *bench) agentSampleOf(ctx context.Context, name string, manifest func(string) []byte, ok func(v1.Pod) string) (sample, error) {
	key := podKeys([]string{name})
	t0, err := b.putManifestsOf([]string{name}, manifest)
	if err != nil {
		return sample{}, err
	}
	wctx, cancel := b.stepCtx(ctx)
	defer cancel()
	found, err := b.rec.waitFor(wctx, "/tasks/start", t0, []string{name}, key)
	if err != nil {
		if aerr := b.agentAlive(); aerr != nil {
			return sample{}, aerr
		}
		return sample{}, err
	}
	s := sample{total: found[name].Received.Sub(t0), t0: t0, events: map[string]event{}}
	for _, e := range b.rec.between(t0, found[name].Received, name, key) {
		if _, dup := s.events[e.Topic]; !dup {
			s.events[e.Topic] = e
		}
	}
	if _, err := b.waitPods(ctx, []string{name}, ok); err != nil {
		return sample{}, err
	}
	return s, b.removePods(ctx, []string{name})
}

// ctrSample times `ctr run -d` of the same image and command on the same containerd: the floor.
// The wall clock of the ctr command includes starting the ctr process itself.
func (b *bench) ctrSample(ctx context.Context, id string) (sample, sample, error) {
	key := func(cid string) string {
		if cid == id {
			return id
		}
		return ""
	}
	cctx, cancel := b.stepCtx(ctx)
	defer cancel()
	cmd := exec.CommandContext(cctx, b.cfg.ctr, "--address", b.cfg.socket, "-n", b.cfg.namespace,
		"run", "-d", b.cfg.image, id, "sleep", "3600")
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	wall := time.Since(t0)
	if err != nil {
		return sample{}, sample{}, fmt.Errorf("%s: %v: %s", strings.Join(cmd.Args, " "), err, out)
	}
	found, err := b.rec.waitFor(cctx, "/tasks/start", t0, []string{id}, key)
	if err != nil {
		return sample{}, sample{}, err
	}
	ev := sample{total: found[id].Received.Sub(t0), t0: t0, events: map[string]event{}}
	for _, e := range b.rec.between(t0, found[id].Received, id, key) {
		if _, dup := ev.events[e.Topic]; !dup {
			ev.events[e.Topic] = e
		}
	}
	// Remove it the way ctr would (kill, delete task, delete container and snapshot).
	c, err := b.client.LoadContainer(b.nsctx(cctx), id)
	if err != nil {
		return sample{}, sample{}, fmt.Errorf("load %s after ctr run: %w", id, err)
	}
	if t, err := c.Task(b.nsctx(cctx), nil); err == nil {
		if _, err := t.Delete(b.nsctx(cctx), containerd.WithProcessKill); err != nil {
			return sample{}, sample{}, fmt.Errorf("delete task %s: %w", id, err)
		}
	}
	if err := c.Delete(b.nsctx(cctx), containerd.WithSnapshotCleanup); err != nil {
		return sample{}, sample{}, fmt.Errorf("delete container %s: %w", id, err)
	}
	return sample{total: wall, t0: t0}, ev, nil
}

type breakdownRow struct {
	step       string
	agent, ctr float64
}

func (b *bench) measurePodStart(ctx context.Context, r *results) error {
	if err := b.agentAlive(); err != nil {
		return err
	}
	// One unrecorded round of each first: page cache, shim and runc binaries, bbolt's first growth.
	if _, err := b.agentSample(ctx, "warmup"); err != nil {
		return fmt.Errorf("warm-up pod: %w", err)
	}
	if _, _, err := b.ctrSample(ctx, "ctr-warmup"); err != nil {
		return fmt.Errorf("warm-up ctr run: %w", err)
	}
	var agent, ctrWall, ctrEvent []sample
	for i := 0; i < b.cfg.samples; i++ {
		// Alternate which goes first, so neither always runs right after the other's cleanup.
		for j := 0; j < 2; j++ {
			if (i+j)%2 == 0 {
				s, err := b.agentSample(ctx, fmt.Sprintf("start-%02d", i))
				if err != nil {
					return fmt.Errorf("sample %d: %w", i, err)
				}
				agent = append(agent, s)
			} else {
				w, e, err := b.ctrSample(ctx, fmt.Sprintf("ctr-%02d", i))
				if err != nil {
					return fmt.Errorf("ctr sample %d: %w", i, err)
				}
				ctrWall, ctrEvent = append(ctrWall, w), append(ctrEvent, e)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	r.PodStartP50Ms, r.PodStartP90Ms = ms(percentile(totals(agent), 50)), ms(percentile(totals(agent), 90))
	r.CtrRunP50Ms, r.CtrRunP90Ms = ms(percentile(totals(ctrWall), 50)), ms(percentile(totals(ctrWall), 90))
	r.ctrEventP50Ms = ms(percentile(totals(ctrEvent), 50))
	r.podStartSamples = len(agent)

	br, err := breakdown(agent, ctrEvent)
	if err != nil {
		return err
	}
	r.breakdown = br
	return nil
}

func totals(s []sample) []time.Duration {
	out := make([]time.Duration, len(s))
	for i := range s {
		out[i] = s[i].total
	}
	return out
}

// breakdown splits starts at containerd's own events, by their containerd timestamps: what the
// caller did before the snapshot, creating the container record, creating the task (shim + runc
// create), starting it, and delivering the start event to the harness.
func breakdown(agent, ctr []sample) ([]breakdownRow, error) {
	type span struct {
		name     string
		from, to string // "" = t0; "recv" = task start received
	}
	spans := []span{
		{"t0 -> snapshot prepared", "", "/snapshot/prepare"},
		{"snapshot -> container created", "/snapshot/prepare", "/containers/create"},
		{"container -> task created (shim, runc create)", "/containers/create", "/tasks/create"},
		{"task created -> started (runc start)", "/tasks/create", "/tasks/start"},
		{"start event delivered", "/tasks/start", "recv"},
	}
	med := func(ss []sample, sp span) (float64, error) {
		var ds []time.Duration
		for _, s := range ss {
			at := func(topic string) (time.Time, error) {
				switch topic {
				case "":
					return s.t0, nil
				case "recv":
					return s.events["/tasks/start"].Received, nil
				}
				e, ok := s.events[topic]
				if !ok {
					return time.Time{}, fmt.Errorf("no %s event seen for a start", topic)
				}
				return e.Stamped, nil
			}
			from, err := at(sp.from)
			if err != nil {
				return 0, err
			}
			to, err := at(sp.to)
			if err != nil {
				return 0, err
			}
			ds = append(ds, to.Sub(from))
		}
		return ms(percentile(ds, 50)), nil
	}
	var out []breakdownRow
	for _, sp := range spans {
		a, err := med(agent, sp)
		if err != nil {
			return nil, err
		}
		c, err := med(ctr, sp)
		if err != nil {
			return nil, err
		}
		out = append(out, breakdownRow{sp.name, a, c})
	}
	return out, nil
}

func (b *bench) measureBurst(ctx context.Context, r *results) error {
	names := podNames("burst", 0, 20)
	agentCPU, err1 := cpuTime(b.agent.pid(), false)
	ctrdCPU, err2 := cpuTime(b.ctrd.pid(), false)
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	t0, err := b.putManifests(names)
	if err != nil {
		return err
	}
	wctx, cancel := b.stepCtx(ctx)
	defer cancel()
	found, err := b.rec.waitFor(wctx, "/tasks/start", t0, names, podKeys(names))
	if err != nil {
		return errors.Join(err, b.agentAlive())
	}
	// Where the CPU went: only the burst's shims exist now, and each has reaped its runc calls.
	agentAfter, err1 := cpuTime(b.agent.pid(), false)
	ctrdAfter, err2 := cpuTime(b.ctrd.pid(), false)
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	r.burstCPU.agent, r.burstCPU.containerd = ms(agentAfter-agentCPU), ms(ctrdAfter-ctrdCPU)
	for _, pid := range shimPids(b.cfg.socket) {
		if t, err := cpuTime(pid, true); err == nil {
			r.burstCPU.shims += ms(t)
		}
	}
	r.burstCPU.shims = round1(r.burstCPU.shims)
	var last time.Time
	for _, e := range found {
		if e.Received.After(last) {
			last = e.Received
		}
	}
	r.Burst20Ms = ms(last.Sub(t0))
	if _, err := b.waitRunning(ctx, names); err != nil {
		return err
	}
	if err := b.removePods(ctx, names); err != nil {
		return err
	}
	floor, err := b.ctrBurst(ctx, podNames("ctr-burst", 0, 20))
	if err != nil {
		return fmt.Errorf("ctr floor of the burst: %w", err)
	}
	r.CtrBurst20Ms = ms(floor)
	return nil
}

// ctrBurst starts the same containers with as many concurrent `ctr run -d` and times until the
// last task-start event: what containerd alone needs for a burst, for comparison with burst20_ms.
func (b *bench) ctrBurst(ctx context.Context, ids []string) (time.Duration, error) {
	cctx, cancel := b.stepCtx(ctx)
	defer cancel()
	errs := make(chan error, len(ids))
	t0 := time.Now()
	for _, id := range ids {
		go func() {
			out, err := exec.CommandContext(cctx, b.cfg.ctr, "--address", b.cfg.socket, "-n", b.cfg.namespace,
				"run", "-d", b.cfg.image, id, "sleep", "3600").CombinedOutput()
			if err != nil {
				err = fmt.Errorf("ctr run %s: %v: %s", id, err, out)
			}
			errs <- err
		}()
	}
	var runErr error
	for range ids {
		runErr = errors.Join(runErr, <-errs)
	}
	var last time.Time
	if runErr == nil {
		found, err := b.rec.waitFor(cctx, "/tasks/start", t0, ids, func(id string) string { return id })
		runErr = err
		for _, e := range found {
			if e.Received.After(last) {
				last = e.Received
			}
		}
	}
	// Whatever was started goes, even after a failure.
	runErr = errors.Join(runErr, b.removeContainers(cctx, func(id string) bool { return slices.Contains(ids, id) }))
	return last.Sub(t0), runErr
}

func (b *bench) measure25(ctx context.Context, r *results) error {
	names := podNames("pods", 0, 25)
	t0, err := b.putManifests(names)
	if err != nil {
		return err
	}
	wctx, cancel := b.stepCtx(ctx)
	defer cancel()
	if _, err := b.rec.waitFor(wctx, "/tasks/start", t0, names, podKeys(names)); err != nil {
		return errors.Join(err, b.agentAlive())
	}
	if _, err := b.waitRunning(ctx, names); err != nil {
		return err
	}
	m, err := b.memoryAfter(ctx, settleWait, "25-pods")
	if err != nil {
		return err
	}
	r.RSS25PodsMiB, r.Anon25PodsMiB = m.rssMiB(), m.anonMiB()
	// The next two figures start from ten running pods.
	return b.removePods(ctx, names[10:])
}

// measureAgentStart restarts the agent over ten running pods and times until its API reports all
// ten Running with the same containers, and /readyz says it has listed containerd.
func (b *bench) measureAgentStart(ctx context.Context, r *results) error {
	names := podNames("pods", 0, 10)
	before, err := b.waitRunning(ctx, names)
	if err != nil {
		return err
	}
	pidsBefore, err := b.taskPids(ctx)
	if err != nil {
		return err
	}
	if err := b.stopAgent(); err != nil {
		return err
	}
	t0, err := b.startAgent(false)
	if err != nil {
		return err
	}
	wctx, cancel := b.stepCtx(ctx)
	defer cancel()
	var firstListed time.Time
	var why string
	for {
		if err := b.agentAlive(); err != nil {
			return err
		}
		pods, err := b.api.ListPods(wctx, podNamespace)
		if err == nil {
			if err := samePods(before, pods); err != nil {
				return err
			}
			var got map[string]v1.Pod
			if got, why = runningPods(pods, names); got != nil {
				if firstListed.IsZero() {
					firstListed = time.Now()
				}
				if err = b.api.Ready(wctx); err == nil {
					r.AgentStartMs = ms(time.Since(t0))
					r.agentStartFirstAPI = ms(firstListed.Sub(t0))
					break
				}
				why = "not ready: " + err.Error()
			}
		} else {
			why = err.Error()
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("restarted agent did not report the 10 pods Running and ready within %v: %s", b.cfg.step, why)
		case <-time.After(pollAPI):
		}
	}
	// The API's word is checked against containerd: same processes, and nothing started since.
	pidsAfter, err := b.taskPids(ctx)
	if err != nil {
		return err
	}
	for id, pid := range pidsBefore {
		if pidsAfter[id] != pid {
			return fmt.Errorf("container %s: task pid %d before the agent restart, %d after: it was restarted", id, pid, pidsAfter[id])
		}
	}
	key := podKeys(names)
	for _, n := range names {
		if evs := b.rec.between(t0, time.Now(), n, key); len(evs) > 0 {
			return fmt.Errorf("pod %s: containerd saw %s for %s after the agent restart", n, evs[0].Topic, evs[0].ContainerID)
		}
	}
	return nil
}

// samePods fails when a pod the agent lists has a different container or restart count than before.
func samePods(before map[string]v1.Pod, list *v1.PodList) error {
	for _, p := range list.Items {
		old, ok := before[p.Name]
		if !ok {
			continue
		}
		for _, cs := range p.Status.ContainerStatuses {
			for _, ocs := range old.Status.ContainerStatuses {
				if cs.Name != ocs.Name || cs.ContainerID == "" {
					continue
				}
				if cs.ContainerID != ocs.ContainerID || cs.RestartCount != ocs.RestartCount {
					return fmt.Errorf("pod %s container %s was restarted by the agent start: %s (restarts %d) became %s (restarts %d)",
						p.Name, cs.Name, ocs.ContainerID, ocs.RestartCount, cs.ContainerID, cs.RestartCount)
				}
			}
		}
	}
	return nil
}

// taskPids returns the init pid of every running task in the bench namespace.
func (b *bench) taskPids(ctx context.Context) (map[string]uint32, error) {
	resp, err := b.client.TaskService().List(b.nsctx(ctx), &tasks.ListTasksRequest{})
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", err)
	}
	out := map[string]uint32{}
	for _, t := range resp.Tasks {
		if t.Status == tasktypes.Status_RUNNING {
			out[t.ID] = t.Pid
		}
	}
	return out, nil
}

// measureRecovery stands in for a power cycle: agent stopped, every container process killed,
// containerd restarted; then the agent starts with no network at all and must bring all ten back.
func (b *bench) measureRecovery(ctx context.Context, r *results) error {
	names := podNames("pods", 0, 10)
	key := podKeys(names)
	if err := b.stopAgent(); err != nil {
		return err
	}
	pids, err := b.taskPids(ctx)
	if err != nil {
		return err
	}
	if len(pids) != len(names) {
		return fmt.Errorf("want %d running tasks before the power cut, containerd has %d", len(names), len(pids))
	}
	killed := time.Now()
	for id, pid := range pids {
		if err := syscall.Kill(int(pid), syscall.SIGKILL); err != nil {
			return fmt.Errorf("kill task %s (pid %d): %w", id, pid, err)
		}
	}
	wctx, cancel := b.stepCtx(ctx)
	defer cancel()
	if _, err := b.rec.waitFor(wctx, "/tasks/exit", killed, names, key); err != nil {
		return err
	}
	if err := b.stopContainerd(); err != nil {
		return err
	}
	if err := b.startContainerd(ctx); err != nil {
		return fmt.Errorf("restart containerd: %w", err)
	}
	if err := b.rec.attach(ctx, b.client); err != nil {
		return err
	}
	t0, err := b.startAgent(true)
	if err != nil {
		return err
	}
	found, err := b.rec.waitFor(wctx, "/tasks/start", t0, names, key)
	if err != nil {
		return errors.Join(err, b.agentAlive())
	}
	var last time.Time
	for _, e := range found {
		if e.Received.After(last) {
			last = e.Received
		}
	}
	r.Recovery10PodsMs = ms(last.Sub(t0))
	_, err = b.waitRunning(ctx, names)
	return err
}

// memoryAfter waits, checks the agent is still alive, reads its memory and keeps its smaps
// under label (with -keep-logs).
func (b *bench) memoryAfter(ctx context.Context, wait time.Duration, label string) (memory, error) {
	select {
	case <-time.After(wait):
	case <-ctx.Done():
		return memory{}, ctx.Err()
	}
	if err := b.agentAlive(); err != nil {
		return memory{}, err
	}
	m, err := readMemory(b.agent.pid())
	if err != nil {
		return memory{}, err
	}
	b.keepSmaps(label)
	return m, nil
}
