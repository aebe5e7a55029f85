package ctrd

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/agent/devices"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// PodRef names a pod whose sandbox is set up or torn down. Namespace and Name may be empty when only
// the UID is known (a pod dir left behind by a crash names only its UID).
type PodRef struct {
	UID       types.UID
	Namespace string
	Name      string
}

// RefOf is the PodRef of pod.
func RefOf(pod *v1.Pod) PodRef { return PodRef{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name} }

func (p PodRef) String() string {
	if p.Name == "" {
		return string(p.UID)
	}
	return p.Namespace + "/" + p.Name + " (" + string(p.UID) + ")"
}

// Sandbox is what one pod instance's containers share, set up once before the first of them
// starts. StartContainer builds every container of the pod from it.
type Sandbox struct {
	Ref          PodRef
	Dir          string            // the pod's private directory under the state dir
	LogDir       string            // <state>/logs/<ns>_<name>_<uid>
	NetNS        string            // pinned network namespace; "" with hostNetwork
	PodIPs       []string          // the pod's addresses from CNI, primary first; none with hostNetwork
	IPCNS        string            // pinned IPC namespace; "" with hostIPC
	PIDNS        string            // pinned shared PID namespace (shareProcessNamespace); "" otherwise
	Shm          string            // what is mounted at /dev/shm (the pod's tmpfs, or the host's with hostIPC)
	HostsFile    string            // the pod's /etc/hosts (hostNetwork: the host's plus hostAliases)
	ResolvConf   string            // the pod's /etc/resolv.conf, from its dnsPolicy (see hostsHook)
	HostnameFile string            // the pod's /etc/hostname
	Hostname     string            // the pod's hostname (the host's with hostNetwork)
	CgroupParent string            // cgroup path the pod's containers go below
	Volumes      map[string]string // emptyDir volume name -> host directory

	// Created reports that the sandbox was set up anew by this call rather than found intact: a
	// new pod, or one whose namespaces vanished (a reboot). For a pod that ran before, kubelet's
	// rule follows: its containers are started again from the first init container, because what
	// the init containers set up went with the old sandbox. hostNetwork pods have no namespace to
	// lose; for them (and everyone) the pod dir records the boot id it was set up in, and a
	// different boot counts as a new sandbox too.
	Created bool

	netnsNew   bool               // the network namespace was made by this set-up (cniHook attaches it afresh)
	Devices    devices.Allocation // host devices of the pod's containers (see devicesHook)
	Warnings   []SandboxWarning   // for the pod's events: what set-up did differently than asked (DNS)
	devicesErr error              // why the pod has no devices, for its containers that ask for some
}

// namespaces is what of the sandbox the containers' specs join.
func (sb *Sandbox) namespaces() ctrspec.Namespaces {
	return ctrspec.Namespaces{NetNS: sb.NetNS, IPCNS: sb.IPCNS, PIDNS: sb.PIDNS, Shm: sb.Shm, Hostname: sb.Hostname}
}

// A sandbox hook is one part of the sandbox (pod dir, a namespace, the cgroup, volumes...). Each has
// a Name and implements the phases it needs, found by type assertion, so a new part (CNI, a
// configMap volume) is one new hook rather than an edit of the runner.
type sandboxHook interface{ Name() string }

// sandboxPrerunner sets its part up, once per pod instance, before any container starts. It must be
// idempotent: the worker calls it again after an agent restart and after a spec change.
type sandboxPrerunner interface {
	Prerun(ctx context.Context, pod *v1.Pod, sb *Sandbox) error
}

// sandboxDestroyer removes its part. It must be idempotent and work when Prerun never ran, from the
// UID alone: the same call serves a deletion, an orphan found after a crash and a sweep of leftovers.
type sandboxDestroyer interface {
	Destroy(ctx context.Context, ref PodRef) error
}

// sandboxLister reports the pods that have something of this part on the node.
type sandboxLister interface {
	List() ([]PodRef, error)
}

