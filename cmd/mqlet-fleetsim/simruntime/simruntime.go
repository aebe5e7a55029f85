// Package simruntime is a container runtime that lives in memory, for the fleet simulator
// (`mqlet fleet-sim`): it implements what the agent and its pod workers ask of a runtime
// (agent.Runtime) without containerd, cgroups, CNI, files or root. A container "runs" the moment
// it is started and keeps running until it is stopped; a stop ends it with the exit code of a
// process killed by the signal (143: SIGTERM, honoured at once; 137 when it is removed while
// running); every image is present.
//
// It is not a test double of the real runtime's rules: the agent's own logic (admission, the desired
// set, pod workers, status, the MQTT sync) runs for real on top of it, so a control plane sees the
// traffic of real nodes. What it does check is what a control plane can get wrong and a real node
// would report: a malformed image reference (InvalidImageName) and a ConfigMap or Secret that a
// container needs but the node does not hold (CreateContainerConfigError), so a pod applied
// before its ConfigMap waits for it as on a real node.
package simruntime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/distribution/reference"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/ctrspec"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Exit codes of a container stopped by a signal, as a shell reports a process killed by it.
const (
	ExitCodeSIGTERM = 128 + 15
	ExitCodeSIGKILL = 128 + 9
)

// DefaultPodCIDR is where pod addresses come from when Options.PodCIDR is not set: the default
// pod network of mqlet's CNI configuration (--pod-cidr), which every real node has for itself.
var DefaultPodCIDR = netip.MustParsePrefix("10.88.0.0/16")

// Options configure a Runtime.
type Options struct {
	// Objects holds the ConfigMaps and Secrets pods reference (the agent's objects store); nil
	// refuses every reference, as the real runtime does before SetObjects.
	Objects ctrspec.Objects
	// PodCIDR is the range pod addresses are handed out from (DefaultPodCIDR when invalid/zero).
	PodCIDR netip.Prefix
	// OnNewImage, when set, is called when a container uses an image no container used before,
	// with no lock held: the node status lists the node's images and may be asked to recompute.
	OnNewImage func()
	// Now is the clock of creation and exit times; time.Now when nil.
	Now func() time.Time
}

// Image is an image the runtime "holds": one that some container used.
type Image struct {
	Name   string // normalized reference, e.g. docker.io/library/busybox:1.36
	Digest string // sha256:... derived from the name, so one name always has one digest
	Size   int64  // bytes, a plausible size derived from the name
}

// Runtime keeps containers, sandboxes and images in maps. It is safe for concurrent use; no lock
// is held while an event is delivered or a callback runs.
type Runtime struct {
	o Options

	mu        sync.Mutex
	ctrs      map[string]ctrd.Container
	sandboxes map[types.UID]*ctrd.Sandbox
	images    map[string]Image
	usedIPs   map[netip.Addr]bool
	nextIP    netip.Addr
	nextPid   uint32
	subs      map[*subscriber]bool
}

// subscriber is one Events call: events queue here and its own goroutine delivers them, so a
// stop never waits for the agent's event handler.
type subscriber struct {
	mu    sync.Mutex
	queue []ctrd.Event
	wake  chan struct{}
}

// New returns an empty ctrd.
func New(o Options) *Runtime {
	if !o.PodCIDR.IsValid() || !o.PodCIDR.Addr().Is4() || o.PodCIDR.Bits() > 30 {
		o.PodCIDR = DefaultPodCIDR
	}
	o.PodCIDR = o.PodCIDR.Masked()
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Runtime{
		o:         o,
		ctrs:      map[string]ctrd.Container{},
		sandboxes: map[types.UID]*ctrd.Sandbox{},
		images:    map[string]Image{},
		usedIPs:   map[netip.Addr]bool{},
		nextIP:    o.PodCIDR.Addr().Next(), // .0 is the network; .1 the bridge's gateway, skipped below
		nextPid:   1000,
		subs:      map[*subscriber]bool{},
	}
}

// Version is what the node status reports as the runtime's version ("containerd://<Version>").
func (r *Runtime) Version() string { return "simulated" }

