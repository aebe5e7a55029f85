package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// OutboxEntry is one message that must reach the MQTT broker. Queued entries survive a kill -9
// and a power cut; the uplink removes them with OutboxAckMany once the broker has them.
type OutboxEntry struct {
	Seq      uint64 // assigned by the store at put; grows across reopen; order of sending
	Topic    string
	Payload  []byte
	Retained bool
	// Latest: at most one entry per Topic is kept; a put replaces the previous entry for that
	// topic (status, acks, liveness). When false the entry is an event: appended, bounded, oldest
	// dropped.
	Latest bool
}

// OutboxLimits bound the outbox. Zero (or negative) fields take the defaults.
type OutboxLimits struct {
	MaxBytes  int64 // of len(Topic)+len(Payload) over queued entries; default DefaultOutboxMaxBytes
	MaxEvents int   // queued events (Latest entries are not counted); default DefaultOutboxMaxEvents
}

const (
	DefaultOutboxMaxBytes  = 1 << 20
	DefaultOutboxMaxEvents = 1000
)

// OutboxStats describe the outbox now. DroppedEvents and RefusedLatest count since the file was
// created, across restarts.
type OutboxStats struct {
	Entries       int
	Bytes         int64
	Events        int
	DroppedEvents uint64
	RefusedLatest uint64
}

// ErrOutboxFull is wrapped by OutboxPut's error for each entry that was not queued because it
// could not fit under the limits even with every event dropped.
var ErrOutboxFull = errors.New("outbox full")

// Encoding of an outbox value: format byte, flags byte, uvarint len(topic), topic, payload.
const (
	outboxFormat   = 1
	outboxRetained = 1 << 0
	outboxLatest   = 1 << 1
)

func encodeOutbox(e OutboxEntry) []byte {
	val := make([]byte, 0, 2+binary.MaxVarintLen64+len(e.Topic)+len(e.Payload))
	var flags byte
	if e.Retained {
		flags |= outboxRetained
	}
	if e.Latest {
		flags |= outboxLatest
	}
	val = append(val, outboxFormat, flags)
	val = binary.AppendUvarint(val, uint64(len(e.Topic)))
	val = append(val, e.Topic...)
	return append(val, e.Payload...)
}

// decodeOutbox decodes the value stored under seq into a fresh entry (nothing in it aliases val,
// which bbolt only lends for the transaction).
func decodeOutbox(seq uint64, val []byte) (OutboxEntry, error) {
	if val == nil {
		return OutboxEntry{}, fmt.Errorf("entry %d: not found", seq)
	}
	if len(val) < 3 || val[0] != outboxFormat || val[1]&^(outboxRetained|outboxLatest) != 0 {
		return OutboxEntry{}, fmt.Errorf("entry %d: not an outbox entry of format %d", seq, outboxFormat)
	}
	n, w := binary.Uvarint(val[2:])
	if w <= 0 || n == 0 || n > uint64(len(val)-2-w) {
		return OutboxEntry{}, fmt.Errorf("entry %d: bad topic length", seq)
	}
	topic := val[2+w : 2+w+int(n)]
	return OutboxEntry{
		Seq:      seq,
		Topic:    string(topic),
		Payload:  bytes.Clone(val[2+w+int(n):]),
		Retained: val[1]&outboxRetained != 0,
		Latest:   val[1]&outboxLatest != 0,
	}, nil
}

func entrySize(e OutboxEntry) int64 { return int64(len(e.Topic) + len(e.Payload)) }

func seqKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// outboxCounters are the outbox's running totals, kept in meta so that a put knows whether it
// must drop anything without walking the outbox. They count the entries that decode: a value
// that does not (damage; this code never writes one) is not counted, is skipped by OutboxList and
// is removed when a put next looks for an event to drop.
type outboxCounters struct {
	EventBytes    int64  `json:"eventBytes"`
	LatestBytes   int64  `json:"latestBytes"`
	Events        int    `json:"events"`
	Latest        int    `json:"latest"`
	DroppedEvents uint64 `json:"droppedEvents"`
	RefusedLatest uint64 `json:"refusedLatest"`
}

func (c *outboxCounters) bytes() int64 { return c.EventBytes + c.LatestBytes }