// sandboxHooks in set-up order; teardown runs them in reverse.
func (r *Runtime) sandboxHooks() []sandboxHook {
	return []sandboxHook{
		podDirHook{r.dirs()},
		logDirHook{r.dirs()},
		netnsHook{r.dirs()},
		cniHook{r.dirs(), r.opts.Network}, // after the namespace it attaches; fills PodIPs for the hosts file
		ipcHook{r.dirs()},
		cgroupHook{r.opts.Cgroups, r.opts.Namespace},
		pidnsHook{r.dirs(), r.opts.Executable, r.log}, // after the pod dir (its record) and the cgroup (where the holder goes)
		r.emptyDirHook(),
		fsGroupHook{r.log},          // after the volumes it gives to the pod's fsGroup
		objectVolumesHook{r.dirs()}, // after the pod dir: its tmpfs mounts go before the dir is removed
		imageVolumesHook{r.dirs(), func() snapshots.Snapshotter { return r.client.SnapshotService(r.opts.Snapshotter) }, r.ctx}, // likewise
		hostsHook{r.opts.DNS},
		r.devicesHook(),  // after the pod dir, where it records the allocation
		bootMarkerHook{}, // last: only a complete set-up is recorded as done in this boot
	}
}

// emptyDirHook sizes memory-backed emptyDirs from the machine's memory and node allocatable.
func (r *Runtime) emptyDirHook() emptyDirHook {
	return emptyDirHook{dirs: r.dirs(), memCapacity: r.memCapacity, nodeAllocatable: r.opts.NodeAllocatableMemory}
}

// devicesHook hands out the devices of r's device manager.
func (r *Runtime) devicesHook() devicesHook {
	return devicesHook{dirs: r.dirs(), devices: r.opts.Devices}
}

// EnsureSandbox sets up (or finds intact) everything pod's containers share. It is idempotent; a
// failed set-up leaves what it made for the next call, or for RemoveSandbox.
func (r *Runtime) EnsureSandbox(ctx context.Context, pod *v1.Pod) (*Sandbox, error) {
	if err := checkPathElem("pod UID", string(pod.UID)); err != nil {
		return nil, err
	}
	sb := &Sandbox{Ref: RefOf(pod), Volumes: map[string]string{}}
	for _, h := range r.sandboxHooks() {
		if p, ok := h.(sandboxPrerunner); ok {
			if err := p.Prerun(ctx, pod, sb); err != nil {
				return nil, fmt.Errorf("pod %s sandbox: %s: %w", sb.Ref, h.Name(), err)
			}
		}
	}
	return sb, nil
}

// RemoveSandbox removes everything of the pod outside containerd (namespaces, cgroup, pod dir, logs),
// by UID alone if need be. Missing parts are fine; every part is tried even when one fails.
func (r *Runtime) RemoveSandbox(ctx context.Context, ref PodRef) error {
	if err := checkPathElem("pod UID", string(ref.UID)); err != nil {
		return err
	}
	hooks := r.sandboxHooks()
	var errs []error
	for i := len(hooks) - 1; i >= 0; i-- {
		if d, ok := hooks[i].(sandboxDestroyer); ok {
			if err := d.Destroy(ctx, ref); err != nil {
				errs = append(errs, fmt.Errorf("pod %s sandbox: %s: %w", ref, hooks[i].Name(), err))
			}
		}
	}
	return errors.Join(errs...)
}

// ListSandboxes returns every pod that has anything on this node outside containerd: pod dir,
// pinned namespaces, log dir, cgroup. Names are filled where a part records them (the log dir).
func (r *Runtime) ListSandboxes() ([]PodRef, error) {
	byUID := map[types.UID]PodRef{}
	var errs []error
	for _, h := range r.sandboxHooks() {
		l, ok := h.(sandboxLister)
		if !ok {
			continue
		}
		refs, err := l.List()
		if err != nil {
			errs = append(errs, fmt.Errorf("list sandboxes: %s: %w", h.Name(), err))
			continue
		}
		for _, ref := range refs {
			if cur, ok := byUID[ref.UID]; !ok || cur.Name == "" {
				byUID[ref.UID] = ref
			}
		}
	}
	out := make([]PodRef, 0, len(byUID))
	for _, ref := range byUID {
		out = append(out, ref)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UID < out[j].UID })
	return out, errors.Join(errs...)
}

// uidRefs turns directory entry names that are pod UIDs into refs, skipping what is not one.
func uidRefs(names []string) []PodRef {
	out := make([]PodRef, 0, len(names))
	for _, n := range names {
		if checkPathElem("pod UID", n) == nil && !strings.HasPrefix(n, ".") {
			out = append(out, PodRef{UID: types.UID(n)})
		}
	}
	return out
}
