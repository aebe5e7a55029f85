package ctrd

import (
	"context"

	v1 "k8s.io/api/core/v1"
)

// PodNetwork attaches pods' network namespaces to the node's network: agent/cni.Manager, through
// CNI plugins. The runtime only calls it from the sandbox (cniHook), so it does not depend on how.
type PodNetwork interface {
	// Setup attaches the namespace pinned at netns and returns the pod's addresses, primary
	// first. It is called again after agent restarts and spec changes, and must then keep what
	// is attached (and its addresses) rather than attach it twice. fresh says the namespace was
	// made just now (a new pod, or its namespace was lost: a reboot), so any attachment recorded
	// for the pod belongs to a namespace that is gone.
	Setup(ctx context.Context, pod *v1.Pod, netns string, fresh bool) ([]string, error)
	// Teardown releases the pod's attachment by UID alone; netns is "" when the namespace is
	// gone. A pod never attached is no error.
	Teardown(ctx context.Context, uid, netns string) error
	// Pods lists the UIDs of pods that have an attachment on the node.
	Pods() ([]string, error)
}

// cniHook attaches the pod's network namespace (Options.Network) right after it is pinned and
// fills Sandbox.PodIPs, which the hosts file and the pod status read. hostNetwork pods have no
// namespace of their own and skip it.
type cniHook struct {
	dirs    stateDir
	network PodNetwork // nil: loopback only
}

func (cniHook) Name() string { return "pod network (CNI)" }

func (h cniHook) Prerun(ctx context.Context, pod *v1.Pod, sb *Sandbox) error {
	n := h.network
	if n == nil {
		return nil
	}
	if pod.Spec.HostNetwork {
		// A pod that no longer has a namespace of its own gives back what it had (a new spec of
		// the same pod): a no-op for a pod never attached.
		return h.Destroy(ctx, sb.Ref)
	}
	ips, err := n.Setup(ctx, pod, sb.NetNS, sb.netnsNew)
	if err != nil {
		return err
	}
	sb.PodIPs = ips
	return nil
}

// Destroy runs before the namespace is released (hooks tear down in reverse), so plugins still
// find the pod's interface in it; after a reboot the pin is no namespace and they are given none.
func (h cniHook) Destroy(ctx context.Context, ref PodRef) error {
	n := h.network
	if n == nil {
		return nil
	}
	path, err := h.dirs.nsPath(netNS(), string(ref.UID))
	if err != nil {
		return err
	}
	if !isNS(path) {
		path = ""
	}
	return n.Teardown(ctx, string(ref.UID), path)
}

func (h cniHook) List() ([]PodRef, error) {
	n := h.network
	if n == nil {
		return nil, nil
	}
	uids, err := n.Pods()
	return uidRefs(uids), err
}
