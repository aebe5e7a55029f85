// Package ctrd runs pod containers on containerd directly, through its Go client: no CRI, no
// pause image. It knows nothing about desired state; the pod workers tell it what to start and stop.
package ctrd

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/agent/devices"
	"github.com/mqlet/mqlet/agent/regauth"
	"github.com/mqlet/mqlet/hw"
	v1 "k8s.io/api/core/v1"
)

// Labels put on every container mqlet creates, so that a restarted agent can adopt what is running.
const (
	LabelPodUID        = "io.mqlet.pod.uid"
	LabelPodName       = "io.mqlet.pod.name"
	LabelPodNamespace  = "io.mqlet.pod.namespace"
	LabelContainerName = "io.mqlet.container.name"
	LabelSpecHash      = "io.mqlet.container.hash"
	LabelRestartCount  = "io.mqlet.container.restart-count"
	LabelLogPath       = "io.mqlet.container.log"
	LabelImageID       = "io.mqlet.container.image-id"
	LabelGracePeriod   = "io.mqlet.pod.grace-period" // seconds: an orphan is stopped with its own pod's grace
	LabelStdin         = "io.mqlet.container.stdin"  // "open" or "once" (stdinOnce): the container has a stdin FIFO
	LabelTTY           = "io.mqlet.container.tty"    // "true": the container has a terminal
	// What an in-place resize checks and updates (resize.go): the spec hash without the
	// resources, the resources the container's cgroup has (JSON) and the pod's QoS class.
	LabelResizeBase = "io.mqlet.container.resize-base"
	LabelResources  = "io.mqlet.container.resources"
	LabelQOSClass   = "io.mqlet.pod.qos-class"
)

// Options configures a Runtime.
type Options struct {
	Address     string        // containerd socket path (optionally unix://)
	Namespace   string        // containerd namespace all mqlet objects live in
	DialTimeout time.Duration // how long to wait for containerd at start
	StateDir    string        // where pod network namespaces and logs live
	Snapshotter string        // "" means containerd's default (overlayfs)
	// Executable is the mqlet binary, run as `<Executable> sandbox-pause` to hold the shared PID
	// namespace of pods with shareProcessNamespace; "" refuses those pods.
	Executable string
	Registry   RegistryOptions
	// Cgroups puts pods in the QoS cgroup hierarchy with pod-level limits (agent/cgroup.Manager);
	// nil keeps them at /mqlet/<namespace>/pod<uid> without (unit tests, fake runtimes).
	Cgroups PodCgroups
	// DNS is the node's cluster DNS and host resolver file, for the pods' resolv.conf.
	DNS DNS

	// Devices hands out the host devices pods ask for in resources.limits; nil refuses every
	// container that asks for an extended resource. Each pod's allocation is recorded in its pod dir
	// and given back to the Manager by New, before any new allocation.
	Devices *devices.Manager
	// Network attaches non-hostNetwork pods to the node's network (agent/cni); nil leaves them
	// with loopback only.
	Network PodNetwork
	Log     *slog.Logger
	// LogMaxSize and LogMaxFiles rotate container logs (containerLogMaxSize, containerLogMaxFiles);
	// zero means DefaultLogMaxSize and DefaultLogMaxFiles.
	LogMaxSize  int64
	LogMaxFiles int
	// OnPull, when set, is told of every pull from a registry (one per shared pull), how long it
	// took and how it ended: metrics.
	OnPull func(ref string, took time.Duration, err error)
	// SingleProcessOOMKill is kubelet's singleProcessOOMKill: on cgroup v2, containers get
	// memory.oom.group=1 unless it is set, so an OOM kill ends the whole container (and it is
	// restarted whole) rather than one process of it, leaving the rest running half broken.
	SingleProcessOOMKill bool
	// NodeAllocatableMemory is node allocatable memory in bytes, the largest a memory-backed
	// emptyDir may be (kubelet's rule); nil or 0 means the machine's memory.
	NodeAllocatableMemory func() int64
	// NodeAllocatable is the node's allocatable resources: the downward API's limits of a
	// container without them (ctrspec.WithDownwardLimits); nil gives 0, as a node with none.
	NodeAllocatable func() v1.ResourceList
}

