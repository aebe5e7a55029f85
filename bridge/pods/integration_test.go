package pods

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mqlet/mqlet/bridge/mq"
	"github.com/mqlet/mqlet/core/prom"
	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/sync/protocol"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
)

// startConn runs the bridge's own MQTT connection (bridge/mq.Conn: PUBACK-awaited publishes,
// marker-based snapshots, the uplink of every node routed to handle) until the test ends. It is
// the controller's Broker, as in the bridge.
func startConn(t *testing.T, url, id string, handle func(protocol.Topic, []byte)) *mq.Conn {
	t.Helper()
	conn, err := mq.New(mq.Options{Broker: url, ClientID: id, Timeout: 10 * time.Second, Log: quietLog(),
		Handler: func(m mq.Message) { handle(m.Topic, m.Payload) }})
	if err != nil {
		t.Fatalf("mq.New %s: %v", url, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- conn.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("mq.Conn.Run: %v", err)
		}
	})
	wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
	defer wcancel()
	if _, _, err := conn.WaitConnected(wctx); err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	return conn
}

func connectPaho(t *testing.T, url, id string, onMsg mqtt.MessageHandler, filters ...string) mqtt.Client {
	t.Helper()
	o := mqtt.NewClientOptions().AddBroker(url).SetClientID(id).SetCleanSession(true).SetAutoReconnect(false).SetOrderMatters(true)
	mc := mqtt.NewClient(o)
	if tok := mc.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", url, tok.Error())
	}
	t.Cleanup(func() { mc.Disconnect(100) })
	for _, f := range filters {
		if tok := mc.Subscribe(f, 1, onMsg); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe %s: %v", f, tok.Error())
		}
	}
	return mc
}

// recorder keeps every message seen live on a subscription.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) handle(_ mqtt.Client, m mqtt.Message) {
	if m.Retained() {
		return // replays of the retained state at subscribe time are not writes
	}
	r.mu.Lock()
	r.msgs = append(r.msgs, m.Topic())
	r.mu.Unlock()
}

func (r *recorder) since(n int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs[n:]...)
}

