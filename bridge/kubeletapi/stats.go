package kubeletapi

import (
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The shape of kubelet's /stats/summary (k8s.io/kubelet/pkg/apis/stats/v1alpha1), the fields the
// nodes' usage fills; written here rather than importing k8s.io/kubelet for five structs.
type (
	summary struct {
		Node nodeStats  `json:"node"`
		Pods []podStats `json:"pods"`
	}
	nodeStats struct {
		NodeName  string       `json:"nodeName"`
		StartTime metav1.Time  `json:"startTime"`
		CPU       *cpuStats    `json:"cpu,omitempty"`
		Memory    *memoryStats `json:"memory,omitempty"`
	}
	podStats struct {
		PodRef     podRef           `json:"podRef"`
		StartTime  metav1.Time      `json:"startTime"`
		Containers []containerStats `json:"containers"`
		CPU        *cpuStats        `json:"cpu,omitempty"`
		Memory     *memoryStats     `json:"memory,omitempty"`
	}
	podRef struct {
		Name      string    `json:"name"`
		Namespace string    `json:"namespace"`
		UID       types.UID `json:"uid"`
	}
	containerStats struct {
		Name      string       `json:"name"`
		StartTime metav1.Time  `json:"startTime"`
		CPU       *cpuStats    `json:"cpu,omitempty"`
		Memory    *memoryStats `json:"memory,omitempty"`
	}
	cpuStats struct {
		Time                 metav1.Time `json:"time"`
		UsageNanoCores       *uint64     `json:"usageNanoCores,omitempty"`
		UsageCoreNanoSeconds *uint64     `json:"usageCoreNanoSeconds,omitempty"`
	}
	memoryStats struct {
		Time            metav1.Time `json:"time"`
		AvailableBytes  *uint64     `json:"availableBytes,omitempty"`
		WorkingSetBytes *uint64     `json:"workingSetBytes,omitempty"`
	}
)

// usageCache keeps each node's previous usage reading, for CPU rates (usageNanoCores).
type usageCache struct {
	mu   sync.Mutex
	last map[string]*protocol.Usage
}

// swap records u as node's latest reading and returns the one before.
func (c *usageCache) swap(node string, u *protocol.Usage) *protocol.Usage {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		c.last = map[string]*protocol.Usage{}
	}
	prev := c.last[node]
	c.last[node] = u
	return prev
}

// readUsage asks the node for its usage; the answer for the client when it fails.
func (s *Server) readUsage(w http.ResponseWriter, r *http.Request, node string) *protocol.Usage {
	if s.offline(w, node) {
		return nil
	}
	if s.o.Usage == nil {
		http.Error(w, "stats over the bridge are not available", http.StatusNotImplemented)
		return nil
	}
	u, err := s.o.Usage(r.Context(), node)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return nil
	}
	var pods []*v1.Pod
	if s.o.NodePods != nil {
		pods = s.o.NodePods(node)
	}
	return onlyBoundPods(u, pods)
}

// onlyBoundPods keeps the containers of u that belong to pods the API binds to the node: a node
// (or whoever answers for it on the broker: the answer is not signed) must not report figures
// for other nodes' pods to metrics-server and the autoscalers.
func onlyBoundPods(u *protocol.Usage, pods []*v1.Pod) *protocol.Usage {
	bound := make(map[string]bool, len(pods))
	for _, p := range pods {
		bound[p.Namespace+"/"+p.Name] = true
	}
	out := *u
	out.Containers = nil
	for _, c := range u.Containers {
		if bound[c.Namespace+"/"+c.Pod] {
			out.Containers = append(out.Containers, c)
		}
	}
	return &out
}

// summary answers /stats/summary from a fresh usage reading of the node and the pods the API
// binds to it.
func (s *Server) summary(w http.ResponseWriter, r *http.Request, node string) {
	u := s.readUsage(w, r, node)
	if u == nil {
		return
	}
	var pods []*v1.Pod
	if s.o.NodePods != nil {
		pods = s.o.NodePods(node)
	}
	writeJSON(w, buildSummary(node, u, s.usage.swap(node, u), pods))
}

func u64(v uint64) *uint64 { return &v }

func nanos(seconds float64) uint64 { return uint64(seconds * 1e9) }

// rate is the CPU use between two readings in nanocores, nil without an earlier reading of the
// same series (a restarted container's counter starts again: its id changed).
func rate(prevSeconds, seconds float64, prevTime, now time.Time) *uint64 {
	dt := now.Sub(prevTime).Seconds()
	if dt <= 0 || seconds < prevSeconds {
		return nil
	}
	return u64(uint64((seconds - prevSeconds) / dt * 1e9))
}

