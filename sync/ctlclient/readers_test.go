package ctlclient

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/sync/protocol"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// smallQueueBroker is a broker whose per-client queue holds 120 messages (20 in flight, 100
// queued), the configs' small sizing, so one subscription's retained set larger than that is
// delivered in part, silently.
func smallQueueBroker(t *testing.T) *mqtttest.Broker {
	t.Helper()
	b := mqtttest.Start(t, mqtttest.Options{})
	// mqtttest has no option for the queue limits: its config is rewritten and the broker
	// started again on it.
	b.Stop(t)
	conf := filepath.Join(b.Dir, "mosquitto.conf")
	data, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	const line = "max_queued_messages 10000\n"
	if !strings.Contains(string(data), line) {
		t.Fatalf("%s no longer holds %q; update the test", conf, line)
	}
	data = []byte(strings.Replace(string(data), line, "max_queued_messages 100\nmax_inflight_messages 20\n", 1))
	if err := os.WriteFile(conf, data, 0o600); err != nil {
		t.Fatal(err)
	}
	b.Start(t)
	return b
}

// publishStatuses publishes n live pod statuses of node, then its summary counting summarized
// of them (n unless told otherwise), without waiting for each PUBACK.
func publishStatuses(t *testing.T, raw mqtt.Client, node string, n, summarized int) {
	t.Helper()
	var toks []mqtt.Token
	for i := range n {
		name := fmt.Sprintf("p%03d", i)
		payload, err := protocol.Encode(&protocol.PodStatus{Node: node, Namespace: "default", Name: name, Source: "mqtt", Generation: 1, Object: pod(name)})
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, raw.Publish(tp.PodStatus(node, "default", name), 1, true, payload))
	}
	for _, tok := range toks {
		if !tok.WaitTimeout(testTimeout) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	pub(t, raw, tp.Summary(node), &protocol.StatusSummary{Node: node, Pods: summarized, Digest: protocol.Digest(nil)}, true)
}

func countByNode(l *PodList) map[string]int {
	out := map[string]int{}
	for _, p := range l.Items {
		out[p.Node]++
	}
	return out
}

// A fleet-wide read larger than the broker's queue for the reader loses statuses without a word;
// Pods finds the short nodes by their summaries and reads each alone, which fits.
func TestPodsReadsShortNodesAgainAlone(t *testing.T) {
	b := smallQueueBroker(t)
	raw := rawClient(t, b.Plain)
	for i := range 5 {
		publishStatuses(t, raw, fmt.Sprintf("n%d", i), 40, 40)
	}
	c := dial(t, b)
	ctx := testCtx(t)
	// The premise: one read of all 200 is partial, and the marker still came back.
	if got, err := c.Snapshot(ctx, tp.AllNodes(protocol.ClassPodStatus)); err != nil || len(got) >= 200 {
		t.Fatalf("one read of 200 statuses through a 120-message queue = %d, %v; the limits are not in force", len(got), err)
	}
	l, err := c.Pods(ctx, "")
	if err != nil {
		t.Fatalf("Pods: %v", err)
	}
	for i := range 5 {
		if n := countByNode(l)[fmt.Sprintf("n%d", i)]; n != 40 {
			t.Errorf("Pods: %d statuses of n%d, want 40", n, i)
		}
	}
	if len(l.Short) != 0 || l.Incomplete() != nil || len(l.Unchecked) != 0 || len(l.Summaries) != 5 {
		t.Errorf("Pods: short %v, unchecked %v, %d summaries; want none short, none unchecked, 5 summaries", l.Short, l.Unchecked, len(l.Summaries))
	}
}

