package uplink

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/link"
	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// These tests run the uplink against a real mosquitto (internal/mqtttest), a real link and a real
// bbolt file; the routing of the node's summary and marker messages is the few lines nodesync
// has for it.

const edge = "edge-1"

// counting is the link as the uplink sees it, counting the publishes per topic.
type counting struct {
	*link.Link
	mu   sync.Mutex
	pubs map[string]int
}

func (c *counting) Send(topic string, payload []byte, retained bool) Receipt {
	c.mu.Lock()
	c.pubs[topic]++
	c.mu.Unlock()
	return c.Publish(topic, payload, retained)
}

// statusPubs counts the publishes of kept topics and summaries (markers and events left out).
func (c *counting) statusPubs() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for topic, n := range c.pubs {
		if topic != tp.NodeMarker(edge) && topic != tp.Events(edge) {
			out[topic] = n
		}
	}
	return out
}

type node struct {
	u    *Uplink
	db   *store.DB
	link *counting
	stop func()
}

func startNode(t *testing.T, broker, dbPath string) *node {
	t.Helper()
	db, err := store.Open(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("UPLINK_TEST_LOG") != "" {
		quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	l, err := link.New(link.Options{
		Broker: broker, ClientID: edge, Keepalive: 5 * time.Second,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond,
		Subscriptions: []string{tp.Summary(edge), tp.NodeMarker(edge)},
		NextSession:   db.NextSession, Log: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	c := &counting{Link: l, pubs: map[string]int{}}
	u := New(Options{Node: edge, Topics: tp, Store: db, Link: c, Log: quiet, MarkerRetry: 200 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { l.Run(ctx) })
	wg.Go(func() { u.Run(ctx) })
	wg.Go(func() {
		// nodesync's routing of these two classes.
		for {
			select {
			case <-ctx.Done():
				return
			case m := <-l.Inbox():
				if p, err := tp.Parse(m.Topic); err == nil && p.Node == edge {
					u.Receive(p.Class, m.Payload, m.Retained, m.Session)
				}
			}
		}
	})
	var once sync.Once
	n := &node{u: u, db: db, link: c}
	n.stop = func() { once.Do(func() { cancel(); wg.Wait(); db.Close() }) }
	t.Cleanup(n.stop)
	return n
}

func brokerPod(name string) store.DesiredPod {
	return store.DesiredPod{Pod: &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: "uid-" + "name"},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "busybox"}}}}, Generation: 1}
}

func (n *node) running(names ...string) {
	for _, name := range names {
		n.u.PodStatus(brokerPod(name), v1.PodStatus{Phase: v1.PodRunning, Message: name})
	}
}

func waitUntil(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// settled waits until a connection after after (a session number) was checked and returns it.
func (n *node) settled(t *testing.T, after int64) int64 {
	t.Helper()
	var session int64
	waitUntil(t, fmt.Sprintf("a connection after session %d checked", after), 15*time.Second, func() bool {
		n.u.mu.Lock()
		defer n.u.mu.Unlock()
		c := n.u.check
		if c == nil || c.session <= after || !c.settled {
			return false
		}
		session = c.session
		return true
	})
	return session
}

// drained waits until nothing is queued in memory or in the outbox and no summary is due.
func (n *node) drained(t *testing.T) {
	t.Helper()
	waitUntil(t, "uplink drained", 15*time.Second, func() bool {
		n.u.mu.Lock()
		idle := len(n.u.latest) == 0 && !n.u.summaryDue && !n.u.summaryForce && !n.u.summary.queued
		for _, k := range n.u.kept {
			idle = idle && !k.queued
		}
		n.u.mu.Unlock()
		st, err := n.db.OutboxStats()
		return idle && err == nil && st.Entries == 0
	})
}

// retainedState reads every retained message under the node's subtree, completely: a marker on
// the reader's own topic comes back after them (docs/protocol.md, section 10).
func retainedState(t *testing.T, broker string) map[string][]byte {
	t.Helper()
	var b [8]byte
	rand.Read(b[:])
	id := "reader-" + hex.EncodeToString(b[:])
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(broker).SetClientID(id).SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("reader connect %s: %v", broker, tok.Error())
	}
	defer c.Disconnect(0)
	var mu sync.Mutex
	got := map[string][]byte{}
	back := make(chan struct{})
	value := id
	sub := func(filter string, h mqtt.MessageHandler) {
		if tok := c.Subscribe(filter, 1, h); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("reader subscribe %s: %v", filter, tok.Error())
		}
	}
	sub(tp.Node(edge)+"/#", func(_ mqtt.Client, m mqtt.Message) {
		if m.Retained() {
			mu.Lock()
			got[m.Topic()] = m.Payload()
			mu.Unlock()
		}
	})
	sub(tp.Marker(id), func(_ mqtt.Client, m mqtt.Message) {
		if string(m.Payload()) == value {
			close(back)
		}
	})
	c.Publish(tp.Marker(id), 1, false, []byte(value))
	select {
	case <-back:
	case <-time.After(10 * time.Second):
		t.Fatal("reader's marker never came back")
	}
	mu.Lock()
	defer mu.Unlock()
	return maps.Clone(got)
}

