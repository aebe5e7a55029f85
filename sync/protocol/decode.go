package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	sigsjson "sigs.k8s.io/json"
)

// ErrTooLarge is wrapped by every decoder when a payload exceeds the size limit.
var ErrTooLarge = errors.New("payload too large")

// Decoding is strict: unknown and duplicate fields are refused, so a payload from a newer or
// broken control plane is reported instead of being half-applied. Every decoder checks the size
// first, so an oversized payload costs no parsing.
func decodeStrict(payload []byte, max int, what string, v any) error {
	if max <= 0 {
		max = DefaultMaxPayload
	}
	if len(payload) > max {
		return fmt.Errorf("%s: %w: %d bytes, the limit is %d", what, ErrTooLarge, len(payload), max)
	}
	if len(payload) == 0 {
		return fmt.Errorf("%s: empty payload", what)
	}
	strict, err := sigsjson.UnmarshalStrict(payload, v)
	if err != nil {
		return fmt.Errorf("%s: invalid JSON: %w", what, err)
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		return fmt.Errorf("%s: %s", what, strings.Join(msgs, "; "))
	}
	return nil
}

func checkAPIVersion(got, what string) error {
	if got != APIVersion {
		return fmt.Errorf("%s: apiVersion %q, want %q", what, got, APIVersion)
	}
	return nil
}

// payload is every message type of the contract: each carries the contract's apiVersion.
type payload interface{ apiVersion() *string }

func (x *Desired) apiVersion() *string       { return &x.APIVersion }
func (x *Index) apiVersion() *string         { return &x.APIVersion }
func (x *Liveness) apiVersion() *string      { return &x.APIVersion }
func (x *NodeStatus) apiVersion() *string    { return &x.APIVersion }
func (x *PodStatus) apiVersion() *string     { return &x.APIVersion }
func (x *Event) apiVersion() *string         { return &x.APIVersion }
func (x *Acks) apiVersion() *string          { return &x.APIVersion }
func (x *StatusSummary) apiVersion() *string { return &x.APIVersion }
func (x *ResyncRequest) apiVersion() *string { return &x.APIVersion }
func (x *LogsRequest) apiVersion() *string   { return &x.APIVersion }
func (x *LogsChunk) apiVersion() *string     { return &x.APIVersion }

// decodePayload is the common part of every decoder: size, strict JSON, apiVersion.
func decodePayload[T any, P interface {
	*T
	payload
}](data []byte, max int, what string) (P, error) {
	x := P(new(T))
	if err := decodeStrict(data, max, what, x); err != nil {
		return nil, err
	}
	if err := checkAPIVersion(*x.apiVersion(), what); err != nil {
		return nil, err
	}
	return x, nil
}

