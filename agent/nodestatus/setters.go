// Package nodestatus builds the node's status the way kubelet's nodestatus setters do: a list of
// small functions, each filling one part of a v1.Node from readers it is given (addresses,
// capacity and allocatable, nodeInfo, images, labels and taints, the hardware facts under
// mqlet.io/, and one function per condition), and a Manager that runs them on a period, keeps the
// latest result for readers, and stores and hands on only what really changed.
//
// Each computation starts from a copy of the previous node, as kubelet's setters mutate the node
// they last posted: that is how a condition keeps its lastTransitionTime while its status holds,
// and how the temperature annotation keeps its value while the reading stays within a band.
package nodestatus

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/mqlet/mqlet/agent/eviction"
	"github.com/mqlet/mqlet/agent/resources"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Setter fills one part of n, which holds the previous computation's result (or a node with only
// a name, the first time). It may change n partly before it fails; the Manager logs the error and
// runs the other setters.
type Setter func(ctx context.Context, n *v1.Node) error

// NodeAddress sets the node's addresses: InternalIP from hostIP (the default route's address) and
// Hostname. When hostIP finds none (the link is down, DHCP has not answered yet) the previous
// InternalIP stays: a brief loss of the address is not a change worth reporting. A node that never
// had an address (a factory node with no network) reports its hostname alone, which is not an
// error: it would only fill the log every period.
func NodeAddress(hostname string, hostIP func() string) Setter {
	return func(_ context.Context, n *v1.Node) error {
		ip := hostIP()
		if ip == "" {
			for _, a := range n.Status.Addresses {
				if a.Type == v1.NodeInternalIP {
					ip = a.Address
					break
				}
			}
		}
		var addrs []v1.NodeAddress
		if ip != "" {
			addrs = append(addrs, v1.NodeAddress{Type: v1.NodeInternalIP, Address: ip})
		}
		n.Status.Addresses = append(addrs, v1.NodeAddress{Type: v1.NodeHostName, Address: hostname})
		return nil
	}
}

// Machine is what MachineInfo reads.
type Machine struct {
	// CPUs and Memory read the processor count and memory in bytes.
	CPUs   func() (int, error)
	Memory func() (int64, error)
	// DiskCapacity reads the size in bytes of the filesystem that holds Path (the state dir):
	// the node's ephemeral-storage, as kubelet reports its root dir's filesystem.
	DiskCapacity func(path string) (int64, error)
	Path         string
	MaxPods      int64
	// Extra returns resources beyond cpu, memory, storage and pods (host devices), each with its
	// capacity, which is also its allocatable; nil for none.
	Extra func() v1.ResourceList
	// HugePages reads the huge page pools (page size in bytes -> pages; hw.HugePages); nil for
	// none. Each pool is a hugepages-<size> resource, and the memory it holds is not allocatable
	// as memory, as in kubelet.
	HugePages func() (map[int64]int64, error)
	// SystemReserved and AgentReserved are kept back from allocatable, and so are the hard
	// eviction thresholds (Thresholds), as kubelet computes node allocatable.
	SystemReserved, AgentReserved v1.ResourceList
	Thresholds                    []eviction.Threshold
}

// MachineInfo sets capacity and allocatable: cpu, memory, ephemeral-storage, pods and the extra
// resources. A value that cannot be read keeps the previous one (a resource never read stays
// absent, and Ready then says which is missing); the error names what failed.
func MachineInfo(m Machine) Setter {
	return func(_ context.Context, n *v1.Node) error {
		capacity, err := m.capacity(n.Status.Capacity)
		n.Status.Capacity = capacity
		n.Status.Allocatable = m.NodeAllocatable(capacity)
		return err
	}
}

// NodeAllocatable is the allocatable a node publishes and admission checks pods against:
// Allocatable, less the memory held in huge page pools (kubelet's MachineInfo setter takes
// hugepages-* capacity out of allocatable memory: those pages cannot serve ordinary memory). The
// pods' top cgroup is sized with Allocatable: huge pages are not charged to memory.max.
func (m Machine) NodeAllocatable(capacity v1.ResourceList) v1.ResourceList {
	alloc := m.Allocatable(capacity)
	mem, ok := alloc[v1.ResourceMemory]
	if !ok {
		return alloc
	}
	for name, q := range capacity {
		if strings.HasPrefix(string(name), v1.ResourceHugePagesPrefix) {
			mem.Sub(q)
		}
	}
	if mem.Sign() < 0 {
		mem = *resource.NewQuantity(0, resource.BinarySI)
	}
	alloc[v1.ResourceMemory] = mem
	return alloc
}

