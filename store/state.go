package store

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// State is the agent's persistent state, one typed Put/Get/List/Delete per kind of record. It is
// implemented by the bbolt file (DB) and by Memory, the in-memory twin used by unit tests. Later
// record kinds (outbox, node status, configMaps/secrets, events) are added here, to both.
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
