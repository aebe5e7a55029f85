package main

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/sync/ctlclient"
	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The fleet simulator against a real mosquitto, read and driven through sync/ctlclient as a
// control plane would: no containerd, no root.

// runFleetSim runs `mqlet-fleetsim args...` in this process until the returned stop is called;
// stop returns Run's error once every node has stopped.
func runFleetSim(t *testing.T, args ...string) (stop func() error, logs *syncBuffer) {
	t.Helper()
	var c cli
	p, err := parser(&c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Parse(args); err != nil {
		t.Fatalf("parse fleet-sim %v: %v", args, err)
	}
	logs = &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, logs) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(60 * time.Second):
				t.Fatalf("fleet-sim did not stop within 60s; log:\n%s", logs)
			}
		})
		return runErr
	}
	t.Cleanup(func() { stop() })
	return stop, logs
}

// waitSim polls cond every 100ms for up to limit; cond says what it saw last, for the failure.
func waitSim(t *testing.T, limit time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last seen: %s", what, limit, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func simNodeReady(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

func TestFleetSim(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	ctx := context.Background()

	cc, err := ctlclient.Connect(ctx, ctlclient.Options{Broker: b.Plain, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	_, pahoBefore := simGoroutines() // the control plane's own paho goroutines are not the simulator's

	const nodes = 5
	stop, logs := runFleetSim(t, "--nodes", fmt.Sprint(nodes), "--broker", b.Plain, "--name-prefix", "fs-",
		"--pods-per-node", "150", "--connect-rate", "20", "--node-label", "node-role.kubernetes.io/edge=",
		"--node-taint", "edge=true:NoSchedule", "--mqtt-keepalive", "10s", "--node-log-level", "debug")
	names := make([]string, nodes)
	for i := range names {
		names[i] = fmt.Sprintf("fs-%04d", i)
	}

	// Every node online with a Ready status that shows the simulated machine.
	byName := map[string]ctlclient.Node{}
	waitSim(t, 60*time.Second, "every node online with a Ready status", func() (bool, string) {
		list, err := cc.Nodes(ctx)
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		ready := 0
		for _, n := range list.Items {
			byName[n.Name] = n
			r := n.Status != nil && n.Status.Object != nil && simNodeReady(n.Status.Object)
			seen = append(seen, fmt.Sprintf("%s:%s:ready=%v", n.Name, n.State, r))
			if n.State == ctlclient.StateOnline && r && slices.Contains(names, n.Name) {
				ready++
			}
		}
		return ready == nodes, strings.Join(seen, " ")
	})
	for i, name := range names {
		n := byName[name].Status.Object
		pods := n.Status.Allocatable[v1.ResourcePods]
		if pods.Cmp(resource.MustParse("150")) < 0 {
			t.Errorf("%s: allocatable pods %s, want at least --pods-per-node 150", name, pods.String())
		}
		if cpu := n.Status.Capacity[v1.ResourceCPU]; cpu.Value() != 4 {
			t.Errorf("%s: capacity cpu %s, want 4", name, cpu.String())
		}
		if n.Labels["kubernetes.io/arch"] != "arm64" || n.Labels[LabelSimulated] != "true" || n.Labels["node-role.kubernetes.io/edge"] != "" ||
			n.Labels["kubernetes.io/hostname"] != name {
			t.Errorf("%s: labels %v, want arch arm64, hostname, the simulated marker and the --node-label", name, n.Labels)
		}
		if _, ok := n.Labels["node-role.kubernetes.io/edge"]; !ok {
			t.Errorf("%s: --node-label missing from %v", name, n.Labels)
		}
		if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != "edge" || n.Spec.Taints[0].Effect != v1.TaintEffectNoSchedule {
			t.Errorf("%s: taints %v, want the --node-taint", name, n.Spec.Taints)
		}
		if len(n.Status.Addresses) == 0 || n.Status.Addresses[0].Address != nodeIP(i) {
			t.Errorf("%s: addresses %v, want InternalIP %s first", name, n.Status.Addresses, nodeIP(i))
		}
	}
	waitSim(t, 10*time.Second, "the all-connected summary line", func() (bool, string) {
		return strings.Contains(logs.String(), "all simulated nodes connected"), ""
	})

	// Two pods mounting a ConfigMap on one node run there; the others get nothing.
	node := names[2]
	cm := &v1.ConfigMap{Data: map[string]string{"app.conf": "x=1"}}
	cm.Name, cm.Namespace = "app-config", "default"
	podWith := func(name string) *v1.Pod {
		p := &v1.Pod{}
		p.Name, p.Namespace = name, "default"
		p.Spec.Containers = []v1.Container{{Name: "app", Image: "registry.example/app:1.0",
			VolumeMounts: []v1.VolumeMount{{Name: "conf", MountPath: "/etc/app"}}}}
		p.Spec.Volumes = []v1.Volume{{Name: "conf", VolumeSource: v1.VolumeSource{
			ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "app-config"}}}}}
		return p
	}
	// The pods first: without their ConfigMap they wait, as on a real node.
	podsRes, err := cc.Apply(ctx, node, []any{podWith("web-1"), podWith("web-2")})
	if err != nil {
		t.Fatal(err)
	}
	waitSim(t, 30*time.Second, "both pods waiting for their ConfigMap", func() (bool, string) {
		list, err := cc.Pods(ctx, node)
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		waiting := 0
		for _, s := range list.Items {
			for _, cs := range s.Object.Status.ContainerStatuses {
				if w := cs.State.Waiting; w != nil {
					seen = append(seen, s.Name+":"+w.Reason+":"+w.Message)
					if w.Reason == "CreateContainerConfigError" && strings.Contains(w.Message, "app-config") {
						waiting++
					}
				}
			}
		}
		return waiting == 2, strings.Join(seen, " ")
	})
	if _, err := cc.Apply(ctx, node, []any{cm}); err != nil {
		t.Fatal(err)
	}
	waitSim(t, 30*time.Second, "both pods Running in the node's retained status", func() (bool, string) {
		list, err := cc.Pods(ctx, node)
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		running := 0
		for _, s := range list.Items {
			ph := v1.PodPhase("")
			if s.Object != nil {
				ph = s.Object.Status.Phase
			}
			seen = append(seen, fmt.Sprintf("%s:%s:gen=%d", s.Name, ph, s.Generation))
			if ph == v1.PodRunning && s.Generation == podsRes.Generation && len(s.Object.Status.ContainerStatuses) == 1 &&
				s.Object.Status.ContainerStatuses[0].Ready && s.Object.Status.PodIP != "" {
				running++
			}
		}
		return running == 2, strings.Join(seen, " ")
	})
	// The ConfigMap's arrival started them, not the worker's back-off running out.
	if !strings.Contains(logs.String(), "an object the pod uses changed; retrying the container at once") {
		t.Errorf("the pods did not start on the ConfigMap's arrival; log:\n%s", logs)
	}
	if all, err := cc.Pods(ctx, ""); err != nil || len(all.Items) != 2 {
		t.Errorf("pods on every node: %v %v, want only the two applied", all, err)
	}

	// A deletion ends in a retained status saying deleted.
	if _, err := cc.Delete(ctx, node, protocol.KindPod, "default", "web-1"); err != nil {
		t.Fatal(err)
	}
	topic := cc.Topics().PodStatus(node, "default", "web-1")
	waitSim(t, 30*time.Second, "web-1's retained status deleted", func() (bool, string) {
		got, err := cc.Snapshot(ctx, topic)
		if err != nil {
			return false, err.Error()
		}
		s, err := protocol.DecodePodStatus(got[topic], 0)
		if err != nil {
			return false, err.Error()
		}
		return s.Deleted, fmt.Sprintf("%+v", s)
	})

	// Stopping the simulator turns every node offline and ends every goroutine it started.
	if err := stop(); err != nil {
		t.Fatalf("fleet-sim: %v\n%s", err, logs)
	}
	list, err := cc.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range list.Items {
		if slices.Contains(names, n.Name) && n.State != ctlclient.StateOffline {
			t.Errorf("%s is %s after the simulator stopped, want offline", n.Name, n.State)
		}
	}
	if !strings.Contains(logs.String(), "fleet simulator stopped") || !strings.Contains(logs.String(), "nodes=5 failed=0") {
		t.Errorf("no clean stop summary in the log:\n%s", logs)
	}
	waitSim(t, 10*time.Second, "the simulator's goroutines ended", func() (bool, string) {
		left, paho := simGoroutines()
		return len(left) == 0 && paho <= pahoBefore, fmt.Sprintf("%d paho goroutines (%d before), and:\n%s",
			paho, pahoBefore, strings.Join(left, "\n\n"))
	})
}

// simGoroutines returns the stacks of running goroutines in the agent's and the sync's code (the
// control plane client's and the tests' own aside), and how many goroutines run in paho.
func simGoroutines() (stacks []string, paho int) {
	buf := make([]byte, 8<<20)
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "eclipse/paho") {
			paho++
		}
		for _, pkg := range []string{"mqlet/mqlet/agent", "mqlet/mqlet/sync/", "mqlet/mqlet/store", "main.(*simNode)",
			"main.(*fleet)", "mqlet/mqlet/node.", "main.(*FleetSimCmd)"} {
			if strings.Contains(g, pkg) && !strings.Contains(g, "sync/ctlclient") {
				stacks = append(stacks, g)
				break
			}
		}
	}
	return stacks, paho
}

func TestFleetSimBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nodes", "0", "--broker", "tcp://127.0.0.1:1883"}, "--nodes: 0: must be at least 1"},
		{[]string{"--broker", "tcp://127.0.0.1:1883", "--name-prefix", "Bad_"}, "--name-prefix: \"Bad_\""},
		{[]string{"--broker", "ftp://127.0.0.1:1883"}, "mqtt-broker"},
		{[]string{"--broker", "tcp://127.0.0.1:1883", "--node-taint", "edge:Sometimes"}, "edge:Sometimes"},
		{[]string{"--broker", "tcp://127.0.0.1:1883", "--mqtt-keepalive", "1s"}, "must be at least 5s"},
		{[]string{"--broker", "tcp://127.0.0.1:1883", "--node-memory", "lots"}, "--node-memory: \"lots\""},
		{[]string{"--broker", "tcp://127.0.0.1:1883", "--connect-rate", "0"}, "--connect-rate"},
	} {
		stop, logs := runFleetSim(t, tc.args...)
		err := stop()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("fleet-sim %v: %v, want an error naming %q", tc.args, err, tc.want)
		}
		if strings.Contains(logs.String(), "starting") {
			t.Errorf("fleet-sim %v started despite the bad flag:\n%s", tc.args, logs)
		}
	}
}

// syncBuffer is the simulator's log: written by its nodes, read by the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