// Capacity reads cpu, memory, ephemeral-storage (when DiskCapacity is set), pods and the Extra
// resources. A resource that cannot be read is absent, and the error names it. Admission and the
// pods' cgroups size themselves with it before the first node status exists.
func (m Machine) Capacity() (v1.ResourceList, error) { return m.capacity(nil) }

// capacity is Capacity with prev's value for a resource that cannot be read.
func (m Machine) capacity(prev v1.ResourceList) (v1.ResourceList, error) {
	capacity := v1.ResourceList{v1.ResourcePods: *resource.NewQuantity(m.MaxPods, resource.DecimalSI)}
	var errs []error
	keep := func(name v1.ResourceName, err error) {
		errs = append(errs, fmt.Errorf("%s capacity: %w", name, err))
		if q, ok := prev[name]; ok {
			capacity[name] = q
		}
	}
	if c, err := m.CPUs(); err != nil {
		keep(v1.ResourceCPU, err)
	} else {
		capacity[v1.ResourceCPU] = *resource.NewQuantity(int64(c), resource.DecimalSI)
	}
	if b, err := m.Memory(); err != nil {
		keep(v1.ResourceMemory, err)
	} else {
		capacity[v1.ResourceMemory] = *resource.NewQuantity(b, resource.BinarySI)
	}
	if m.DiskCapacity != nil {
		if b, err := m.DiskCapacity(m.Path); err != nil {
			keep(v1.ResourceEphemeralStorage, fmt.Errorf("filesystem of %s: %w", m.Path, err))
		} else {
			capacity[v1.ResourceEphemeralStorage] = *resource.NewQuantity(b, resource.BinarySI)
		}
	}
	if m.HugePages != nil {
		pools, err := m.HugePages()
		if err != nil {
			errs = append(errs, fmt.Errorf("hugepages capacity: %w", err))
			for name, q := range prev {
				if strings.HasPrefix(string(name), v1.ResourceHugePagesPrefix) {
					capacity[name] = q
				}
			}
		}
		for size, pages := range pools {
			name := v1.ResourceName(v1.ResourceHugePagesPrefix + resource.NewQuantity(size, resource.BinarySI).String())
			capacity[name] = *resource.NewQuantity(size*pages, resource.BinarySI)
		}
	}
	if m.Extra != nil {
		for name, q := range m.Extra() {
			capacity[name] = q.DeepCopy()
		}
	}
	return capacity, errors.Join(errs...)
}

// Allocatable is capacity less SystemReserved, AgentReserved and the hard eviction thresholds,
// as kubelet computes node allocatable.
func (m Machine) Allocatable(capacity v1.ResourceList) v1.ResourceList {
	return resources.Allocatable(capacity, m.SystemReserved, m.AgentReserved, eviction.HardReserve(m.Thresholds, capacity))
}

// Info is what NodeInfo reads: the machine's software identity (hw.ReadSystem in production).
type Info struct {
	OSImage, KernelVersion, BootID, MachineID string
	// SystemUUID is the hardware's UUID (hw.SystemUUID: DMI's, else the machine-id's).
	SystemUUID string
	// OperatingSystem and Architecture in Kubernetes' spelling (GOOS, GOARCH).
	OperatingSystem, Architecture string
}

// NodeInfo sets nodeInfo: "containerd://<version>" from runtimeVersion, kubeletVersion (mqlet's
// version string, e.g. "mqlet-v0.3.0"), and the system facts from info.
func NodeInfo(agentVersion string, runtimeVersion func() string, info func() Info) Setter {
	return func(_ context.Context, n *v1.Node) error {
		i := info()
		rv := runtimeVersion()
		if rv == "" {
			rv = "Unknown" // as kubelet says when the runtime does not tell
		}
		n.Status.NodeInfo = v1.NodeSystemInfo{
			MachineID:               i.MachineID,
			SystemUUID:              i.SystemUUID,
			BootID:                  i.BootID,
			KernelVersion:           i.KernelVersion,
			OSImage:                 i.OSImage,
			ContainerRuntimeVersion: "containerd://" + rv,
			KubeletVersion:          agentVersion,
			OperatingSystem:         i.OperatingSystem,
			Architecture:            i.Architecture,
		}
		return nil
	}
}

// Image is one image name in containerd; several names may point at one image (Digest).
type Image struct {
	Name   string
	Digest string
	Size   int64
}

// MaxNamesPerImage bounds the names listed for one image, as kubelet bounds them.
const MaxNamesPerImage = 5