// ListContainers returns the containers (of one pod when podUID is set), sorted by id.
func (r *Runtime) ListContainers(_ context.Context, podUID string) ([]ctrd.Container, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ctrd.Container, 0, len(r.ctrs))
	for _, c := range r.ctrs {
		if podUID == "" || c.PodUID == podUID {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b ctrd.Container) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// EnsureSandbox returns the pod's sandbox, making it (with a pod address, unless the pod uses the
// host's network) the first time. Created says it was made by this call.
func (r *Runtime) EnsureSandbox(_ context.Context, pod *v1.Pod) (*ctrd.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sb, ok := r.sandboxes[pod.UID]; ok {
		cp := *sb
		cp.Created = false
		return &cp, nil
	}
	hostname := pod.Spec.Hostname
	if hostname == "" {
		hostname = pod.Name
	}
	sb := &ctrd.Sandbox{Ref: ctrd.RefOf(pod), Hostname: hostname, Created: true}
	if !pod.Spec.HostNetwork {
		ip, err := r.allocIPLocked()
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		sb.PodIPs = []string{ip.String()}
	}
	r.sandboxes[pod.UID] = sb
	cp := *sb
	return &cp, nil
}

// allocIPLocked hands out the next free address of the pod range; r.mu held.
func (r *Runtime) allocIPLocked() (netip.Addr, error) {
	p := r.o.PodCIDR
	size := 1 << (32 - p.Bits())
	for range size {
		ip := r.nextIP
		r.nextIP = ip.Next()
		if !p.Contains(r.nextIP) {
			r.nextIP = p.Addr()
		}
		if ip == p.Addr() || ip == p.Addr().Next() || !p.Contains(ip.Next()) || r.usedIPs[ip] {
			continue // network, gateway, broadcast, or taken
		}
		r.usedIPs[ip] = true
		return ip, nil
	}
	return netip.Addr{}, fmt.Errorf("no free address left in the pod range %s", p)
}

// StartContainer starts attempt `restarts` of container c, running at once. It fails as the real
// runtime does for a malformed image reference and for a ConfigMap or Secret the container needs
// that is not stored.
func (r *Runtime) StartContainer(_ context.Context, pod *v1.Pod, sb *ctrd.Sandbox, c *v1.Container, restarts int) (ctrd.Container, error) {
	if sb == nil || sb.Ref.UID != pod.UID {
		return ctrd.Container{}, &ctrd.StartError{Reason: "CreateContainerError",
			Err: fmt.Errorf("container %q of pod %s/%s: no sandbox for this pod", c.Name, pod.Namespace, pod.Name)}
	}
	named, err := reference.ParseDockerRef(c.Image)
	if err != nil {
		return ctrd.Container{}, &ctrd.StartError{Reason: "InvalidImageName",
			Err: fmt.Errorf("%w %q: %v", ctrd.ErrInvalidImage, c.Image, err)}
	}
	if err := r.checkObjects(pod, c); err != nil {
		return ctrd.Container{}, &ctrd.StartError{Reason: "CreateContainerConfigError", Err: err}
	}
	img := imageOf(named.String())

	r.mu.Lock()
	if _, ok := r.sandboxes[pod.UID]; !ok {
		r.mu.Unlock()
		return ctrd.Container{}, &ctrd.StartError{Reason: "CreateContainerError",
			Err: fmt.Errorf("container %q of pod %s/%s: the pod's sandbox was removed", c.Name, pod.Namespace, pod.Name)}
	}
	_, known := r.images[img.Name]
	r.images[img.Name] = img
	r.nextPid++
	ct := ctrd.Container{
		ID: ctrd.ContainerID(string(pod.UID), c.Name, restarts), PodUID: string(pod.UID), PodName: pod.Name,
		PodNamespace: pod.Namespace, Name: c.Name, Hash: ctrspec.SpecHash(pod, c), RestartCount: restarts,
		Image: img.Name, ImageID: imageRepo(named) + "@" + img.Digest, CreatedAt: r.o.Now(),
		State: ctrd.StateRunning, Pid: r.nextPid, Grace: ctrd.PodGrace(pod),
	}
	r.ctrs[ct.ID] = ct // a stale attempt with this id (never in practice) is replaced, as the real runtime does
	r.mu.Unlock()

	if !known && r.o.OnNewImage != nil {
		r.o.OnNewImage()
	}
	return ct, nil
}

// StopContainer ends a running container as SIGTERM would, with no wait: a simulated process
// honours SIGTERM at once. The record stays until RemoveContainer, so its exit can be read.
func (r *Runtime) StopContainer(_ context.Context, id string, _ time.Duration) error {
	r.exit(id, ExitCodeSIGTERM, false)
	return nil
}

// KillContainer is StopContainer for the kills the workers treat as exits (a failed liveness
// probe): the real runtime keeps the exit readable there too.
func (r *Runtime) KillContainer(_ context.Context, id string, _ time.Duration) error {
	r.exit(id, ExitCodeSIGTERM, false)
	return nil
}

// RemoveContainer kills what still runs and forgets the container.
func (r *Runtime) RemoveContainer(_ context.Context, id string) error {
	r.exit(id, ExitCodeSIGKILL, true)
	return nil
}

// exit ends container id with code if it runs (an exit event follows, as containerd sends one),
// and forgets it with remove.
func (r *Runtime) exit(id string, code int32, remove bool) {
	r.mu.Lock()
	c, ok := r.ctrs[id]
	ran := ok && c.State == ctrd.StateRunning
	if ran {
		c.State, c.ExitCode, c.ExitedAt = ctrd.StateExited, code, r.o.Now()
		r.ctrs[id] = c
	}
	if ok && remove {
		delete(r.ctrs, id)
	}
	subs := make([]*subscriber, 0, len(r.subs))
	for s := range r.subs {
		subs = append(subs, s)
	}
	r.mu.Unlock()
	if !ran {
		return
	}
	for _, s := range subs {
		s.push(ctrd.Event{ContainerID: id})
	}
}

// RemoveSandbox forgets the pod's sandbox and frees its address; a missing sandbox is fine.
func (r *Runtime) RemoveSandbox(_ context.Context, ref ctrd.PodRef) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.sandboxes[ref.UID]
	if !ok {
		return nil
	}
	for _, s := range sb.PodIPs {
		if ip, err := netip.ParseAddr(s); err == nil {
			delete(r.usedIPs, ip)
		}
	}
	delete(r.sandboxes, ref.UID)
	return nil
}

