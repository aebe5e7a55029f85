package e2e

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/internal/mqtttest"
	v1 "k8s.io/api/core/v1"
)

// A 64 MiB retained message on the node's index topic (which it subscribes to on every
// connection), from a client the broker lets publish it (the harness broker has no
// message_size_limit): the agent, with its default 1 MiB payload limit, drops the connection at
// the packet's header on every attempt, its peak RSS (VmHWM) does not take the packet in, and once
// the control plane replaces the index the agent reconnects and runs what it is given.
func TestMQTTOversizedPacketDropsConnectionNotMemory(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{})
	cp := newControlPlane(t, b.Plain)
	h.startMQTTAgent(b.Plain, "--mqtt-reconnect-max", "1s")
	cp.applyYAML(sleeper("before", "3600"))
	h.waitPod("before", "running from MQTT", allRunning)

	const packet = 64 << 20
	peak := func() int64 { return procStatusKiB(t, h.agent.Process.Pid, "VmHWM") << 10 }
	before := peak()
	cp.raw(topics.Index(e2eNode), bytes.Repeat([]byte("x"), packet), true)
	const refused = "mqtt inbound packet refused"
	// Either outcome ends the wait, so that an agent that read the packet (and then refused its
	// payload) fails on its memory, not on a timeout.
	waitFor(t, "two connections dropped at the oversized index, or the index read and refused", func() bool {
		log := h.agentLog.String()
		return strings.Count(log, refused) >= 2 || strings.Contains(log, "payload too large")
	})
	after := peak()
	t.Logf("agent VmHWM %d MiB before, %d MiB after meeting the %d MiB packet", before>>20, after>>20, packet>>20)
	if after-before > packet/4 {
		t.Errorf("the agent's peak RSS grew by %d bytes while it met a %d-byte packet: it was read", after-before, packet)
	}
	if strings.Count(h.agentLog.String(), refused) < 2 {
		t.Fatalf("the agent read the oversized index instead of dropping the connection at its header")
	}
	if !strings.Contains(h.agentLog.String(), fmt.Sprintf("of %d bytes is over the limit of %d bytes", 2+len(topics.Index(e2eNode))+2+packet, 1<<20+65539)) {
		t.Errorf("the log does not name the packet's size and the limit:\n%s", h.agentLog)
	}

	// The control plane writes a new index: the agent connects again and applies it.
	gen := cp.applyYAML(sleeper("before", "3600"), sleeper("after", "3600"))
	h.waitPod("after", "running once the index was replaced", allRunning)
	waitRetained(t, b.Plain, topics.PodStatus(e2eNode, "default", "after"), "status of after", podStatusIs(v1.PodRunning, gen))
}

// procStatusKiB reads one "kB" field of /proc/<pid>/status.
func procStatusKiB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("/proc/%d/status %s: %q", pid, field, line)
			}
			return n
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, field)
	return 0
}
