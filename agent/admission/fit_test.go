package admission

import (
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/core/source"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// fitPod is a pod whose one container requests reqs ("cpu=500m", "memory=1Gi", ...).
func fitPod(name string, reqs ...string) *v1.Pod {
	p := &v1.Pod{}
	p.Name, p.Namespace = name, "default"
	c := v1.Container{Name: "c", Image: "busybox:1"}
	for _, r := range reqs {
		k, v, _ := strings.Cut(r, "=")
		if c.Resources.Requests == nil {
			c.Resources.Requests = v1.ResourceList{}
		}
		c.Resources.Requests[v1.ResourceName(k)] = resource.MustParse(v)
	}
	p.Spec.Containers = []v1.Container{c}
	return p
}

func list(pairs ...string) v1.ResourceList {
	return fitPod("x", pairs...).Spec.Containers[0].Resources.Requests
}

func TestFitArithmeticAndMessages(t *testing.T) {
	alloc := list("cpu=4", "memory=8Gi", "pods=3", "ephemeral-storage=10Gi", "mqlet.io/serial=1")
	running := []*v1.Pod{fitPod("a", "cpu=3800m", "memory=1Gi"), fitPod("b", "mqlet.io/serial=1")}
	tests := []struct {
		name        string
		pod         *v1.Pod
		admitted    []*v1.Pod
		reason, msg string
	}{
		{"fits", fitPod("n", "cpu=200m", "memory=7Gi"), running, "", ""},
		{"exactly fits", fitPod("n", "cpu=200m"), running, "", ""},
		{"cpu in millicores", fitPod("n", "cpu=500m"), running,
			"OutOfcpu", "Node didn't have enough resource: cpu, requested: 500, used: 3800, capacity: 4000"},
		{"memory in bytes", fitPod("n", "memory=7516192769"), running,
			"OutOfmemory", "Node didn't have enough resource: memory, requested: 7516192769, used: 1073741824, capacity: 8589934592"},
		{"cpu is reported before memory", fitPod("n", "memory=100Gi", "cpu=5"), running, "OutOfcpu", ""},
		{"ephemeral storage", fitPod("n", "ephemeral-storage=11Gi"), nil, "OutOfephemeral-storage", ""},
		{"a device taken", fitPod("n", "mqlet.io/serial=1"), running,
			"OutOfmqlet.io/serial", "Node didn't have enough resource: mqlet.io/serial, requested: 1, used: 1, capacity: 1"},
		{"a device the node does not have", fitPod("n", "mqlet.io/gpio=1"), nil,
			"OutOfmqlet.io/gpio", "Node didn't have enough resource: mqlet.io/gpio, requested: 1, used: 0, capacity: 0"},
		{"pods count first", fitPod("n", "cpu=100"), []*v1.Pod{fitPod("a"), fitPod("b"), fitPod("c")},
			"OutOfpods", "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3"},
		// A pod that asks for no cpu is not refused for cpu even when the node is overcommitted
		// (kubelet's rule: only a positive request can be short).
		{"no request on an overcommitted node", fitPod("n", "cpu=0", "memory=1Mi"), []*v1.Pod{fitPod("a", "cpu=6")}, "", ""},
		{"best effort", fitPod("n"), running, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Fit(fitRequests(tt.pod), tt.admitted, alloc)
			switch {
			case tt.reason == "" && r != nil:
				t.Fatalf("refused: %v", r)
			case tt.reason == "":
			case r == nil:
				t.Fatalf("admitted, want %s", tt.reason)
			case r.Reason != tt.reason || tt.msg != "" && r.Message != tt.msg:
				t.Fatalf("got %s %q, want %s %q", r.Reason, r.Message, tt.reason, tt.msg)
			}
		})
	}
}

func fitRequests(p *v1.Pod) v1.ResourceList {
	r := v1.ResourceList{}
	for n, q := range p.Spec.Containers[0].Resources.Requests {
		r[n] = q
	}
	return r
}

// A node that lists no memory (its reader failed) does not refuse pods for memory; one that does
// not list a device refuses pods that ask for it.
func TestFitUnlistedResources(t *testing.T) {
	if r := Fit(list("memory=1Gi"), nil, list("cpu=1")); r != nil {
		t.Errorf("memory unlisted: refused %v", r)
	}
	if r := Fit(list("hugepages-2Mi=2Mi"), nil, list("cpu=1")); r == nil || r.Reason != "OutOfhugepages-2Mi" {
		t.Errorf("hugepages unlisted: %v, want OutOfhugepages-2Mi", r)
	}
}

