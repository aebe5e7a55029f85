package store

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mqlet/mqlet/store/seal"
	bolt "go.etcd.io/bbolt"
)

// TestSecretNeverInClear reads the state file's bytes after a Secret was stored: neither its
// values (raw or base64, as JSON would carry them) nor its metadata may appear anywhere in it.
func TestSecretNeverInClear(t *testing.T) {
	key := testKey(t)
	d, path := openTempWith(t, Options{SecretKey: key})
	const marker = "Zq7distinctiveSecretValue41"
	sec := secretRecord("default", "db", 1, map[string][]byte{"password": []byte(marker)})
	sec.Secret.StringData = map[string]string{"token": marker + "-stringData"}
	sec.Secret.Annotations = map[string]string{"note": marker + "-annotation"}
	putObject(t, d, sec)
	// A ConfigMap in the same file shows that the search does find clear values.
	const visible = "cmVisibleValue77"
	putObject(t, d, cmRecord("default", "app", 1, map[string]string{"k": visible}))
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	raw := readFile(t, path)
	if !bytes.Contains(raw, []byte(visible)) {
		t.Fatalf("the ConfigMap value %q is not in the file: the search below would prove nothing", visible)
	}
	for _, needle := range []string{
		marker,
		strings.TrimRight(base64.StdEncoding.EncodeToString([]byte(marker)), "="),
		strings.TrimRight(base64.URLEncoding.EncodeToString([]byte(marker)), "="),
		"Zq7distinct", // any sizeable part of it
	} {
		if bytes.Contains(raw, []byte(needle)) {
			t.Errorf("the state file holds the secret in clear: %q found in %s", needle, path)
		}
	}
	if bytes.Contains(raw, []byte(`"password"`)) || bytes.Contains(raw, []byte(`"secret"`)) {
		t.Errorf("the state file holds the secret's JSON in clear")
	}

	// Back with the key: all there.
	d, err := OpenWith(path, Options{SecretKey: key})
	if err != nil {
		t.Fatal(err)
	}
	got, ok, err := d.GetObject(KindSecret, "default", "db")
	if err != nil || !ok || !reflect.DeepEqual(got, sec) {
		t.Errorf("secret after reopen = %+v, %v, %v; want %+v", got, ok, err, sec)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}

// A DB without a node key works for everything but Secrets, and says why it refuses them.
func TestSecretsWithoutKey(t *testing.T) {
	key := testKey(t)
	d, path := openTempWith(t, Options{SecretKey: key})
	putObject(t, d, secretRecord("default", "db", 1, map[string][]byte{"p": []byte("v")}))
	putObject(t, d, cmRecord("default", "app", 1, nil))
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	before := readFile(t, path)

	d, err := Open(path)
	if err != nil {
		t.Fatalf("Open without a key: %v", err)
	}
	defer d.Close()
	err = d.PutObject(secretRecord("default", "new", 1, nil))
	if err == nil || !strings.Contains(err.Error(), "no node key configured") || !strings.Contains(err.Error(), "Secret/default/new") {
		t.Errorf("PutObject(secret) without a key = %v, want a refusal naming the secret and the missing key", err)
	}
	objs, bad, err := d.ListObjects()
	if err != nil {
		t.Fatalf("ListObjects without a key: %v", err)
	}
	if len(objs) != 1 || objs[0].Kind != KindConfigMap {
		t.Errorf("ListObjects without a key loaded %+v, want the ConfigMap only", objs)
	}
	if len(bad) != 1 || bad[0].Key != "Secret/default/db" || !errors.Is(bad[0], errNoKey) {
		t.Errorf("record errors %v, want one for Secret/default/db saying there is no node key", bad)
	}
	if _, _, err := d.GetObject(KindSecret, "default", "db"); err == nil || !strings.Contains(err.Error(), "no node key") {
		t.Errorf("GetObject(secret) without a key = %v", err)
	}
	if !bytes.Equal(before, readFile(t, path)) {
		t.Errorf("refused put and reads changed the file")
	}
	// A Secret that cannot be opened can still be removed.
	if err := d.DeleteObject(KindSecret, "default", "db"); err != nil {
		t.Errorf("DeleteObject(secret) without a key: %v", err)
	}
	if _, bad, _ := d.ListObjects(); len(bad) != 0 {
		t.Errorf("record errors after deleting the secret: %v", bad)
	}
}

// Sealed values open only under their key and at their own place in the file.
func TestSealedSecretBoundToKeyAndRecord(t *testing.T) {
	key := testKey(t)
	d, path := openTempWith(t, Options{SecretKey: key})
	putObject(t, d, secretRecord("default", "db", 1, map[string][]byte{"p": []byte("v")}))
	putObject(t, d, secretRecord("default", "other", 1, map[string][]byte{"p": []byte("w")}))
	// Copy db's sealed value over other's, as an attacker with write access to the file (or a
	// bug) might.
	err := d.bolt.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketObjects)
		return b.Put([]byte("Secret/default/other"), bytes.Clone(b.Get([]byte("Secret/default/db"))))
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.GetObject(KindSecret, "default", "other"); !errors.Is(err, seal.ErrOpen) {
		t.Errorf("GetObject of a sealed value moved to another key = %v, want seal.ErrOpen", err)
	}
	if got, _, err := d.GetObject(KindSecret, "default", "db"); err != nil || got.Secret == nil || string(got.Secret.Data["p"]) != "v" {
		t.Errorf("the original = %+v, %v", got, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	d, err = OpenWith(path, Options{SecretKey: testKey(t)}) // another node's key
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_, bad, err := d.ListObjects()
	if err != nil || len(bad) != 2 || !errors.Is(bad[0], seal.ErrOpen) {
		t.Errorf("ListObjects under another key: %v, record errors %v; want two seal.ErrOpen", err, bad)
	}
}

func TestOpenWithBadKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	_, err := OpenWith(path, Options{SecretKey: make([]byte, 16)})
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "32") {
		t.Fatalf("OpenWith(16-byte key) = %v, want an error naming the path and the size", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("OpenWith with a bad key created %s", path)
	}
}

// Marks, the session counter and the outbox (entries, Seq, counters) are all in the file.
func TestSyncRecordsSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	reopen := func(d *DB) *DB {
		t.Helper()
		if d != nil {
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
		}
		d, err := Open(path)
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		if n := d.Notices(); len(n) != 0 {
			t.Errorf("reopen: notices %q", n)
		}
		return d
	}
	d := reopen(nil)
	for want := int64(1); want <= 2; want++ {
		if n, err := d.NextSession(); err != nil || n != want {
			t.Fatalf("NextSession = %d, %v; want %d", n, err, want)
		}
	}
	marks := []SyncMark{{Key: "pods/default/web", Generation: 3}, {Key: "secrets/default/x", Generation: 9, Deleted: true}}
	if err := d.PutMarks(marks); err != nil {
		t.Fatal(err)
	}
	lim := OutboxLimits{MaxEvents: 2}
	queue(t, d, lim, latest("st", "a"), event("ev", "1"), event("ev", "2"), event("ev", "3"), latest("st", "b"))
	want := []string{"3 ev=2", "4 ev=3", "5LR st=b"}

	d = reopen(d) // closed without any ack
	defer func() { d.Close() }()
	if n, err := d.NextSession(); err != nil || n != 3 {
		t.Errorf("NextSession after reopen = %d, %v; want 3", n, err)
	}
	if got, _, err := d.ListMarks(); err != nil || !reflect.DeepEqual(got, map[string]SyncMark{marks[0].Key: marks[0], marks[1].Key: marks[1]}) {
		t.Errorf("marks after reopen = %+v, %v", got, err)
	}
	if got := listOutbox(t, d); !reflect.DeepEqual(got, want) {
		t.Errorf("outbox after reopen = %q, want %q", got, want)
	}
	if st := stats(t, d); st != (OutboxStats{Entries: 3, Events: 2, Bytes: 9, DroppedEvents: 1}) {
		t.Errorf("stats after reopen: %+v", st)
	}
	// Replacing and acking after a reopen works on what the file holds.
	if err := d.OutboxAck("st", 5); err != nil {
		t.Fatal(err)
	}
	for _, e := range listOutboxEntries(t, d) {
		if err := d.OutboxAck(e.Topic, e.Seq); err != nil {
			t.Fatal(err)
		}
	}
	d = reopen(d)
	// Seq keeps growing even when the outbox was emptied before the restart.
	if seqs := queue(t, d, lim, event("ev", "4")); seqs[0] != 6 {
		t.Errorf("first seq after emptying and reopening = %d, want 6", seqs[0])
	}
	if st := stats(t, d); st != (OutboxStats{Entries: 1, Events: 1, Bytes: 3, DroppedEvents: 1}) {
		t.Errorf("stats: %+v", st)
	}
}

