// Package podspec holds small helpers over k8s.io/api pod types that several layers need (qos,
// runtime, the pod worker, the agent), kept in a leaf package so none of them imports another for it.
package podspec

import v1 "k8s.io/api/core/v1"

// AllContainers is the pod's init containers followed by its app containers, in a new slice.
func AllContainers(spec *v1.PodSpec) []v1.Container {
	return append(append(make([]v1.Container, 0, len(spec.InitContainers)+len(spec.Containers)), spec.InitContainers...), spec.Containers...)
}

// AllStatuses is the pod's init container statuses followed by its app container statuses, in a
// new slice.
func AllStatuses(st *v1.PodStatus) []v1.ContainerStatus {
	return append(append(make([]v1.ContainerStatus, 0, len(st.InitContainerStatuses)+len(st.ContainerStatuses)), st.InitContainerStatuses...), st.ContainerStatuses...)
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
