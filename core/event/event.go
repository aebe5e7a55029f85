// Package event defines what the node tells its operator and control plane happened, in the shape
// of Kubernetes events (a type, a CamelCase reason, a message, the object it is about), so the
// MQTT uplink and the bridge can pass them on as v1 Events without translating meaning. It is a
// leaf package: the agent emits, the uplink sinks, and neither imports the other for it.
package event

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Type is Kubernetes' event type: Normal or Warning.
type Type string

const (
	Normal  Type = "Normal"
	Warning Type = "Warning"
)

// Reasons the agent emits, CamelCase as kubelet's are, so they can be matched on and counted.
const (
	// ReasonRejected: a source could not turn something into a pod, or admission refused it.
	ReasonRejected = "Rejected"
	// ReasonNameClash: a source declares a namespace/name that another source already defines.
	ReasonNameClash = "NameClash"
	// ReasonDuplicateUID: a pod declares a metadata.uid another pod already has.
	ReasonDuplicateUID = "DuplicateUID"
	// ReasonPolicyDenied: a pod from the control plane asks for more than the node's policy allows
	// (privileged, host namespaces, hostPath).
	ReasonPolicyDenied = "PolicyDenied"
	// ReasonStateFileSetAside: the state file was damaged; it was renamed and the node started
	// from empty state (a node event).
	ReasonStateFileSetAside = "StateFileSetAside"
	// ReasonStateFileRolledBack: the state file came from a newer mqlet that this binary cannot
	// read (a rollback after an update); it was kept aside and the newest older backup, or an
	// empty state, took its place (a node event).
	ReasonStateFileRolledBack = "StateFileRolledBack"
	// ReasonStateWriteFailed: a source change could not be written to the state file (a full
	// disk, say); the node keeps what it ran and retries until it is stored (a node event).
	ReasonStateWriteFailed = "StateWriteFailed"
	// ReasonStateWriteRecovered: the change a StateWriteFailed was about is stored now.
	ReasonStateWriteRecovered = "StateWriteRecovered"
)

// Kinds of Object.
const (
	KindPod       = "Pod"
	KindNode      = "Node"
	KindConfigMap = "ConfigMap"
	KindSecret    = "Secret"
)

// Object is what an event is about (Kubernetes' involvedObject). Namespace is empty for a Node; UID
// is empty when not known (a pod refused before it got one).
type Object struct {
	Kind      string
	Namespace string
	Name      string
	UID       types.UID
	// FieldPath names a part of the object, as Kubernetes' involvedObject.fieldPath does: the
	// container of a pod an event is about ("spec.containers{web}"); empty for the whole object.
	FieldPath string
}

// PodObject is the Object of an event about pod p.
func PodObject(p metav1.Object) Object {
	return Object{Kind: KindPod, Namespace: p.GetNamespace(), Name: p.GetName(), UID: p.GetUID()}
}

// NodeObject is the Object of an event about the node named name.
func NodeObject(name string) Object { return Object{Kind: KindNode, Name: name} }

// Event is one thing that happened on the node.
type Event struct {
	Time    time.Time
	Type    Type
	Reason  string // CamelCase: "Rejected", "NameClash", "PolicyDenied", ...
	Message string
	Object  Object
	// Source is where the event's cause came from, as source.Ref prints it:
	// "file /etc/mqlet/pods/a.yaml#0", "mqtt mqlet/v2/nodes/n/desired/pods/ns/x".
	Source string
}

// Sink receives events. Emit must not block: the agent calls it from the paths that apply desired
// state, and a link that is down must not stall them (the MQTT uplink queues).
type Sink interface {
	Emit(Event)
}

// SinkFunc lets a plain function be a Sink (tests, a logger).
type SinkFunc func(Event)

// Emit calls f(e).
func (f SinkFunc) Emit(e Event) { f(e) }