const killChildEnv = "MQLET_STORE_KILL_CHILD"

// TestOutboxKillChild is the child of TestOutboxSurvivesKill: it queues entries in a loop from
// several goroutines, printing each Seq once OutboxPut has returned it, until it is killed.
func TestOutboxKillChild(t *testing.T) {
	path := os.Getenv(killChildEnv)
	if path == "" {
		t.Skip("run by TestOutboxSurvivesKill")
	}
	d, err := Open(path)
	if err != nil {
		fmt.Printf("ERROR %v\n", err)
		return
	}
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	lim := OutboxLimits{MaxEvents: 1 << 30, MaxBytes: 1 << 40}
	for w := range 8 {
		go func() {
			for i := 0; ; i++ {
				seqs, err := d.OutboxPut([]OutboxEntry{
					event(fmt.Sprintf("ev/%d", w), strconv.Itoa(i)),
					latest(fmt.Sprintf("st/%d", w), strconv.Itoa(i)),
				}, lim)
				mu.Lock()
				if err != nil {
					fmt.Fprintf(out, "ERROR %v\n", err)
				} else {
					fmt.Fprintf(out, "PUT %d %d %d %d\n", w, i, seqs[0], seqs[1])
				}
				out.Flush()
				mu.Unlock()
			}
		}()
	}
	time.Sleep(time.Minute) // killed long before
}