// Images sets the node's image list: the images in containerd, one entry per image (its names
// grouped by digest, digest references first, then tags, at most MaxNamesPerImage), largest
// first, at most maxImages of them (0 lists none). If the list cannot be read the previous one stays,
// so a containerd hiccup does not look like every image vanished.
func Images(maxImages int, list func(ctx context.Context) ([]Image, error)) Setter {
	return func(ctx context.Context, n *v1.Node) error {
		if maxImages <= 0 {
			n.Status.Images = nil
			return nil
		}
		imgs, err := list(ctx)
		if err != nil {
			return fmt.Errorf("images: %w", err)
		}
		type group struct {
			names []string
			size  int64
		}
		byDigest := map[string]*group{}
		for _, img := range imgs {
			key := img.Digest
			if key == "" {
				key = img.Name
			}
			g := byDigest[key]
			if g == nil {
				g = &group{}
				byDigest[key] = g
			}
			g.names = append(g.names, img.Name)
			g.size = max(g.size, img.Size)
		}
		out := make([]v1.ContainerImage, 0, len(byDigest))
		for _, g := range byDigest {
			slices.SortFunc(g.names, func(a, b string) int {
				if da, db := strings.Contains(a, "@"), strings.Contains(b, "@"); da != db {
					if da {
						return -1
					}
					return 1
				}
				return strings.Compare(a, b)
			})
			out = append(out, v1.ContainerImage{Names: g.names[:min(len(g.names), MaxNamesPerImage)], SizeBytes: g.size})
		}
		slices.SortFunc(out, func(a, b v1.ContainerImage) int {
			if a.SizeBytes != b.SizeBytes {
				if a.SizeBytes > b.SizeBytes {
					return -1
				}
				return 1
			}
			return strings.Compare(a.Names[0], b.Names[0])
		})
		n.Status.Images = out[:min(len(out), maxImages)]
		return nil
	}
}

// Well-known labels kubelet sets on its node.
const (
	LabelHostname = "kubernetes.io/hostname"
	LabelOS       = "kubernetes.io/os"
	LabelArch     = "kubernetes.io/arch"
)

// Labels sets the node's labels: kubernetes.io/hostname, os and arch, plus the operator's
// nodeLabels (which may not override those three). It owns the label set: it replaces what the
// previous computation left, so a label dropped from the config goes; setters that add labels
// (Hardware) must run after it.
func Labels(hostname, goos, goarch string, extra map[string]string) Setter {
	return func(_ context.Context, n *v1.Node) error {
		l := make(map[string]string, len(extra)+3)
		maps.Copy(l, extra)
		l[LabelHostname], l[LabelOS], l[LabelArch] = hostname, goos, goarch
		n.Labels = l
		return nil
	}
}

// Taints sets the node's taints (the nodeTaints setting).
func Taints(taints []v1.Taint) Setter {
	return func(_ context.Context, n *v1.Node) error {
		n.Spec.Taints = nil
		if len(taints) > 0 {
			n.Spec.Taints = slices.Clone(taints)
		}
		return nil
	}
}

// Condition reasons and messages, kubelet's reasons (tools key on them) with mqlet named where
// kubelet names itself.
const (
	ReasonReady                = "KubeletReady"
	ReasonNotReady             = "KubeletNotReady"
	ReasonSufficientMemory     = "KubeletHasSufficientMemory"
	ReasonInsufficientMemory   = "KubeletHasInsufficientMemory"
	ReasonNoDiskPressure       = "KubeletHasNoDiskPressure"
	ReasonDiskPressure         = "KubeletHasDiskPressure"
	ReasonSufficientPID        = "KubeletHasSufficientPID"
	ReasonInsufficientPID      = "KubeletHasInsufficientPID"
	MessageReady               = "mqlet is posting ready status"
	MessageShuttingDown        = "node is shutting down"
	messageSufficientMemory    = "mqlet has sufficient memory available"
	messageInsufficientMemory  = "mqlet has insufficient memory available"
	messageNoDiskPressure      = "mqlet has no disk pressure"
	messageDiskPressure        = "mqlet has disk pressure"
	messageSufficientPID       = "mqlet has sufficient PID available"
	messageInsufficientPID     = "mqlet has insufficient PID available"
	requiredCapacitiesNotFound = "missing node capacity for resources: "
)

// Pressure says which node conditions are under pressure now; the eviction manager implements it.
// A condition missing from the map is not under pressure.
type Pressure interface {
	Conditions() map[v1.NodeConditionType]bool
}

