package agent

import (
	"time"

	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/store"
)

// fieldWarnings are the Warning events for the fields of a newly stored pod (or a new version of
// it) that mqlet accepts without acting on them, as kubelet would ignore them on this node
// (admission.FieldRules): one per field, naming its path. A resync that changes nothing stores
// nothing and so repeats none.
func fieldWarnings(d store.DesiredPod, now time.Time) []event.Event {
	var out []event.Event
	for _, msg := range admission.FieldWarnings(d.Pod) {
		out = append(out, event.Event{Time: now, Type: event.Warning, Reason: admission.ReasonFieldIgnored, Message: msg,
			Object: event.PodObject(d.Pod), Source: d.Source.String()})
	}
	return out
}
