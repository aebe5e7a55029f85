package podevents

import (
	"fmt"

	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/store"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// AnnotationSource carries event.Event.Source (the manifest file or topic an event's cause came
// from), which a v1.Event has no field for.
const AnnotationSource = "mqlet.io/event-source"

// toV1 is a stored event as the Kubernetes Event kubelet's recorder would have made of it: named
// after the pod and its first time, as client-go names them.
func toV1(uid types.UID, namespace, name, node string, e store.EventRecord) v1.Event {
	ev := v1.Event{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Event"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s.%x", name, e.FirstTime.UnixNano()),
			Namespace: namespace,
		},
		InvolvedObject: v1.ObjectReference{Kind: event.KindPod, APIVersion: "v1", Namespace: namespace, Name: name,
			UID: uid, FieldPath: e.FieldPath},
		Reason:              e.Reason,
		Message:             e.Message,
		Source:              v1.EventSource{Component: Component, Host: node},
		FirstTimestamp:      metav1.NewTime(e.FirstTime),
		LastTimestamp:       metav1.NewTime(e.LastTime),
		Count:               e.Count,
		Type:                e.Type,
		ReportingController: Component,
		ReportingInstance:   node,
	}
	if e.Source != "" {
		ev.Annotations = map[string]string{AnnotationSource: e.Source}
	}
	return ev
}

// Reporter is the shape of the agent's Reporter (agent.Reporter), declared here so that this
// package does not import the agent.
type Reporter interface {
	PodStatus(d store.DesiredPod, st v1.PodStatus)
	PodGone(d store.DesiredPod)
	event.Sink
}

// Wrap returns a Reporter that records every event before handing it to next (unless the
// throttle holds it back), and forgets a pod's events when next is told the pod is gone. next may
// be nil (a standalone node reports to no one).
func (r *Recorder) Wrap(next Reporter) Reporter { return recording{rec: r, next: next} }

type recording struct {
	rec  *Recorder
	next Reporter
}

func (x recording) PodStatus(d store.DesiredPod, st v1.PodStatus) {
	if x.next != nil {
		x.next.PodStatus(d, st)
	}
}

func (x recording) PodGone(d store.DesiredPod) {
	if d.Pod != nil {
		x.rec.Forget(d.Pod.UID)
	}
	if x.next != nil {
		x.next.PodGone(d)
	}
}

func (x recording) Emit(e event.Event) {
	if x.rec.Record(e) && x.next != nil {
		x.next.Emit(e)
	}
}