// Check counts init containers and sidecars the way resources.PodRequests does, and refuses with
// the first check that fails in kubelet's order.
func TestCheckOrderAndInitContainers(t *testing.T) {
	alloc := list("cpu=2", "memory=1Gi", "pods=10")
	p := fitPod("n", "memory=100Mi")
	p.Spec.InitContainers = []v1.Container{{Name: "init", Resources: v1.ResourceRequirements{Requests: list("memory=2Gi")}}}
	if r := Check(p, false, nil, Node{Allocatable: alloc}); r == nil || r.Reason != "OutOfmemory" {
		t.Fatalf("init container's 2Gi: %v, want OutOfmemory", r)
	}
	// Pressure is checked before resources; shutdown after them.
	be := fitPod("be")
	if r := Check(be, false, nil, Node{Allocatable: list("pods=0"), Pressure: []v1.NodeConditionType{v1.NodeMemoryPressure}, ShuttingDown: true}); r == nil || r.Reason != ReasonPressure {
		t.Fatalf("got %v, want the pressure refusal first", r)
	}
	if r := Check(be, false, nil, Node{Allocatable: list("pods=0"), ShuttingDown: true}); r == nil || r.Reason != "OutOfpods" {
		t.Fatalf("got %v, want OutOfpods before NodeShutdown", r)
	}
	if r := Check(be, false, nil, Node{Allocatable: alloc, ShuttingDown: true}); r == nil || r.Reason != ReasonNodeShutdown ||
		r.Message != "Pod was rejected as the node is shutting down." {
		t.Fatalf("got %v, want NodeShutdown", r)
	}
	if r := Check(be, true, nil, Node{ShuttingDown: true}); r == nil {
		t.Fatalf("a critical pod was admitted during a shutdown")
	}
	if r := Check(be, false, nil, Node{Allocatable: alloc}); r != nil {
		t.Fatalf("refused on a healthy node: %v", r)
	}
}

func TestCheckPressure(t *testing.T) {
	mem := []v1.NodeConditionType{v1.NodeMemoryPressure}
	be, burstable := fitPod("be"), fitPod("bu", "memory=10Mi")
	tolerant := fitPod("tol")
	tolerant.Spec.Tolerations = []v1.Toleration{{Key: v1.TaintNodeMemoryPressure, Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoSchedule}}
	all := fitPod("all")
	all.Spec.Tolerations = []v1.Toleration{{Operator: v1.TolerationOpExists}}
	wrongEffect := fitPod("wrong")
	wrongEffect.Spec.Tolerations = []v1.Toleration{{Key: v1.TaintNodeMemoryPressure, Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoExecute}}
	tests := []struct {
		name     string
		pod      *v1.Pod
		critical bool
		pressure []v1.NodeConditionType
		refused  bool
	}{
		{"best effort, memory pressure", be, false, mem, true},
		{"burstable, memory pressure", burstable, false, mem, false},
		{"tolerates the memory-pressure taint", tolerant, false, mem, false},
		{"tolerates every taint", all, false, mem, false},
		{"toleration with another effect", wrongEffect, false, mem, true},
		{"critical best effort", be, true, mem, false},
		{"disk pressure refuses all", burstable, false, []v1.NodeConditionType{v1.NodeDiskPressure}, true},
		{"memory and pid pressure refuse all", burstable, false, []v1.NodeConditionType{v1.NodeMemoryPressure, v1.NodePIDPressure}, true},
		{"no pressure", be, false, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Check(tt.pod, tt.critical, nil, Node{Pressure: tt.pressure})
			if (r != nil) != tt.refused {
				t.Fatalf("refusal %v, want refused=%v", r, tt.refused)
			}
			if r != nil && (r.Reason != "Evicted" || !strings.HasPrefix(r.Message, "The node had condition: [")) {
				t.Fatalf("refusal %s %q", r.Reason, r.Message)
			}
		})
	}
	r := Check(be, false, nil, Node{Pressure: mem})
	if r.Message != "The node had condition: [MemoryPressure]. " {
		t.Errorf("message %q, want kubelet's", r.Message)
	}
	if !IsRefusal(r.Reason, r.Message) || IsRefusal("Evicted", "The node was low on resource: memory. ") {
		t.Errorf("IsRefusal tells admission's Evicted from the eviction manager's wrongly")
	}
}

func portPod(name string, hostNetwork bool, ports ...v1.ContainerPort) *v1.Pod {
	p := fitPod(name)
	p.Spec.HostNetwork = hostNetwork
	p.Spec.Containers[0].Ports = ports
	return p
}