// DecodeDesired decodes a desired object's payload received on topic t (already parsed with
// Topics.Parse, so its names are valid) and checks that the payload is about exactly that object:
// same node, kind, namespace and name in the envelope and in the object.
func DecodeDesired(t Topic, payload []byte, max int) (*DesiredObject, error) {
	what := "desired " + strings.ToLower(string(t.Kind))
	if t.Class != ClassDesired {
		return nil, fmt.Errorf("%s: topic class %q is not desired", what, t.Class)
	}
	var d DesiredObject
	if err := decodeStrict(payload, max, what, &d.Desired); err != nil {
		return nil, err
	}
	if err := checkAPIVersion(d.APIVersion, what); err != nil {
		return nil, err
	}
	switch {
	case d.Kind != t.Kind:
		return nil, fmt.Errorf("%s: payload kind %q does not match the topic's %q", what, d.Kind, t.Kind)
	case d.Node != t.Node:
		return nil, fmt.Errorf("%s: payload is for node %q, not %q", what, d.Node, t.Node)
	case d.Namespace != t.Namespace || d.Name != t.Name:
		return nil, fmt.Errorf("%s: payload names %s/%s, the topic %s/%s", what, d.Namespace, d.Name, t.Namespace, t.Name)
	case d.Generation <= 0:
		return nil, fmt.Errorf("%s %s/%s: generation %d, must be positive", what, d.Namespace, d.Name, d.Generation)
	}
	if len(d.Object) == 0 || string(d.Object) == "null" {
		return nil, fmt.Errorf("%s %s/%s: no object (an object is deleted by an index that leaves it out)", what, d.Namespace, d.Name)
	}
	var kind, apiVersion, namespace, name string
	switch d.Kind {
	case KindPod:
		d.Pod = new(v1.Pod)
		if err := decodeStrict(d.Object, max, what+" object", d.Pod); err != nil {
			return nil, err
		}
		kind, apiVersion, namespace, name = d.Pod.Kind, d.Pod.APIVersion, d.Pod.Namespace, d.Pod.Name
	case KindConfigMap:
		d.ConfigMap = new(v1.ConfigMap)
		if err := decodeStrict(d.Object, max, what+" object", d.ConfigMap); err != nil {
			return nil, err
		}
		kind, apiVersion, namespace, name = d.ConfigMap.Kind, d.ConfigMap.APIVersion, d.ConfigMap.Namespace, d.ConfigMap.Name
	case KindSecret:
		d.Secret = new(v1.Secret)
		if err := decodeStrict(d.Object, max, what+" object", d.Secret); err != nil {
			return nil, err
		}
		kind, apiVersion, namespace, name = d.Secret.Kind, d.Secret.APIVersion, d.Secret.Namespace, d.Secret.Name
	default:
		return nil, fmt.Errorf("%s: unknown kind %q", what, d.Kind)
	}
	if kind != "" && kind != string(d.Kind) {
		return nil, fmt.Errorf("%s %s/%s: object kind %q", what, d.Namespace, d.Name, kind)
	}
	if apiVersion != "" && apiVersion != "v1" {
		return nil, fmt.Errorf("%s %s/%s: object apiVersion %q, want v1", what, d.Namespace, d.Name, apiVersion)
	}
	if namespace == "" {
		namespace = "default"
	}
	if namespace != d.Namespace || name != d.Name {
		return nil, fmt.Errorf("%s: object is %s/%s, the envelope says %s/%s", what, namespace, name, d.Namespace, d.Name)
	}
	if d.Sealed != nil {
		switch {
		case d.Secret == nil:
			return nil, fmt.Errorf("%s %s/%s: only a secret's data is sealed", what, d.Namespace, d.Name)
		case len(d.Secret.Data) > 0 || len(d.Secret.StringData) > 0:
			return nil, fmt.Errorf("%s %s/%s: sealed, yet it also carries data in clear", what, d.Namespace, d.Name)
		case d.Sealed.KeyID == "" || len(d.Sealed.Ciphertext) == 0:
			return nil, fmt.Errorf("%s %s/%s: sealed data without a key id or ciphertext", what, d.Namespace, d.Name)
		}
	}
	return &d, nil
}

// DecodeIndex decodes and validates a node's index.
func DecodeIndex(t Topic, payload []byte, max int) (*Index, error) {
	x, err := decodePayload[Index](payload, max, "index")
	if err != nil {
		return nil, err
	}
	if x.Node != t.Node {
		return nil, fmt.Errorf("index: payload is for node %q, not %q", x.Node, t.Node)
	}
	if x.Revision <= 0 {
		return nil, fmt.Errorf("index: revision %d, must be positive", x.Revision)
	}
	if x.Objects == nil {
		x.Objects = map[string]IndexEntry{}
	}
	x.PayloadDigest = Digest(payload)
	if x.Signature != nil {
		if err := validSignatureShape(x.Signature); err != nil {
			return nil, fmt.Errorf("index: %w", err)
		}
	}
	for k, e := range x.Objects {
		if _, _, _, err := ParseObjectKey(k); err != nil {
			return nil, fmt.Errorf("index: %w", err)
		}
		if e.Generation <= 0 || e.Generation > x.Revision {
			return nil, fmt.Errorf("index: %s has generation %d, outside 1..%d (the index revision)", k, e.Generation, x.Revision)
		}
		if !validDigest(e.Digest) {
			return nil, fmt.Errorf("index: %s has digest %q, want 64 lowercase hex digits (SHA-256 of the desired payload)", k, e.Digest)
		}
	}
	return x, nil
}

// DecodeLiveness decodes an online message or Will.
func DecodeLiveness(payload []byte, max int) (*Liveness, error) {
	x, err := decodePayload[Liveness](payload, max, "liveness")
	if err != nil {
		return nil, err
	}
	if x.Session <= 0 {
		return nil, fmt.Errorf("liveness: session %d, must be positive", x.Session)
	}
	return x, nil
}

// IsStaleOffline is true when payload is an offline message from a session older than current:
// an earlier connection's Will that the broker delivered after the newer connection came up.
func IsStaleOffline(payload []byte, current int64) bool {
	l, err := DecodeLiveness(payload, DefaultMaxPayload)
	return err == nil && !l.Online && l.Session < current
}

