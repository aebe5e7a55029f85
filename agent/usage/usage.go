// Package usage reads the CPU and memory that the node and each running container of the
// agent's pods use, from /proc and from the containers' cgroups, with cAdvisor's definitions:
// cumulative CPU seconds, and the memory working set (usage minus inactive file pages, which
// the kernel can drop at once). These are the figures behind the metrics
// container_cpu_usage_seconds_total and container_memory_working_set_bytes (kubelet's resource
// metrics, which metrics-server and `kubectl top` read) and behind `mqlet top`.
package usage

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/mqlet/mqlet/hw"
	v1 "k8s.io/api/core/v1"
)

// Container is one running container's use.
type Container struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Container string `json:"container"`
	// ID is containerd's container id: a restarted container has a new one, and CPU seconds of
	// two ids are not comparable.
	ID string `json:"id"`
	// CPUSeconds is the CPU time the container used since it started.
	CPUSeconds float64 `json:"cpuSeconds"`
	// MemoryWorkingSetBytes is its memory usage minus inactive file pages.
	MemoryWorkingSetBytes int64 `json:"memoryWorkingSetBytes"`
}

// Node is the node's use and capacity.
type Node struct {
	// CPUSeconds is the CPU time all CPUs spent busy since boot (/proc/stat).
	CPUSeconds float64 `json:"cpuSeconds"`
	CPUs       int     `json:"cpus"`
	// MemoryWorkingSetBytes is the root cgroup's working set, as kubelet's memory.available
	// counts it; MemoryCapacityBytes is MemTotal.
	MemoryWorkingSetBytes int64 `json:"memoryWorkingSetBytes"`
	MemoryCapacityBytes   int64 `json:"memoryCapacityBytes"`
}

// Snapshot is one reading of the node and its containers.
type Snapshot struct {
	Time       time.Time   `json:"time"`
	Node       Node        `json:"node"`
	Containers []Container `json:"containers"`
}

// Options are what a Reader reads from.
type Options struct {
	// Root is the tree that holds proc/ and sys/: "/" on a node, a fixture tree in tests.
	Root string
	// Pods lists the agent's pods with their status (agent.Agent.Pods): the running containers
	// and their ids come from it.
	Pods func() []v1.Pod
	// CgroupOf returns a container's cgroup path (ctrd.Runtime.ContainerCgroup); the Reader
	// keeps each path while the container exists.
	CgroupOf func(ctx context.Context, id string) (string, error)
	// Now stamps snapshots; time.Now when nil.
	Now func() time.Time
}

// Reader takes snapshots. Safe for concurrent use.
type Reader struct {
	o Options

	mu    sync.Mutex
	paths map[string]string // container id -> cgroup path
	last  *Snapshot
}

// New returns a Reader.
func New(o Options) *Reader {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Reader{o: o, paths: map[string]string{}}
}

// Read takes a snapshot now. A container whose cgroup cannot be read (it exited meanwhile, or its
// path is unknown) is left out of it; only the node's own figures are errors.
func (r *Reader) Read(ctx context.Context) (Snapshot, error) {
	s := Snapshot{Time: r.o.Now()}
	cpu, err := hw.NodeCPUSeconds(r.o.Root)
	if err != nil {
		return Snapshot{}, fmt.Errorf("node cpu usage: %w", err)
	}
	mem, err := hw.NodeMemory(r.o.Root)
	if err != nil {
		return Snapshot{}, fmt.Errorf("node memory usage: %w", err)
	}
	s.Node = Node{CPUSeconds: cpu.Seconds, CPUs: cpu.CPUs, MemoryWorkingSetBytes: mem.WorkingSet, MemoryCapacityBytes: mem.Capacity}

	seen := map[string]string{}
	for _, p := range r.o.Pods() {
		for _, cs := range allStatuses(&p.Status) {
			id, ok := strings.CutPrefix(cs.ContainerID, "containerd://")
			if !ok || cs.State.Running == nil {
				continue
			}
			path, err := r.cgroupOf(ctx, id)
			if err != nil {
				continue
			}
			seen[id] = path
			c, err := readContainer(r.o.Root, path)
			if err != nil {
				continue // exited between the listing and the read
			}
			c.Namespace, c.Pod, c.Container, c.ID = p.Namespace, p.Name, cs.Name, id
			s.Containers = append(s.Containers, c)
		}
	}
	r.mu.Lock()
	r.paths = seen // forget the containers that are gone
	r.last = &s
	r.mu.Unlock()
	return s, nil
}