// downwardPod is pod as resourceFieldRef reads it: unset limits are the node's allocatable.
func (r *Runtime) downwardPod(pod *v1.Pod) *v1.Pod {
	if r.opts.NodeAllocatable == nil {
		return pod
	}
	return ctrspec.WithDownwardLimits(pod, r.opts.NodeAllocatable())
}

// Runtime is a thin layer over the containerd client.
type Runtime struct {
	client *containerd.Client
	opts   Options
	log    *slog.Logger

	pulls   sync.Mutex
	pulling map[string]*pull // image ref -> in-flight pull, so concurrent pods share one pull

	memCapacity int64 // bytes, for Burstable oom_score_adj
	oomFloor    int   // lowest oom_score_adj runc may set (see oomScoreFloor)
	oomWarned   sync.Once
	cg          ctrspec.CgroupFeatures // what the containers' cgroup settings may use on this host

	// taskStatus reads a task's status; nil means task.Status. Tests replace it to make the
	// status unreadable, which a real shim does only when busy or broken.
	taskStatus func(context.Context, containerd.Task) (containerd.Status, error)

	version string

	imageSizes imageSizes // ListImages' sizes by image digest

	logIO logCopiers // copies of container output into their logs (logio.go)

	objects  ctrspec.Objects  // ConfigMaps and Secrets pods use (SetObjects); nil refuses them
	nodeAuth *regauth.Keyring // the node's registryAuthFile (SetNodeCredentials)
}

// New connects to containerd. The error names the address, because an unreachable containerd is the
// most common start-up failure.
func New(ctx context.Context, o Options) (*Runtime, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.Snapshotter == "" {
		o.Snapshotter = defaults.DefaultSnapshotter
	}
	addr := strings.TrimPrefix(o.Address, "unix://")
	c, err := containerd.New(addr,
		containerd.WithDefaultNamespace(o.Namespace),
		containerd.WithTimeout(o.DialTimeout))
	if err != nil {
		return nil, fmt.Errorf("containerd at %s (--containerd-address) is not reachable: %w", addr, err)
	}
	// containerd.New only dials lazily on some versions; ask for the version so that a wrong socket
	// fails here, at start, rather than at the first pod.
	vctx, cancel := context.WithTimeout(ctx, o.DialTimeout)
	defer cancel()
	ver, err := c.Version(vctx)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("containerd at %s (--containerd-address) is not answering: %w", addr, err)
	}
	r := &Runtime{client: c, opts: o, log: o.Log, pulling: map[string]*pull{}, oomFloor: -1000,
		cg:      ctrspec.CgroupFeatures{V2: unifiedCgroups(), Swap: swapAccounting(), OOMGroup: !o.SingleProcessOOMKill, HostMountOptions: cgroup2HostOptions("/proc/self/mountinfo")},
		version: ver.Version}
	if r.memCapacity, err = hw.MemTotal("/"); err != nil {
		o.Log.Warn("memory capacity unknown; Burstable containers get oom_score_adj 999", "err", err)
	}
	floor, restricted, err := oomScoreFloor(addr)
	switch {
	case err != nil:
		// Not knowing containerd's score, assume the common case (containerd at 0, shim at 1)
		// rather than risk runc refusing every Guaranteed container.
		r.oomFloor = 1
		o.Log.Warn("cannot read containerd's oom_score_adj; container scores will not go below 1", "err", err)
	case restricted:
		r.oomFloor = floor
	}
	if o.Devices != nil {
		r.restoreDevices()
	}
	r.sweepMountStages() // mountstage.go: what an agent killed while creating a container left mounted
	return r, nil
}

// Version is containerd's version as it answered at connect (for the node's nodeInfo).
func (r *Runtime) Version() string { return r.version }

// Close stops copying container output and releases the client connection; containers keep
// running, and the next Runtime attaches to their output again.
func (r *Runtime) Close() error {
	r.closeLogs()
	return r.client.Close()
}

func (r *Runtime) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, r.opts.Namespace)
}