// TestOutboxSurvivesKill: what OutboxPut returned before a SIGKILL is in the file afterwards.
func TestOutboxSurvivesKill(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	cmd := exec.Command(os.Args[0], "-test.run=^TestOutboxKillChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), killChildEnv+"="+path)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// A failing check below must not leave the child writing: kill it by pid (idempotent).
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	type put struct{ w, i, eventSeq, latestSeq int }
	var puts []put
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(30 * time.Second)
	for len(puts) < 200 {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("child exited after %d puts: %v", len(puts), cmd.Wait())
			}
			var p put
			if _, err := fmt.Sscanf(line, "PUT %d %d %d %d", &p.w, &p.i, &p.eventSeq, &p.latestSeq); err != nil {
				t.Fatalf("child: %s", line)
			}
			puts = append(puts, p)
		case <-timeout:
			t.Fatalf("child made %d puts in 30s", len(puts))
		}
	}
	// Killed in the middle of its writes: more puts are in flight.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for line := range lines { // lines the child printed before it died are acknowledged puts too
		var p put
		if _, err := fmt.Sscanf(line, "PUT %d %d %d %d", &p.w, &p.i, &p.eventSeq, &p.latestSeq); err == nil {
			puts = append(puts, p)
		}
	}
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("child ended with %v, want killed", err)
	}

	d, err := Open(path)
	if err != nil {
		t.Fatalf("Open after SIGKILL: %v", err)
	}
	defer d.Close()
	entries := listOutboxEntries(t, d)
	bySeq := map[uint64]OutboxEntry{}
	var last uint64
	for _, e := range entries {
		if e.Seq <= last {
			t.Errorf("seq %d after %d: not in order", e.Seq, last)
		}
		last = e.Seq
		bySeq[e.Seq] = e
	}
	latestI := map[int]int{}
	for _, p := range puts {
		e, ok := bySeq[uint64(p.eventSeq)]
		if !ok || e.Topic != fmt.Sprintf("ev/%d", p.w) || string(e.Payload) != strconv.Itoa(p.i) {
			t.Errorf("event put by worker %d (round %d) as seq %d: found %v %+v", p.w, p.i, p.eventSeq, ok, e)
		}
		latestI[p.w] = max(latestI[p.w], p.i)
	}
	// Each worker's status topic holds one entry, at least as new as the last one acknowledged.
	for w, i := range latestI {
		n := 0
		for _, e := range entries {
			if e.Topic == fmt.Sprintf("st/%d", w) {
				n++
				if got, _ := strconv.Atoi(string(e.Payload)); got < i {
					t.Errorf("st/%d holds round %d, older than the acknowledged round %d", w, got, i)
				}
			}
		}
		if n != 1 {
			t.Errorf("st/%d has %d entries, want 1", w, n)
		}
	}
	st := stats(t, d)
	if st.Entries != len(entries) || st.Events != len(entries)-len(latestI) {
		t.Errorf("stats %+v disagree with the %d entries listed", st, len(entries))
	}
	// Nothing acknowledged is reused.
	if seqs := queue(t, d, OutboxLimits{MaxEvents: 1 << 30}, event("ev/after", "x")); seqs[0] <= last {
		t.Errorf("seq after the kill %d, want above %d", seqs[0], last)
	}
	t.Logf("child acknowledged %d puts before SIGKILL; %d entries in the file", len(puts), len(entries))
}

