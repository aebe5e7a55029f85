package nodesync

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"path/filepath"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/link"
	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// These tests run the node's channel against a real mosquitto and a real bbolt state file, with
// the agent replaced by a recorder of the changes the source delivers. cmd/mqlet/e2e's tests run the
// whole agent on containerd.

var tp = protocol.MustTopics(protocol.DefaultPrefix)

const node = "edge-1"

type running struct {
	s       *Sync
	db      *store.DB
	mu      sync.Mutex
	changes []source.Change
	stop    func()
}

func (r *running) Changes() []source.Change {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]source.Change(nil), r.changes...)
}

func start(t *testing.T, broker, dbPath string) *running {
	t.Helper()
	return startWith(t, node, link.Options{Broker: broker}, dbPath)
}

func startWith(t *testing.T, name string, lo link.Options, dbPath string) *running {
	t.Helper()
	key := make([]byte, 32)
	db, err := store.OpenWith(dbPath, store.Options{SecretKey: key})
	if err != nil {
		t.Fatal(err)
	}
	lo.Keepalive, lo.ReconnectMin, lo.ReconnectMax = 5*time.Second, 100*time.Millisecond, 500*time.Millisecond
	s, err := New(Options{
		Node: name, Topics: tp, Store: db, Link: lo,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &running{s: s, db: db}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.Run(ctx) }()
	go func() {
		defer wg.Done()
		s.Source().Run(ctx, func(c source.Change) source.Result {
			r.mu.Lock()
			r.changes = append(r.changes, c)
			r.mu.Unlock()
			return source.Result{}
		})
	}()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			db.Close()
		})
	}
	t.Cleanup(r.stop)
	return r
}

func client(t *testing.T, broker string) mqtt.Client {
	t.Helper()
	o := mqtt.NewClientOptions().AddBroker(broker).SetClientID("test-" + t.Name()).SetAutoReconnect(false)
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", broker, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}

func publish(t *testing.T, c mqtt.Client, topic string, v any, retained bool) {
	t.Helper()
	b, err := protocol.Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	if tok := c.Publish(topic, 1, retained, b); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("publish %s: %v", topic, tok.Error())
	}
}

// writeDesired publishes objects for name at generation rev, then the index at rev listing them (and
// the entries of keep) with their digests, as a control plane does; it returns the index's entries.
func writeDesired(t *testing.T, c mqtt.Client, name string, rev int64, keep map[string]protocol.IndexEntry, objs ...any) map[string]protocol.IndexEntry {
	t.Helper()
	entries := maps.Clone(keep)
	if entries == nil {
		entries = map[string]protocol.IndexEntry{}
	}
	for _, o := range objs {
		d, err := protocol.NewDesired(name, rev, o)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := protocol.Encode(d)
		if tok := c.Publish(tp.Desired(name, d.Kind, d.Namespace, d.Name), 1, true, b); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("publish %s: %v", d.Key(), tok.Error())
		}
		entries[d.Key()] = protocol.IndexEntry{Generation: rev, Digest: protocol.Digest(b)}
	}
	publish(t, c, tp.Index(name), &protocol.Index{Node: name, Revision: rev, Objects: entries}, true)
	return entries
}

// retained waits (bounded) until the retained message on topic satisfies ok.
func retained(t *testing.T, broker, topic string, ok func([]byte) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(broker).SetClientID("reader").SetAutoReconnect(false))
		if tok := c.Connect(); tok.WaitTimeout(5*time.Second) && tok.Error() == nil {
			got := make(chan []byte, 1)
			c.Subscribe(topic, 1, func(_ mqtt.Client, m mqtt.Message) {
				select {
				case got <- m.Payload():
				default:
				}
			}).WaitTimeout(5 * time.Second)
			select {
			case p := <-got:
				if ok(p) {
					c.Disconnect(0)
					return
				}
			case <-time.After(200 * time.Millisecond):
			}
			c.Disconnect(0)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("retained %s never matched within 10s", topic)
}