func TestHostPortConflicts(t *testing.T) {
	web := portPod("web", false, v1.ContainerPort{ContainerPort: 80, HostPort: 8080})
	local := portPod("local", false, v1.ContainerPort{ContainerPort: 80, HostPort: 9090, HostIP: "127.0.0.1", Protocol: v1.ProtocolUDP})
	hostnet := portPod("hostnet", true, v1.ContainerPort{ContainerPort: 7000})
	admitted := []*v1.Pod{web, local, hostnet}
	tests := []struct {
		name string
		pod  *v1.Pod
		want bool // refused
	}{
		{"same port, default protocol and address", portPod("n", false, v1.ContainerPort{ContainerPort: 1, HostPort: 8080, Protocol: v1.ProtocolTCP}), true},
		{"same port, other protocol", portPod("n", false, v1.ContainerPort{ContainerPort: 1, HostPort: 8080, Protocol: v1.ProtocolUDP}), false},
		{"specific address against a wildcard", portPod("n", false, v1.ContainerPort{ContainerPort: 1, HostPort: 8080, HostIP: "10.0.0.1"}), true},
		{"wildcard against a specific address", portPod("n", false, v1.ContainerPort{ContainerPort: 1, HostPort: 9090, Protocol: v1.ProtocolUDP}), true},
		{"two specific addresses", portPod("n", false, v1.ContainerPort{ContainerPort: 1, HostPort: 9090, HostIP: "127.0.0.2", Protocol: v1.ProtocolUDP}), false},
		{"a hostNetwork pod's container port", portPod("n", false, v1.ContainerPort{ContainerPort: 1, HostPort: 7000}), true},
		{"hostNetwork pod against one", portPod("n", true, v1.ContainerPort{ContainerPort: 8080}), true},
		{"container port only", portPod("n", false, v1.ContainerPort{ContainerPort: 8080}), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Check(tt.pod, false, admitted, Node{})
			if (r != nil) != tt.want {
				t.Fatalf("refusal %v, want refused=%v", r, tt.want)
			}
			if r != nil && (r.Reason != "NodePorts" || !strings.HasPrefix(r.Message, "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports")) {
				t.Fatalf("refusal %s %q", r.Reason, r.Message)
			}
		})
	}
}

// The probe finds a port a process outside the node's pods listens on, TCP and UDP, and frees a
// port once that process is gone.
func TestProbeHostPorts(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tcpPort := int32(l.Addr().(*net.TCPAddr).Port)
	u, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	udpPort := int32(u.LocalAddr().(*net.UDPAddr).Port)

	p := portPod("n", false, v1.ContainerPort{ContainerPort: 80, HostPort: tcpPort})
	r := ProbeHostPorts(p)
	if r == nil || r.Reason != ReasonNodePorts || !strings.Contains(r.Message, "*:"+strconv.Itoa(int(tcpPort))+"/TCP is in use on the host") {
		t.Fatalf("listener on 127.0.0.1:%d, pod wants it on every address: %v", tcpPort, r)
	}
	if r := ProbeHostPorts(portPod("n", false, v1.ContainerPort{ContainerPort: 80, HostPort: udpPort, Protocol: v1.ProtocolUDP})); r == nil {
		t.Fatalf("UDP port %d in use not found", udpPort)
	}
	if r := ProbeHostPorts(portPod("n", true, v1.ContainerPort{ContainerPort: tcpPort})); r == nil {
		t.Fatalf("hostNetwork pod's container port %d in use not found", tcpPort)
	}
	l.Close()
	if r := ProbeHostPorts(p); r != nil {
		t.Fatalf("port %d free again, still refused: %v", tcpPort, r)
	}
}

func TestCriticalReason(t *testing.T) {
	mqtt := source.Ref{Kind: source.MQTT}
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
		src  source.Ref
		want string
	}{
		{"manifest-dir", &v1.Pod{}, source.Ref{Kind: source.File, Origin: "a.yaml"}, "manifest-dir pod"},
		{"node-critical class", &v1.Pod{Spec: v1.PodSpec{PriorityClassName: "system-node-critical"}}, mqtt, "critical priority"},
		{"ordinary", &v1.Pod{}, mqtt, ""},
	} {
		if got := CriticalReason(tc.pod, tc.src); got != tc.want {
			t.Errorf("%s: CriticalReason = %q, want %q", tc.name, got, tc.want)
		}
	}
}
