package ctrd

import (
	"context"
	"errors"

	v1 "k8s.io/api/core/v1"
)

// cgroupHook owns the cgroup the pod's containers go below: with a cgroup manager, the pod's
// cgroup in its QoS tier, sized from its containers; without, /mqlet/<ns>/pod<uid>, which runc
// makes with the first container. runc removes each container's own cgroup, never this parent.
type cgroupHook struct {
	cgroups   PodCgroups // the QoS hierarchy's pod cgroups; nil: the legacy /mqlet/<namespace>/pod<uid>
	namespace string     // the containerd namespace, which names the legacy pod cgroups
}

func (cgroupHook) Name() string { return "cgroup" }

// Prerun runs again after a spec change: a pod whose QoS class changed gets its cgroup in the new
// tier, where its new containers go.
func (h cgroupHook) Prerun(_ context.Context, pod *v1.Pod, sb *Sandbox) error {
	if cg := h.cgroups; cg != nil {
		dir, err := cg.EnsurePod(pod)
		sb.CgroupParent = dir
		return err
	}
	cg, err := legacyPodCgroup(h.namespace, string(pod.UID))
	sb.CgroupParent = cg
	return err
}

func (h cgroupHook) Destroy(_ context.Context, ref PodRef) error {
	cg, err := legacyPodCgroup(h.namespace, string(ref.UID))
	if err != nil {
		return err
	}
	// The whole tree: the pod cgroup and what was left below it (a container's cgroup runc did not
	// remove, the PID namespace holder's leaf).
	err = RemoveCgroupTree(cg)
	if m := h.cgroups; m != nil {
		err = errors.Join(m.RemovePod(string(ref.UID)), err)
	}
	return err
}

func (h cgroupHook) List() ([]PodRef, error) {
	uids, err := podCgroupUIDs(h.namespace)
	if m := h.cgroups; m != nil {
		more, merr := m.PodUIDs()
		uids, err = append(uids, more...), errors.Join(err, merr)
	}
	return uidRefs(uids), err
}