// Recent returns the last snapshot if it is younger than maxAge, else a new one: the metrics
// families of one scrape then read the cgroups once.
func (r *Reader) Recent(ctx context.Context, maxAge time.Duration) (Snapshot, error) {
	r.mu.Lock()
	last := r.last
	r.mu.Unlock()
	if last != nil && r.o.Now().Sub(last.Time) < maxAge {
		return *last, nil
	}
	return r.Read(ctx)
}

// cgroupOf is the container's cgroup path, asked of the runtime once per container.
func (r *Reader) cgroupOf(ctx context.Context, id string) (string, error) {
	r.mu.Lock()
	path, ok := r.paths[id]
	r.mu.Unlock()
	if ok {
		return path, nil
	}
	return r.o.CgroupOf(ctx, id) // I/O outside the lock
}

func readContainer(root, path string) (Container, error) {
	cpu, err := hw.CgroupCPUSeconds(root, path)
	if err != nil {
		return Container{}, err
	}
	mem, err := hw.CgroupMemory(root, path)
	if err != nil {
		return Container{}, err
	}
	return Container{CPUSeconds: cpu, MemoryWorkingSetBytes: mem.WorkingSet}, nil
}

func allStatuses(st *v1.PodStatus) []v1.ContainerStatus {
	out := make([]v1.ContainerStatus, 0, len(st.InitContainerStatuses)+len(st.ContainerStatuses)+len(st.EphemeralContainerStatuses))
	out = append(out, st.InitContainerStatuses...)
	out = append(out, st.ContainerStatuses...)
	return append(out, st.EphemeralContainerStatuses...)
}

// Rate is the use between two snapshots of the same node, as `kubectl top` shows it.
type Rate struct {
	Node       NodeRate
	Containers []ContainerRate
}

// NodeRate is the node's CPU in millicores over the interval and its memory at the end.
type NodeRate struct {
	MilliCPU              int64
	CPUs                  int
	MemoryWorkingSetBytes int64
	MemoryCapacityBytes   int64
}

// ContainerRate is a container's CPU in millicores over the interval and its memory at the end.
type ContainerRate struct {
	Namespace, Pod, Container string
	MilliCPU                  int64
	MemoryWorkingSetBytes     int64
}

// Between computes the rates from a to b (b later). A container in b but not in a with the same
// id (it started or restarted between them) has no rate and is left out, as kubectl top leaves
// out a pod metrics-server has one sample of.
func Between(a, b Snapshot) (Rate, error) {
	dt := b.Time.Sub(a.Time).Seconds()
	if dt <= 0 {
		return Rate{}, fmt.Errorf("snapshots at %s and %s: the second must be later", a.Time.Format(time.RFC3339Nano), b.Time.Format(time.RFC3339Nano))
	}
	milli := func(from, to float64) int64 {
		if to < from {
			return 0
		}
		return int64((to-from)/dt*1000 + 0.5)
	}
	out := Rate{Node: NodeRate{
		MilliCPU: milli(a.Node.CPUSeconds, b.Node.CPUSeconds), CPUs: b.Node.CPUs,
		MemoryWorkingSetBytes: b.Node.MemoryWorkingSetBytes, MemoryCapacityBytes: b.Node.MemoryCapacityBytes,
	}}
	before := map[string]Container{}
	for _, c := range a.Containers {
		before[c.ID] = c
	}
	for _, c := range b.Containers {
		prev, ok := before[c.ID]
		if !ok {
			continue
		}
		out.Containers = append(out.Containers, ContainerRate{Namespace: c.Namespace, Pod: c.Pod, Container: c.Container,
			MilliCPU: milli(prev.CPUSeconds, c.CPUSeconds), MemoryWorkingSetBytes: c.MemoryWorkingSetBytes})
	}
	return out, nil
}
