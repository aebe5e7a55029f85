package pod

import (
	"github.com/mqlet/mqlet/agent/ctrd"
	v1 "k8s.io/api/core/v1"
)

// messageReader is implemented by runtimes that keep termination messages (ctrd.Runtime).
type messageReader interface {
	TerminationMessage(c ctrd.Container, spec *v1.Container) string
}

// maxPodTerminationMessages is kubelet's bound on the termination messages of all of a pod's
// containers together (MaxPodTerminationMessageLogLength): each container's status gets an even
// share, its message cut to it.
const maxPodTerminationMessages = 12 << 10

// exitMessage is the termination message read for one attempt.
type exitMessage struct {
	id, msg string
}

// addExitMessage puts in t what attempt cur of container name left as its termination message. It
// is read once per attempt: the status is computed at every sync, the file only changes while the
// container runs.
func (w *Worker) addExitMessage(t *v1.ContainerStateTerminated, name string, cur *ctrd.Container) {
	mr, ok := w.env.Runtime.(messageReader)
	if !ok {
		return
	}
	if m, ok := w.exitMsgs[name]; ok && m.id == cur.ID {
		t.Message = m.msg
		return
	}
	w.mu.Lock()
	pod := w.desired.Pod
	w.mu.Unlock()
	spec := containerSpec(pod, name)
	if spec == nil {
		return
	}
	msg := mr.TerminationMessage(*cur, spec)
	if share := maxPodTerminationMessages / (len(pod.Spec.Containers) + len(pod.Spec.InitContainers)); len(msg) > share {
		msg = msg[:share]
	}
	if w.exitMsgs == nil {
		w.exitMsgs = map[string]exitMessage{}
	}
	w.exitMsgs[name] = exitMessage{cur.ID, msg}
	t.Message = msg
}