func (r *recorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

// TestAgainstARealBroker runs the controller against mosquitto: the desired set of a node
// reaches only that node's subtree and decodes as the node decodes it; a configMap change is one
// object and one index; a deletion waits for the node's acks; a restarted controller over the
// same retained state writes nothing.
func TestAgainstARealBroker(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	web1 := apiPod("default", "web-1", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000001")
	web2 := apiPod("default", "web-2", nodeA, "6f1c2d3e-aaaa-4bbb-8ccc-000000000002")
	web2.Spec.Containers[0].Env = nil // references the configMap only
	elsewhere := apiPod("default", "web-3", "edge-c", "6f1c2d3e-aaaa-4bbb-8ccc-000000000003")
	apiNode, sealKey := sealedNode(t, nodeA)
	kube := fake.NewClientset(web1, web2, elsewhere, apiNode,
		configMap("default", "web-config", map[string]string{"index.html": "v1"}),
		secret("default", "web-secret", map[string][]byte{"token": []byte("s3cr3t")}),
		secret("default", "unused", map[string][]byte{"x": []byte("y")}))
	served := map[string]bool{nodeA: true, "edge-b": true} // edge-c belongs to someone else

	var current atomic.Pointer[Controller]
	broker := startConn(t, b.Plain, "bridge", func(tp protocol.Topic, payload []byte) {
		if c := current.Load(); c != nil {
			c.Handle(tp, payload)
		}
	})
	// A reader apart from the bridge, as a node or ctl would read the broker.
	ctl := startConn(t, b.Plain, "reader", func(protocol.Topic, []byte) {})
	var live recorder
	connectPaho(t, b.Plain, "watcher", live.handle, topics.Node(nodeA)+"/#", topics.Node("edge-b")+"/#", topics.Node("edge-c")+"/#")

	var syncMu sync.Mutex
	syncs := map[string]int{}
	startController := func() (*Controller, func()) {
		factory := informers.NewSharedInformerFactory(kube, 0)
		c, err := New(Options{Kube: kube, Factory: factory, Broker: broker, Topics: topics, Served: func(n string) bool { return served[n] },
			Metrics: prom.NewRegistry(), Log: quietLog(), Debounce: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		c.synced = func(queue, key string, err error) {
			if err == nil {
				syncMu.Lock()
				syncs[queue+"/"+key]++
				syncMu.Unlock()
			}
		}
		current.Store(c)
		cctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(cctx) }()
		return c, func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
			factory.Shutdown()
		}
	}
	nodeSyncs := func(node string) int {
		syncMu.Lock()
		defer syncMu.Unlock()
		return syncs["node/"+node]
	}
	indexOf := func(node string) *protocol.Index {
		got, err := ctl.Snapshot(ctx, topics.Index(node))
		if err != nil {
			t.Fatal(err)
		}
		payload := got[topics.Index(node)]
		if len(payload) == 0 {
			return &protocol.Index{Node: node, Objects: map[string]protocol.IndexEntry{}}
		}
		idx, err := protocol.DecodeIndex(protocol.Topic{Class: protocol.ClassIndex, Node: node}, payload, 0)
		if err != nil {
			t.Fatalf("retained index of %s: %v", node, err)
		}
		return idx
	}

	c1, stop1 := startController()
	c1.NodeServed("edge-b")
	waitFor(t, "edge-a's index with 4 objects", func() bool { return len(indexOf(nodeA).Objects) == 4 })
	waitFor(t, "edge-b synced", func() bool { return nodeSyncs("edge-b") > 0 })

	// Node A's subtree: the pods and exactly what they reference, decoded as the node decodes.
	snapA, err := ctl.Snapshot(ctx, topics.DesiredFilter(nodeA))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"pods/default/web-1": true, "pods/default/web-2": true, "configmaps/default/web-config": true, "secrets/default/web-secret": true}
	if len(snapA) != len(want) {
		t.Errorf("edge-a holds %d desired topics, want %d: %v", len(snapA), len(want), keys(snapA))
	}
	for topic, payload := range snapA {
		tp, err := topics.Parse(topic)
		if err != nil {
			t.Fatal(err)
		}
		d, err := protocol.DecodeDesired(tp, payload, protocol.DefaultMaxPayload)
		if err != nil {
			t.Fatalf("the node's decoder refuses %s: %v", topic, err)
		}
		if !want[d.Key()] {
			t.Errorf("edge-a got %s, which none of its pods references", d.Key())
		}
		if d.Pod != nil {
			if _, warnings, err := admitAsNode(t, nodeA, d.Pod); err != nil || len(warnings) > 0 {
				t.Errorf("the node's admission: %v, warnings %q", err, warnings)
			}
		}
		if d.Secret != nil {
			// Sealed to the node's key: nothing in clear on the broker, and the node opens it.
			if len(d.Secret.Data) != 0 || d.Sealed == nil || bytes.Contains(payload, []byte("s3cr3t")) {
				t.Errorf("secret sent unsealed: %s", payload)
			} else if err := sealKey.Open(nodeA, d.Secret, d.Sealed); err != nil || string(d.Secret.Data["token"]) != "s3cr3t" {
				t.Errorf("secret data %q, %v", d.Secret.Data, err)
			}
		}
	}
	for _, n := range []string{"edge-b", "edge-c"} {
		got, err := ctl.Snapshot(ctx, topics.Node(n)+"/#")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 0 {
			t.Errorf("node %s got %v; it runs none of these pods", n, keys(got))
		}
	}

	// A configMap change: one object at the next generation, then the index.
	before := indexOf(nodeA)
	mark := live.len()
	cm, _ := kube.CoreV1().ConfigMaps("default").Get(ctx, "web-config", metav1.GetOptions{})
	cm.Data["index.html"] = "v2"
	cm.ResourceVersion = "2"
	if _, err := kube.CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a new index", func() bool { return indexOf(nodeA).Revision > before.Revision })
	after := indexOf(nodeA)
	msgs := live.since(mark)
	if len(msgs) != 2 || msgs[0] != topics.Desired(nodeA, protocol.KindConfigMap, "default", "web-config") || msgs[1] != topics.Index(nodeA) {
		t.Errorf("a configMap change published %v, want the configMap and then the index", msgs)
	}
	for k, e := range before.Objects {
		if k != "configmaps/default/web-config" && after.Objects[k] != e {
			t.Errorf("%s moved from %+v to %+v though it did not change", k, e, after.Objects[k])
		}
	}
	if after.Objects["configmaps/default/web-config"].Generation != after.Revision {
		t.Errorf("index %+v: the configMap should be at the new revision", after)
	}
	// Each entry lists the digest of the exact payload the broker holds.
	snapA, err = ctl.Snapshot(ctx, topics.DesiredFilter(nodeA))
	if err != nil {
		t.Fatal(err)
	}
	for k, e := range after.Objects {
		kind, ns, name, _ := protocol.ParseObjectKey(k)
		if got := protocol.Digest(snapA[topics.Desired(nodeA, kind, ns, name)]); got != e.Digest {
			t.Errorf("index entry %s lists digest %s, the retained payload has %s", k, e.Digest, got)
		}
	}

	// Deletion: an index without the pod (and the secret only it used), then their retained
	// topics cleared; the API pod stays until the node confirms, then goes with grace 0.
	p, _ := kube.CoreV1().Pods("default").Get(ctx, "web-1", metav1.GetOptions{})
	now := metav1.Now()
	p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &now, ptr(int64(30))
	if _, err := kube.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var dropIdx *protocol.Index
	waitFor(t, "an index without web-1 and the secret only it used", func() bool {
		dropIdx = indexOf(nodeA)
		_, pod := dropIdx.Objects["pods/default/web-1"]
		_, sec := dropIdx.Objects["secrets/default/web-secret"]
		return dropIdx.Revision > after.Revision && !pod && !sec
	})
	waitFor(t, "web-1's and the secret's retained topics cleared", func() bool {
		got, err := ctl.Snapshot(ctx, topics.Desired(nodeA, protocol.KindPod, "default", "web-1"),
			topics.Desired(nodeA, protocol.KindSecret, "default", "web-secret"))
		if err != nil {
			t.Fatal(err)
		}
		return len(got) == 0
	})
	if idx := indexOf(nodeA); idx.Objects["pods/default/web-2"].Generation == 0 || idx.Objects["configmaps/default/web-config"].Generation == 0 {
		t.Errorf("index %+v lost objects that are still wanted", idx)
	}
	if _, err := kube.CoreV1().Pods("default").Get(ctx, "web-1", metav1.GetOptions{}); err != nil {
		t.Fatalf("web-1 left the API before its node confirmed: %v", err)
	}
	// The node takes the index in and says so in its retained acks: web-1 is in none of its
	// outcomes any more.
	acks := mustEncode(t, &protocol.Acks{Node: nodeA, Session: 3, IndexRevision: dropIdx.Revision, Applied: dropIdx.Objects})
	if err := broker.Publish(ctx, topics.Acks(nodeA), acks, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "web-1 deleted from the API", func() bool {
		_, err := kube.CoreV1().Pods("default").Get(ctx, "web-1", metav1.GetOptions{})
		return err != nil
	})
	var graceZero bool
	for _, a := range kube.Actions() {
		if d, ok := a.(interface {
			GetName() string
			GetDeleteOptions() metav1.DeleteOptions
		}); ok && a.GetVerb() == "delete" && d.GetName() == "web-1" {
			o := d.GetDeleteOptions()
			graceZero = o.GracePeriodSeconds != nil && *o.GracePeriodSeconds == 0 && o.Preconditions != nil && *o.Preconditions.UID == web1.UID
		}
	}
	if !graceZero {
		t.Errorf("web-1 was not deleted with grace period 0 and its uid as precondition")
	}
	stop1()

	// A restarted bridge over the same retained state writes nothing.
	mark = live.len()
	nA, nB := nodeSyncs(nodeA), nodeSyncs("edge-b")
	c2, stop2 := startController()
	c2.NodeServed("edge-b")
	waitFor(t, "the new controller's first syncs", func() bool { return nodeSyncs(nodeA) > nA && nodeSyncs("edge-b") > nB })
	if n := c2.m.indexWrites.Value(); n != 0 {
		t.Errorf("the restarted controller wrote %v indexes", n)
	}
	// The watcher sees the controller's own messages in order; a marker read by ctl after the
	// syncs has gone through the same broker, so anything written is in by now.
	if _, err := ctl.Snapshot(ctx, topics.Index(nodeA)); err != nil {
		t.Fatal(err)
	}
	if msgs := live.since(mark); len(msgs) != 0 {
		t.Errorf("the restarted controller published %v", msgs)
	}
	stop2()
}

func keys(m map[string][]byte) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
