package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// APIVersion is carried by every payload, so a receiver can refuse a payload of a contract it does
// not speak instead of misreading it.
const APIVersion = "mqlet.io/v2"

// DefaultMaxPayload is the largest payload a receiver accepts unless configured otherwise. It matches
// the example broker's message_size_limit.
const DefaultMaxPayload = 1 << 20

// MaxLogChunk bounds the data of one logs reply, so a log stream never makes a payload that a
// constrained broker or link would refuse.
const MaxLogChunk = 16 << 10

// ObjectKind is a kind of desired object.
type ObjectKind string

const (
	KindPod       ObjectKind = "Pod"
	KindConfigMap ObjectKind = "ConfigMap"
	KindSecret    ObjectKind = "Secret"
)

// Plural is the kind's topic segment.
func (k ObjectKind) Plural() string {
	switch k {
	case KindPod:
		return "pods"
	case KindConfigMap:
		return "configmaps"
	case KindSecret:
		return "secrets"
	}
	return strings.ToLower(string(k)) + "s"
}

// KindFromPlural is the inverse of Plural for the kinds the protocol carries.
func KindFromPlural(s string) (ObjectKind, error) {
	switch s {
	case "pods":
		return KindPod, nil
	case "configmaps":
		return KindConfigMap, nil
	case "secrets":
		return KindSecret, nil
	}
	return "", fmt.Errorf("unknown kind %q (want pods, configmaps or secrets)", s)
}

// ObjectKey names an object within a node's desired set: "<kinds>/<namespace>/<name>", the same
// string as the tail of its desired topic. Index entries and acks use it.
func ObjectKey(kind ObjectKind, namespace, name string) string {
	return kind.Plural() + "/" + namespace + "/" + name
}

// ParseObjectKey splits and validates an ObjectKey.
func ParseObjectKey(key string) (ObjectKind, string, string, error) {
	seg := strings.Split(key, "/")
	if len(seg) != 3 {
		return "", "", "", fmt.Errorf("object key %q is not <kinds>/<namespace>/<name>", key)
	}
	k, err := KindFromPlural(seg[0])
	if err != nil {
		return "", "", "", fmt.Errorf("object key %q: %w", key, err)
	}
	if err := ValidateObjectName(k, seg[1], seg[2]); err != nil {
		return "", "", "", fmt.Errorf("object key %q: %w", key, err)
	}
	return k, seg[1], seg[2], nil
}

// Desired is the payload of a desired object's retained topic: the whole object and its
// generation. Generations of one node's objects come from one counter per node (see Index). There
// are no tombstones in v2: an object is deleted by an index that leaves it out, and its writer then
// clears the retained topic (an empty payload), which a node ignores.
type Desired struct {
	APIVersion string          `json:"apiVersion"`
	Kind       ObjectKind      `json:"kind"`
	Node       string          `json:"node"`
	Namespace  string          `json:"namespace"`
	Name       string          `json:"name"`
	Generation int64           `json:"generation"`
	Object     json.RawMessage `json:"object"`
	// Sealed carries a Secret's data encrypted to the node's sealing key (package
	// sync/sealing): the Secret in Object then has no data of its own, so the broker, a site
	// gateway and every other node see only ciphertext.
	Sealed *Sealed `json:"sealed,omitempty"`
}

// Sealed is a Secret's data (and stringData, merged) sealed with HPKE to one node's key.
type Sealed struct {
	// KeyID names the node key it is sealed to (sealing.KeyID of the public key), so a node that
	// changed its key says which one it was.
	KeyID string `json:"keyID"`
	// Ciphertext is the HPKE encapsulated key followed by the sealed data.
	Ciphertext []byte `json:"ciphertext"`
}

// DesiredObject is a decoded, validated Desired: exactly one of the pointers is set.
type DesiredObject struct {
	Desired
	Pod       *v1.Pod
	ConfigMap *v1.ConfigMap
	Secret    *v1.Secret
}

// Key is the object's ObjectKey.
func (d *Desired) Key() string { return ObjectKey(d.Kind, d.Namespace, d.Name) }

// Index is the retained summary of a node's desired set: every live object with its generation
// and the digest of its exact desired payload, as of Revision. Revision is the node's counter at
// the time the index was written; every object generation is drawn from the same counter.
//
// A node applies an object only when its payload's digest matches the entry the current index has
// for it, deletes an object only when a newer index leaves it out, and never deletes because a
// message is missing (docs/protocol.md, section 5). The digests are what a signature over the index
// covers (the next step: signed desired state), so each object is covered through its digest.
type Index struct {
	APIVersion string                `json:"apiVersion"`
	Node       string                `json:"node"`
	Revision   int64                 `json:"revision"`
	Objects    map[string]IndexEntry `json:"objects"`
	// Signature is the writer's, over IndexSigningBytes; required by a node with trust anchors.
	Signature *Signature `json:"signature,omitempty"`
	// PayloadDigest is the Digest of the payload DecodeIndex read it from (not sent: it is the
	// payload's own). Acks name the index a node runs by this digest. Empty for an index built
	// in memory.
	PayloadDigest string `json:"-"`
}