// PressureCondition sets the MemoryPressure, DiskPressure or PIDPressure condition from p (nil:
// never under pressure), with kubelet's rules: lastHeartbeatTime is now on every computation,
// lastTransitionTime only when the status changes (a new condition starts from Unknown, so it
// transitions at once).
func PressureCondition(t v1.NodeConditionType, p Pressure, now func() time.Time) Setter {
	var trueReason, trueMsg, falseReason, falseMsg string
	switch t {
	case v1.NodeMemoryPressure:
		trueReason, trueMsg, falseReason, falseMsg = ReasonInsufficientMemory, messageInsufficientMemory, ReasonSufficientMemory, messageSufficientMemory
	case v1.NodeDiskPressure:
		trueReason, trueMsg, falseReason, falseMsg = ReasonDiskPressure, messageDiskPressure, ReasonNoDiskPressure, messageNoDiskPressure
	case v1.NodePIDPressure:
		trueReason, trueMsg, falseReason, falseMsg = ReasonInsufficientPID, messageInsufficientPID, ReasonSufficientPID, messageSufficientPID
	default:
		panic(fmt.Sprintf("nodestatus: %s is not a pressure condition", t)) // a wiring bug, caught by any test
	}
	return func(_ context.Context, n *v1.Node) error {
		under := p != nil && p.Conditions()[t]
		if under {
			setCondition(n, t, v1.ConditionTrue, trueReason, trueMsg, now())
		} else {
			setCondition(n, t, v1.ConditionFalse, falseReason, falseMsg, now())
		}
		return nil
	}
}

// ReadyCondition sets the Ready condition: True while ready returns nil, the node has every
// required capacity (cpu, memory, ephemeral-storage, pods) and shuttingDown (nil: never) says no;
// otherwise False with the reasons joined, as kubelet does. It must run after MachineInfo, and
// after the pressure conditions so that Ready is listed last, as kubelet lists it.
func ReadyCondition(ready func() error, shuttingDown func() bool, now func() time.Time) Setter {
	return func(_ context.Context, n *v1.Node) error {
		var why []string
		if shuttingDown != nil && shuttingDown() {
			why = append(why, MessageShuttingDown)
		}
		if err := ready(); err != nil {
			why = append(why, err.Error())
		}
		var missing []string
		for _, r := range []v1.ResourceName{v1.ResourceCPU, v1.ResourceMemory, v1.ResourceEphemeralStorage, v1.ResourcePods} {
			if _, ok := n.Status.Capacity[r]; !ok {
				missing = append(missing, string(r))
			}
		}
		if len(missing) > 0 {
			why = append(why, requiredCapacitiesNotFound+strings.Join(missing, ", "))
		}
		if len(why) > 0 {
			setCondition(n, v1.NodeReady, v1.ConditionFalse, ReasonNotReady, strings.Join(why, ", "), now())
		} else {
			setCondition(n, v1.NodeReady, v1.ConditionTrue, ReasonReady, MessageReady, now())
		}
		// Last, also when a status stored by an older mqlet listed it first.
		i := slices.IndexFunc(n.Status.Conditions, func(c v1.NodeCondition) bool { return c.Type == v1.NodeReady })
		ready := n.Status.Conditions[i]
		n.Status.Conditions = append(slices.Delete(n.Status.Conditions, i, i+1), ready)
		return nil
	}
}

// setCondition updates (or appends) condition t with kubelet's heartbeat and transition rules.
// A condition with the same status keeps its lastTransitionTime even if its reason or message
// changes.
func setCondition(n *v1.Node, t v1.NodeConditionType, status v1.ConditionStatus, reason, msg string, now time.Time) {
	ts := metav1.NewTime(now)
	for i := range n.Status.Conditions {
		c := &n.Status.Conditions[i]
		if c.Type != t {
			continue
		}
		if c.Status != status {
			c.LastTransitionTime = ts
		}
		c.Status, c.Reason, c.Message, c.LastHeartbeatTime = status, reason, msg, ts
		return
	}
	n.Status.Conditions = append(n.Status.Conditions, v1.NodeCondition{
		Type: t, Status: status, Reason: reason, Message: msg, LastHeartbeatTime: ts, LastTransitionTime: ts,
	})
}

// Annotation sets one annotation to a fixed value (e.g. the node's sealing key); it must run after
// HardwareFacts when the key is a mqlet.io/ one, since that setter owns and resets those.
func Annotation(key, value string) Setter {
	return func(_ context.Context, n *v1.Node) error {
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[key] = value
		return nil
	}
}
