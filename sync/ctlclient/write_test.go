package ctlclient

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/source"
	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/link"
	"github.com/mqlet/mqlet/sync/nodesync"
	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// These tests write with real clients to a real mosquitto, and some run a real node channel
// (sync/nodesync on a bbolt file, the agent replaced by a recorder) to see what the node did.

// testNode is a node channel on a real state file.
type testNode struct {
	s    *nodesync.Sync
	db   *store.DB
	stop func()
}

func startNode(t *testing.T, broker, name, dbPath string) *testNode {
	t.Helper()
	return startNodeTrusting(t, broker, name, dbPath, nil)
}

// startNodeTrusting starts a node channel with trust anchors.
func startNodeTrusting(t *testing.T, broker, name, dbPath string, trusted []ed25519.PublicKey) *testNode {
	t.Helper()
	db, err := store.OpenWith(dbPath, store.Options{SecretKey: make([]byte, 32)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := nodesync.New(nodesync.Options{Node: name, Topics: tp, Store: db, Trusted: trusted,
		Link: link.Options{Broker: broker, Keepalive: 5 * time.Second, ReconnectMin: 50 * time.Millisecond, ReconnectMax: 300 * time.Millisecond},
		Log:  slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.Run(ctx) }()
	go func() {
		defer wg.Done()
		s.Source().Run(ctx, func(source.Change) source.Result { return source.Result{} })
	}()
	var once sync.Once
	n := &testNode{s: s, db: db, stop: func() { once.Do(func() { cancel(); wg.Wait(); db.Close() }) }}
	t.Cleanup(n.stop)
	return n
}

func configMap(name string) *v1.ConfigMap {
	return &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Data: map[string]string{"k": name}}
}

// applied is what acks say the node applied: complete acks list it, compact ones against the
// broker's index (nil when they name another index than the broker holds).
func applied(t *testing.T, c *Client, node string, a *protocol.Acks) map[string]protocol.IndexEntry {
	t.Helper()
	idx, err := c.Index(testCtx(t), node)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := a.AppliedIn(idx)
	return m
}

// waitAcks waits (bounded) until the node's retained acks satisfy ok, and returns them.
func waitAcks(t *testing.T, c *Client, node, what string, ok func(*protocol.Acks) bool) *protocol.Acks {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		a, err := c.Acks(testCtx(t), node)
		if err == nil && a != nil && ok(a) {
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the node's acks never showed it within 20s (last: %+v, %v)", what, a, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The reproduction: objects a, b, c applied and taken in; the broker killed -9 inside its
// autosave window and restarted empty; one more apply. The writer must not publish an index built
// from nothing: it rebuilds from what the node reports, and the node deletes nothing.
func TestBrokerLostItsStateAndAnApplyDeletesNothing(t *testing.T) {
	mqtttest.Require(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	n := startNode(t, b.Plain, "edge-1", filepath.Join(t.TempDir(), "state.db"))
	c := dial(t, b)
	if _, err := c.Apply(testCtx(t), "edge-1", []any{configMap("a"), configMap("b"), configMap("c")}); err != nil {
		t.Fatal(err)
	}
	waitAcks(t, c, "edge-1", "a, b, c applied", func(a *protocol.Acks) bool { return len(applied(t, c, "edge-1", a)) == 3 })

	b.Kill(t) // before any autosave: the restarted broker holds nothing
	b.Start(t)
	c = dial(t, b)
	if got, err := c.Snapshot(testCtx(t), tp.Index("edge-1")); err != nil || len(got) != 0 {
		t.Fatalf("the restarted broker still holds %v (%v): the test needs it to have lost its state", got, err)
	}
	// The node reconnects and reports what it runs.
	waitAcks(t, c, "edge-1", "the node reports again", func(a *protocol.Acks) bool { return len(applied(t, c, "edge-1", a)) == 3 })

	res, err := c.Apply(testCtx(t), "edge-1", []any{configMap("d")})
	if err != nil {
		t.Fatalf("Apply after the broker lost its state: %v", err)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "rebuilt from what the node reports") {
		t.Errorf("warnings %q, want one saying the index was rebuilt", res.Warnings)
	}
	idx := index(t, c, "edge-1")
	if len(idx.Objects) != 4 || idx.Revision <= 1 {
		t.Fatalf("index after the apply: %+v, want a, b, c and d above the node's revision", idx)
	}
	// The node takes the index in, then fetches d: wait for the outcome, not the index alone.
	waitAcks(t, c, "edge-1", "all four applied", func(a *protocol.Acks) bool {
		return a.IndexRevision == idx.Revision && len(applied(t, c, "edge-1", a)) == 4 && len(a.Missing) == 0
	})
	for _, name := range []string{"a", "b", "c", "d"} {
		if _, ok, _ := n.db.GetObject(store.KindConfigMap, "default", name); !ok {
			t.Errorf("configmap %s is gone from the node", name)
		}
	}
}

// A writer never builds on an index older than the node's (a broker restored from a backup), and a
// rebuild that would need an object the node reports without a digest is refused, naming it.
func TestWriterBuildsOnTheNodesIndexWhenTheBrokersIsOlder(t *testing.T) {
	mqtttest.Require(t)
	b := mqtttest.Start(t, mqtttest.Options{})
	raw := rawClient(t, b.Plain)
	dg := func(s string) string { return protocol.Digest([]byte(s)) }
	pub(t, raw, tp.Index("n1"), &protocol.Index{Node: "n1", Revision: 2,
		Objects: map[string]protocol.IndexEntry{"configmaps/default/a": {Generation: 2, Digest: dg("a")}}}, true)
	pub(t, raw, tp.Acks("n1"), &protocol.Acks{Node: "n1", Session: 1, IndexRevision: 5,
		Applied: map[string]protocol.IndexEntry{"configmaps/default/a": {Generation: 2, Digest: dg("a")}, "configmaps/default/b": {Generation: 5, Digest: dg("b")}},
		Missing: map[string]protocol.IndexEntry{"configmaps/default/m": {Generation: 4, Digest: dg("m")}}}, true)
	c := dial(t, b)
	res, err := c.Apply(testCtx(t), "n1", []any{configMap("c")})
	if err != nil {
		t.Fatal(err)
	}
	idx := index(t, c, "n1")
	if got := slices.Sorted(mapsKeys(idx.Objects)); idx.Revision != 6 || !slices.Equal(got, []string{"configmaps/default/a", "configmaps/default/b", "configmaps/default/c", "configmaps/default/m"}) ||
		idx.Objects["configmaps/default/b"].Digest != dg("b") {
		t.Fatalf("index %+v (warnings %q), want revision 6 with a, b, m kept from the node and c", idx, res.Warnings)
	}

	pub(t, raw, tp.Acks("n2"), &protocol.Acks{Node: "n2", Session: 1, IndexRevision: 0,
		Applied: map[string]protocol.IndexEntry{"pods/default/old": {Generation: 3}}}, true)
	_, err = c.Apply(testCtx(t), "n2", []any{configMap("x")})
	if err == nil || !strings.Contains(err.Error(), "pods/default/old") {
		t.Fatalf("Apply over a node running an object without a digest = %v, want a refusal naming it", err)
	}
	if _, err := c.Apply(testCtx(t), "n2", []any{configMap("x"), pod("old")}); err != nil {
		t.Fatalf("Apply that names the undigested object: %v", err)
	}
}

func mapsKeys[M ~map[K]V, K comparable, V any](m M) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// An unchanged re-apply writes nothing and keeps the generation.
func TestUnchangedReapplyWritesNothing(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	c := dial(t, b)
	if _, err := c.Apply(testCtx(t), "n1", []any{configMap("a"), configMap("b")}); err != nil {
		t.Fatal(err)
	}
	changed := configMap("b")
	changed.Data["k"] = "new"
	res, err := c.Apply(testCtx(t), "n1", []any{configMap("a"), changed})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Objects[0].Unchanged || res.Objects[0].Generation != 1 || res.Objects[1].Unchanged || res.Objects[1].Generation != 2 {
		t.Fatalf("Apply = %+v, want a unchanged at 1 and b written at 2", res.Objects)
	}
	res, err = c.Apply(testCtx(t), "n1", []any{configMap("a"), changed})
	if err != nil || !res.Objects[0].Unchanged || !res.Objects[1].Unchanged {
		t.Fatalf("a second identical apply = %+v, %v; want both unchanged", res, err)
	}
	if idx := index(t, c, "n1"); idx.Revision != 2 {
		t.Fatalf("an unchanged apply wrote the index: revision %d", idx.Revision)
	}
}

// Two writers at once, 30 times over (separate clients, as two `mqlet ctl` processes): every write
// that reports success is listed by the final index and taken in by the node; a write that lost
// says so. Nothing a writer reported as written is deleted.
func TestConcurrentWritersNeverLoseAReportedWrite(t *testing.T) {
	mqtttest.Require(t)
	b := mqtttest.Start(t, mqtttest.Options{})
	startNode(t, b.Plain, "edge-1", filepath.Join(t.TempDir(), "state.db"))
	w1, w2, reader := dial(t, b), dial(t, b), dial(t, b)
	var written []string
	lost := 0
	for i := range 30 {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for j, w := range []*Client{w1, w2} {
			wg.Go(func() {
				_, errs[j] = w.Apply(testCtx(t), "edge-1", []any{configMap(fmt.Sprintf("cm-%d-%d", i, j))})
			})
		}
		wg.Wait()
		idx := index(t, reader, "edge-1")
		for j, err := range errs {
			key := fmt.Sprintf("configmaps/default/cm-%d-%d", i, j)
			switch {
			case err == nil:
				written = append(written, key)
				// Right after the pair, not only at the end: a later write that builds on what
				// the node reports would hide a loss.
				if _, ok := idx.Objects[key]; !ok {
					t.Errorf("pair %d: %s was reported written, and the index right after the pair does not list it", i, key)
				}
			case strings.Contains(err.Error(), "lost to a concurrent writer"):
				lost++
			default:
				t.Fatalf("pair %d writer %d: %v", i, j, err)
			}
		}
	}
	t.Logf("%d writes reported, %d lost and said so", len(written), lost)
	idx := index(t, reader, "edge-1")
	for _, k := range written {
		if _, ok := idx.Objects[k]; !ok {
			t.Errorf("%s was reported written but the final index does not list it", k)
		}
	}
	a := waitAcks(t, reader, "edge-1", "the node took in the final index", func(a *protocol.Acks) bool {
		return a.IndexRevision == idx.Revision && len(a.Missing) == 0
	})
	runs := applied(t, reader, "edge-1", a)
	for _, k := range written {
		if _, ok := runs[k]; !ok {
			t.Errorf("%s was reported written but the node does not run it", k)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Review regression: the broker comes back from an older save while the node is offline. A write
// built on the broker's stale index is refused by the node; the next write builds on what the node
// runs, so an object the node's index deleted does not come back.
func TestBrokerFromAnOlderSaveBringsNothingBack(t *testing.T) {
	mqtttest.Require(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	dbPath := filepath.Join(t.TempDir(), "state.db")
	n := startNode(t, b.Plain, "edge-1", dbPath)
	c := dial(t, b)
	for _, name := range []string{"a", "x"} {
		if _, err := c.Apply(testCtx(t), "edge-1", []any{configMap(name)}); err != nil {
			t.Fatal(err)
		}
	}
	waitAcks(t, c, "edge-1", "a and x", func(a *protocol.Acks) bool { return a.IndexRevision == 2 && len(applied(t, c, "edge-1", a)) == 2 })
	c.Close()
	b.Stop(t)
	save := filepath.Join(b.Dir, "mosquitto.db")
	copyFile(t, save, save+".old")
	b.Start(t)
	c = dial(t, b)
	if _, err := c.Delete(testCtx(t), "edge-1", protocol.KindConfigMap, "default", "x"); err != nil {
		t.Fatal(err)
	}
	waitAcks(t, c, "edge-1", "x deleted", func(a *protocol.Acks) bool { return a.IndexRevision == 3 && len(applied(t, c, "edge-1", a)) == 1 })
	n.stop()
	c.Close()
	b.Stop(t)
	copyFile(t, save+".old", save)
	b.Start(t)
	c = dial(t, b)
	if _, err := c.Apply(testCtx(t), "edge-1", []any{configMap("y")}); err != nil {
		t.Fatal(err)
	}
	n = startNode(t, b.Plain, "edge-1", dbPath)
	waitAcks(t, c, "edge-1", "the node refuses the stale-based index", func(a *protocol.Acks) bool { return a.IndexRefused != nil })
	res, err := c.Apply(testCtx(t), "edge-1", []any{configMap("z")})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(res.Warnings, " "), "rebuilt from what the node reports") {
		t.Errorf("warnings %q, want the rebuild from the node named", res.Warnings)
	}
	idx := index(t, c, "edge-1")
	waitAcks(t, c, "edge-1", "the node took it", func(a *protocol.Acks) bool { return a.IndexRevision == idx.Revision && len(a.Missing) == 0 })
	if _, ok, _ := n.db.GetObject(store.KindConfigMap, "default", "x"); ok {
		t.Error("x, deleted at revision 3, is back on the node")
	}
	if _, ok, _ := n.db.GetObject(store.KindConfigMap, "default", "z"); !ok {
		t.Error("z is not on the node")
	}
}

// Review regression: a broker attacker replays an old signed index inside forged acks that claim a
// newer revision; the signing writer refuses to build on it, and the node keeps everything.
func TestSigningWriterRefusesAReplayedIndexInForgedAcks(t *testing.T) {
	mqtttest.Require(t)
	b := mqtttest.Start(t, mqtttest.Options{})
	pubKey, key, _ := ed25519.GenerateKey(rand.Reader)
	db := startNodeTrusting(t, b.Plain, "edge-1", filepath.Join(t.TempDir(), "state.db"), []ed25519.PublicKey{pubKey}).db

	c, err := Connect(testCtx(t), Options{Broker: b.Plain, Timeout: 5 * time.Second, SigningKey: key})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Apply(testCtx(t), "edge-1", []any{configMap("a")}); err != nil {
		t.Fatal(err)
	}
	got, _ := c.Snapshot(testCtx(t), tp.Index("edge-1"))
	old := got[tp.Index("edge-1")]
	if _, err := c.Apply(testCtx(t), "edge-1", []any{configMap("b"), configMap("c")}); err != nil {
		t.Fatal(err)
	}
	cur := index(t, c, "edge-1")
	waitAcks(t, c, "edge-1", "a, b, c", func(a *protocol.Acks) bool {
		return a.IndexRevision == cur.Revision && len(applied(t, c, "edge-1", a)) == 3
	})
	pub(t, rawClient(t, b.Plain), tp.Acks("edge-1"), &protocol.Acks{Node: "edge-1", IndexRevision: cur.Revision + 1,
		IndexDigest: protocol.Digest(old), Index: old, Applied: map[string]protocol.IndexEntry{}}, true)
	if _, err := c.Apply(testCtx(t), "edge-1", []any{configMap("d")}); err == nil || !strings.Contains(err.Error(), "cannot be verified") {
		t.Fatalf("apply over forged acks = %v, want a refusal to build on the replayed index", err)
	}
	if idx := index(t, c, "edge-1"); idx.Revision != cur.Revision {
		t.Fatalf("the writer published revision %d over forged acks", idx.Revision)
	}
	for _, name := range []string{"a", "b", "c"} {
		if _, ok, _ := db.GetObject(store.KindConfigMap, "default", name); !ok {
			t.Errorf("configmap %s is gone from the node", name)
		}
	}
}

// Review regression: forged acks with a counter near the int64 limit cannot make a writer publish
// an index that overflows.
func TestWriterRefusesACounterNearTheLimit(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	pub(t, rawClient(t, b.Plain), tp.Acks("edge-1"), &protocol.Acks{Node: "edge-1", IndexRevision: 1, Applied: map[string]protocol.IndexEntry{},
		IndexRefused: &protocol.Refusal{Generation: math.MaxInt64 - 1, Reason: "x"}}, true)
	c := dial(t, b)
	if _, err := c.Apply(testCtx(t), "edge-1", []any{configMap("b")}); err == nil || !strings.Contains(err.Error(), "generation counter") {
		t.Fatalf("apply = %v, want a refusal naming the counter", err)
	}
	if got, _ := c.Snapshot(testCtx(t), tp.Index("edge-1")); len(got) != 0 {
		t.Fatalf("an index was published: %s", got[tp.Index("edge-1")])
	}
}

// Compact acks name the node's index instead of listing what it runs. When the broker no longer
// holds that index (cleared while the node was offline), a writer has nothing whole to build on:
// it must refuse, naming the node and what to do, and publish nothing, rather than write an index
// built from the acks' exceptions alone, which the node would obey by deleting the rest. Once the
// node is back and reports in complete acks, the same write builds on them and nothing is lost.
func TestCompactAcksWithoutTheirIndexRefuseTheWrite(t *testing.T) {
	mqtttest.Require(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	dbPath := filepath.Join(t.TempDir(), "state.db")
	n := startNode(t, b.Plain, "edge-1", dbPath)
	c := dial(t, b)
	if _, err := c.Apply(testCtx(t), "edge-1", []any{configMap("a"), configMap("b")}); err != nil {
		t.Fatal(err)
	}
	waitAcks(t, c, "edge-1", "a and b applied, compact acks", func(a *protocol.Acks) bool {
		return a.Compact && len(a.Missing) == 0 && len(applied(t, c, "edge-1", a)) == 2
	})
	n.stop()
	pub(t, rawClient(t, b.Plain), tp.Index("edge-1"), []byte{}, true) // the index cleared while the node is away

	_, err := c.Apply(testCtx(t), "edge-1", []any{configMap("c")})
	if !errors.Is(err, errAcksIncomplete) || !strings.Contains(err.Error(), "node edge-1") || !strings.Contains(err.Error(), "wait for the node to connect") {
		t.Fatalf("Apply with compact acks and no index on the broker: %v; want it refused, naming the node and what to do", err)
	}
	if got, err := c.Snapshot(testCtx(t), tp.Index("edge-1"), tp.Desired("edge-1", protocol.KindConfigMap, "default", "c")); err != nil || len(got) != 0 {
		t.Fatalf("the refused write left %d retained messages (%v): it must publish nothing", len(got), err)
	}

	// The node comes back, finds its index gone and reports what it runs in complete acks.
	n = startNode(t, b.Plain, "edge-1", dbPath)
	waitAcks(t, c, "edge-1", "complete acks", func(a *protocol.Acks) bool { return !a.Compact && len(a.Applied) == 2 })
	if _, err := c.Apply(testCtx(t), "edge-1", []any{configMap("c")}); err != nil {
		t.Fatalf("Apply once the node reported: %v", err)
	}
	idx := index(t, c, "edge-1")
	waitAcks(t, c, "edge-1", "a, b and c applied", func(a *protocol.Acks) bool {
		return a.IndexRevision == idx.Revision && len(a.Missing) == 0 && len(applied(t, c, "edge-1", a)) == 3
	})
	for _, name := range []string{"a", "b", "c"} {
		if _, ok, _ := n.db.GetObject(store.KindConfigMap, "default", name); !ok {
			t.Errorf("configmap %s is not on the node", name)
		}
	}
}
