package eviction

import (
	"fmt"
	"time"

	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/agent/event"
	"github.com/mqlet/mqlet/hw"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Local storage isolation, kubelet's localStorageEviction for emptyDir volumes: a pod whose
// disk-backed emptyDir holds more than its sizeLimit is evicted, whatever the node's thresholds.
// Memory-backed emptyDirs need no watch: their tmpfs is no larger than the limit.

// SignalEmptyDirFsLimit counts evictions for an emptyDir over its sizeLimit (kubelet's metric label).
const SignalEmptyDirFsLimit Signal = "emptydirfs.limit"

// emptyDirsOverLimit looks at every active pod's disk emptyDirs that have a sizeLimit and evicts
// the first pod found with one over it, as kubelet does before judging thresholds. It returns the
// evicted pod. Critical pods (manifest-dir pods, like kubelet's static pods) are never evicted:
// the overuse is logged once per pod spec instead.
func (m *Manager) emptyDirsOverLimit() *Pod {
	if m.o.EmptyDirPath == nil {
		return nil
	}
	pods := m.o.Pods.List()
	seen := map[types.UID]bool{}
	for _, p := range pods {
		seen[p.Pod.UID] = true
	}
	for uid := range m.overLimitLogged {
		if !seen[uid] {
			delete(m.overLimitLogged, uid)
		}
	}
	for _, p := range pods {
		if !active(p.Pod) {
			continue
		}
		if hash, ok := m.evicted[p.Pod.UID]; ok && hash == configHash(p.Pod) {
			continue // evicted already, still stopping
		}
		name, limit, used, over := m.emptyDirOver(p.Pod)
		if !over {
			continue
		}
		msg := fmt.Sprintf("Usage of EmptyDir volume %q exceeds the limit %q. ", name, limit)
		if why := admission.CriticalReason(p.Pod, p.Source); why != "" {
			key := configHash(p.Pod) + "/" + name
			if m.overLimitLogged == nil {
				m.overLimitLogged = map[types.UID]string{}
			}
			if m.overLimitLogged[p.Pod.UID] != key {
				m.overLimitLogged[p.Pod.UID] = key
				m.log.Warn("eviction: emptyDir over its sizeLimit, but the pod is never evicted", "pod", p.Pod.Namespace+"/"+p.Pod.Name,
					"why", why, "volume", name, "sizeLimit", limit, "used at least", used)
			}
			continue
		}
		zero := time.Duration(0) // kubelet evicts for local storage at once, without grace
		m.log.Warn("eviction: evicting pod", "pod", p.Pod.Namespace+"/"+p.Pod.Name, "uid", p.Pod.UID,
			"signal", SignalEmptyDirFsLimit, "volume", name, "used at least", used, "message", msg)
		m.emit(event.Event{Time: time.Now(), Type: event.Warning, Reason: Reason, Message: msg,
			Object: event.PodObject(p.Pod), Source: p.Source.String()})
		if !m.o.Pods.Evict(p.Pod.UID, msg, &zero) {
			continue
		}
		m.evicted[p.Pod.UID] = configHash(p.Pod)
		m.mu.Lock()
		m.evictions[SignalEmptyDirFsLimit]++
		m.mu.Unlock()
		return &p
	}
	return nil
}

// emptyDirOver finds the first disk-backed emptyDir of pod with a sizeLimit that it exceeds, with
// what was counted of it (the walk stops at the limit, so at least that much is used).
func (m *Manager) emptyDirOver(pod *v1.Pod) (name, limit string, used int64, over bool) {
	for _, v := range pod.Spec.Volumes {
		ed := v.EmptyDir
		if ed == nil || ed.Medium != v1.StorageMediumDefault || ed.SizeLimit == nil || ed.SizeLimit.Sign() <= 0 {
			continue
		}
		dir, err := m.o.EmptyDirPath(pod, v.Name)
		if err != nil {
			m.log.Debug("eviction: emptyDir path", "pod", pod.Namespace+"/"+pod.Name, "volume", v.Name, "err", err)
			continue
		}
		// Counted as kubelet measures emptyDirs: blocks on the volume's own file system.
		used, over, err := hw.DiskUsageOver(dir, ed.SizeLimit.Value())
		if err != nil {
			m.log.Debug("eviction: emptyDir usage", "dir", dir, "err", err)
		}
		if over {
			return v.Name, ed.SizeLimit.String(), used, true
		}
	}
	return "", "", 0, false
}