// DecodeNodeStatus decodes a node status message.
func DecodeNodeStatus(payload []byte, max int) (*NodeStatus, error) {
	x, err := decodePayload[NodeStatus](payload, max, "node status")
	if err != nil {
		return nil, err
	}
	if x.Object == nil {
		return nil, errors.New("node status: no object")
	}
	return x, nil
}

// DecodePodStatus decodes a pod status message.
func DecodePodStatus(payload []byte, max int) (*PodStatus, error) {
	x, err := decodePayload[PodStatus](payload, max, "pod status")
	if err != nil {
		return nil, err
	}
	return x, nil
}

// DecodeEvent decodes an event.
func DecodeEvent(payload []byte, max int) (*Event, error) {
	return decodePayload[Event](payload, max, "event")
}

// DecodeAcks decodes a node's acknowledgements.
func DecodeAcks(payload []byte, max int) (*Acks, error) {
	return decodePayload[Acks](payload, max, "acks")
}

// DecodeStatusSummary decodes a node's pod status summary.
func DecodeStatusSummary(payload []byte, max int) (*StatusSummary, error) {
	x, err := decodePayload[StatusSummary](payload, max, "status summary")
	if err != nil {
		return nil, err
	}
	if x.Pods < 0 {
		return nil, fmt.Errorf("status summary: %d pods, must not be negative", x.Pods)
	}
	return x, nil
}

// DecodeResync decodes a resync request.
func DecodeResync(payload []byte, max int) (*ResyncRequest, error) {
	return decodePayload[ResyncRequest](payload, max, "resync request")
}

// DecodeLogsRequest decodes and validates a logs request. The names are validated here because
// the agent turns them into a log file path.
func DecodeLogsRequest(payload []byte, max int) (*LogsRequest, error) {
	x, err := decodePayload[LogsRequest](payload, max, "logs request")
	if err != nil {
		return nil, err
	}
	if err := ValidateRequestID(x.ID); err != nil {
		return nil, fmt.Errorf("logs request: %w", err)
	}
	if x.Signature != nil {
		if err := validSignatureShape(x.Signature); err != nil {
			return nil, fmt.Errorf("logs request %s: %w", x.ID, err)
		}
	}
	switch x.Op {
	case LogsOpen:
		if err := ValidateObjectName(KindPod, x.Namespace, x.Pod); err != nil {
			return nil, fmt.Errorf("logs request %s: %w", x.ID, err)
		}
		if x.Container != "" {
			// Container names are DNS-1123 labels in Kubernetes.
			if errs := validation.IsDNS1123Label(x.Container); len(errs) > 0 {
				return nil, fmt.Errorf("logs request %s: container name %q is invalid: %s", x.ID, x.Container, strings.Join(errs, "; "))
			}
		}
		if x.SinceSeconds < 0 {
			return nil, fmt.Errorf("logs request %s: sinceSeconds %d must not be negative", x.ID, x.SinceSeconds)
		}
		if x.SinceSeconds > 0 && !x.SinceTime.IsZero() {
			return nil, fmt.Errorf("logs request %s: at most one of sinceSeconds and sinceTime may be set", x.ID)
		}
	case LogsRenew, LogsCancel, LogsUsage:
	default:
		return nil, fmt.Errorf("logs request %s: unknown op %q (want open, renew, cancel or usage)", x.ID, x.Op)
	}
	return x, nil
}

// DecodeLogsChunk decodes one logs reply.
func DecodeLogsChunk(payload []byte, max int) (*LogsChunk, error) {
	x, err := decodePayload[LogsChunk](payload, max, "logs chunk")
	if err != nil {
		return nil, err
	}
	if len(x.Data) > MaxLogChunk {
		return nil, fmt.Errorf("logs chunk %s/%d: %d bytes of data, more than %d", x.ID, x.Seq, len(x.Data), MaxLogChunk)
	}
	return x, nil
}

// Encode marshals any payload of this package. It exists so every writer fills APIVersion the
// same way; the value's APIVersion field is set if empty.
func Encode(v any) ([]byte, error) {
	x, ok := v.(payload)
	if !ok {
		return nil, fmt.Errorf("encode %T: not a protocol payload", v)
	}
	if p := x.apiVersion(); *p == "" {
		*p = APIVersion
	}
	return json.Marshal(v)
}