// kept is what the node keeps on the broker now: every kept topic and the summary.
func (n *node) keptNow() map[string][]byte {
	n.u.mu.Lock()
	defer n.u.mu.Unlock()
	out := map[string][]byte{}
	for topic, k := range n.u.kept {
		out[topic] = k.payload
	}
	out[tp.Summary(edge)] = n.u.summary.payload
	return out
}

// brokerHolds fails unless the broker's retained state holds every kept topic and the summary
// with the node's payloads.
func brokerHolds(t *testing.T, broker string, n *node) {
	t.Helper()
	held := retainedState(t, broker)
	want := n.keptNow()
	for _, topic := range slices.Sorted(maps.Keys(want)) {
		if got, ok := held[topic]; !ok {
			t.Errorf("the broker holds nothing on %s", topic)
		} else if string(got) != string(want[topic]) {
			t.Errorf("the broker holds another payload on %s:\n got %s\nwant %s", topic, got, want[topic])
		}
	}
}

func (n *node) report(names ...string) {
	n.running(names...)
	n.u.NodeStatus(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: edge}})
	n.u.Acks(protocol.Acks{IndexRevision: 1})
}

// A broker that kept its retained state (here: stopped, saved and started again) costs a
// reconnect no status bytes: the node reads its summary back and sends nothing again. The first
// connection after the node's start sends each status once (its check finds the broker's summary
// absent, but everything on its way or acknowledged on that very connection).
func TestReconnectToBrokerThatKeptStateSendsNoStatus(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	n := startNode(t, b.Plain, filepath.Join(t.TempDir(), "state.db"))
	n.report("a", "b", "c", "d", "e")
	first := n.settled(t, 0)
	n.drained(t)
	before := n.link.statusPubs()
	for topic, count := range before {
		// The summary follows each write of the outbox: the reports may have taken more than one.
		if count != 1 && topic != tp.Summary(edge) {
			t.Errorf("%s published %d times on the first connection, want once", topic, count)
		}
	}
	if len(before) != 8 { // 5 pods, node, acks, summary
		t.Errorf("published on %d topics, want 8: %v", len(before), before)
	}
	brokerHolds(t, b.Plain, n)

	for round := range 2 {
		b.Stop(t)
		b.Start(t)
		first = n.settled(t, first)
		n.drained(t)
		if after := n.link.statusPubs(); !maps.Equal(after, before) {
			t.Errorf("reconnect %d to a broker that kept everything published status again: before %v, after %v", round+1, before, after)
		}
	}
	brokerHolds(t, b.Plain, n)
}

// A broker that lost what the node reported gets it back on the next connection: every live
// status, the node status, the acks and the summary.
func TestBrokerThatLostStatusGetsItAgain(t *testing.T) {
	t.Run("fresh broker on the same port", func(t *testing.T) {
		b := mqtttest.Start(t, mqtttest.Options{}) // no persistence: a restart loses everything
		n := startNode(t, b.Plain, filepath.Join(t.TempDir(), "state.db"))
		n.report("a", "b", "c")
		session := n.settled(t, 0)
		n.drained(t)
		before := n.link.statusPubs()
		b.Kill(t)
		b.Start(t)
		n.settled(t, session)
		n.drained(t)
		brokerHolds(t, b.Plain, n)
		// Each once more: the node does not know which ones the broker lost.
		after := n.link.statusPubs()
		for topic, count := range before {
			if after[topic] != count+1 {
				t.Errorf("%s published %d times, %d before the broker lost it: want once more", topic, after[topic], count)
			}
		}
	})

	t.Run("killed and started from an older persistence file", func(t *testing.T) {
		b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
		n := startNode(t, b.Plain, filepath.Join(t.TempDir(), "state.db"))
		n.report("a")
		session := n.settled(t, 0)
		n.drained(t)
		b.Stop(t) // saves: the file holds a, node, acks and the summary of them
		old, err := os.ReadFile(filepath.Join(b.Dir, "mosquitto.db"))
		if err != nil {
			t.Fatal(err)
		}
		b.Start(t)
		session = n.settled(t, session)
		n.drained(t)

		n.u.PodStatus(brokerPod("a"), v1.PodStatus{Phase: v1.PodFailed, Message: "changed"})
		n.running("b", "c")
		n.u.PodGone(brokerPod("c"))
		n.drained(t)
		brokerHolds(t, b.Plain, n)
		b.Kill(t)
		if err := os.WriteFile(filepath.Join(b.Dir, "mosquitto.db"), old, 0o600); err != nil {
			t.Fatal(err)
		}
		b.Start(t)
		n.settled(t, session)
		n.drained(t)
		brokerHolds(t, b.Plain, n)
	})
}