// buildSummary is the Summary of node's usage u (prev: the reading before, for rates); pods gives
// the pods' UIDs and start times.
func buildSummary(node string, u, prev *protocol.Usage, pods []*v1.Pod) *summary {
	t := metav1.NewTime(u.Time)
	out := &summary{Node: nodeStats{NodeName: node}, Pods: []podStats{}}
	n := u.Node
	cpu := &cpuStats{Time: t, UsageCoreNanoSeconds: u64(nanos(n.CPUSeconds))}
	if prev != nil {
		cpu.UsageNanoCores = rate(prev.Node.CPUSeconds, n.CPUSeconds, prev.Time, u.Time)
	}
	mem := &memoryStats{Time: t, WorkingSetBytes: u64(uint64(max(n.MemoryWorkingSetBytes, 0)))}
	if n.MemoryCapacityBytes > 0 {
		mem.AvailableBytes = u64(uint64(max(n.MemoryCapacityBytes-n.MemoryWorkingSetBytes, 0)))
	}
	out.Node.CPU, out.Node.Memory = cpu, mem

	prevByID := map[string]protocol.ContainerUsage{}
	if prev != nil {
		for _, c := range prev.Containers {
			prevByID[c.ID] = c
		}
	}
	byPod := map[string]*v1.Pod{}
	for _, p := range pods {
		byPod[p.Namespace+"/"+p.Name] = p
	}
	index := map[string]int{}
	for _, c := range u.Containers {
		key := c.Namespace + "/" + c.Pod
		i, ok := index[key]
		if !ok {
			ps := podStats{PodRef: podRef{Name: c.Pod, Namespace: c.Namespace}, Containers: []containerStats{},
				CPU: &cpuStats{Time: t, UsageCoreNanoSeconds: u64(0)}, Memory: &memoryStats{Time: t, WorkingSetBytes: u64(0)}}
			if p := byPod[key]; p != nil {
				ps.PodRef.UID = p.UID
				if p.Status.StartTime != nil {
					ps.StartTime = *p.Status.StartTime
				}
			}
			out.Pods = append(out.Pods, ps)
			i = len(out.Pods) - 1
			index[key] = i
		}
		ps := &out.Pods[i]
		cs := containerStats{Name: c.Container,
			CPU:    &cpuStats{Time: t, UsageCoreNanoSeconds: u64(nanos(c.CPUSeconds))},
			Memory: &memoryStats{Time: t, WorkingSetBytes: u64(uint64(max(c.MemoryWorkingSetBytes, 0)))}}
		if pc, ok := prevByID[c.ID]; ok && prev != nil {
			cs.CPU.UsageNanoCores = rate(pc.CPUSeconds, c.CPUSeconds, prev.Time, u.Time)
		}
		if p := byPod[key]; p != nil {
			for _, st := range p.Status.ContainerStatuses {
				if st.Name == c.Container && st.State.Running != nil {
					cs.StartTime = st.State.Running.StartedAt
				}
			}
		}
		ps.Containers = append(ps.Containers, cs)
		*ps.CPU.UsageCoreNanoSeconds += *cs.CPU.UsageCoreNanoSeconds
		*ps.Memory.WorkingSetBytes += *cs.Memory.WorkingSetBytes
		if cs.CPU.UsageNanoCores != nil {
			if ps.CPU.UsageNanoCores == nil {
				ps.CPU.UsageNanoCores = u64(0)
			}
			*ps.CPU.UsageNanoCores += *cs.CPU.UsageNanoCores
		}
	}
	return out
}

// resourceMetrics answers /metrics/resource with kubelet's resource metrics (the figures
// metrics-server reads) from a fresh usage reading.
func (s *Server) resourceMetrics(w http.ResponseWriter, r *http.Request, node string) {
	u := s.readUsage(w, r, node)
	if u == nil {
		return
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	fmt.Fprint(w, resourceMetricsText(u))
}

// resourceMetricsText is u in the Prometheus text format, with kubelet's names and labels, each
// sample stamped with the reading's time (metrics-server computes rates from them).
func resourceMetricsText(u *protocol.Usage) string {
	var b strings.Builder
	ts := strconv.FormatInt(u.Time.UnixMilli(), 10)
	num := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	family := func(name, typ, help string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	family("node_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed by the node in core-seconds")
	fmt.Fprintf(&b, "node_cpu_usage_seconds_total %s %s\n", num(u.Node.CPUSeconds), ts)
	family("node_memory_working_set_bytes", "gauge", "Current working set of the node in bytes")
	fmt.Fprintf(&b, "node_memory_working_set_bytes %d %s\n", u.Node.MemoryWorkingSetBytes, ts)

	cs := slices.Clone(u.Containers)
	sort.Slice(cs, func(i, j int) bool {
		a, c := cs[i], cs[j]
		return a.Namespace+"/"+a.Pod+"/"+a.Container < c.Namespace+"/"+c.Pod+"/"+c.Container
	})
	labels := func(c protocol.ContainerUsage) string {
		return fmt.Sprintf(`container=%q,namespace=%q,pod=%q`, c.Container, c.Namespace, c.Pod)
	}
	family("container_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed by the container in core-seconds")
	for _, c := range cs {
		fmt.Fprintf(&b, "container_cpu_usage_seconds_total{%s} %s %s\n", labels(c), num(c.CPUSeconds), ts)
	}
	family("container_memory_working_set_bytes", "gauge", "Current working set of the container in bytes")
	for _, c := range cs {
		fmt.Fprintf(&b, "container_memory_working_set_bytes{%s} %d %s\n", labels(c), c.MemoryWorkingSetBytes, ts)
	}
	type pod struct{ ns, name string }
	var order []pod
	cpu, memory := map[pod]float64{}, map[pod]int64{}
	for _, c := range cs {
		p := pod{c.Namespace, c.Pod}
		if _, ok := cpu[p]; !ok {
			order = append(order, p)
		}
		cpu[p] += c.CPUSeconds
		memory[p] += c.MemoryWorkingSetBytes
	}
	family("pod_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed by the pod in core-seconds")
	for _, p := range order {
		fmt.Fprintf(&b, "pod_cpu_usage_seconds_total{namespace=%q,pod=%q} %s %s\n", p.ns, p.name, num(cpu[p]), ts)
	}
	family("pod_memory_working_set_bytes", "gauge", "Current working set of the pod in bytes")
	for _, p := range order {
		fmt.Fprintf(&b, "pod_memory_working_set_bytes{namespace=%q,pod=%q} %d %s\n", p.ns, p.name, memory[p], ts)
	}
	family("resource_scrape_error", "gauge", "1 if there was an error while getting container metrics, 0 otherwise")
	b.WriteString("resource_scrape_error 0\n")
	return b.String()
}