// remove takes a queued entry out of the totals. They never go below zero, even if damage made
// them disagree with the buckets.
func (c *outboxCounters) remove(size int64, latest bool) {
	if latest {
		c.LatestBytes, c.Latest = max(c.LatestBytes-size, 0), max(c.Latest-1, 0)
	} else {
		c.EventBytes, c.Events = max(c.EventBytes-size, 0), max(c.Events-1, 0)
	}
}

// outboxTx is the outbox's view of one transaction. DB implements it over bbolt and Memory over
// its maps, so both run the same code below and cannot drift apart.
type outboxTx interface {
	// walk calls fn for each entry with seq >= from, in seq order, until fn returns false. The
	// outbox must not be changed during the walk.
	walk(from uint64, fn func(seq uint64, val []byte) bool) error
	get(seq uint64) []byte
	put(seq uint64, val []byte) error
	del(seq uint64) error
	latest(topic string) (seq uint64, ok bool)
	setLatest(topic string, seq uint64) error
	delLatest(topic string) error
	nextSeq() (uint64, error)
	counters() []byte
	setCounters(val []byte) error
}

// loadCounters reads the running totals, rebuilding them from the outbox when the record is
// missing (a file that never had an outbox write) or does not decode.
func loadCounters(tx outboxTx) (outboxCounters, error) {
	var c outboxCounters
	if raw := tx.counters(); raw != nil && json.Unmarshal(raw, &c) == nil {
		return c, nil
	}
	c = outboxCounters{}
	err := tx.walk(0, func(seq uint64, val []byte) bool {
		e, err := decodeOutbox(seq, val)
		switch {
		case err != nil:
		case e.Latest:
			c.LatestBytes += entrySize(e)
			c.Latest++
		default:
			c.EventBytes += entrySize(e)
			c.Events++
		}
		return true
	})
	return c, err
}

func saveCounters(tx outboxTx, c outboxCounters) error {
	val, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return tx.setCounters(val)
}

// checkOutbox refuses, before anything is written, entries no implementation can store.
func checkOutbox(entries []OutboxEntry) error {
	for i, e := range entries {
		if e.Topic == "" {
			return fmt.Errorf("entries[%d]: empty topic", i)
		}
		// The topic of a Latest entry is a bbolt key in outbox_latest.
		if len(e.Topic) > bolt.MaxKeySize {
			return fmt.Errorf("entries[%d]: topic of %d bytes, longer than %d", i, len(e.Topic), bolt.MaxKeySize)
		}
	}
	return nil
}

func (lim OutboxLimits) withDefaults() OutboxLimits {
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = DefaultOutboxMaxBytes
	}
	if lim.MaxEvents <= 0 {
		lim.MaxEvents = DefaultOutboxMaxEvents
	}
	return lim
}

