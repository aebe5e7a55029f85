package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/store"
	bolt "go.etcd.io/bbolt"
)

// An A/B OTA rollback boots the previous release on a state file the newer one migrated to a
// schema the previous one cannot read. The agent does not refuse to start (the unit would keep
// failing and the device go dark): it keeps the newer file aside, restores the backup the newer
// release made before migrating, says so in its log and a node event, and adopts the running
// pods instead of restarting them.
func TestNewerStateFileRolledBack(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("web.yaml", twoContainers)
	h.startAgent()
	h.waitPod("web", "running", allRunning)
	pids := h.tasks()
	h.stopAgent()

	// What a newer release with a non-additive schema 6 leaves: the copy it made of the schema 5
	// file before migrating, and the migrated file, which schema 5 binaries cannot read.
	db := filepath.Join(h.state, store.FileName)
	b, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	backup := db + ".schema-" + "5"
	if err := os.WriteFile(backup, b, 0o600); err != nil {
		t.Fatal(err)
	}
	bdb, err := bolt.Open(db, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = bdb.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket([]byte("meta"))
		if err := meta.Put([]byte("schema_version"), []byte("6")); err != nil {
			return err
		}
		return meta.Put([]byte("min_reader_schema"), []byte("6"))
	})
	bdb.Close()
	if err != nil {
		t.Fatal(err)
	}

	h.startAgent()
	h.waitPod("web", "running", allRunning)
	h.undisturbed("web", pids)
	if _, err := os.Stat(db + ".schema-6"); err != nil {
		t.Errorf("the newer file was not kept aside: %v\nagent log:\n%s", err, h.agentLog)
	}
	if log := h.agentLog.String(); !strings.Contains(log, "restored the backup "+backup) {
		t.Errorf("agent log does not name the restored backup %s:\n%s", backup, log)
	}
	fams := scrape(t, unixHTTP(h.sock), "http://mqlet/metrics")
	if v, _ := sampleOf(fams, "mqlet_events_total", map[string]string{"type": "Warning", "reason": event.ReasonStateFileRolledBack}); v != 1 {
		t.Errorf("%s node events counted: %v, want 1", event.ReasonStateFileRolledBack, v)
	}
}