// IndexEntry is one object of an index: its generation and the digest of its desired payload.
type IndexEntry struct {
	Generation int64  `json:"generation"`
	Digest     string `json:"digest"`
}

// StatusSummary is the node's retained summary of what it keeps on the broker: how many live (not
// deleted) pod status topics, and a digest over every retained topic it keeps up to date (each
// live pod status, the node status and the acks). It is published after what it sums up, so a
// reader can tell a partial read from a whole one (Pods), and the node, reading its own summary
// back on every connection, can tell a broker that lost retained messages (Digest).
type StatusSummary struct {
	APIVersion string `json:"apiVersion"`
	Node       string `json:"node"`
	Pods       int    `json:"pods"`
	Digest     string `json:"digest"`
}

// Liveness is the payload of the retained online topic and of the Last Will. Session grows with
// every connection of the node, so a Will from an older session, delivered late, is recognisably
// stale: readers ignore an offline whose session is below the newest online they saw, and the node
// republishes its online message when it sees one.
type Liveness struct {
	APIVersion string    `json:"apiVersion"`
	Node       string    `json:"node"`
	Online     bool      `json:"online"`
	Session    int64     `json:"session"`
	Time       time.Time `json:"time,omitzero"` // the node's clock: informational only
	Version    string    `json:"version,omitempty"`
}

// NodeStatus is the node's retained status, republished only when something that matters changed.
type NodeStatus struct {
	APIVersion string    `json:"apiVersion"`
	Node       string    `json:"node"`
	Time       time.Time `json:"time,omitzero"`
	Object     *v1.Node  `json:"object"`
}

// PodStatus is a pod's retained, latest-only status. Generation is the desired generation the node
// runs (observedGeneration; 0 for pods from the node's manifest dir). A pod gone from the node
// is reported once with Deleted set.
type PodStatus struct {
	APIVersion string    `json:"apiVersion"`
	Node       string    `json:"node"`
	Namespace  string    `json:"namespace"`
	Name       string    `json:"name"`
	UID        types.UID `json:"uid,omitempty"`
	Source     string    `json:"source"` // "file" or "mqtt"
	Generation int64     `json:"observedGeneration"`
	Deleted    bool      `json:"deleted,omitempty"`
	Time       time.Time `json:"time,omitzero"`
	// Object is the pod as the node runs it: metadata, spec and status.
	Object *v1.Pod `json:"object,omitempty"`
}

// ObjectRef names what an event is about.
type ObjectRef struct {
	Kind      string    `json:"kind"`
	Namespace string    `json:"namespace,omitempty"`
	Name      string    `json:"name,omitempty"`
	UID       types.UID `json:"uid,omitempty"`
}

// Event is one event from the node (not retained: events are a stream, bounded in the outbox).
type Event struct {
	APIVersion string    `json:"apiVersion"`
	Node       string    `json:"node"`
	Time       time.Time `json:"time,omitzero"`
	Type       string    `json:"type"` // Normal or Warning
	Reason     string    `json:"reason"`
	Message    string    `json:"message"`
	Object     ObjectRef `json:"object"`
	Source     string    `json:"source,omitempty"`
	// Dropped is how many events the node's outbox dropped (oldest first, because it was full)
	// since the last event that reached the broker.
	Dropped uint64 `json:"dropped,omitempty"`
}