func testPod(name string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: "uid-" + "x"},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "busybox"}}}}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDesiredDownStatusUp(t *testing.T) {
	mqtttest.Require(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	r := start(t, b.Plain, filepath.Join(t.TempDir(), "state.db"))
	ctl := client(t, b.Plain)

	entries := writeDesired(t, ctl, node, 1, nil, testPod("web"))
	waitFor(t, "upsert delivered", func() bool {
		for _, c := range r.Changes() {
			if c.Op == source.Upsert && c.Items[0].Pod.Name == "web" && c.Items[0].Generation == 1 {
				return true
			}
		}
		return false
	})

	// Acks and liveness reach the broker as retained messages.
	retained(t, b.Plain, tp.Acks(node), func(p []byte) bool {
		// Compact acks, the broker holding the index: the pod is applied as the index lists it
		// (not missing, not refused).
		a, err := protocol.DecodeAcks(p, 0)
		return err == nil && a.Compact && a.IndexRevision == 1 && len(a.Missing)+len(a.Refused) == 0 && entries["pods/default/web"].Generation == 1
	})
	retained(t, b.Plain, tp.Liveness(node), func(p []byte) bool {
		l, err := protocol.DecodeLiveness(p, 0)
		return err == nil && l.Online
	})

	// A status report reaches the broker.
	dp := store.DesiredPod{Pod: testPod("web"), Source: source.Ref{Kind: source.MQTT}, Generation: 1}
	r.s.Reporter().PodStatus(dp, v1.PodStatus{Phase: v1.PodRunning})
	retained(t, b.Plain, tp.PodStatus(node, "default", "web"), func(p []byte) bool {
		s, err := protocol.DecodePodStatus(p, 0)
		return err == nil && s.Object.Status.Phase == v1.PodRunning && s.Generation == 1
	})
}

// Status reported while the broker is down stays in the bbolt outbox, survives a restart of the
// node, and reaches the broker once it returns: only the final status of each pod.
func TestOutboxSurvivesBrokerOutageAndRestart(t *testing.T) {
	mqtttest.Require(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	dbPath := filepath.Join(t.TempDir(), "state.db")
	r := start(t, b.Plain, dbPath)
	waitFor(t, "connected", func() bool { _, _, ok := r.s.link.Connected(); return ok })
	b.Stop(t)
	waitFor(t, "disconnected", func() bool { _, _, ok := r.s.link.Connected(); return !ok })

	for i := range 10 {
		for _, name := range []string{"a", "b"} {
			dp := store.DesiredPod{Pod: testPod(name), Source: source.Ref{Kind: source.MQTT}, Generation: int64(i + 1)}
			r.s.Reporter().PodStatus(dp, v1.PodStatus{Phase: v1.PodRunning, Message: "change " + string(rune('0'+i))})
		}
	}
	waitFor(t, "outbox written", func() bool {
		st, _ := r.db.OutboxStats()
		return st.Entries >= 2
	})
	r.stop() // the node goes down with its outbox full

	b.Start(t)
	r2 := start(t, b.Plain, dbPath)
	for _, name := range []string{"a", "b"} {
		retained(t, b.Plain, tp.PodStatus(node, "default", name), func(p []byte) bool {
			s, err := protocol.DecodePodStatus(p, 0)
			return err == nil && s.Generation == 10 && s.Object.Status.Message == "change 9"
		})
	}
	waitFor(t, "outbox drained", func() bool {
		st, _ := r2.db.OutboxStats()
		return st.Entries == 0
	})
}

// Over the TLS listener with the node ACL, node A never receives node B's desired objects (a
// secret for B stays B's), and what A publishes into B's subtree is dropped by the broker.
func TestACLConfinesEachNodeToItsSubtree(t *testing.T) {
	mqtttest.Require(t)
	b := mqtttest.Start(t, mqtttest.Options{Identities: []string{"node-a", "node-b"}})
	dir := t.TempDir()
	tlsOpts := func(id string) link.Options {
		cert, key := b.ClientCert(id)
		return link.Options{Broker: b.TLS, CAFile: b.CAFile, CertFile: cert, KeyFile: key}
	}
	ra := startWith(t, "node-a", tlsOpts("node-a"), filepath.Join(dir, "a.db"))
	rb := startWith(t, "node-b", tlsOpts("node-b"), filepath.Join(dir, "b.db"))

	admin := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(b.TLS).SetClientID("admin").
		SetTLSConfig(b.TLSConfig(mqtttest.Admin)).SetAutoReconnect(false))
	if tok := admin.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("admin connect: %v", tok.Error())
	}
	defer admin.Disconnect(100)
	secret := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "b-only"}, Data: map[string][]byte{"token": []byte("for-b")}}
	writeDesired(t, admin, "node-b", 1, nil, secret)
	// A's own object, published after B's secret: once A has it, B's secret had its chance.
	writeDesired(t, admin, "node-a", 1, nil, testPod("a-pod"))

	waitFor(t, "B stores its secret", func() bool {
		_, ok, _ := rb.db.GetObject(store.KindSecret, "default", "b-only")
		return ok
	})
	waitFor(t, "A gets its own pod", func() bool {
		for _, c := range ra.Changes() {
			if c.Op == source.Upsert && c.Items[0].Pod.Name == "a-pod" {
				return true
			}
		}
		return false
	})
	if objs, _, _ := ra.db.ListObjects(); len(objs) != 0 {
		t.Fatalf("node A stored another node's objects: %+v", objs)
	}

	// A client with A's identity subscribing to B's subtree gets nothing; publishing there is
	// dropped (the admin sees A's own-topic publish sent after it, and not the forged one).
	ca := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(b.TLS).SetClientID("node-a-probe").
		SetTLSConfig(b.TLSConfig("node-a")).SetAutoReconnect(false))
	if tok := ca.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("node-a probe connect: %v", tok.Error())
	}
	defer ca.Disconnect(100)
	leaked := make(chan string, 4)
	ca.Subscribe(tp.Node("node-b")+"/#", 1, func(_ mqtt.Client, m mqtt.Message) { leaked <- m.Topic() }).WaitTimeout(5 * time.Second)
	// A probe in A's own subtree, subscribed and published after: the broker delivers on this
	// connection in order, so once the probe is back, anything retained from B's subtree would
	// have arrived before it.
	probed := make(chan struct{}, 1)
	ca.Subscribe(tp.Node("node-a")+"/probe", 1, func(mqtt.Client, mqtt.Message) { probed <- struct{}{} }).WaitTimeout(5 * time.Second)
	ca.Publish(tp.Node("node-a")+"/probe", 1, false, []byte("x")).WaitTimeout(5 * time.Second)
	select {
	case <-probed:
	case <-time.After(10 * time.Second):
		t.Fatal("node A's probe in its own subtree never came back")
	}

	seen := make(chan string, 8)
	admin.Subscribe(tp.Node("node-b")+"/status/pods/#", 1, func(_ mqtt.Client, m mqtt.Message) { seen <- "b:" + m.Topic() }).WaitTimeout(5 * time.Second)
	admin.Subscribe(tp.Node("node-a")+"/events", 1, func(_ mqtt.Client, m mqtt.Message) { seen <- "a:" + m.Topic() }).WaitTimeout(5 * time.Second)
	ca.Publish(tp.PodStatus("node-b", "default", "forged"), 1, false, []byte("{}")).WaitTimeout(5 * time.Second)
	ca.Publish(tp.Events("node-a"), 1, false, []byte("{}")).WaitTimeout(5 * time.Second)
	select {
	case got := <-seen:
		if got != "a:"+tp.Events("node-a") {
			t.Fatalf("a forged publish into node B's subtree reached the admin: %s", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("node A's publish to its own topic never reached the admin")
	}
	select {
	case topic := <-leaked:
		t.Fatalf("node A's identity received %s from node B's subtree", topic)
	default:
	}
}

// A reconnect moves the index and what changed, not the desired set: with 50 pods taken in, a
// reconnect to a broker that kept its state fetches nothing, and a node restarted after one pod
// changed fetches that one object.
func TestReconnectAndRestartFetchOnlyWhatChanged(t *testing.T) {
	mqtttest.Require(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	dbPath := filepath.Join(t.TempDir(), "state.db")
	r := start(t, b.Plain, dbPath)
	ctl := client(t, b.Plain)
	var pods []any
	for i := range 50 {
		pods = append(pods, testPod(fmt.Sprintf("p%02d", i)))
	}
	entries := writeDesired(t, ctl, node, 1, nil, pods...)
	upserted := func(r *running) int {
		n := 0
		for _, c := range r.Changes() {
			if c.Op == source.Upsert {
				n += len(c.Items)
			}
		}
		return n
	}
	waitFor(t, "50 pods taken in", func() bool { return upserted(r) == 50 })
	if got := r.s.DesiredReceived(); got != 50 {
		t.Fatalf("%d desired messages for 50 objects", got)
	}

	// takenIn waits until r took in pod name at generation gen.
	takenIn := func(r *running, name string, gen int64) {
		t.Helper()
		waitFor(t, fmt.Sprintf("%s at generation %d taken in", name, gen), func() bool {
			for _, c := range r.Changes() {
				if c.Op == source.Upsert && c.Items[0].Pod.Name == name && c.Items[0].Generation == gen {
					return true
				}
			}
			return false
		})
	}
	// change makes one pod differ at rev; the node fetches what it lacks in the order it learns
	// of it, so once it took in a change, anything fetched before has arrived too.
	change := func(name string, rev int64) {
		t.Helper()
		p := testPod(name)
		p.Spec.Containers[0].Image = fmt.Sprintf("busybox:%d", rev)
		entries = writeDesired(t, ctl, node, rev, entries, p)
	}

	// The broker restarts (its state kept): the node reconnects and fetches nothing.
	b.Stop(t)
	waitFor(t, "disconnected", func() bool { _, _, ok := r.s.link.Connected(); return !ok })
	b.Start(t)
	waitFor(t, "reconnected", func() bool { _, _, ok := r.s.link.Connected(); return ok })
	ctl = client(t, b.Plain)
	change("p03", 2)
	takenIn(r, "p03", 2)
	if got := r.s.DesiredReceived(); got != 51 {
		t.Fatalf("a reconnect and one change moved %d desired messages, want 1", got-50)
	}

	// The node is down while one pod changes; restarted, it fetches that one object.
	r.stop()
	change("p07", 3)
	r2 := start(t, b.Plain, dbPath)
	takenIn(r2, "p07", 3)
	change("p08", 4)
	takenIn(r2, "p08", 4)
	if got := r2.s.DesiredReceived(); got != 2 {
		t.Fatalf("the restarted node received %d desired messages for two changes", got)
	}
	if n := upserted(r2); n != 2 {
		t.Fatalf("%d upserts after the restart, want 2", n)
	}
}

// Acks are compact (the index's revision and digest, and the exceptions) while the broker holds the
// index the node runs, and complete (every applied entry) from the moment the node finds the broker
// without it until an index reaches it again: a writer rebuilding after a broker lost its state
// has what it needs, and a change costs O(exceptions) otherwise.
func TestAcksCompleteOnlyWhileTheBrokerLacksTheIndex(t *testing.T) {
	mqtttest.Require(t)
	b := mqtttest.Start(t, mqtttest.Options{}) // no persistence: a restart loses everything
	start(t, b.Plain, filepath.Join(t.TempDir(), "state.db"))
	ctl := client(t, b.Plain)
	var pods []any
	for i := range 50 {
		pods = append(pods, testPod(fmt.Sprintf("p%02d", i)))
	}
	entries := writeDesired(t, ctl, node, 1, nil, pods...)
	acks := func(what string, ok func(a *protocol.Acks, size int) bool) {
		t.Helper()
		retained(t, b.Plain, tp.Acks(node), func(p []byte) bool {
			a, err := protocol.DecodeAcks(p, 0)
			return err == nil && ok(a, len(p))
		})
	}
	compact := func(rev int64) func(*protocol.Acks, int) bool {
		return func(a *protocol.Acks, size int) bool {
			return a.Compact && len(a.Applied) == 0 && a.IndexRevision == rev && len(a.Missing)+len(a.Refused) == 0 && size < 512
		}
	}
	acks("compact acks of revision 1", compact(1))

	b.Stop(t)
	b.Start(t)
	acks("complete acks after the broker lost the index", func(a *protocol.Acks, _ int) bool {
		return !a.Compact && a.IndexRevision == 1 && maps.Equal(a.Applied, entries)
	})

	ctl = client(t, b.Plain)
	writeDesired(t, ctl, node, 2, entries)
	acks("compact again once an index is back", compact(2))
}
