package protocol

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"
)

// DefaultPrefix is the topic prefix when none is configured. The version is part of it so that an
// incompatible contract can live beside this one on the same broker during a fleet upgrade.
const DefaultPrefix = "mqlet/v2"

// MaxPrefixLen bounds the prefix so topic names stay well under MQTT's 65,535-byte limit.
const MaxPrefixLen = 128

// Class is what a topic carries; see docs/protocol.md for the tree.
type Class string

const (
	// Downlink, written by the control plane, read by the node.
	ClassDesired     Class = "desired"  // <node>/desired/<kinds>/<namespace>/<name>, retained
	ClassIndex       Class = "index"    // <node>/index, retained
	ClassLogsRequest Class = "logs/req" // <node>/logs/req, not retained
	ClassExecRequest Class = "exec/req" // <node>/exec/req, not retained: opens and client frames

	// Uplink, written by the node.
	ClassLiveness   Class = "online"         // <node>/online, retained (and the Last Will)
	ClassNodeStatus Class = "status/node"    // <node>/status/node, retained
	ClassPodStatus  Class = "status/pods"    // <node>/status/pods/<namespace>/<name>, retained
	ClassSummary    Class = "status/summary" // <node>/status/summary, retained
	ClassEvents     Class = "events"         // <node>/events, not retained
	ClassAcks       Class = "acks"           // <node>/acks, retained
	ClassResync     Class = "resync"         // <node>/resync, not retained
	ClassLogsReply  Class = "logs/resp"      // <node>/logs/resp/<request id>, not retained
	ClassExecReply  Class = "exec/resp"      // <node>/exec/resp/<session id>, not retained
	// The node's own end-of-retained marker (docs/protocol.md section 10, done by the node for its
	// own subtree): written and read by the node only, not retained.
	ClassNodeMarker Class = "marker" // <node>/marker
)

// Topics builds and parses topic names under one prefix. The zero value is not usable: use
// NewTopics, which validates the prefix.
type Topics struct {
	prefix string
}

// NewTopics validates prefix (empty means DefaultPrefix).
func NewTopics(prefix string) (Topics, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if err := ValidatePrefix(prefix); err != nil {
		return Topics{}, err
	}
	return Topics{prefix: prefix}, nil
}

// MustTopics is NewTopics for prefixes known to be valid (constants, tests).
func MustTopics(prefix string) Topics {
	t, err := NewTopics(prefix)
	if err != nil {
		panic(err)
	}
	return t
}

// ValidatePrefix says why prefix cannot be a topic prefix (see PrefixProblems).
func ValidatePrefix(prefix string) error {
	if p := PrefixProblems(prefix); len(p) > 0 {
		return fmt.Errorf("topic prefix %q: %s", prefix, strings.Join(p, "; "))
	}
	return nil
}

// PrefixProblems lists why p cannot start every topic of a node: the MQTT rules for topic names
// (UTF-8, no NUL, no wildcards: a wildcard would make every node's topic a filter) and the ones
// that keep the ACL pattern <prefix>/nodes/%u/# meaningful (no empty levels, no leading or
// trailing '/', no broker-reserved '$' topics).
func PrefixProblems(p string) []string {
	if p == "" {
		return []string{"must not be empty"}
	}
	var out []string
	if len(p) > MaxPrefixLen {
		out = append(out, fmt.Sprintf("is %d bytes, longer than %d", len(p), MaxPrefixLen))
	}
	if !utf8.ValidString(p) {
		out = append(out, "must be valid UTF-8")
	}
	if strings.ContainsRune(p, 0) {
		out = append(out, "must not contain NUL")
	}
	if strings.ContainsAny(p, "+#") {
		out = append(out, "must not contain the MQTT wildcards + and #")
	}
	if strings.HasPrefix(p, "$") {
		out = append(out, "must not start with '$' (brokers reserve such topics, like $SYS)")
	}
	if strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") {
		out = append(out, "must not start or end with '/'")
	}
	if strings.Contains(p, "//") {
		out = append(out, "must not have empty levels ('//')")
	}
	return out
}

// Prefix is the validated prefix.
func (t Topics) Prefix() string { return t.prefix }

// Node is the root of a node's subtree: the ACL pattern "<prefix>/nodes/%u/#" covers all of it.
func (t Topics) Node(node string) string { return t.prefix + "/nodes/" + node }

// Desired is the retained topic of one desired object.
func (t Topics) Desired(node string, kind ObjectKind, namespace, name string) string {
	return t.Node(node) + "/desired/" + kind.Plural() + "/" + namespace + "/" + name
}

// DesiredFilter matches every desired object of a node.
func (t Topics) DesiredFilter(node string) string { return t.Node(node) + "/desired/#" }

func (t Topics) Index(node string) string       { return t.Node(node) + "/index" }
func (t Topics) Liveness(node string) string    { return t.Node(node) + "/online" }
func (t Topics) NodeStatus(node string) string  { return t.Node(node) + "/status/node" }
func (t Topics) Summary(node string) string     { return t.Node(node) + "/status/summary" }
func (t Topics) NodeMarker(node string) string  { return t.Node(node) + "/marker" }
func (t Topics) Events(node string) string      { return t.Node(node) + "/events" }
func (t Topics) Acks(node string) string        { return t.Node(node) + "/acks" }
func (t Topics) Resync(node string) string      { return t.Node(node) + "/resync" }
func (t Topics) LogsRequest(node string) string { return t.Node(node) + "/logs/req" }

// PodStatus is the retained status topic of one pod.
func (t Topics) PodStatus(node, namespace, name string) string {
	return t.Node(node) + "/status/pods/" + namespace + "/" + name
}