// Acks is the node's retained statement of what it has taken in: the index it compared against
// (revision and the digest of its payload), and the entries of that index it has not applied:
// refused (with why) or missing (not received yet, asked for again). Every other entry of that
// index is applied. An object that the node's current index does not list is gone from the node.
// It is how the control plane knows what the node runs, when a deletion took effect, and where the
// node's counter stands after a broker lost its retained state.
//
// Acks are compact (Compact set) while the broker holds the index the node runs: a reader takes
// the applied entries from that index (AppliedIn), so an acks costs O(exceptions), not O(desired
// set), on every change. When the node finds the broker without that index (none after a
// reconnect, an older one, another writer's of the same revision), after it starts, or before it
// has any index, it publishes complete acks: Applied lists every applied entry (and Index the
// signed index), which is what a writer rebuilds the index from. The flag is on the compact form
// so that a strict decoder that predates it refuses compact acks instead of reading "nothing
// applied" into them.
type Acks struct {
	APIVersion    string `json:"apiVersion"`
	Node          string `json:"node"`
	Session       int64  `json:"session"`
	IndexRevision int64  `json:"indexRevision"`
	// IndexDigest is the digest of the index payload compared against; two different indexes with
	// one revision (two writers at once) have different digests.
	IndexDigest string `json:"indexDigest,omitempty"`
	// Compact says Applied is left out: the applied entries are those of the index named above
	// that are neither refused nor missing. Otherwise Applied lists every applied entry.
	Compact bool                  `json:"compact,omitempty"`
	Applied map[string]IndexEntry `json:"applied,omitempty"`
	// Refused holds the entries the node refused (admission, policy, a payload it cannot decode),
	// by key. A refused generation is an outcome: it is not asked for again.
	Refused map[string]Refusal `json:"refused,omitempty"`
	// Missing holds the entries whose payload has not arrived (or arrived with another digest).
	Missing map[string]IndexEntry `json:"missing,omitempty"`
	// IndexRefused is the last index the node refused (stale, conflicting, invalid, unsigned or
	// forged), so a writer learns it without a live reader.
	IndexRefused *Refusal `json:"indexRefused,omitempty"`
	// Index is the payload of the index in force, in complete acks when it is signed: a writer
	// that rebuilds from the acks (the broker lost its index) verifies it, instead of trusting
	// entries a broker could have forged.
	Index json.RawMessage `json:"index,omitempty"`
}

// AppliedIn returns the entries the node applied, and whether the acks tell them: complete acks
// list them; compact acks tell them only against the index they name (x decoded from the payload
// whose digest the acks give), as that index's entries less the refused and missing ones.
func (a *Acks) AppliedIn(x *Index) (map[string]IndexEntry, bool) {
	if !a.Compact {
		return a.Applied, true
	}
	if x == nil || x.PayloadDigest == "" || x.PayloadDigest != a.IndexDigest || x.Revision != a.IndexRevision {
		return nil, false
	}
	out := make(map[string]IndexEntry, len(x.Objects))
	for k, e := range x.Objects {
		_, refused := a.Refused[k]
		_, missing := a.Missing[k]
		if !refused && !missing {
			out[k] = e
		}
	}
	return out, true
}

// Top is the highest revision or generation the acks mention: where the node's counter stands, so
// a writer that lost the retained index goes on above it. Every entry of an index is at or below
// its revision, so compact acks tell it as well as complete ones.
func (a *Acks) Top() int64 {
	top := a.IndexRevision
	for _, e := range a.Applied {
		top = max(top, e.Generation)
	}
	for _, e := range a.Missing {
		top = max(top, e.Generation)
	}
	for _, r := range a.Refused {
		top = max(top, r.Generation)
	}
	if a.IndexRefused != nil {
		top = max(top, a.IndexRefused.Generation)
	}
	return top
}

// Refusal is why a node did not apply a generation of an object (or, in Acks.IndexRefused, an
// index revision).
type Refusal struct {
	Generation int64  `json:"generation"`
	Digest     string `json:"digest,omitempty"`
	Reason     string `json:"reason"`
}

// ResyncRequest asks the control plane to publish the node's whole desired set again; the node
// also resubscribes, which makes the broker resend every retained desired message it still holds.
type ResyncRequest struct {
	APIVersion string   `json:"apiVersion"`
	Node       string   `json:"node"`
	Session    int64    `json:"session"`
	Reason     string   `json:"reason"`
	Missing    []string `json:"missing,omitempty"`
}

// Logs request operations.
const (
	LogsOpen   = "open"
	LogsRenew  = "renew"  // a following reader is still there
	LogsCancel = "cancel" // stop a stream now
	// LogsUsage asks for the node's CPU and memory use instead of a log: the reply's data is one
	// Usage in JSON, split over chunks like a log (docs/protocol.md section 9).
	LogsUsage = "usage"
)

// Usage is a node's CPU and memory use and its running containers', read from /proc and the
// containers' cgroups with cAdvisor's definitions (the figures of kubelet's /stats/summary and
// /metrics/resource).
type Usage struct {
	Time       time.Time        `json:"time"`
	Node       NodeUsage        `json:"node"`
	Containers []ContainerUsage `json:"containers"`
}

// NodeUsage is the node's use: CPU seconds busy since boot, and the root cgroup's memory working
// set; with the CPU count and MemTotal.
type NodeUsage struct {
	CPUSeconds            float64 `json:"cpuSeconds"`
	CPUs                  int     `json:"cpus"`
	MemoryWorkingSetBytes int64   `json:"memoryWorkingSetBytes"`
	MemoryCapacityBytes   int64   `json:"memoryCapacityBytes"`
}