// outboxPut queues entries in order within one transaction and returns the Seq of each (0 for an
// entry that was refused) and one error per refused entry, each wrapping ErrOutboxFull. The
// function may be run more than once (bbolt's Batch reruns it after another caller's failure),
// so everything it returns is built afresh here.
//
// Room is made by dropping the oldest events. Whether an entry can fit at all is decided first,
// from the totals: a Latest entry fits if the other Latest entries leave room for it, an event if
// all Latest entries do; an entry that cannot fit is refused without dropping anything for it.
func outboxPut(tx outboxTx, entries []OutboxEntry, lim OutboxLimits) ([]uint64, []error, error) {
	lim = lim.withDefaults()
	c, err := loadCounters(tx)
	if err != nil {
		return nil, nil, err
	}
	seqs := make([]uint64, len(entries))
	var refused []error
	// Events before from were already found to be gone or Latest: each put walks the head of the
	// outbox once, however many events it drops.
	var from uint64
	makeRoom := func(need func() bool) error {
		for need() {
			dropped, next, err := dropOldestEvent(tx, &c, from)
			if err != nil {
				return err
			}
			if !dropped {
				// No event left: totals that still say otherwise were wrong.
				c.EventBytes, c.Events = 0, 0
				return nil
			}
			from = next
		}
		return nil
	}

	for i, e := range entries {
		size := entrySize(e)
		if e.Latest {
			oldSeq, hasOld := tx.latest(e.Topic)
			var oldSize int64
			if hasOld {
				// An index entry pointing at nothing, at an event or at a value that does not
				// decode is stale: it is overwritten below, and what it points at (if anything)
				// stays what it is.
				old, err := decodeOutbox(oldSeq, tx.get(oldSeq))
				if err != nil || !old.Latest {
					hasOld = false
				} else {
					oldSize = entrySize(old)
				}
			}
			if c.LatestBytes-oldSize+size > lim.MaxBytes {
				c.RefusedLatest++
				refused = append(refused, fmt.Errorf("store outbox entry for topic %s: %w: a latest entry of %d bytes does not fit "+
					"beside the other latest entries (%d bytes) under the %d-byte bound; the previous entry for the topic, if any, stays queued",
					e.Topic, ErrOutboxFull, size, c.LatestBytes-oldSize, lim.MaxBytes))
				continue
			}
			if err := makeRoom(func() bool { return c.bytes()-oldSize+size > lim.MaxBytes }); err != nil {
				return nil, nil, err
			}
			if hasOld {
				if err := tx.del(oldSeq); err != nil {
					return nil, nil, fmt.Errorf("topic %s: replace entry %d: %w", e.Topic, oldSeq, err)
				}
				c.remove(oldSize, true)
			}
			seq, err := putEntry(tx, e)
			if err != nil {
				return nil, nil, err
			}
			if err := tx.setLatest(e.Topic, seq); err != nil {
				return nil, nil, fmt.Errorf("topic %s: %w", e.Topic, err)
			}
			c.LatestBytes += size
			c.Latest++
			seqs[i] = seq
			continue
		}

		if c.LatestBytes+size > lim.MaxBytes {
			c.DroppedEvents++
			refused = append(refused, fmt.Errorf("store outbox entry for topic %s: %w: an event of %d bytes does not fit under "+
				"the %d-byte bound (latest entries hold %d bytes); dropped", e.Topic, ErrOutboxFull, size, lim.MaxBytes, c.LatestBytes))
			continue
		}
		if err := makeRoom(func() bool { return c.bytes()+size > lim.MaxBytes || c.Events+1 > lim.MaxEvents }); err != nil {
			return nil, nil, err
		}
		seq, err := putEntry(tx, e)
		if err != nil {
			return nil, nil, err
		}
		c.EventBytes += size
		c.Events++
		seqs[i] = seq
	}
	if err := saveCounters(tx, c); err != nil {
		return nil, nil, err
	}
	return seqs, refused, nil
}

func putEntry(tx outboxTx, e OutboxEntry) (uint64, error) {
	seq, err := tx.nextSeq()
	if err != nil {
		return 0, fmt.Errorf("topic %s: next seq: %w", e.Topic, err)
	}
	if err := tx.put(seq, encodeOutbox(e)); err != nil {
		return 0, fmt.Errorf("topic %s: put entry %d: %w", e.Topic, seq, err)
	}
	return seq, nil
}

// dropOldestEvent removes the oldest event with seq >= from, or the oldest value that does not
// decode (it can never be sent; it was not counted, so removing it changes no total), and reports
// where the next search may start. It reports false when there is nothing left to remove.
func dropOldestEvent(tx outboxTx, c *outboxCounters, from uint64) (removed bool, next uint64, err error) {
	var (
		found bool
		seq   uint64
		event *OutboxEntry
	)
	err = tx.walk(from, func(s uint64, val []byte) bool {
		e, err := decodeOutbox(s, val)
		if err == nil && e.Latest {
			return true
		}
		found, seq = true, s
		if err == nil {
			event = &e
		}
		return false
	})
	if err != nil || !found {
		return false, 0, err
	}
	if err := tx.del(seq); err != nil {
		return false, 0, fmt.Errorf("drop event %d: %w", seq, err)
	}
	if event != nil {
		c.remove(entrySize(*event), false)
		c.DroppedEvents++
	}
	return true, seq + 1, nil
}

// OutboxRef names one sent entry: the topic it was published on and its Seq.
type OutboxRef struct {
	Topic string
	Seq   uint64
}

