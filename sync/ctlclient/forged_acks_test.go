package ctlclient

import (
	"crypto/ed25519"
	"crypto/rand"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/protocol"
)

// The acks rollback: a broker that clears a node's retained index (or retains an older one again)
// and publishes acks carrying an older index the writer once signed makes a signing writer build on
// that older set. The node must never take the result: a signing writer goes on only from
// revisions it verified (never from a counter in the unsigned acks), so its revision is at or
// below the node's and refused. The node is stopped while the broker forges (the broker withholds what the
// node publishes, as it can), and started again afterwards with the same state file.
func TestForgedAcksCannotRollANodeBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		// inflate is a generation the forged acks claim (IndexRefused), 0 for none.
		inflate int64
		// retainOld: the broker puts the old signed index back as the retained one instead of
		// clearing it (no rebuild: the acks agree with it).
		retainOld bool
	}{
		{name: "old index with its own revision only", inflate: 0},
		{name: "old index and a forged counter above the node's", inflate: 50},
		{name: "old index retained again and a forged counter", inflate: 50, retainOld: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mqtttest.Require(t)
			b := mqtttest.Start(t, mqtttest.Options{})
			pubKey, key, _ := ed25519.GenerateKey(rand.Reader)
			dbPath := filepath.Join(t.TempDir(), "state.db")
			n := startNodeTrusting(t, b.Plain, "edge-1", dbPath, []ed25519.PublicKey{pubKey})
			c, err := Connect(testCtx(t), Options{Broker: b.Plain, Timeout: 5 * time.Second, SigningKey: key})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Apply(testCtx(t), "edge-1", []any{configMap("a")}); err != nil {
				t.Fatal(err)
			}
			got, _ := c.Snapshot(testCtx(t), tp.Index("edge-1"))
			old := got[tp.Index("edge-1")] // revision 1: a
			if _, err := c.Apply(testCtx(t), "edge-1", []any{configMap("b"), configMap("c")}); err != nil {
				t.Fatal(err)
			}
			cur := index(t, c, "edge-1")
			waitAcks(t, c, "edge-1", "a, b, c", func(a *protocol.Acks) bool {
				return a.IndexRevision == cur.Revision && len(applied(t, c, "edge-1", a)) == 3
			})
			n.stop()

			// The broker: no index, and acks that report the old signed index as the node's.
			raw := rawClient(t, b.Plain)
			if tc.retainOld {
				pub(t, raw, tp.Index("edge-1"), old, true)
			} else {
				pub(t, raw, tp.Index("edge-1"), []byte{}, true)
			}
			forged := &protocol.Acks{APIVersion: protocol.APIVersion, Node: "edge-1", IndexRevision: 1,
				IndexDigest: protocol.Digest(old), Index: old, Applied: map[string]protocol.IndexEntry{}}
			if tc.inflate > 0 {
				forged.IndexRefused = &protocol.Refusal{Generation: tc.inflate, Reason: "forged"}
			}
			pub(t, raw, tp.Acks("edge-1"), forged, true)

			res, err := c.Apply(testCtx(t), "edge-1", []any{configMap("d")})
			if err != nil {
				t.Logf("the writer refused: %v", err)
				return
			}
			idx := index(t, c, "edge-1")
			t.Logf("the writer published revision %d with %d objects (warnings %q)", idx.Revision, len(idx.Objects), res.Warnings)

			n = startNodeTrusting(t, b.Plain, "edge-1", dbPath, []ed25519.PublicKey{pubKey})
			a := waitAcks(t, c, "edge-1", "the node judged the writer's index", func(a *protocol.Acks) bool {
				return a.IndexRevision == idx.Revision || (a.IndexRefused != nil && a.IndexRefused.Generation == idx.Revision)
			})
			if a.IndexRefused != nil && a.IndexRefused.Generation == idx.Revision {
				t.Logf("the node refused revision %d: %s", idx.Revision, a.IndexRefused.Reason)
			}
			var lost []string
			for _, name := range []string{"b", "c"} {
				if _, ok, _ := n.db.GetObject(store.KindConfigMap, "default", name); !ok {
					lost = append(lost, name)
				}
			}
			if len(lost) > 0 {
				t.Errorf("rollback: configmaps %s, applied at revision %d by the only writer, are deleted on the node by the writer's own signed revision %d built on the replayed revision 1",
					strings.Join(lost, ", "), cur.Revision, idx.Revision)
			}
		})
	}
}

// A counter forged in the acks must not move a node's revision to the writers' ceiling
// (maxCounter): the node would take the signed index at that revision and no writer could write
// a newer one, a freeze that outlasts the broker's misbehaviour. A signing writer ignores it.
func TestForgedCounterCannotFreezeTheNode(t *testing.T) {
	mqtttest.Require(t)
	b := mqtttest.Start(t, mqtttest.Options{})
	pubKey, key, _ := ed25519.GenerateKey(rand.Reader)
	n := startNodeTrusting(t, b.Plain, "edge-1", filepath.Join(t.TempDir(), "state.db"), []ed25519.PublicKey{pubKey})
	c, err := Connect(testCtx(t), Options{Broker: b.Plain, Timeout: 5 * time.Second, SigningKey: key})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Apply(testCtx(t), "edge-1", []any{configMap("a")}); err != nil {
		t.Fatal(err)
	}
	waitAcks(t, c, "edge-1", "a", func(a *protocol.Acks) bool { return a.IndexRevision == 1 && len(a.Missing) == 0 })
	n.stop() // the broker withholds the node's acks while it forges them
	got, _ := c.Snapshot(testCtx(t), tp.Index("edge-1"))
	idx1 := got[tp.Index("edge-1")]
	pub(t, rawClient(t, b.Plain), tp.Acks("edge-1"), &protocol.Acks{APIVersion: protocol.APIVersion, Node: "edge-1", IndexRevision: 1,
		IndexDigest: protocol.Digest(idx1), Applied: map[string]protocol.IndexEntry{},
		IndexRefused: &protocol.Refusal{Generation: maxCounter - 2, Reason: "forged"}}, true)
	if _, err := c.Apply(testCtx(t), "edge-1", []any{configMap("b")}); err != nil {
		t.Fatalf("apply over the forged counter: %v", err)
	}
	top := index(t, c, "edge-1").Revision
	t.Logf("the writer published revision %d (ceiling %d)", top, int64(maxCounter))
	// The broker behaves again: the node reconnects and reports; the operator goes on.
	n = startNodeTrusting(t, b.Plain, "edge-1", n.db.Path(), []ed25519.PublicKey{pubKey})
	waitAcks(t, c, "edge-1", "the node took the inflated revision", func(a *protocol.Acks) bool { return a.IndexRevision == top })
	for i, name := range []string{"c", "d"} {
		if _, err := c.Apply(testCtx(t), "edge-1", []any{configMap(name)}); err != nil {
			t.Errorf("broke: apply %d after the broker behaves again: %v", i+1, err)
		}
	}
}
