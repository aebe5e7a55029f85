package devices

import (
	"fmt"
	"slices"
	"strings"

	"github.com/mqlet/mqlet/agent/podspec"
	v1 "k8s.io/api/core/v1"
)

// IsExtended reports whether name is an extended resource (domain-qualified, outside kubernetes.io):
// the kind a device resource is. cpu, memory, hugepages-* and ephemeral-storage are not.
func IsExtended(name v1.ResourceName) bool {
	dom, _, ok := strings.Cut(string(name), "/")
	if !ok || strings.HasPrefix(string(name), "requests.") {
		return false
	}
	return dom != "kubernetes.io" && !strings.HasSuffix(dom, ".kubernetes.io")
}

// ContainerCounts is the extended resources container c asks for. As in Kubernetes they cannot be
// overcommitted: the count is the limit, a request must equal it, and it is a whole number.
func ContainerCounts(c *v1.Container) (map[v1.ResourceName]int64, error) {
	out := map[v1.ResourceName]int64{}
	names := map[v1.ResourceName]bool{}
	for n := range c.Resources.Limits {
		names[n] = true
	}
	for n := range c.Resources.Requests {
		names[n] = true
	}
	for _, n := range sortedNames(names) {
		if !IsExtended(n) {
			continue
		}
		lim, hasLim := c.Resources.Limits[n]
		req, hasReq := c.Resources.Requests[n]
		switch {
		case !hasLim:
			return nil, fmt.Errorf("container %q: %s must be set in resources.limits (extended resources are requested by their limit)", c.Name, n)
		case hasReq && req.Cmp(lim) != 0:
			return nil, fmt.Errorf("container %q: %s request %s must equal its limit %s (extended resources cannot be overcommitted)", c.Name, n, req.String(), lim.String())
		case lim.MilliValue()%1000 != 0 || lim.Sign() < 0:
			return nil, fmt.Errorf("container %q: %s limit %s must be a whole number of devices", c.Name, n, lim.String())
		}
		if v := lim.Value(); v > 0 {
			out[n] = v
		}
	}
	return out, nil
}

// Requests is what the pod's containers ask for, init containers first, in start order. Containers
// that ask for no extended resource are left out.
func Requests(pod *v1.Pod) ([]Request, error) {
	var out []Request
	nInit := len(pod.Spec.InitContainers)
	for i, c := range podspec.AllContainers(&pod.Spec) {
		counts, err := ContainerCounts(&c)
		if err != nil {
			return nil, err
		}
		if len(counts) == 0 {
			continue
		}
		sidecar := c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
		out = append(out, Request{Container: c.Name, Init: i < nInit && !sidecar, Counts: counts})
	}
	return out, nil
}

func sortedNames(m map[v1.ResourceName]bool) []v1.ResourceName {
	out := make([]v1.ResourceName, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