// outboxAckMany removes, in one transaction, each entry of acks that is still queued. An entry
// that is gone (acked before, dropped, or a Latest entry replaced by a newer one, which stays) is
// skipped. A ref naming another topic than its entry's (the caller mixed up its acks, and removing
// it would lose a message) or an entry that does not decode is an error, and then nothing at all
// is removed: everything is checked before the first write, because Memory has no rollback and
// both implementations must leave the same outbox behind.
func outboxAckMany(tx outboxTx, acks []OutboxRef) error {
	var (
		gone []OutboxEntry
		errs []error
	)
	for _, a := range acks {
		val := tx.get(a.Seq)
		if val == nil {
			continue // acked before, replaced by a newer Latest entry, or dropped
		}
		e, err := decodeOutbox(a.Seq, val)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if e.Topic != a.Topic {
			errs = append(errs, fmt.Errorf("entry %d is for topic %s, not %s", a.Seq, e.Topic, a.Topic))
			continue
		}
		gone = append(gone, e)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w; nothing removed", errors.Join(errs...))
	}
	if len(gone) == 0 {
		return nil
	}
	c, err := loadCounters(tx)
	if err != nil {
		return err
	}
	for _, e := range gone {
		if tx.get(e.Seq) == nil {
			continue // named twice in acks: removed (and counted) once
		}
		if e.Latest {
			if s, ok := tx.latest(e.Topic); ok && s == e.Seq {
				if err := tx.delLatest(e.Topic); err != nil {
					return fmt.Errorf("entry %d: %w", e.Seq, err)
				}
			}
		}
		if err := tx.del(e.Seq); err != nil {
			return fmt.Errorf("entry %d: %w", e.Seq, err)
		}
		c.remove(entrySize(e), e.Latest)
	}
	return saveCounters(tx, c)
}

// ackDescription names the acks of one call in an error: the first entry and how many.
func ackDescription(acks []OutboxRef) string {
	if len(acks) == 1 {
		return fmt.Sprintf("entry %d for topic %s", acks[0].Seq, acks[0].Topic)
	}
	return fmt.Sprintf("%d entries (first %d for topic %s)", len(acks), acks[0].Seq, acks[0].Topic)
}

// outboxList returns up to limit queued entries (all when limit <= 0), oldest first. Entries that
// do not decode are skipped: they cannot be sent, and the next put that needs room drops them
// first.
func outboxList(tx outboxTx, limit int) ([]OutboxEntry, error) {
	var out []OutboxEntry
	err := tx.walk(0, func(seq uint64, val []byte) bool {
		if e, err := decodeOutbox(seq, val); err == nil {
			out = append(out, e)
		}
		return limit <= 0 || len(out) < limit
	})
	return out, err
}

func outboxStats(tx outboxTx) (OutboxStats, error) {
	c, err := loadCounters(tx)
	if err != nil {
		return OutboxStats{}, err
	}
	return OutboxStats{
		Entries:       c.Events + c.Latest,
		Bytes:         c.bytes(),
		Events:        c.Events,
		DroppedEvents: c.DroppedEvents,
		RefusedLatest: c.RefusedLatest,
	}, nil
}

// boltOutbox is outboxTx over one bbolt transaction.
type boltOutbox struct {
	entries, latestIdx, meta *bolt.Bucket
}

func newBoltOutbox(tx *bolt.Tx) (*boltOutbox, error) {
	var o boltOutbox
	var err error
	if o.entries, err = bucket(tx, bucketOutbox); err != nil {
		return nil, err
	}
	if o.latestIdx, err = bucket(tx, bucketOutboxLatest); err != nil {
		return nil, err
	}
	if o.meta, err = bucket(tx, bucketMeta); err != nil {
		return nil, err
	}
	return &o, nil
}

func (o *boltOutbox) walk(from uint64, fn func(uint64, []byte) bool) error {
	c := o.entries.Cursor()
	for k, v := c.Seek(seqKey(from)); k != nil; k, v = c.Next() {
		if len(k) != 8 {
			continue // not an outbox key; it sorts among them but was never written by this code
		}
		if !fn(binary.BigEndian.Uint64(k), v) {
			return nil
		}
	}
	return nil
}

func (o *boltOutbox) get(seq uint64) []byte            { return o.entries.Get(seqKey(seq)) }
func (o *boltOutbox) put(seq uint64, val []byte) error { return o.entries.Put(seqKey(seq), val) }
func (o *boltOutbox) del(seq uint64) error             { return o.entries.Delete(seqKey(seq)) }

func (o *boltOutbox) latest(topic string) (uint64, bool) {
	v := o.latestIdx.Get([]byte(topic))
	if len(v) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(v), true
}

