package eviction

import (
	"fmt"
	"time"

	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/agent/resources"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/hw"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Local storage isolation, kubelet's localStorageEviction, whatever the node's thresholds: a pod
// whose disk-backed emptyDir holds more than its sizeLimit, a pod whose containers' writable
// layers and logs plus its disk emptyDirs pass the sum of its containers' ephemeral-storage
// limits, and a pod with a container whose writable layer and logs pass that container's limit,
// is evicted, in that order of checks. Memory-backed emptyDirs need no watch: their tmpfs is no
// larger than the limit (and is memory, not ephemeral storage).

// Signals of the local storage evictions (kubelet's metric labels).
const (
	SignalEmptyDirFsLimit  Signal = "emptydirfs.limit"
	SignalPodFsLimit       Signal = "ephemeralpodfs.limit"
	SignalContainerFsLimit Signal = "ephemeralcontainerfs.limit"
)

// emptyDirsOverLimit looks at every active pod's local storage limits (its disk emptyDirs' sizeLimit,
// then its ephemeral-storage limits) and evicts the first pod found over one, as kubelet does
// before judging thresholds. It returns the evicted pod. Critical pods (manifest-dir pods, like
// kubelet's static pods) are never evicted: the overuse is logged once per pod spec instead.
func (m *Manager) emptyDirsOverLimit() *Pod {
	if m.o.EmptyDirPath == nil && m.o.ContainerStorage == nil {
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
		var msg, name string
		var signal Signal
		var used int64
		if vol, limit, n, over := m.emptyDirOver(p.Pod); over {
			msg, name, signal, used = fmt.Sprintf("Usage of EmptyDir volume %q exceeds the limit %q. ", vol, limit), vol, SignalEmptyDirFsLimit, n
		} else if what, text, n, over := m.ephemeralOver(p.Pod); over {
			msg, name, signal, used = text, what, SignalPodFsLimit, n
			if what != "" {
				signal = SignalContainerFsLimit
			}
		} else {
			continue
		}
		if why := admission.CriticalReason(p.Pod, p.Source); why != "" {
			key := configHash(p.Pod) + "/" + string(signal) + "/" + name
			if m.overLimitLogged == nil {
				m.overLimitLogged = map[types.UID]string{}
			}
			if m.overLimitLogged[p.Pod.UID] != key {
				m.overLimitLogged[p.Pod.UID] = key
				m.log.Warn("eviction: local storage over its limit, but the pod is never evicted", "pod", p.Pod.Namespace+"/"+p.Pod.Name,
					"why", why, "signal", signal, "message", msg, "used at least", used)
			}
			continue
		}
		zero := time.Duration(0) // kubelet evicts for local storage at once, without grace
		m.log.Warn("eviction: evicting pod", "pod", p.Pod.Namespace+"/"+p.Pod.Name, "uid", p.Pod.UID,
			"signal", signal, "used at least", used, "message", msg)
		m.emit(event.Event{Time: time.Now(), Type: event.Warning, Reason: Reason, Message: msg,
			Object: event.PodObject(p.Pod), Source: p.Source.String()})
		if !m.o.Pods.Evict(p.Pod.UID, msg, &zero) {
			continue
		}
		m.evicted[p.Pod.UID] = configHash(p.Pod)
		m.mu.Lock()
		m.evictions[signal]++
		m.mu.Unlock()
		return &p
	}
	return nil
}

// ephemeralOver checks the pod's ephemeral-storage limits (kubelet's podEphemeralStorageLimitEviction,
// then containerEphemeralStorageLimitEviction): first the pod's, the sum of its containers' limits
// against their writable layers and logs plus its disk emptyDirs; then each container's own. It
// returns the container over its limit ("" for the pod), kubelet's message, and the usage.
func (m *Manager) ephemeralOver(pod *v1.Pod) (container, msg string, used int64, over bool) {
	if m.o.ContainerStorage == nil {
		return "", "", 0, false
	}
	podLimit, limited := resources.PodLimits(&pod.Spec)[v1.ResourceEphemeralStorage]
	if !limited || podLimit.Sign() <= 0 {
		return "", "", 0, false // no container has a limit: nothing to measure
	}
	usage, err := m.o.ContainerStorage(pod)
	if err != nil {
		// Partial figures still count: a limit passed by what could be read is passed.
		m.log.Debug("eviction: container storage", "pod", pod.Namespace+"/"+pod.Name, "err", err)
	}
	total := int64(0)
	for _, n := range usage {
		total += n
	}
	if m.o.EmptyDirPath != nil {
		for _, v := range pod.Spec.Volumes {
			if ed := v.EmptyDir; ed == nil || ed.Medium != v1.StorageMediumDefault {
				continue
			}
			dir, err := m.o.EmptyDirPath(pod, v.Name)
			if err != nil {
				continue
			}
			n, _, err := hw.DiskUsage(dir)
			if err != nil {
				m.log.Debug("eviction: emptyDir usage", "dir", dir, "err", err)
			}
			total += n
		}
	}
	if total > podLimit.Value() {
		return "", fmt.Sprintf("Pod ephemeral local storage usage exceeds the total limit of containers %s. ", podLimit.String()), total, true
	}
	for _, c := range pod.Spec.Containers {
		limit, ok := c.Resources.Limits[v1.ResourceEphemeralStorage]
		if !ok || limit.Sign() <= 0 {
			continue
		}
		if n := usage[c.Name]; n > limit.Value() {
			return c.Name, fmt.Sprintf("Container %s exceeded its local ephemeral storage limit %q. ", c.Name, limit.String()), n, true
		}
	}
	return "", "", 0, false
}

// emptyDirOver finds the first disk-backed emptyDir of pod with a sizeLimit that it exceeds, with
// what was counted of it (the walk stops at the limit, so at least that much is used).
func (m *Manager) emptyDirOver(pod *v1.Pod) (name, limit string, used int64, over bool) {
	if m.o.EmptyDirPath == nil {
		return "", "", 0, false
	}
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
