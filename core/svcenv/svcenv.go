// Package svcenv is the service environment variables of a pod (enableServiceLinks), as kubelet
// injects them: the docker-links-style variables of every Service of the pod's namespace with a
// cluster IP, and those of the master service (default/kubernetes) always. The bridge, which
// watches the API's Services, computes them (ForPod) and sends them with the pod in the
// Annotation; the node reads them (FromPod) when it starts a container, where the container's
// own variables win over them and $(VAR) references fall back to them.
package svcenv

import (
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Annotation holds a pod's service environment variables as a JSON object of name to value, on
// the pod the bridge sends to its node. It is an annotation rather than env entries of the
// containers so that a changed Service changes no container spec (which would restart the
// containers): as with kubelet, a container sees the values current when it starts.
const Annotation = "mqlet.io/service-env"

// masterService is the service whose variables every pod gets, enableServiceLinks or not
// (kubelet's masterServices).
const masterService = "kubernetes"

// ForPod returns the service variables of a pod in namespace ns, from services (any namespaces;
// others are ignored), the way kubelet's getServiceEnvVarMap selects them: services without a
// cluster IP (empty or None, headless) give none; default/kubernetes always counts; the other
// services of ns count when enableServiceLinks is true, and one of ns named kubernetes wins over
// the master service. nil services (no API) give an empty map.
func ForPod(services []*v1.Service, ns string, enableServiceLinks bool) map[string]string {
	picked := map[string]*v1.Service{}
	for _, s := range services {
		if !ipSet(s) {
			continue
		}
		switch {
		case s.Namespace == ns && enableServiceLinks:
			picked[s.Name] = s
		case s.Namespace == "default" && s.Name == masterService:
			if _, ok := picked[s.Name]; !ok {
				picked[s.Name] = s
			}
		}
	}
	names := make([]string, 0, len(picked))
	for n := range picked {
		names = append(names, n)
	}
	// Sorted, so two services whose variables collide give the same winner every time (kubelet's
	// map iteration leaves it to chance).
	slices.Sort(names)
	out := map[string]string{}
	for _, n := range names {
		for _, e := range Vars(picked[n]) {
			out[e.Name] = e.Value
		}
	}
	return out
}

func ipSet(s *v1.Service) bool {
	return s.Spec.ClusterIP != "" && s.Spec.ClusterIP != v1.ClusterIPNone
}

// Vars returns one service's variables in kubelet's order (envvars.FromServices): NAME_SERVICE_HOST,
// NAME_SERVICE_PORT (the first port), NAME_SERVICE_PORT_PORTNAME for each named port, then the
// docker-links ones: NAME_PORT (the first port) and NAME_PORT_<port>_<PROTO> with _PROTO, _PORT
// and _ADDR for each port. NAME is the service's name upper-cased with '-' as '_'. A service
// without a cluster IP has none.
func Vars(s *v1.Service) []v1.EnvVar {
	if !ipSet(s) {
		return nil
	}
	ip := s.Spec.ClusterIP
	prefix := varName(s.Name)
	out := []v1.EnvVar{{Name: prefix + "_SERVICE_HOST", Value: ip}}
	ports := s.Spec.Ports
	if len(ports) == 0 { // the API requires ports of a service with a cluster IP; nothing more to say
		return out
	}
	first := strconv.Itoa(int(ports[0].Port))
	out = append(out, v1.EnvVar{Name: prefix + "_SERVICE_PORT", Value: first})
	for _, p := range ports {
		if p.Name != "" {
			out = append(out, v1.EnvVar{Name: prefix + "_SERVICE_PORT_" + varName(p.Name), Value: strconv.Itoa(int(p.Port))})
		}
	}
	for i, p := range ports {
		proto := strings.ToLower(string(p.Protocol))
		if proto == "" {
			proto = "tcp"
		}
		port := strconv.Itoa(int(p.Port))
		url := proto + "://" + net.JoinHostPort(ip, port)
		if i == 0 {
			out = append(out, v1.EnvVar{Name: prefix + "_PORT", Value: url})
		}
		pp := prefix + "_PORT_" + port + "_" + strings.ToUpper(proto)
		out = append(out,
			v1.EnvVar{Name: pp, Value: url},
			v1.EnvVar{Name: pp + "_PROTO", Value: proto},
			v1.EnvVar{Name: pp + "_PORT", Value: port},
			v1.EnvVar{Name: pp + "_ADDR", Value: ip})
	}
	return out
}

func varName(s string) string { return strings.ToUpper(strings.ReplaceAll(s, "-", "_")) }

// Encode is the Annotation's value for vars.
func Encode(vars map[string]string) string {
	b, _ := json.Marshal(vars) // a map of strings always encodes; its keys come out sorted
	return string(b)
}

// FromPod returns the service variables the pod's Annotation carries (none without it). A value
// that is not a JSON object of strings, or a name that is not a valid environment variable
// name, is an error naming the annotation.
func FromPod(p *v1.Pod) (map[string]string, error) {
	raw, ok := p.Annotations[Annotation]
	if !ok {
		return nil, nil
	}
	var vars map[string]string
	if err := json.Unmarshal([]byte(raw), &vars); err != nil {
		return nil, fmt.Errorf("annotation %s: not a JSON object of strings: %v", Annotation, err)
	}
	for n := range vars {
		if errs := validation.IsEnvVarName(n); len(errs) > 0 {
			return nil, fmt.Errorf("annotation %s: variable %q: %s", Annotation, n, strings.Join(errs, "; "))
		}
	}
	return vars, nil
}
