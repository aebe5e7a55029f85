package store

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mqlet/mqlet/core/source"
	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// lastTxid is the id of the last committed write transaction. bbolt gives every write commit
// the next id, and each commit is one fsync of the meta page, so the difference between two
// readings counts the commits (and fsyncs) made in between, independent of timing.
func lastTxid(t *testing.T, d *DB) int {
	t.Helper()
	id := -1
	if err := d.bolt.View(func(tx *bolt.Tx) error { id = tx.ID(); return nil }); err != nil {
		t.Fatalf("read txid: %v", err)
	}
	return id
}

// TestConcurrentPutStatus proves that concurrent PutStatus calls share transactions: with one
// transaction per call (no batching) the commit count equals the call count and this fails.
func TestConcurrentPutStatus(t *testing.T) {
	d, path := openTemp(t)
	const workers, updates = 50, 5
	const calls = workers * updates
	before := lastTxid(t, d)
	// A batch window far longer than the goroutines need to queue, and room for all of them, so
	// the fold does not depend on how busy the machine is; without batching it is still one
	// commit per call.
	d.bolt.MaxBatchDelay, d.bolt.MaxBatchSize = time.Second, workers

	// All workers start together, so each round of calls arrives within one batch window.
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			uid := types.UID(fmt.Sprintf("uid-%02d", w))
			for i := range updates {
				if err := d.PutStatus(uid, testStatus(v1.PodRunning, int32(i))); err != nil {
					errs <- err
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("PutStatus: %v", err)
	}
	commits := lastTxid(t, d) - before
	t.Logf("%d concurrent PutStatus calls took %d commits", calls, commits)
	// Half is far from both ends: unbatched is exactly calls, batched is typically a few
	// commits per round of updates.
	if commits > calls/2 {
		t.Errorf("%d concurrent PutStatus calls took %d commits (fsyncs), want at most %d: writes are not batched",
			calls, commits, calls/2)
	}

	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// Read back from a fresh open so the check is about what reached the file.
	d2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	all, bad, err := d2.ListStatus()
	if err != nil || len(bad) != 0 {
		t.Fatalf("ListStatus: %v, record errors %v", err, bad)
	}
	if len(all) != workers {
		t.Fatalf("ListStatus has %d entries, want %d", len(all), workers)
	}
	for uid, s := range all {
		if got := s.ContainerStatuses[0].RestartCount; got != updates-1 {
			t.Errorf("%s: last write lost: restart count %d, want %d", uid, got, updates-1)
		}
	}
}

// TestUpdateDesiredOneTransaction: a resync touching many pods costs one commit (one fsync).
func TestUpdateDesiredOneTransaction(t *testing.T) {
	d, _ := openTemp(t)
	var first []DesiredPod
	for i := range 10 {
		first = append(first, DesiredPod{
			Pod:    testPod("default", fmt.Sprintf("old-%02d", i), fmt.Sprintf("uid-old-%02d", i)),
			Source: source.Ref{Kind: source.File, Origin: "/pods/old.yaml", Doc: i},
		})
	}
	before := lastTxid(t, d)
	if err := d.UpdateDesired(first, nil); err != nil {
		t.Fatalf("UpdateDesired(10 puts): %v", err)
	}
	if n := lastTxid(t, d) - before; n != 1 {
		t.Errorf("UpdateDesired of 10 pods took %d commits, want 1", n)
	}

	var put []DesiredPod
	var del []types.UID
	for i := range 20 {
		put = append(put, DesiredPod{
			Pod:    testPod("default", fmt.Sprintf("new-%02d", i), fmt.Sprintf("uid-new-%02d", i)),
			Source: source.Ref{Kind: source.MQTT, Origin: "t"}, Generation: int64(i),
		})
	}
	for i := range 10 {
		del = append(del, types.UID(fmt.Sprintf("uid-old-%02d", i)))
	}
	before = lastTxid(t, d)
	if err := d.UpdateDesired(put, del); err != nil {
		t.Fatalf("UpdateDesired(20 puts, 10 deletes): %v", err)
	}
	if n := lastTxid(t, d) - before; n != 1 {
		t.Errorf("UpdateDesired of 20 puts and 10 deletes took %d commits, want 1", n)
	}
	pods, _, err := d.ListDesired()
	if err != nil || len(pods) != 20 || pods[0].Pod.Name != "new-00" {
		t.Errorf("after update: %d pods, err %v; want the 20 new ones", len(pods), err)
	}

	// Refused input writes nothing at all.
	before = lastTxid(t, d)
	if err := d.UpdateDesired(put[:1], []types.UID{put[0].Pod.UID}); err == nil {
		t.Errorf("UpdateDesired with a uid in put and del succeeded")
	}
	if err := d.UpdateDesired(nil, nil); err != nil {
		t.Errorf("UpdateDesired(nil, nil) = %v", err)
	}
	if n := lastTxid(t, d) - before; n != 0 {
		t.Errorf("refused and empty UpdateDesired took %d commits, want 0", n)
	}
}