// ContainerUsage is one running container's use: CPU seconds since it started, and its memory
// working set (usage minus inactive file pages).
type ContainerUsage struct {
	Namespace             string  `json:"namespace"`
	Pod                   string  `json:"pod"`
	Container             string  `json:"container"`
	ID                    string  `json:"id"`
	CPUSeconds            float64 `json:"cpuSeconds"`
	MemoryWorkingSetBytes int64   `json:"memoryWorkingSetBytes"`
}

// LogsRequest asks a node for a container's log. A follow stream ends on cancel, when the
// container's log ends for good, or when the requester stops renewing (see docs/protocol.md).
type LogsRequest struct {
	APIVersion string `json:"apiVersion"`
	ID         string `json:"id"`
	Op         string `json:"op"`
	Namespace  string `json:"namespace,omitempty"`
	Pod        string `json:"pod,omitempty"`
	Container  string `json:"container,omitempty"`
	Follow     bool   `json:"follow,omitempty"`
	// Tail is the number of last lines to send; 0 or less means the whole log.
	Tail     int64 `json:"tail,omitempty"`
	Previous bool  `json:"previous,omitempty"`
	// SinceSeconds keeps only the lines logged in the last that many seconds; 0 keeps all.
	SinceSeconds int64 `json:"sinceSeconds,omitempty"`
	// Timestamps puts each line's RFC 3339 timestamp (nanoseconds) first.
	Timestamps bool `json:"timestamps,omitempty"`
	// SinceTime keeps only the lines logged at or after it (RFC 3339, UTC); zero keeps all. At most
	// one of SinceSeconds and SinceTime is set.
	SinceTime time.Time `json:"sinceTime,omitzero"`
	// Expires and Signature: a node with trust anchors serves only requests signed by one of
	// them (SignLogsRequest), before they expire, each ID once.
	Expires   time.Time  `json:"expires,omitzero"`
	Signature *Signature `json:"signature,omitempty"`
}

// LogsChunk is one reply to a LogsRequest. Seq starts at 0 and grows by one per chunk, so the
// requester can tell a lost chunk. The last chunk has EOF set, with Error when the request failed.
type LogsChunk struct {
	APIVersion string `json:"apiVersion"`
	ID         string `json:"id"`
	Seq        int64  `json:"seq"`
	Data       []byte `json:"data,omitempty"`
	EOF        bool   `json:"eof,omitempty"`
	Error      string `json:"error,omitempty"`
}

// NewDesired wraps an object (a *v1.Pod, *v1.ConfigMap or *v1.Secret) for node at generation.
// The object's namespace defaults to "default", as the node's admission would default it.
func NewDesired(node string, generation int64, obj any) (*Desired, error) {
	var kind ObjectKind
	var namespace, name string
	switch o := obj.(type) {
	case *v1.Pod:
		kind, namespace, name = KindPod, o.Namespace, o.Name
	case *v1.ConfigMap:
		kind, namespace, name = KindConfigMap, o.Namespace, o.Name
	case *v1.Secret:
		kind, namespace, name = KindSecret, o.Namespace, o.Name
	default:
		return nil, fmt.Errorf("desired object of type %T: only pods, configMaps and secrets are carried", obj)
	}
	if namespace == "" {
		namespace = "default"
	}
	if err := ValidateObjectName(kind, namespace, name); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encode %s %s/%s: %w", kind, namespace, name, err)
	}
	return &Desired{APIVersion: APIVersion, Kind: kind, Node: node, Namespace: namespace, Name: name,
		Generation: generation, Object: raw}, nil
}

// Digest is the digest an index entry carries for a desired payload: SHA-256 of the exact bytes,
// lowercase hex.
func Digest(payload []byte) string {
	sum := sha256.Sum256(payload)
	return hex.EncodeToString(sum[:])
}

// validDigest says whether s has the form Digest returns.
func validDigest(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// AnnotationPodDeletion is the node status annotation by which a node says how it takes a pod that
// its control plane is deleting (docs/protocol.md section 4.3). With the value
// PodDeletionGraceful, a desired pod listed with metadata.deletionTimestamp is a deletion: the node
// stops it with metadata.deletionGracePeriodSeconds (the shorter, if a later version shortens it)
// and reports it deleted, and a writer keeps it listed until then. A node without it (an older
// agent) would keep running such a pod: a writer deletes from it by an index that leaves the pod
// out, which stops the pod with its spec's grace period.
const AnnotationPodDeletion = "mqlet.io/pod-deletion"

// PodDeletionGraceful is AnnotationPodDeletion's value for the graceful deletion it describes.
const PodDeletionGraceful = "graceful"