// ListSandboxes returns the pods that have a sandbox, sorted by UID.
func (r *Runtime) ListSandboxes() ([]ctrd.PodRef, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ctrd.PodRef, 0, len(r.sandboxes))
	for _, sb := range r.sandboxes {
		out = append(out, sb.Ref)
	}
	slices.SortFunc(out, func(a, b ctrd.PodRef) int { return strings.Compare(string(a.UID), string(b.UID)) })
	return out, nil
}

// Events delivers an event for every container that stops running (as containerd's task exit
// events) until ctx ends; it then returns ctx's error, as a broken stream would.
func (r *Runtime) Events(ctx context.Context, fn func(ctrd.Event)) error {
	s := &subscriber{wake: make(chan struct{}, 1)}
	r.mu.Lock()
	r.subs[s] = true
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.subs, s)
		r.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.wake:
		}
		s.mu.Lock()
		batch := s.queue
		s.queue = nil
		s.mu.Unlock()
		for _, e := range batch {
			fn(e)
		}
	}
}

func (s *subscriber) push(e ctrd.Event) {
	s.mu.Lock()
	s.queue = append(s.queue, e)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// ImportArchiveIfMissing imports nothing: every image is present already.
func (r *Runtime) ImportArchiveIfMissing(context.Context, string) ([]string, error) { return nil, nil }

// LogPath is "": simulated containers write no output.
func (r *Runtime) LogPath(*v1.Pod, string, int) string { return "" }

// Exec runs nothing and succeeds, so exec probes and hooks pass (probe.Execer).
func (r *Runtime) Exec(_ context.Context, id string, _ []string, _ time.Duration) (ctrd.ExecResult, error) {
	r.mu.Lock()
	c, ok := r.ctrs[id]
	r.mu.Unlock()
	if !ok || c.State != ctrd.StateRunning {
		return ctrd.ExecResult{}, fmt.Errorf("exec in container %s: it is not running", id)
	}
	return ctrd.ExecResult{}, nil
}

// ListImages returns the images containers used, by name.
func (r *Runtime) ListImages(context.Context) ([]Image, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Image, 0, len(r.images))
	for _, img := range r.images {
		out = append(out, img)
	}
	slices.SortFunc(out, func(a, b Image) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// imageOf makes up an image's digest and size from its name: the same name always gets the same.
func imageOf(name string) Image {
	sum := sha256.Sum256([]byte(name))
	size := int64(5<<20) + int64(sum[0])<<20 // 5 to 260 MiB
	return Image{Name: name, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: size}
}

// imageRepo is the repository of a reference without tag or digest (an imageID's first part).
func imageRepo(named reference.Named) string { return named.Name() }

// checkObjects reports the first ConfigMap or Secret (or key of one) that container c needs and the
// node does not hold: the volumes it mounts, its envFrom and its env key references. Optional
// references may be missing, as with kubelet.
func (r *Runtime) checkObjects(pod *v1.Pod, c *v1.Container) error {
	objs := r.o.Objects
	if objs == nil {
		objs = noObjects{}
	}
	mounted := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounted[m.Name] = true
	}
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		if !mounted[v.Name] {
			continue
		}
		var err error
		switch {
		case v.ConfigMap != nil:
			err = needConfigMap(objs, pod.Namespace, v.ConfigMap.Name, isTrue(v.ConfigMap.Optional), keysOf(v.ConfigMap.Items))
		case v.Secret != nil:
			err = needSecret(objs, pod.Namespace, v.Secret.SecretName, isTrue(v.Secret.Optional), keysOf(v.Secret.Items))
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				switch {
				case src.ConfigMap != nil:
					err = needConfigMap(objs, pod.Namespace, src.ConfigMap.Name, isTrue(src.ConfigMap.Optional), keysOf(src.ConfigMap.Items))
				case src.Secret != nil:
					err = needSecret(objs, pod.Namespace, src.Secret.Name, isTrue(src.Secret.Optional), keysOf(src.Secret.Items))
				}
				if err != nil {
					break
				}
			}
		}
		if err != nil {
			return &ctrspec.ConfigError{Err: &ctrd.MountError{Volume: v.Name, Err: err}}
		}
	}
	for _, ef := range c.EnvFrom {
		var err error
		switch {
		case ef.ConfigMapRef != nil:
			err = needConfigMap(objs, pod.Namespace, ef.ConfigMapRef.Name, isTrue(ef.ConfigMapRef.Optional), nil)
		case ef.SecretRef != nil:
			err = needSecret(objs, pod.Namespace, ef.SecretRef.Name, isTrue(ef.SecretRef.Optional), nil)
		}
		if err != nil {
			return &ctrspec.ConfigError{Err: err}
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			continue
		}
		var err error
		switch ref := e.ValueFrom; {
		case ref.ConfigMapKeyRef != nil:
			err = needConfigMap(objs, pod.Namespace, ref.ConfigMapKeyRef.Name, isTrue(ref.ConfigMapKeyRef.Optional), []string{ref.ConfigMapKeyRef.Key})
		case ref.SecretKeyRef != nil:
			err = needSecret(objs, pod.Namespace, ref.SecretKeyRef.Name, isTrue(ref.SecretKeyRef.Optional), []string{ref.SecretKeyRef.Key})
		}
		if err != nil {
			return &ctrspec.ConfigError{Err: fmt.Errorf("env %s: %w", e.Name, err)}
		}
	}
	return nil
}

