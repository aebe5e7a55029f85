package nodestatus

import (
	"context"
	"errors"
	"runtime"
	"time"

	"github.com/mqlet/mqlet/agent/eviction"
	"github.com/mqlet/mqlet/hw"
	v1 "k8s.io/api/core/v1"
)

// Config is what DefaultSetters needs: settings, and readers for what is not a file under Root.
type Config struct {
	NodeName string
	// AgentVersion goes into nodeInfo.kubeletVersion, e.g. "mqlet-v0.3.0".
	AgentVersion string
	// Root is the machine's root for the hw readers: "/" (fixture trees in tests).
	Root string
	// StateDir's filesystem is the node's ephemeral-storage (DiskCapacity measures it).
	StateDir string
	MaxPods  int64
	// MaxImages bounds the image list (nodeStatusMaxImages); 0 lists none.
	MaxImages int
	// NodeLabels and Taints are the operator's (nodeLabels, nodeTaints).
	NodeLabels map[string]string
	Taints     []v1.Taint
	// SystemReserved, AgentReserved and the hard eviction Thresholds are kept back from
	// allocatable.
	SystemReserved, AgentReserved v1.ResourceList
	Thresholds                    []eviction.Threshold

	// HostIP finds the node's address; nil reads it with hw.HostIPOf(Root, hw.SystemInterfaces).
	HostIP func() string
	// RuntimeVersion is containerd's version; nil reports "Unknown".
	RuntimeVersion func() string
	// ListImages lists containerd's images; nil lists none.
	ListImages func(ctx context.Context) ([]Image, error)
	// DiskCapacity measures a filesystem's size in bytes; nil leaves ephemeral-storage out (and
	// the node not Ready, as kubelet requires it).
	DiskCapacity func(path string) (int64, error)
	// Extra returns the device resources' capacity; nil for none.
	Extra func() v1.ResourceList
	// Ready is nil when the agent is ready (its sources read, containerd answering).
	Ready func() error
	// ShuttingDown reports a node shutdown in progress; nil: never.
	ShuttingDown func() bool
	// Pressure reports memory, disk and PID pressure; nil: never under pressure.
	Pressure Pressure
	// Conditions are further condition setters (NetworkUnavailable, once pod networking
	// exists); they run after the pressure conditions and before Ready.
	Conditions []Setter
	// Now is the clock of the conditions' heartbeat and transition times; time.Now if nil.
	Now func() time.Time
	// Host, when set, is a made-up machine read in place of the one under Root (the fleet
	// simulator's nodes): its figures and facts, and its OS and architecture in the labels.
	Host *Host
}

// Host is a made-up machine: what DefaultSetters reports for a simulated node.
type Host struct {
	CPUs         int
	Memory       int64 // bytes
	DiskCapacity int64 // bytes, the ephemeral-storage
	// Info is the software identity (nodeInfo); its OperatingSystem and Architecture also go
	// into the kubernetes.io/os and kubernetes.io/arch labels.
	Info     Info
	Hardware Hardware
}

// DefaultSetters returns mqlet's setters in the order they must run: addresses, capacity and
// allocatable, nodeInfo, images, labels (which resets the label set) before the hardware facts
// (which add to it), taints, the pressure conditions, c.Conditions, and Ready last (it checks the
// capacity and is listed last, as kubelet lists it).
func DefaultSetters(c Config) []Setter {
	now := c.Now
	if now == nil {
		now = time.Now
	}
	root := c.Root
	ready := c.Ready
	if ready == nil {
		ready = func() error { return nil }
	}
	hostIP := c.HostIP
	if hostIP == nil {
		hostIP = func() string { return hw.HostIPOf(root, hw.SystemInterfaces) }
	}
	runtimeVersion := c.RuntimeVersion
	if runtimeVersion == nil {
		runtimeVersion = func() string { return "" }
	}
	list := c.ListImages
	if list == nil {
		list = func(context.Context) ([]Image, error) { return nil, nil }
	}
	info, hardware, goos, goarch := c.machineFacts()
	setters := []Setter{
		NodeAddress(c.NodeName, hostIP),
		MachineInfo(c.Machine()),
		NodeInfo(c.AgentVersion, runtimeVersion, func() Info { return info }),
		Images(c.MaxImages, list),
		Labels(c.NodeName, goos, goarch, c.NodeLabels),
		HardwareFacts(hardware),
		Taints(c.Taints),
		PressureCondition(v1.NodeMemoryPressure, c.Pressure, now),
		PressureCondition(v1.NodeDiskPressure, c.Pressure, now),
		PressureCondition(v1.NodePIDPressure, c.Pressure, now),
	}
	setters = append(setters, c.Conditions...)
	return append(setters, ReadyCondition(ready, c.ShuttingDown, now))
}