// A node that is short even alone (more statuses than the queue holds, or some unreadable) is
// reported with what was expected and received; what did arrive is listed.
func TestPodsReportsANodeStillShort(t *testing.T) {
	b := smallQueueBroker(t)
	raw := rawClient(t, b.Plain)
	publishStatuses(t, raw, "big", 150, 150)
	publishStatuses(t, raw, "small", 3, 3)
	c := dial(t, b)
	for _, node := range []string{"", "big"} {
		l, err := c.Pods(testCtx(t), node)
		if err != nil {
			t.Fatalf("Pods(%q): %v", node, err)
		}
		got := countByNode(l)["big"]
		if len(l.Short) != 1 || l.Short[0].Node != "big" || l.Short[0].Expected != 150 || l.Short[0].Received != got || got == 0 || got >= 150 {
			t.Fatalf("Pods(%q): short %+v with %d of big's statuses listed; want big short, 150 expected, the partial count received", node, l.Short, got)
		}
		var inc *IncompleteError
		if err := l.Incomplete(); !errors.As(err, &inc) || !strings.Contains(err.Error(), fmt.Sprintf("node big: 150 pod statuses expected (its status summary), %d received", got)) {
			t.Errorf("Pods(%q).Incomplete() = %v", node, err)
		}
		if node == "" && countByNode(l)["small"] != 3 {
			t.Errorf("Pods: %d statuses of small, want 3", countByNode(l)["small"])
		}
	}

	// An unreadable status is not received: a plain broker, one junk status among three counted.
	b2 := mqtttest.Start(t, mqtttest.Options{})
	raw2 := rawClient(t, b2.Plain)
	publishStatuses(t, raw2, "n1", 2, 3)
	pub(t, raw2, tp.PodStatus("n1", "default", "junk"), "{}", true)
	l, err := dial(t, b2).Pods(testCtx(t), "")
	if err != nil || len(l.Short) != 1 || l.Short[0] != (Shortfall{Node: "n1", Expected: 3, Received: 2}) || len(l.Skipped) != 1 {
		t.Errorf("Pods with an unreadable status = short %+v, skipped %v, %v", l.Short, l.Skipped, err)
	}
}

// A node without a summary cannot be checked: listed, and named as unchecked. A node with a
// summary of zero and no statuses is whole.
func TestPodsNodeWithoutSummaryIsUnchecked(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	raw := rawClient(t, b.Plain)
	pub(t, raw, tp.PodStatus("legacy", "default", "a"), &protocol.PodStatus{Node: "legacy", Namespace: "default", Name: "a", Source: "mqtt", Generation: 1, Object: pod("a")}, true)
	pub(t, raw, tp.Summary("empty"), &protocol.StatusSummary{Node: "empty", Pods: 0, Digest: protocol.Digest(nil)}, true)
	l, err := dial(t, b).Pods(testCtx(t), "")
	if err != nil || len(l.Items) != 1 || len(l.Unchecked) != 1 || l.Unchecked[0] != "legacy" || len(l.Short) != 0 || l.Summaries["empty"] == nil {
		t.Errorf("Pods = %+v, %v; want legacy's pod, legacy unchecked, empty's summary", l, err)
	}
}

// WatchAcks returns once the node's acks say what the caller waits for, live ones included; it
// ends with the context, handing back the last acks it read.
func TestWatchAcks(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	raw := rawClient(t, b.Plain)
	c := dial(t, b)
	acks := func(rev int64) *protocol.Acks {
		return &protocol.Acks{Node: "n1", Session: 1, IndexRevision: rev, Applied: map[string]protocol.IndexEntry{}}
	}
	pub(t, raw, tp.Acks("n1"), acks(1), true)
	later, err := protocol.Encode(acks(2))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		// Not pub: t.Fatal belongs to the test's goroutine; a failed publish shows as a wrong
		// result below.
		raw.Publish(tp.Acks("n1"), 1, true, []byte("not json")).WaitTimeout(testTimeout) // passed over
		raw.Publish(tp.Acks("n1"), 1, true, later).WaitTimeout(testTimeout)
	}()
	var seen []int64
	a, err := c.WatchAcks(testCtx(t), "n1", func(a *protocol.Acks) bool {
		seen = append(seen, a.IndexRevision)
		return a.IndexRevision >= 2
	})
	if err != nil || a.IndexRevision != 2 || len(seen) != 2 || seen[0] != 1 {
		t.Errorf("WatchAcks = %+v, %v, saw revisions %v; want 1 then 2", a, err, seen)
	}

	// Long enough for the subscription to be answered on a loaded machine: the retained acks
	// must have been read when the deadline comes.
	ctx, cancel := context.WithTimeout(testCtx(t), 2*time.Second)
	defer cancel()
	a, err = c.WatchAcks(ctx, "n1", func(*protocol.Acks) bool { return false })
	if !errors.Is(err, context.DeadlineExceeded) || a == nil || a.IndexRevision != 2 {
		t.Errorf("WatchAcks until the deadline = %+v, %v; want the last acks and the deadline", a, err)
	}
	// The client works on after a watch: snapshots get their subscriptions afresh.
	if all, skipped, err := c.AllAcks(testCtx(t)); err != nil || all["n1"] == nil || all["n1"].IndexRevision != 2 || len(skipped) != 0 {
		t.Errorf("AllAcks after watching = %v, %v, %v", all, skipped, err)
	}
}

