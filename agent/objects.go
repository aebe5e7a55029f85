package agent

import (
	"github.com/mqlet/mqlet/agent/pod"
	"github.com/mqlet/mqlet/agent/podspec"
)

// ObjectChanged tells the workers of the pods that use the ConfigMap or Secret (kind
// podspec.KindConfigMap or KindSecret) namespace/name that it was added, changed or removed: a
// container waiting for it is tried again now, and its mounted volumes are rewritten. Env of
// running containers is not changed, as with kubelet. It does no I/O under a.mu.
func (a *Agent) ObjectChanged(kind, namespace, name string) {
	a.mu.Lock()
	var ws []*pod.Worker
	for uid, d := range a.desired {
		if w := a.workers[uid]; w != nil && d.Pod.Namespace == namespace && podspec.UsesObject(&d.Pod.Spec, kind, name) {
			ws = append(ws, w)
		}
	}
	a.mu.Unlock()
	for _, w := range ws {
		w.ObjectsChanged()
	}
}