func needConfigMap(objs ctrspec.Objects, ns, name string, optional bool, keys []string) error {
	cm, err := objs.ConfigMap(ns, name)
	if err != nil {
		if optional && ctrspec.IsNotFound(err) {
			return nil
		}
		return err
	}
	for _, k := range keys {
		_, inData := cm.Data[k]
		_, inBinary := cm.BinaryData[k]
		if !inData && !inBinary && !optional {
			return fmt.Errorf("couldn't find key %s in ConfigMap %s/%s", k, ns, name)
		}
	}
	return nil
}

func needSecret(objs ctrspec.Objects, ns, name string, optional bool, keys []string) error {
	s, err := objs.Secret(ns, name)
	if err != nil {
		if optional && ctrspec.IsNotFound(err) {
			return nil
		}
		return err
	}
	for _, k := range keys {
		_, inData := s.Data[k]
		_, inString := s.StringData[k]
		if !inData && !inString && !optional {
			return fmt.Errorf("couldn't find key %s in Secret %s/%s", k, ns, name)
		}
	}
	return nil
}

func keysOf(items []v1.KeyToPath) []string {
	out := make([]string, 0, len(items))
	for _, it := range items {
		out = append(out, it.Key)
	}
	return out
}

func isTrue(b *bool) bool { return b != nil && *b }

// noObjects is the Objects of a runtime that was given none.
type noObjects struct{}

func (noObjects) ConfigMap(ns, name string) (*v1.ConfigMap, error) {
	return nil, fmt.Errorf("ConfigMap %s/%s: this node has no ConfigMap store", ns, name)
}

func (noObjects) Secret(ns, name string) (*v1.Secret, error) {
	return nil, fmt.Errorf("Secret %s/%s: this node has no Secret store", ns, name)
}
