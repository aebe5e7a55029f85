// Package ctrspec translates a pod's container into OCI runtime spec options: the spec hash that
// says when a container must be made anew, its environment (kubelet's env and $(VAR) expansion,
// ConfigMap and Secret references), its security context (user, groups, capabilities, seccomp,
// sysctls), its resources, and the pod namespaces it joins. It is pure translation: it reads no
// containerd state and does not import the containerd client, so a rule here is tested with a spec
// applied in memory (agent/ctrd builds the container from it).
package ctrspec