// Machine is what the MachineInfo setter reads: the processors and memory under Root (the CPU
// count falls back to Go's when cpuinfo lists none), DiskCapacity at StateDir, MaxPods, Extra and
// the reservations.
func (c Config) Machine() Machine {
	if h := c.Host; h != nil {
		return Machine{
			CPUs:           func() (int, error) { return h.CPUs, nil },
			Memory:         func() (int64, error) { return h.Memory, nil },
			DiskCapacity:   func(string) (int64, error) { return h.DiskCapacity, nil },
			Path:           c.StateDir,
			MaxPods:        c.MaxPods,
			Extra:          c.Extra,
			SystemReserved: c.SystemReserved,
			AgentReserved:  c.AgentReserved,
			Thresholds:     c.Thresholds,
		}
	}
	root := c.Root
	return Machine{
		CPUs: func() (int, error) {
			info, err := hw.CPU(root)
			if err != nil || info.Count == 0 {
				// A cpuinfo without processor lines (some emulators): Go's count of the
				// CPUs this process may use is the next best.
				return runtime.NumCPU(), nil
			}
			return info.Count, nil
		},
		Memory:         func() (int64, error) { return hw.MemTotal(root) },
		DiskCapacity:   c.DiskCapacity,
		Path:           c.StateDir,
		MaxPods:        c.MaxPods,
		Extra:          c.Extra,
		HugePages:      func() (map[int64]int64, error) { return hw.HugePages(root) },
		SystemReserved: c.SystemReserved,
		AgentReserved:  c.AgentReserved,
		Thresholds:     c.Thresholds,
	}
}

// machineFacts are the software identity and the hardware facts reader of the machine, and the
// OS and architecture its labels name. What cannot change while the agent runs is read once, here:
// the software identity (a new kernel or boot id needs a reboot, which restarts the agent) and the
// board. Only the temperatures and the throttling flags are read every period.
func (c Config) machineFacts() (info Info, hardware func() (Hardware, error), goos, goarch string) {
	if h := c.Host; h != nil {
		return h.Info, func() (Hardware, error) { return h.Hardware, nil }, h.Info.OperatingSystem, h.Info.Architecture
	}
	root := c.Root
	sys := hw.ReadSystem(root)
	info = Info{OSImage: sys.OSImage, KernelVersion: sys.KernelVersion, BootID: sys.BootID, MachineID: sys.MachineID,
		SystemUUID:      sys.SystemUUID,
		OperatingSystem: runtime.GOOS, Architecture: sys.Arch}
	fixed, fixedErr := readFixedHardware(root)
	return info, func() (Hardware, error) { return readHardwareReadings(root, fixed, fixedErr) }, runtime.GOOS, runtime.GOARCH
}

// ReadHardware reads the Hardware facts under root with the hw readers.
func ReadHardware(root string) (Hardware, error) {
	fixed, err := readFixedHardware(root)
	return readHardwareReadings(root, fixed, err)
}

// readFixedHardware reads the facts that hold while the machine runs: the processor model, the
// board and the kernel's machine name.
func readFixedHardware(root string) (Hardware, error) {
	cpu, err := hw.CPU(root)
	return Hardware{CPUModel: cpu.Model, Board: hw.ReadBoard(root, cpu), Machine: hw.Machine(root)}, err
}

// readHardwareReadings is fixed (and its read error) with the readings that move: the
// temperatures and the throttling flags.
func readHardwareReadings(root string, fixed Hardware, fixedErr error) (Hardware, error) {
	h := fixed
	h.Temperatures = hw.Temperatures(root)
	t, ok, err := hw.Throttled(root)
	if ok {
		h.Throttling = &t
	}
	return h, errors.Join(fixedErr, err)
}
