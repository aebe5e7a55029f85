package node

import (
	"context"
	"log/slog"
	"time"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/agent/eviction"
	"github.com/mqlet/mqlet/agent/oomwatch"
	"github.com/mqlet/mqlet/agent/pod"
	"github.com/mqlet/mqlet/core/event"
	"github.com/mqlet/mqlet/core/source"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// newEviction makes the eviction manager of agent a. events receives the Evicted and
// EvictionThresholdMet events (nil on a standalone node: they are logged only); reclaim is the
// node-level reclaim for disk pressure (image GC; nil for none). It needs no broker. podsCgroup is
// the pods' top cgroup, whose memory limit is node allocatable when enforced. life bounds its
// readings of containerd: it ends when the node stops. release closes the kernel memory notifier it
// starts here, for a node that never runs (the manager's Run closes it otherwise; closing twice is
// harmless).
func newEviction(life context.Context, cfg config.Config, a *agent.Agent, rt *ctrd.Runtime, podsCgroup string, events event.Sink,
	reclaim eviction.Reclaimer, onChange func(), log *slog.Logger) (m *eviction.Manager, release func() error) {
	thresholds := evictionThresholds(cfg)
	if !cfg.EnforceNodeAllocatable {
		podsCgroup = "" // no limit on it: allocatableMemory.available is not a signal
	}
	var notifier eviction.MemoryNotifier
	release = func() error { return nil }
	for _, t := range thresholds {
		if t.Signal != eviction.SignalMemoryAvailable {
			continue
		}
		n, err := eviction.NewKernelNotifier("/", log)
		if err != nil {
			log.Warn("eviction: no kernel memory notifications; memory is polled", "every", cfg.EvictionMonitoringPeriod.Duration, "err", err)
		} else {
			notifier, release = n, n.Close
		}
		break
	}
	m = eviction.New(eviction.Options{
		NodeName:                 cfg.NodeName,
		Thresholds:               thresholds,
		MonitoringPeriod:         cfg.EvictionMonitoringPeriod.Duration,
		PressureTransitionPeriod: cfg.EvictionPressureTransitionPeriod.Duration,
		MaxPodGracePeriod:        cfg.EvictionMaxPodGracePeriod.Duration,
		Observer: &eviction.NodeObserver{Root: "/", NodeFsDir: cfg.StateDir, ImageFsDir: cfg.ImageFSDir,
			AllocatableCgroup: podsCgroup, Log: log},
		Usage: eviction.NodeUsage{Root: "/", PodCgroup: rt.PodCgroup, PodDirs: rt.PodStorageDirs,
			WritableLayers: func(pod *v1.Pod) (int64, int64, error) {
				ctx, cancel := context.WithTimeout(life, storageTimeout)
				defer cancel()
				u, err := rt.WritableLayers(ctx, pod)
				return u.Bytes, u.Inodes, err
			}},
		Pods:               agentPods{a: a, rt: rt},
		Reclaimer:          reclaim,
		Events:             events,
		Notifier:           notifier,
		Log:                log,
		OnConditionsChange: onChange,
		EmptyDirPath:       rt.EmptyDirPath, // emptyDir sizeLimit
		// ephemeral-storage limits: each container's writable layer and logs
		ContainerStorage: func(pod *v1.Pod) (map[string]int64, error) {
			ctx, cancel := context.WithTimeout(life, storageTimeout)
			defer cancel()
			us, err := rt.ContainerStorage(ctx, pod)
			out := make(map[string]int64, len(us))
			for name, u := range us {
				out[name] = u.Bytes
			}
			return out, err
		},
	})
	return m, release
}

// evictionThresholds are the configured thresholds and, when node allocatable is enforced on the
// pods' cgroup, the allocatableMemory.available ones kubelet derives from the hard memory ones.
func evictionThresholds(cfg config.Config) []eviction.Threshold {
	ts := cfg.Thresholds()
	if cfg.EnforceNodeAllocatable {
		ts = append(ts, eviction.AllocatableThresholds(ts)...)
	}
	return ts
}

// newOOMWatch makes the OOM watcher: SystemOOM node events from the kernel log, for kills outside
// podsCgroup.
func newOOMWatch(cfg config.Config, podsCgroup string, events event.Sink, log *slog.Logger) *oomwatch.Watcher {
	return oomwatch.New(oomwatch.Options{NodeName: cfg.NodeName, PodsCgroup: podsCgroup, Events: events, Log: log})
}

// agentPods is the agent as the eviction manager sees it.
type agentPods struct {
	a  *agent.Agent
	rt *ctrd.Runtime
}

// List returns the desired pods with their status; pods being deleted are left out (they go anyway).
func (p agentPods) List() []eviction.Pod {
	src := map[types.UID]source.Ref{}
	for _, d := range p.a.Desired() {
		src[d.Pod.UID] = d.Source
	}
	pods := p.a.Pods()
	out := make([]eviction.Pod, 0, len(pods))
	for i := range pods {
		if ref, ok := src[pods[i].UID]; ok {
			out = append(out, eviction.Pod{Pod: &pods[i], Source: ref})
		}
	}
	return out
}

func (p agentPods) Evict(uid types.UID, message string, grace *time.Duration) bool {
	return p.a.Fail(uid, pod.Failure{Reason: pod.ReasonEvicted, Message: message, Grace: grace})
}

// storageTimeout bounds one pod's storage reading (containerd walks each writable layer).
const storageTimeout = 30 * time.Second

// releaseTimeout bounds the containerd calls that remove an evicted pod's containers.
const releaseTimeout = 30 * time.Second

// Release frees the evicted pod's volumes, shm and devices, then removes its containers with their
// writable layers and its logs (kubelet's container GC for evicted pods); the pod and its status
// stay until it is deleted.
func (p agentPods) Release(pod *v1.Pod) error {
	if err := p.rt.ReleasePodStorage(pod); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	_, err := p.rt.RemoveEvictedContainers(ctx, pod)
	return err
}
