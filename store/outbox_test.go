package store

import (
	"fmt"
	"testing"
)

func commits(t *testing.T, d *DB) uint64 {
	t.Helper()
	n, err := d.Commits()
	if err != nil {
		t.Fatalf("Commits: %v", err)
	}
	return n
}

// Commits counts bbolt commits since Open, and OutboxAckMany removes a whole window's entries in
// one, where OutboxAck costs one per entry: on flash each commit is a pair of fdatasyncs.
func TestOutboxAckManyIsOneCommit(t *testing.T) {
	d, path := openTemp(t)
	if n := commits(t, d); n != 0 {
		t.Fatalf("Commits right after Open = %d, want 0 (the migration of a new file is not counted)", n)
	}
	var entries []OutboxEntry
	for i := range 64 {
		entries = append(entries, latest(fmt.Sprintf("st/%d", i), "x"))
	}
	seqs := queue(t, d, OutboxLimits{}, entries...)
	if n := commits(t, d); n != 1 {
		t.Fatalf("Commits after one OutboxPut = %d, want 1", n)
	}
	refs := make([]OutboxRef, len(seqs))
	for i, s := range seqs {
		refs[i] = OutboxRef{Topic: entries[i].Topic, Seq: s}
	}
	if err := d.OutboxAckMany(refs[:32]); err != nil {
		t.Fatal(err)
	}
	if n := commits(t, d); n != 2 {
		t.Fatalf("Commits after OutboxAckMany of 32 entries = %d, want 2", n)
	}
	for _, r := range refs[32:] {
		if err := d.OutboxAck(r.Topic, r.Seq); err != nil {
			t.Fatal(err)
		}
	}
	if n := commits(t, d); n != 2+32 {
		t.Errorf("Commits after 32 OutboxAck calls one after the other = %d, want %d", n, 2+32)
	}
	if st := stats(t, d); st.Entries != 0 {
		t.Errorf("outbox not empty: %+v", st)
	}
	// Reads commit nothing; an empty ack opens no transaction.
	_, _ = d.OutboxList(0)
	if err := d.OutboxAckMany(nil); err != nil {
		t.Fatal(err)
	}
	if n := commits(t, d); n != 34 {
		t.Errorf("Commits after a list and an empty ack = %d, want 34", n)
	}

	// The count starts over with every Open: it is this process's writes, not the file's.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if n := commits(t, d2); n != 0 {
		t.Errorf("Commits after reopening = %d, want 0", n)
	}
}
