package e2e

import (
	"encoding/json"
	"fmt"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/hw"
	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/internal/testenv"
	"github.com/mqlet/mqlet/sync/protocol"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The agent's debug log says what each node status computation did; the tests below count these
// lines as positive signals (N computations happened) before they check that nothing was written.
var (
	computedLine = regexp.MustCompile(`msg="node status computed" seq=(\d+) ready=(\w+) settling=\w+ changed=(\w+) stored=(\w+)`)
	outboxLine   = regexp.MustCompile(`msg="uplink: wrote to the outbox" topics="?\[([^\]]*)\]`)
)

// computations returns the last computation's sequence number and how many were stored.
func computations(log string) (last, stored int) {
	for _, m := range computedLine.FindAllStringSubmatch(log, -1) {
		last, _ = strconv.Atoi(m[1])
		if m[4] == "true" {
			stored++
		}
	}
	return last, stored
}

// nodePublishes counts the uplink's outbox writes that carried the node status.
func nodePublishes(log string) int {
	n := 0
	for _, m := range outboxLine.FindAllStringSubmatch(log, -1) {
		if strings.Contains(m[1], "/status/node") {
			n++
		}
	}
	return n
}

func (h *harness) nodeJSON() *v1.Node {
	h.t.Helper()
	var n v1.Node
	out := h.mqlet("node", "-o", "json")
	if err := json.Unmarshal([]byte(out), &n); err != nil {
		h.t.Fatalf("mqlet node -o json: %v\n%s", err, out)
	}
	return &n
}

func nodeCondition(n *v1.Node, t v1.NodeConditionType) *v1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == t {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// waitComputations waits until the agent has logged k more node status computations than it had
// when called.
func (h *harness) waitComputations(k int) {
	h.t.Helper()
	from, _ := computations(h.agentLog.String())
	waitFor(h.t, fmt.Sprintf("%d more node status computations after #%d", k, from), func() bool {
		last, _ := computations(h.agentLog.String())
		return last >= from+k
	})
}

// TestNodeStatusStandalone: a real agent (no broker) computes its node status from this machine
// and containerd; `mqlet node -o json` holds capacity, allocatable, nodeInfo and every condition,
// the tables read like kubectl's, and an idle agent stores nothing more once the status settled.
func TestNodeStatusStandalone(t *testing.T) {
	h := newHarness(t)
	h.startAgent("--node-status-update-frequency", "1s", "--max-pods", "42", "--node-label", "site=e2e",
		"--node-taint", "dedicated=edge:NoSchedule", "--system-reserved", "cpu=100m,memory=100Mi")

	var n *v1.Node
	waitFor(t, "mqlet node reports Ready", func() bool {
		n = h.nodeJSON()
		c := nodeCondition(n, v1.NodeReady)
		return c != nil && c.Status == v1.ConditionTrue
	})
	if n.Kind != "Node" || n.APIVersion != "v1" || n.Name != "e2e-node" || n.CreationTimestamp.IsZero() {
		t.Errorf("node %q kind %q apiVersion %q created %v", n.Name, n.Kind, n.APIVersion, n.CreationTimestamp)
	}

	// Capacity: this machine's.
	cpu, err := hw.CPU("/")
	if err != nil {
		t.Fatal(err)
	}
	mem, err := hw.MemTotal("/")
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(h.state, &st); err != nil {
		t.Fatal(err)
	}
	disk := int64(st.Blocks) * int64(st.Bsize)
	want := map[v1.ResourceName]int64{v1.ResourceCPU: int64(cpu.Count), v1.ResourceMemory: mem, v1.ResourceEphemeralStorage: disk, v1.ResourcePods: 42}
	for name, w := range want {
		q, ok := n.Status.Capacity[name]
		if !ok || q.Value() != w {
			t.Errorf("capacity %s = %v (present %v), want %d", name, q.String(), ok, w)
		}
	}
	// Allocatable: less the reservations and kubelet's default hard eviction thresholds
	// (memory.available<100Mi, nodefs.available<10%).
	wantAlloc := map[v1.ResourceName]resource.Quantity{
		v1.ResourceCPU:              *resource.NewMilliQuantity(int64(cpu.Count)*1000-100, resource.DecimalSI),
		v1.ResourceMemory:           *resource.NewQuantity(mem-200<<20, resource.BinarySI),
		v1.ResourceEphemeralStorage: *resource.NewQuantity(disk-int64(0.1*float64(disk)), resource.BinarySI),
		v1.ResourcePods:             *resource.NewQuantity(42, resource.DecimalSI),
	}
	for name, w := range wantAlloc {
		if q, ok := n.Status.Allocatable[name]; !ok || q.Cmp(w) != 0 {
			t.Errorf("allocatable %s = %v, want %v", name, q.String(), w.String())
		}
	}

	// nodeInfo: containerd's version, mqlet's, and this machine's system.
	info := n.Status.NodeInfo
	version := strings.Fields(h.mqlet("version"))[1] // "mqlet VERSION (commit ...)"
	if !regexp.MustCompile(`^containerd://v?\d+\.\d+`).MatchString(info.ContainerRuntimeVersion) {
		t.Errorf("containerRuntimeVersion %q, want containerd://<version>", info.ContainerRuntimeVersion)
	}
	if info.KubeletVersion != "mqlet-"+version {
		t.Errorf("kubeletVersion %q, want mqlet-%s", info.KubeletVersion, version)
	}
	sys := hw.ReadSystem("/")
	if info.OperatingSystem != "linux" || info.Architecture != runtime.GOARCH || info.KernelVersion != sys.KernelVersion ||
		info.BootID != sys.BootID || info.BootID == "" || info.MachineID != sys.MachineID || info.OSImage != sys.OSImage {
		t.Errorf("nodeInfo %+v, want this machine's %+v", info, sys)
	}

	// Conditions: all five, pressure ones False (nothing reports pressure yet), NetworkUnavailable
	// False (the harness's loopback CNI network is usable), Ready last.
	var types []string
	for _, c := range n.Status.Conditions {
		types = append(types, string(c.Type))
		if c.LastHeartbeatTime.IsZero() || c.LastTransitionTime.IsZero() || c.Reason == "" || c.Message == "" {
			t.Errorf("condition %+v lacks times, reason or message", c)
		}
	}
	if got := strings.Join(types, ","); got != "MemoryPressure,DiskPressure,PIDPressure,NetworkUnavailable,Ready" {
		t.Errorf("conditions %s", got)
	}
	for typ, reason := range map[v1.NodeConditionType]string{v1.NodeNetworkUnavailable: "NetworkPluginReady", v1.NodeMemoryPressure: "KubeletHasSufficientMemory",
		v1.NodeDiskPressure: "KubeletHasNoDiskPressure", v1.NodePIDPressure: "KubeletHasSufficientPID"} {
		if c := nodeCondition(n, typ); c.Status != v1.ConditionFalse || c.Reason != reason {
			t.Errorf("%s: %s %s", typ, c.Status, c.Reason)
		}
	}
	if c := nodeCondition(n, v1.NodeReady); c.Reason != "KubeletReady" || c.Message != "mqlet is posting ready status" {
		t.Errorf("Ready: %+v", c)
	}

	// Labels, taints, images.
	for k, v := range map[string]string{"kubernetes.io/hostname": "e2e-node", "kubernetes.io/os": "linux",
		"kubernetes.io/arch": runtime.GOARCH, "site": "e2e"} {
		if n.Labels[k] != v {
			t.Errorf("label %s = %q, want %q (labels %v)", k, n.Labels[k], v, n.Labels)
		}
	}
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != "dedicated" || n.Spec.Taints[0].Effect != v1.TaintEffectNoSchedule {
		t.Errorf("taints %+v", n.Spec.Taints)
	}
	found := false
	for _, img := range n.Status.Images {
		for _, name := range img.Names {
			found = found || name == testenv.BusyboxRef
		}
	}
	if !found {
		t.Errorf("images %+v lack %s", n.Status.Images, testenv.BusyboxRef)
	}

	// The tables.
	table := h.mqlet("node")
	if !regexp.MustCompile(`(?m)^NAME\s+STATUS\s+ROLES\s+AGE\s+VERSION\n+e2e-node\s+Ready\s+<none>\s+\S+\s+mqlet-`).MatchString(table) {
		t.Errorf("mqlet node:\n%s", table)
	}
	wide := h.mqlet("node", "-o", "wide")
	for _, s := range []string{"INTERNAL-IP", "OS-IMAGE", "KERNEL-VERSION", "CONTAINER-RUNTIME", info.KernelVersion, info.ContainerRuntimeVersion} {
		if !strings.Contains(wide, s) {
			t.Errorf("mqlet node -o wide lacks %q:\n%s", s, wide)
		}
	}
	if y := h.mqlet("node", "-o", "yaml"); !strings.Contains(y, "kind: Node") || !strings.Contains(y, "type: DiskPressure") {
		t.Errorf("mqlet node -o yaml:\n%s", y)
	}

	// Idle: the status settled (stored once); five more computations store nothing.
	_, stored := computations(h.agentLog.String())
	if stored == 0 {
		t.Fatalf("the Ready status was never stored:\n%s", h.agentLog)
	}
	h.waitComputations(5)
	if _, again := computations(h.agentLog.String()); again != stored {
		t.Errorf("an idle agent stored its node status again: %d stores, then %d", stored, again)
	}
	// ...while the heartbeat `mqlet node` shows moved on.
	later := h.nodeJSON()
	if a, b := nodeCondition(n, v1.NodeReady), nodeCondition(later, v1.NodeReady); !b.LastHeartbeatTime.After(a.LastHeartbeatTime.Time) ||
		!b.LastTransitionTime.Equal(&a.LastTransitionTime) {
		t.Errorf("Ready after idle computations: heartbeat %v -> %v, transition %v -> %v",
			a.LastHeartbeatTime, b.LastHeartbeatTime, a.LastTransitionTime, b.LastTransitionTime)
	}

	// A restart with nothing changed takes the stored status up: same transition time, no store.
	h.stopAgent()
	h.startAgent("--node-status-update-frequency", "1s", "--max-pods", "42", "--node-label", "site=e2e",
		"--node-taint", "dedicated=edge:NoSchedule", "--system-reserved", "cpu=100m,memory=100Mi")
	waitFor(t, "Ready again after the restart", func() bool {
		c := nodeCondition(h.nodeJSON(), v1.NodeReady)
		return c != nil && c.Status == v1.ConditionTrue
	})
	h.waitComputations(3)
	after := h.nodeJSON()
	if _, stores := computations(h.agentLog.String()); stores != 0 {
		t.Errorf("a restart with nothing changed stored the node status %d times", stores)
	}
	if a, b := nodeCondition(n, v1.NodeReady), nodeCondition(after, v1.NodeReady); !b.LastTransitionTime.Equal(&a.LastTransitionTime) ||
		!after.CreationTimestamp.Equal(&n.CreationTimestamp) {
		t.Errorf("after the restart: Ready transition %v (was %v), created %v (was %v)", b.LastTransitionTime, a.LastTransitionTime,
			after.CreationTimestamp, n.CreationTimestamp)
	}
}

// TestNodeStatusOverMQTTOnRealChangeOnly: the node status reaches the broker (retained), an idle
// node publishes it no more, and a real change (a new image) is published once.
func TestNodeStatusOverMQTTOnRealChangeOnly(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{})
	h.startMQTTAgent(b.Plain, "--node-status-update-frequency", "1s")
	topic := topics.NodeStatus(e2eNode)
	hasImage := func(ref string) func([]byte) bool {
		return func(p []byte) bool {
			s, err := protocol.DecodeNodeStatus(p, 0)
			if err != nil || s.Object == nil {
				return false
			}
			c := nodeCondition(s.Object, v1.NodeReady)
			if c == nil || c.Status != v1.ConditionTrue {
				return false
			}
			for _, img := range s.Object.Status.Images {
				for _, n := range img.Names {
					if n == ref {
						return true
					}
				}
			}
			return false
		}
	}
	waitRetained(t, b.Plain, topic, "a Ready node status", hasImage(testenv.BusyboxRef))
	published := nodePublishes(h.agentLog.String())
	if published != 1 {
		t.Errorf("node status went to the outbox %d times before the node went idle, want 1", published)
	}
	h.waitComputations(5)
	if again := nodePublishes(h.agentLog.String()); again != published {
		t.Errorf("an idle node published its status again: %d, then %d outbox writes", published, again)
	}

	// A real change: a new image.
	h.mqlet("image", "import", h.env.Image(testenv.Busybox2))
	waitRetained(t, b.Plain, topic, "the node status with the new image", hasImage(testenv.Busybox2Ref))
	if got := nodePublishes(h.agentLog.String()); got != published+1 {
		t.Errorf("the new image made %d node status writes, want 1", got-published)
	}
}
