package store

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// State is the agent's persistent state, one typed Put/Get/List/Delete per kind of record. It is
// implemented by the bbolt file (DB) and by Memory, the in-memory twin used by unit tests. A new
// record kind is added here, to both.
//
// List methods degrade per record: a record that cannot be decoded is returned as a RecordError
// and skipped, the others load, so one bad key never stops the node. The error result is for the
// read itself failing.
type State interface {
	PutDesired(p DesiredPod) error
	// UpdateDesired puts and deletes desired pods in one transaction (one fsync): a source's
	// resync touching many pods costs one write.
	UpdateDesired(put []DesiredPod, del []types.UID) error
	GetDesired(uid types.UID) (DesiredPod, bool, error)
	ListDesired() ([]DesiredPod, []RecordError, error)
	DeleteDesired(uid types.UID) error

	PutStatus(uid types.UID, s *v1.PodStatus) error
	GetStatus(uid types.UID) (*v1.PodStatus, bool, error)
	ListStatus() (map[types.UID]*v1.PodStatus, []RecordError, error)
	DeleteStatus(uid types.UID) error

	// PutObject stores a ConfigMap or Secret delivered by a source, replacing the previous record
	// for its kind, namespace and name. A Secret is never written in clear (see OpenWith).
	PutObject(r ObjectRecord) error
	GetObject(kind ObjectKind, namespace, name string) (ObjectRecord, bool, error)
	ListObjects() ([]ObjectRecord, []RecordError, error)
	DeleteObject(kind ObjectKind, namespace, name string) error

	// PutMarks stores what the MQTT source has taken in, in one transaction (one fsync) for the
	// whole slice.
	PutMarks(marks []SyncMark) error
	ListMarks() (map[string]SyncMark, []RecordError, error)
	DeleteMarks(keys []string) error
	// UpdateMarks puts and deletes marks in one transaction (one fsync).
	UpdateMarks(put []SyncMark, del []string) error
	// NextSession returns 1, 2, 3, ... across restarts, each number stored before it is returned.
	NextSession() (int64, error)

	// OutboxPut queues messages for the broker in one transaction and returns the Seq given to
	// each; see DB.OutboxPut for how the limits are kept.
	OutboxPut(entries []OutboxEntry, lim OutboxLimits) ([]uint64, error)
	// OutboxList returns queued entries oldest first (by Seq); limit <= 0 means all.
	OutboxList(limit int) ([]OutboxEntry, error)
	// OutboxAck removes the entry with seq if it is still queued; a Latest entry since replaced
	// by a newer one for its topic is gone already, and the newer one stays.
	OutboxAck(topic string, seq uint64) error
	// OutboxAckMany is OutboxAck for many entries in one transaction (one fsync for a whole send
	// window, where OutboxAck per entry costs one each). An entry named with another topic than
	// its own, or one that does not decode, makes it fail, and then nothing is removed.
	OutboxAckMany(acks []OutboxRef) error
	OutboxStats() (OutboxStats, error)

	// PutNodeStatus stores the node's status, replacing the one before (a state file belongs to
	// one node); GetNodeStatus returns it, false when none was stored.
	PutNodeStatus(n *v1.Node) error
	GetNodeStatus() (*v1.Node, bool, error)

	// UpdateEvents replaces the event lists of the pods in put and deletes those of del, in one
	// transaction (one fsync), so a burst of events for many pods costs one write.
	UpdateEvents(put []PodEvents, del []types.UID) error
	GetEvents(uid types.UID) (PodEvents, bool, error)
	ListEvents() ([]PodEvents, []RecordError, error)
	DeleteEvents(uid types.UID) error

	// Notices are what Open did that an operator should see in the log (migrations run,
	// a damaged meta page repaired).
	Notices() []string
	Close() error
}

// RecordError is one stored record that could not be decoded; it was skipped.
type RecordError struct {
	Bucket string
	Key    string
	Err    error
}

func (e RecordError) Error() string {
	return "record " + e.Bucket + "/" + e.Key + ": " + e.Err.Error()
}

func (e RecordError) Unwrap() error { return e.Err }
