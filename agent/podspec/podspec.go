// Package podspec holds small helpers over k8s.io/api pod types that several layers need (qos,
// runtime, the pod worker, the agent), kept in a leaf package so none of them imports another for it.
package podspec

import v1 "k8s.io/api/core/v1"

// AllContainers is the pod's init containers followed by its app containers, in a new slice.
func AllContainers(spec *v1.PodSpec) []v1.Container {
	return append(append(make([]v1.Container, 0, len(spec.InitContainers)+len(spec.Containers)), spec.InitContainers...), spec.Containers...)
}

// EphemeralContainers is the pod's ephemeral containers (kubectl debug) as plain containers, in a
// new slice: v1.EphemeralContainerCommon has exactly v1.Container's fields, so the runtime and the
// worker handle them like any container. They are not in AllContainers, which sums resources and
// ranks QoS: an ephemeral container has no resources and no part in the pod's phase.
func EphemeralContainers(spec *v1.PodSpec) []v1.Container {
	out := make([]v1.Container, 0, len(spec.EphemeralContainers))
	for i := range spec.EphemeralContainers {
		out = append(out, v1.Container(spec.EphemeralContainers[i].EphemeralContainerCommon))
	}
	return out
}

// Ephemeral returns the pod's ephemeral container named name, or nil when name is none.
func Ephemeral(spec *v1.PodSpec, name string) *v1.EphemeralContainer {
	for i := range spec.EphemeralContainers {
		if spec.EphemeralContainers[i].Name == name {
			return &spec.EphemeralContainers[i]
		}
	}
	return nil
}

// EveryContainer is AllContainers followed by the ephemeral containers: every container the pod
// may have on the node, for what goes by name or image (logs, exec, images in use, leftovers).
func EveryContainer(spec *v1.PodSpec) []v1.Container {
	return append(AllContainers(spec), EphemeralContainers(spec)...)
}

// AllStatuses is the pod's init container statuses followed by its app container statuses and
// its ephemeral container statuses, in a new slice.
func AllStatuses(st *v1.PodStatus) []v1.ContainerStatus {
	out := make([]v1.ContainerStatus, 0, len(st.InitContainerStatuses)+len(st.ContainerStatuses)+len(st.EphemeralContainerStatuses))
	out = append(append(out, st.InitContainerStatuses...), st.ContainerStatuses...)
	return append(out, st.EphemeralContainerStatuses...)
}

// IsSidecar reports whether c is a sidecar: an init container with restartPolicy Always, which
// starts in the init containers' order and then runs beside the app containers for the pod's life
// (kubelet's restartable init container).
func IsSidecar(c *v1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
}

// Sidecar returns the pod's sidecar named name, or nil when name is no sidecar.
func Sidecar(spec *v1.PodSpec, name string) *v1.Container {
	for i := range spec.InitContainers {
		if c := &spec.InitContainers[i]; c.Name == name && IsSidecar(c) {
			return c
		}
	}
	return nil
}