// TestConcurrentOutboxPut: OutboxPut is on the path of every pod status change; concurrent calls
// must share transactions (fsyncs), as PutStatus calls do.
func TestConcurrentOutboxPut(t *testing.T) {
	d, path := openTemp(t)
	const workers, updates = 50, 5
	const calls = workers * updates
	before := lastTxid(t, d)
	d.bolt.MaxBatchDelay, d.bolt.MaxBatchSize = time.Second, workers
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for w := range workers {
		wg.Go(func() {
			<-start
			for i := range updates {
				_, err := d.OutboxPut([]OutboxEntry{latest(fmt.Sprintf("st/%02d", w), strconv.Itoa(i))}, OutboxLimits{})
				if err != nil {
					errs <- err
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("OutboxPut: %v", err)
	}
	commits := lastTxid(t, d) - before
	t.Logf("%d concurrent OutboxPut calls took %d commits", calls, commits)
	if commits > calls/2 {
		t.Errorf("%d concurrent OutboxPut calls took %d commits (fsyncs), want at most %d: writes are not batched", calls, commits, calls/2)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	entries := listOutboxEntries(t, d2)
	if len(entries) != workers {
		t.Fatalf("%d entries, want one per topic (%d)", len(entries), workers)
	}
	for _, e := range entries {
		if string(e.Payload) != strconv.Itoa(updates-1) {
			t.Errorf("%s: last version lost: %q", e.Topic, e.Payload)
		}
	}
	if st := stats(t, d2); st.Entries != workers || st.Events != 0 {
		t.Errorf("stats %+v", st)
	}
}

// Each multi-record write is one commit (one fsync); refused input is none.
func TestSyncWritesOneTransaction(t *testing.T) {
	d, _ := openTempWith(t, Options{SecretKey: testKey(t)})
	var marks []SyncMark
	var keys []string
	var entries []OutboxEntry
	for i := range 100 {
		marks = append(marks, SyncMark{Key: fmt.Sprintf("pods/default/p%03d", i), Generation: int64(i)})
		keys = append(keys, marks[i].Key)
		entries = append(entries, event("ev", strconv.Itoa(i)), latest(fmt.Sprintf("st/%d", i%10), strconv.Itoa(i)))
	}
	for name, tc := range map[string]struct {
		call    func() error
		commits int // 0: refused or nothing to do
		wantErr bool
	}{
		"PutMarks(100)":     {func() error { return d.PutMarks(marks) }, 1, false},
		"DeleteMarks(100)":  {func() error { return d.DeleteMarks(keys) }, 1, false},
		"NextSession":       {func() error { _, err := d.NextSession(); return err }, 1, false},
		"OutboxPut(200)":    {func() error { _, err := d.OutboxPut(entries, OutboxLimits{MaxEvents: 50}); return err }, 1, false},
		"PutObject(secret)": {func() error { return d.PutObject(secretRecord("default", "s", 1, nil)) }, 1, false},
		"refused PutMarks":  {func() error { return d.PutMarks([]SyncMark{{Key: "a"}, {}}) }, 0, true},
		"refused OutboxPut": {func() error { _, err := d.OutboxPut([]OutboxEntry{event("ev", "1"), {}}, OutboxLimits{}); return err }, 0, true},
		"refused PutObject": {func() error { return d.PutObject(ObjectRecord{Kind: KindSecret}) }, 0, true},
		"empty PutMarks":    {func() error { return d.PutMarks(nil) }, 0, false},
		"empty DeleteMarks": {func() error { return d.DeleteMarks(nil) }, 0, false},
		"empty OutboxPut":   {func() error { _, err := d.OutboxPut(nil, OutboxLimits{}); return err }, 0, false},
	} {
		before := lastTxid(t, d)
		if err := tc.call(); (err != nil) != tc.wantErr {
			t.Errorf("%s: error %v, want error %v", name, err, tc.wantErr)
		}
		if n := lastTxid(t, d) - before; n != tc.commits {
			t.Errorf("%s took %d commits, want %d", name, n, tc.commits)
		}
	}
}

// countingOutbox counts the walks the shared outbox code makes over an outboxTx, and the entries
// they visit.
type countingOutbox struct {
	outboxTx
	walks, visits int
}

func (c *countingOutbox) walk(from uint64, fn func(uint64, []byte) bool) error {
	c.walks++
	return c.outboxTx.walk(from, func(seq uint64, val []byte) bool {
		c.visits++
		return fn(seq, val)
	})
}

// A put that drops nothing reads the running totals and never walks the outbox; one that has to
// drop many events visits each entry of the outbox's head once, not once per dropped event.
func TestOutboxPutDoesNotScan(t *testing.T) {
	m := NewMemory()
	m.mu.Lock()
	defer m.mu.Unlock()
	o, err := m.outbox()
	if err != nil {
		t.Fatal(err)
	}
	// Latest entries at the head of the outbox, which every search for the oldest event passes.
	var head []OutboxEntry
	for i := range 100 {
		head = append(head, latest(fmt.Sprintf("st/%d", i), "x"))
	}
	if _, _, err := outboxPut(o, head, OutboxLimits{}); err != nil {
		t.Fatal(err)
	}
	c := &countingOutbox{outboxTx: o}
	for i := range 500 {
		if _, _, err := outboxPut(c, []OutboxEntry{event("ev", strconv.Itoa(i)), latest("st/0", strconv.Itoa(i))}, OutboxLimits{}); err != nil {
			t.Fatal(err)
		}
	}
	if c.walks != 0 {
		t.Errorf("500 puts with room to spare walked the outbox %d times, want 0", c.walks)
	}
	st, _ := outboxStats(o)
	before := st.Entries
	if _, _, err := outboxPut(c, []OutboxEntry{event("big", strings.Repeat("x", 1000))}, OutboxLimits{MaxBytes: 1800}); err != nil {
		t.Fatal(err)
	}
	st, _ = outboxStats(o)
	if st.DroppedEvents < 400 {
		t.Fatalf("the big put dropped %d events, want most of the 500", st.DroppedEvents)
	}
	if c.visits > before+1 {
		t.Errorf("a put dropping %d events visited %d entries (%d walks); the outbox held %d",
			st.DroppedEvents, c.visits, c.walks, before)
	}
}