// A node whose subtree holds far more retained messages than its desired set and pods account for
// (a node, or a thief of its credentials, filling the broker, which no per-client quota stops) is
// named with a warning; a normal one is not.
func TestRetainedUsageWarnsOfANodeFillingTheBroker(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	c := dial(t, b)
	raw := rawClient(t, b.Plain)
	ctx := testCtx(t)
	if _, err := c.Apply(ctx, "n1", []any{pod("web")}); err != nil {
		t.Fatal(err)
	}
	pub(t, raw, tp.PodStatus("n1", "default", "web"), "{}", true)
	idx := index(t, c, "n1")
	r, err := c.RetainedUsage(ctx, "n1", idx, 1)
	if err != nil || r.Warning != "" || r.Messages != 3 {
		t.Fatalf("a normal node: %+v, %v; want 3 messages (desired, index, status) and no warning", r, err)
	}
	for i := range 300 {
		pub(t, raw, tp.PodStatus("n1", "junk", fmt.Sprintf("p%d", i)), "{}", true)
	}
	r, err = c.RetainedUsage(ctx, "n1", idx, 1)
	if err != nil || r.Messages != 303 || !strings.Contains(r.Warning, "303 retained messages") {
		t.Fatalf("a node with 300 junk statuses: %+v, %v; want a warning naming the count", r, err)
	}
}

// The node list is a fleet-wide read too (liveness, node status and acks of every node): through a
// queue smaller than it, whole nodes or parts of them went missing without a word. Nodes finds
// them by their status summaries (read first) and reads each alone.
func TestNodesReadsShortNodesAgainAlone(t *testing.T) {
	b := smallQueueBroker(t)
	raw := rawClient(t, b.Plain)
	const nodes = 60
	var toks []mqtt.Token
	publish := func(topic string, v any) {
		payload, err := protocol.Encode(v)
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, raw.Publish(topic, 1, true, payload))
	}
	for i := range nodes {
		name := fmt.Sprintf("n%02d", i)
		publish(tp.Liveness(name), &protocol.Liveness{Node: name, Online: true, Session: 1})
		publish(tp.NodeStatus(name), &protocol.NodeStatus{Node: name, Object: &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}})
		publish(tp.Acks(name), &protocol.Acks{Node: name, Session: 1})
		publish(tp.Summary(name), &protocol.StatusSummary{Node: name, Digest: protocol.Digest(nil)})
	}
	for _, tok := range toks {
		if !tok.WaitTimeout(testTimeout) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	c := dial(t, b)
	ctx := testCtx(t)
	// The premise: one read of the 180 messages the list is made of is partial.
	if got, err := c.Snapshot(ctx, tp.AllNodes(protocol.ClassLiveness), tp.AllNodes(protocol.ClassNodeStatus), tp.AllNodes(protocol.ClassAcks)); err != nil || len(got) >= 3*nodes {
		t.Fatalf("one read of %d messages through a 120-message queue = %d, %v; the limits are not in force", 3*nodes, len(got), err)
	}
	l, err := c.Nodes(ctx)
	if err != nil {
		t.Fatalf("Nodes: %v", err)
	}
	if len(l.Items) != nodes || len(l.Skipped) != 0 {
		t.Fatalf("Nodes: %d nodes (skipped %v), want %d", len(l.Items), l.Skipped, nodes)
	}
	for _, n := range l.Items {
		if n.Liveness == nil || n.Status == nil || n.Acks == nil || n.State != StateOnline {
			t.Errorf("node %s read in part: liveness %v, status %v, acks %v, state %s", n.Name, n.Liveness != nil, n.Status != nil, n.Acks != nil, n.State)
		}
	}
}