// PodStatusFilter matches every pod status of a node; node "+" matches every node's.
func (t Topics) PodStatusFilter(node string) string { return t.Node(node) + "/status/pods/#" }

// LogsReply is where the chunks answering one logs request go.
func (t Topics) LogsReply(node, id string) string { return t.Node(node) + "/logs/resp/" + id }

// ExecRequest is where exec sessions are opened and their client frames go (docs/protocol.md §9a).
func (t Topics) ExecRequest(node string) string { return t.Node(node) + "/exec/req" }

// ExecReply is where the node's frames of one exec session go.
func (t Topics) ExecReply(node, id string) string { return t.Node(node) + "/exec/resp/" + id }

// Marker is a reader's private topic for the end-of-retained marker (docs/protocol.md, "Reading
// retained state"): outside every node's subtree, so no node can write or read it.
func (t Topics) Marker(clientID string) string { return t.prefix + "/ctl/" + clientID + "/marker" }

// AllNodes matches topic class c of every node, for `mqlet ctl` and the bridge (never for a node:
// its ACL does not allow it).
func (t Topics) AllNodes(c Class) string {
	switch c {
	case ClassDesired, ClassPodStatus, ClassLogsReply, ClassExecReply:
		return t.prefix + "/nodes/+/" + string(c) + "/#"
	}
	return t.prefix + "/nodes/+/" + string(c)
}

// Topic is a parsed topic name.
type Topic struct {
	Class     Class
	Node      string
	Kind      ObjectKind // ClassDesired
	Namespace string     // ClassDesired, ClassPodStatus
	Name      string     // ClassDesired, ClassPodStatus
	ID        string     // ClassLogsReply
}

// Parse splits a topic name of this tree. Every segment that names something (node, namespace,
// name, request id) is validated, since those strings later become keys and file names.
func (t Topics) Parse(topic string) (Topic, error) {
	rest, ok := strings.CutPrefix(topic, t.prefix+"/nodes/")
	if !ok {
		return Topic{}, fmt.Errorf("topic %q is outside %s/nodes/", topic, t.prefix)
	}
	seg := strings.Split(rest, "/")
	if len(seg) < 2 {
		return Topic{}, fmt.Errorf("topic %q names no node subtree", topic)
	}
	out := Topic{Node: seg[0]}
	if err := ValidateNodeName(out.Node); err != nil {
		return Topic{}, fmt.Errorf("topic %q: %w", topic, err)
	}
	bad := func(why string) (Topic, error) { return Topic{}, fmt.Errorf("topic %q: %s", topic, why) }
	switch {
	case len(seg) == 2:
		switch c := Class(seg[1]); c {
		case ClassIndex, ClassLiveness, ClassEvents, ClassAcks, ClassResync, ClassNodeMarker:
			out.Class = c
		default:
			return bad(fmt.Sprintf("unknown topic %q under the node", seg[1]))
		}
	case seg[1] == "desired":
		if len(seg) != 5 {
			return bad("a desired object's topic is <node>/desired/<kinds>/<namespace>/<name>")
		}
		k, err := KindFromPlural(seg[2])
		if err != nil {
			return bad(err.Error())
		}
		out.Class, out.Kind, out.Namespace, out.Name = ClassDesired, k, seg[3], seg[4]
		if err := ValidateObjectName(k, out.Namespace, out.Name); err != nil {
			return bad(err.Error())
		}
	case seg[1] == "status" && len(seg) == 3 && seg[2] == "node":
		out.Class = ClassNodeStatus
	case seg[1] == "status" && len(seg) == 3 && seg[2] == "summary":
		out.Class = ClassSummary
	case seg[1] == "status" && len(seg) == 5 && seg[2] == "pods":
		out.Class, out.Kind, out.Namespace, out.Name = ClassPodStatus, KindPod, seg[3], seg[4]
		if err := ValidateObjectName(KindPod, out.Namespace, out.Name); err != nil {
			return bad(err.Error())
		}
	case seg[1] == "logs" && len(seg) == 3 && seg[2] == "req":
		out.Class = ClassLogsRequest
	case seg[1] == "logs" && len(seg) == 4 && seg[2] == "resp":
		out.Class, out.ID = ClassLogsReply, seg[3]
		if err := ValidateRequestID(out.ID); err != nil {
			return bad(err.Error())
		}
	case seg[1] == "exec" && len(seg) == 3 && seg[2] == "req":
		out.Class = ClassExecRequest
	case seg[1] == "exec" && len(seg) == 4 && seg[2] == "resp":
		out.Class, out.ID = ClassExecReply, seg[3]
		if err := ValidateRequestID(out.ID); err != nil {
			return bad(err.Error())
		}
	default:
		return bad("unknown topic under the node")
	}
	return out, nil
}

// ValidateNodeName: a node name is a DNS-1123 subdomain, as in Kubernetes; that also keeps MQTT
// wildcards and '/' out of it, since it is both a topic segment and the client id.
func ValidateNodeName(node string) error {
	if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
		return fmt.Errorf("node name %q is invalid: %s", node, strings.Join(errs, "; "))
	}
	return nil
}

// ValidateObjectName checks a namespace (DNS-1123 label) and object name (DNS-1123 subdomain).
func ValidateObjectName(kind ObjectKind, namespace, name string) error {
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return fmt.Errorf("namespace %q is invalid: %s", namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("%s name %q is invalid: %s", kind, name, strings.Join(errs, "; "))
	}
	return nil
}

// ValidateRequestID: request ids become topic segments; keep them short and plain.
func ValidateRequestID(id string) error {
	if id == "" || len(id) > 64 {
		return fmt.Errorf("request id %q must be 1 to 64 characters", id)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("request id %q may hold only letters, digits, '-' and '_'", id)
		}
	}
	return nil
}