func (o *boltOutbox) setLatest(topic string, seq uint64) error {
	return o.latestIdx.Put([]byte(topic), seqKey(seq))
}
func (o *boltOutbox) delLatest(topic string) error { return o.latestIdx.Delete([]byte(topic)) }

// nextSeq uses the bucket's own sequence, which bbolt stores with the bucket and commits with
// the transaction: Seq grows across restarts and is never reused, even after every entry is
// acked.
func (o *boltOutbox) nextSeq() (uint64, error) { return o.entries.NextSequence() }

func (o *boltOutbox) counters() []byte             { return o.meta.Get(keyOutboxCounters) }
func (o *boltOutbox) setCounters(val []byte) error { return o.meta.Put(keyOutboxCounters, val) }

// OutboxPut queues entries in one transaction (one fsync; concurrent calls, e.g. status updates
// from many pod workers, are folded together) and returns the Seq given to each, in order. A
// Latest entry replaces the entry queued for its topic. When the limits are exceeded the oldest
// events are dropped; an entry that cannot fit even so is not queued (its Seq is 0) and the others
// are: the error then wraps ErrOutboxFull once per such entry, naming its topic. Invalid input
// (an empty topic) is refused before anything is written.
func (d *DB) OutboxPut(entries []OutboxEntry, lim OutboxLimits) ([]uint64, error) {
	if err := checkOutbox(entries); err != nil {
		return nil, fmt.Errorf("state db %s: outbox put: %w", d.path, err)
	}
	if len(entries) == 0 {
		return []uint64{}, nil
	}
	var (
		seqs    []uint64
		refused []error
	)
	err := d.bolt.Batch(func(tx *bolt.Tx) error {
		o, err := newBoltOutbox(tx)
		if err != nil {
			return err
		}
		seqs, refused, err = outboxPut(o, entries, lim)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("state db %s: outbox put of %d entries (first for topic %s): %w", d.path, len(entries), entries[0].Topic, err)
	}
	return seqs, refusedError(d.path, refused)
}

// refusedError joins the refusals of one put; each one already names its topic.
func refusedError(where string, refused []error) error {
	if len(refused) == 0 {
		return nil
	}
	return fmt.Errorf("state db %s: %w", where, errors.Join(refused...))
}

// OutboxList returns up to limit queued entries, oldest first (by Seq); limit <= 0 means all.
func (d *DB) OutboxList(limit int) (out []OutboxEntry, err error) {
	err = d.bolt.View(func(tx *bolt.Tx) error {
		o, err := newBoltOutbox(tx)
		if err != nil {
			return err
		}
		out, err = outboxList(o, limit)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("state db %s: outbox list: %w", d.path, err)
	}
	return out, nil
}

// OutboxAck removes the entry with seq once the broker has it. An entry that is no longer queued
// (acked before, dropped, or a Latest entry since replaced by a newer one, which stays queued) is
// not an error. Concurrent calls are folded into one transaction.
func (d *DB) OutboxAck(topic string, seq uint64) error {
	return d.OutboxAckMany([]OutboxRef{{Topic: topic, Seq: seq}})
}

// OutboxAckMany is OutboxAck for many entries in one transaction (one commit, not one per entry):
// the uplink removes a whole send window's acknowledged entries with one call. An error means
// nothing was removed. Concurrent calls (and puts) are folded into one transaction.
func (d *DB) OutboxAckMany(acks []OutboxRef) error {
	if len(acks) == 0 {
		return nil
	}
	err := d.bolt.Batch(func(tx *bolt.Tx) error {
		o, err := newBoltOutbox(tx)
		if err != nil {
			return err
		}
		return outboxAckMany(o, acks)
	})
	if err != nil {
		return fmt.Errorf("state db %s: outbox ack of %s: %w", d.path, ackDescription(acks), err)
	}
	return nil
}

// OutboxStats reads the outbox's totals and counters without walking it.
func (d *DB) OutboxStats() (st OutboxStats, err error) {
	err = d.bolt.View(func(tx *bolt.Tx) error {
		o, err := newBoltOutbox(tx)
		if err != nil {
			return err
		}
		st, err = outboxStats(o)
		return err
	})
	if err != nil {
		return OutboxStats{}, fmt.Errorf("state db %s: outbox stats: %w", d.path, err)
	}
	return st, nil
}
