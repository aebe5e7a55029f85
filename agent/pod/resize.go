package pod

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/ctrspec"
	"github.com/mqlet/mqlet/agent/qos"
	"github.com/mqlet/mqlet/core/event"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// resizer is the runtime's in-place resize (ctrd.Runtime.ResizeContainer). Runtimes without it
// replace a container whose resources changed.
type resizer interface {
	ResizeContainer(ctx context.Context, pod *v1.Pod, c *v1.Container, id string) error
}

// CanResizeInPlace reports whether the running attempt cur can take container c's new spec in place,
// as kubelet's in-place resize: the spec changed in nothing but the cpu and memory requests and
// limits, no limit was added or removed, each changed resource's resizePolicy is NotRequired (the
// default), the memory limit does not decrease, and the pod's QoS class stays. Otherwise it says why not, and the container is
// replaced. A container made before mqlet resized in place (no labels for it) is replaced too.
func CanResizeInPlace(pod *v1.Pod, c *v1.Container, cur *ctrd.Container) (bool, string) {
	if cur.ResizeBase == "" || cur.Resources == "" {
		return false, "the container was made before in-place resize"
	}
	if cur.ResizeBase != ctrspec.ResizeBase(pod, c) {
		return false, "more than its resources changed"
	}
	if cur.QOSClass != string(qos.Class(&pod.Spec)) {
		return false, "the pod's QoS class changed"
	}
	var old v1.ResourceRequirements
	if err := json.Unmarshal([]byte(cur.Resources), &old); err != nil {
		return false, "its recorded resources are unreadable"
	}
	now := c.Resources
	if !equality.Semantic.DeepEqual(old.Claims, now.Claims) {
		return false, "its resource claims changed"
	}
	for _, name := range keys(old.Requests, now.Requests, old.Limits, now.Limits) {
		reqOld, inOldReq := old.Requests[name]
		reqNew, inNewReq := now.Requests[name]
		limOld, inOldLim := old.Limits[name]
		limNew, inNewLim := now.Limits[name]
		if inOldReq == inNewReq && reqOld.Cmp(reqNew) == 0 && inOldLim == inNewLim && limOld.Cmp(limNew) == 0 {
			continue
		}
		if name != v1.ResourceCPU && name != v1.ResourceMemory {
			return false, fmt.Sprintf("its %s changed (only cpu and memory resize in place)", name)
		}
		if inOldLim != inNewLim {
			return false, fmt.Sprintf("a %s limit was added or removed", name)
		}
		if p := policy(c, name); p != v1.NotRequired {
			return false, fmt.Sprintf("its %s resizePolicy is %s", name, p)
		}
		if name == v1.ResourceMemory && inNewLim && limNew.Cmp(limOld) < 0 {
			// Below what the container uses, cgroup v2 would reclaim and then OOM-kill it, and v1
			// refuse; a new container starts under the lower limit instead.
			return false, "its memory limit decreases"
		}
	}
	return true, ""
}

func keys(lists ...v1.ResourceList) []v1.ResourceName {
	seen := map[v1.ResourceName]bool{}
	var out []v1.ResourceName
	for _, l := range lists {
		for k := range l {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	return out
}

// policy is container c's resizePolicy for resource name; NotRequired when it sets none (the API's
// default).
func policy(c *v1.Container, name v1.ResourceName) v1.ResourceResizeRestartPolicy {
	for _, p := range c.ResizePolicy {
		if p.ResourceName == name {
			return p.RestartPolicy
		}
	}
	return v1.NotRequired
}

// resizeInPlace applies container c's new resources to its running attempt cur when it can
// (CanResizeInPlace), and reports whether it did; when it did not, the caller replaces the
// container as for any other change.
func (w *Worker) resizeInPlace(ctx context.Context, pod *v1.Pod, c *v1.Container, cur *ctrd.Container) bool {
	rz, ok := w.env.Runtime.(resizer)
	if !ok || cur.State != ctrd.StateRunning {
		return false
	}
	if ok, why := CanResizeInPlace(pod, c, cur); !ok {
		if cur.ResizeBase == ctrspec.ResizeBase(pod, c) { // only its resources changed: say why it restarts
			w.report(pod, event.Normal, "ResizeByRestart", fmt.Sprintf("Container %s is replaced to resize it: %s", c.Name, why), "container", c.Name)
		}
		return false
	}
	if err := rz.ResizeContainer(ctx, pod, c, cur.ID); err != nil {
		w.report(pod, event.Warning, "ResizeError", fmt.Sprintf("Container %s could not be resized in place, replacing it: %v", c.Name, err), "container", c.Name)
		return false
	}
	w.mutations++ // look again: its labels changed
	w.report(pod, event.Normal, "ResizeCompleted", fmt.Sprintf("Container %s resized in place: %s", c.Name, describeResources(c.Resources)), "container", c.Name)
	return true
}

func describeResources(r v1.ResourceRequirements) string {
	b, _ := json.Marshal(struct {
		Requests v1.ResourceList `json:"requests,omitempty"`
		Limits   v1.ResourceList `json:"limits,omitempty"`
	}{r.Requests, r.Limits})
	return string(b)
}
