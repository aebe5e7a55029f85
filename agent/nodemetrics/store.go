package nodemetrics

import (
	"time"

	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Store returns s with its writes timed into mqlet_store_write_duration_seconds (and failures
// counted in mqlet_store_write_errors_total), by operation. Reads pass through untimed. Methods
// added to store.State later pass through untimed too, until they get a line here.
func (a *Agent) Store(s store.State) store.State { return &timedState{State: s, a: a} }

type timedState struct {
	store.State
	a *Agent
}

// timed records one write that began at start and ended with err.
func (t *timedState) timed(op string, start time.Time, err error) {
	t.a.storeWrites.With(op).Observe(time.Since(start).Seconds())
	if err != nil {
		t.a.storeErrors.With(op).Inc()
	}
}

func (t *timedState) PutDesired(p store.DesiredPod) error {
	start := time.Now()
	err := t.State.PutDesired(p)
	t.timed("put_desired", start, err)
	return err
}

func (t *timedState) UpdateDesired(put []store.DesiredPod, del []types.UID) error {
	start := time.Now()
	err := t.State.UpdateDesired(put, del)
	t.timed("update_desired", start, err)
	return err
}

func (t *timedState) DeleteDesired(uid types.UID) error {
	start := time.Now()
	err := t.State.DeleteDesired(uid)
	t.timed("delete_desired", start, err)
	return err
}

func (t *timedState) PutStatus(uid types.UID, s *v1.PodStatus) error {
	start := time.Now()
	err := t.State.PutStatus(uid, s)
	t.timed("put_status", start, err)
	return err
}

func (t *timedState) DeleteStatus(uid types.UID) error {
	start := time.Now()
	err := t.State.DeleteStatus(uid)
	t.timed("delete_status", start, err)
	return err
}

func (t *timedState) PutObject(r store.ObjectRecord) error {
	start := time.Now()
	err := t.State.PutObject(r)
	t.timed("put_object", start, err)
	return err
}

func (t *timedState) DeleteObject(kind store.ObjectKind, namespace, name string) error {
	start := time.Now()
	err := t.State.DeleteObject(kind, namespace, name)
	t.timed("delete_object", start, err)
	return err
}

func (t *timedState) PutMarks(marks []store.SyncMark) error {
	start := time.Now()
	err := t.State.PutMarks(marks)
	t.timed("put_marks", start, err)
	return err
}

func (t *timedState) DeleteMarks(keys []string) error {
	start := time.Now()
	err := t.State.DeleteMarks(keys)
	t.timed("delete_marks", start, err)
	return err
}

func (t *timedState) NextSession() (int64, error) {
	start := time.Now()
	n, err := t.State.NextSession()
	t.timed("next_session", start, err)
	return n, err
}

func (t *timedState) OutboxPut(entries []store.OutboxEntry, lim store.OutboxLimits) ([]uint64, error) {
	start := time.Now()
	seqs, err := t.State.OutboxPut(entries, lim)
	t.timed("outbox_put", start, err)
	return seqs, err
}

func (t *timedState) OutboxAckMany(acks []store.OutboxRef) error {
	start := time.Now()
	err := t.State.OutboxAckMany(acks)
	t.timed("outbox_ack_many", start, err)
	return err
}

func (t *timedState) OutboxAck(topic string, seq uint64) error {
	start := time.Now()
	err := t.State.OutboxAck(topic, seq)
	t.timed("outbox_ack", start, err)
	return err
}

func (t *timedState) UpdateEvents(put []store.PodEvents, del []types.UID) error {
	start := time.Now()
	err := t.State.UpdateEvents(put, del)
	t.timed("update_events", start, err)
	return err
}

func (t *timedState) DeleteEvents(uid types.UID) error {
	start := time.Now()
	err := t.State.DeleteEvents(uid)
	t.timed("delete_events", start, err)
	return err
}
