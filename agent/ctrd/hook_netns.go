package ctrd

import (
	"context"

	v1 "k8s.io/api/core/v1"
)

// netnsHook owns the pod's pinned network namespace (none with hostNetwork).
type netnsHook struct{ dirs stateDir }

func (netnsHook) Name() string { return "network namespace" }

func (h netnsHook) Prerun(_ context.Context, pod *v1.Pod, sb *Sandbox) error {
	if pod.Spec.HostNetwork {
		return nil
	}
	path, created, err := h.dirs.ensurePodNS(netNS(), string(pod.UID))
	if err != nil {
		return err
	}
	sb.NetNS, sb.Created, sb.netnsNew = path, sb.Created || created, created
	return nil
}

func (h netnsHook) Destroy(_ context.Context, ref PodRef) error {
	return h.dirs.removePodNS(netNS(), string(ref.UID))
}

func (h netnsHook) List() ([]PodRef, error) {
	names, err := h.dirs.podNSUIDs(netNS())
	return uidRefs(names), err
}
