// Package source defines how desired pods reach the agent: every source (the manifest dir, the
// MQTT downlink, a test's fake) only parses and delivers Changes; the agent admits, stores and runs
// them. The types here are shared by the agent, the store (a Ref is kept with each desired pod) and
// the sources, so this package imports nothing of theirs.
package source

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
)

// Kind names a source. Two sources of different kinds may not claim the same namespace/name.
type Kind string

const (
	// File pods come from the manifest dir and are trusted like kubelet's static pods.
	File Kind = "file"
	// MQTT pods come from the control plane over MQTT and obey the agent's policy.
	MQTT Kind = "mqtt"
)

// Ref says where a desired pod came from. It is stored with the pod, so it must stay a plain value.
type Ref struct {
	Kind Kind `json:"kind"`
	// Origin is where inside the source: a manifest file's absolute path, an MQTT topic.
	Origin string `json:"origin,omitempty"`
	// Doc is the 0-based index of the document within a manifest file (non-blank documents only).
	Doc int `json:"doc,omitempty"`
}

func (r Ref) String() string {
	if r.Kind == File {
		if r.Doc < 0 { // the whole file
			return "file " + r.Origin
		}
		return fmt.Sprintf("file %s#%d", r.Origin, r.Doc)
	}
	if r.Origin == "" {
		return string(r.Kind)
	}
	return string(r.Kind) + " " + r.Origin
}

// Op is what a Change does.
type Op int

const (
	// Upsert adds or replaces the pods in Items.
	Upsert Op = iota + 1
	// Delete removes the pods named by Keys ("namespace/name").
	Delete
	// Resync says "Items is my whole set now": pods of this source not in it go away, except
	// those whose origin has a Rejection with Keep set.
	Resync
)

func (o Op) String() string {
	switch o {
	case Upsert:
		return "upsert"
	case Delete:
		return "delete"
	case Resync:
		return "resync"
	}
	return fmt.Sprintf("op(%d)", int(o))
}

// Item is one parsed desired pod. The pod is as the source decoded it: not defaulted, not
// validated; admission does that for every source alike.
type Item struct {
	Pod *v1.Pod
	Ref Ref
	// Generation only grows for a given namespace/name within a source; 0 when the source has
	// no notion of it (the manifest dir). A stored pod is not replaced by a lower generation.
	Generation int64
}

// Key is the "namespace/name" of a pod, the default namespace filled in.
func Key(p *v1.Pod) string {
	ns := p.Namespace
	if ns == "" {
		ns = "default"
	}
	return ns + "/" + p.Name
}

// Rejection is a manifest or message the source could not turn into a pod (or the agent refused).
type Rejection struct {
	Ref Ref
	// Key is "namespace/name" when known.
	Key string
	// Line is the 1-based line where the document starts, when known.
	Line   int
	Reason string
	// Keep marks a whole origin as unreadable right now (an unreadable, truncated or empty
	// file): the pods stored from it stay as they are until the origin reads cleanly again or
	// goes away. A half-written file at power loss must not delete its pods.
	Keep bool
}

func (r Rejection) Error() string {
	where := r.Ref.String()
	if r.Line > 0 {
		where += fmt.Sprintf(" (line %d)", r.Line)
	}
	if r.Key != "" {
		return fmt.Sprintf("%s: pod %s: %s", where, r.Key, r.Reason)
	}
	return where + ": " + r.Reason
}

// Change is one delivery from a source.
type Change struct {
	Op    Op
	Items []Item   // Upsert, Resync
	Keys  []string // Delete
	// Rejections: for Resync, every rejection the source has now (it replaces the last list);
	// for Upsert, rejections about these items.
	Rejections []Rejection
}

// Result is what the agent made of a Change, so a source can report a durable outcome for each
// thing it delivered (the MQTT source acknowledges or refuses every object it receives).
type Result struct {
	// Rejected holds, by pod key ("namespace/name"), why a pod of the change was refused
	// (validation, policy, a name another source holds). A refused pod is not stored.
	Rejected map[string]string
	// Err is set when the change could not be stored: nothing of it was acted on, and delivering
	// it again is how to retry.
	Err error
}

// Source delivers desired pods. Run calls deliver from one goroutine, in order, until ctx ends or
// the source fails; a Resync must come first so the agent knows when every source has spoken.
type Source interface {
	Kind() Kind
	Run(ctx context.Context, deliver func(Change) Result) error
}