// The summary's Pods is the number of live pod statuses after creates and deletes, and its
// digest is what a reader computes from the retained statuses (deleted ones left out), the node
// status and the acks.
func TestSummaryCountsLivePods(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	n := startNode(t, b.Plain, filepath.Join(t.TempDir(), "state.db"))
	n.report("a", "b", "c", "d", "e")
	n.u.PodGone(brokerPod("b"))
	n.u.PodGone(brokerPod("d"))
	n.running("f")
	n.u.PodStatus(brokerPod("a"), v1.PodStatus{Phase: v1.PodSucceeded})
	n.drained(t)

	held := retainedState(t, b.Plain)
	sum, err := protocol.DecodeStatusSummary(held[tp.Summary(edge)], 0)
	if err != nil {
		t.Fatalf("the broker's summary: %v", err)
	}
	var lines []string
	pods := 0
	for topic, payload := range held {
		p, err := tp.Parse(topic)
		if err != nil {
			t.Fatalf("retained %s: %v", topic, err)
		}
		switch p.Class {
		case protocol.ClassPodStatus:
			s, err := protocol.DecodePodStatus(payload, 0)
			if err != nil {
				t.Fatalf("retained %s: %v", topic, err)
			}
			if s.Deleted {
				continue
			}
			pods++
		case protocol.ClassNodeStatus, protocol.ClassAcks:
		default:
			continue
		}
		lines = append(lines, topic+" "+protocol.Digest(payload)+"\n")
	}
	slices.Sort(lines)
	digest := sha256.Sum256([]byte(strings.Join(lines, "")))
	if pods != 4 || sum.Pods != 4 {
		t.Errorf("summary says %d pods, the broker holds %d live statuses; want 4 (a, c, e, f)", sum.Pods, pods)
	}
	if got := hex.EncodeToString(digest[:]); sum.Digest != got {
		t.Errorf("summary digest %s, computed from the retained state %s", sum.Digest, got)
	}
}

// Draining 200 pod statuses costs few bbolt commits (each a pair of fdatasyncs): the writer folds
// the reports into a few puts, the drainer removes each send window's entries with one.
func TestDrainingManyStatusesCommitsFew(t *testing.T) {
	const pods = 200
	b := mqtttest.Start(t, mqtttest.Options{})
	n := startNode(t, b.Plain, filepath.Join(t.TempDir(), "state.db"))
	n.settled(t, 0)
	start, err := n.db.Commits()
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods {
		n.running(fmt.Sprintf("pod-%03d", i))
	}
	n.drained(t)
	end, err := n.db.Commits()
	if err != nil {
		t.Fatal(err)
	}
	per := float64(end-start) / pods
	t.Logf("%d bbolt commits to queue and drain %d pod statuses: %.3f per status", end-start, pods, per)
	if per > 0.2 {
		t.Errorf("%d commits for %d statuses (%.3f per status), want at most 0.2 per status", end-start, pods, per)
	}
	if got := n.link.statusPubs(); len(got) != pods+1 {
		t.Errorf("published on %d topics, want %d statuses and the summary", len(got), pods)
	}
	brokerHolds(t, b.Plain, n)
}

// One-off pods (Jobs with generated names) leave at most maxGoneStatuses deleted statuses on the
// broker: older ones are cleared, so a node's retained statuses stay near its live pods.
func TestDeletedStatusesAreBounded(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	n := startNode(t, b.Plain, filepath.Join(t.TempDir(), "state.db"))
	n.report("live")
	for i := range 150 {
		name := fmt.Sprintf("job-%d", i)
		n.report(name)
		n.u.PodGone(brokerPod(name))
	}
	n.drained(t)
	held := retainedState(t, b.Plain)
	deleted, live := 0, 0
	for topic, payload := range held {
		if p, err := tp.Parse(topic); err != nil || p.Class != protocol.ClassPodStatus {
			continue
		}
		s, err := protocol.DecodePodStatus(payload, 0)
		if err != nil {
			t.Fatalf("retained %s: %v", topic, err)
		}
		if s.Deleted {
			deleted++
		} else {
			live++
		}
	}
	if live != 1 || deleted != maxGoneStatuses {
		t.Fatalf("the broker holds %d live and %d deleted pod statuses, want 1 and %d", live, deleted, maxGoneStatuses)
	}
	if _, ok := held[tp.PodStatus(edge, "default", "job-149")]; !ok {
		t.Fatal("the newest deletion is not on the broker")
	}
}
