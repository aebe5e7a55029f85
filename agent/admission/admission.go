// Package admission is the one gate every desired pod passes, whatever its source: defaults as the
// API server would set them, the validation a node can do on its own, a stable and path-safe UID,
// and the annotations that identify the pod's configuration. Sources only parse; the agent calls
// Admit before a pod reaches the store.
package admission

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"unicode"

	"github.com/mqlet/mqlet/agent/podspec"
	"github.com/mqlet/mqlet/agent/sysctl"
	"github.com/mqlet/mqlet/core/source"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Annotations set on every manifest pod, the same keys the kubelet puts on static pods. The
// hash is over the pod as decoded and defaulted (UID and node name included, the hash
// annotation itself excluded): it changes exactly when the effective pod changes.
const (
	AnnotationConfigSource = "kubernetes.io/config.source"
	AnnotationConfigHash   = "kubernetes.io/config.hash"
	ConfigSourceFile       = "file"
	ConfigSourceAPI        = "api"
)

const (
	defaultTerminationGracePeriod = int64(30)
	defaultSchedulerName          = "default-scheduler"
)

// Admitter admits pods for one node.
type Admitter struct {
	NodeName string
	// MQTTPolicy applies to pods whose Ref.Kind is source.MQTT; the manifest dir is trusted.
	MQTTPolicy Policy
	// Sysctls pods may set, from every source (kubelet's rule); nil: the node's safe set alone.
	Sysctls *sysctl.Allowlist
}

// Admit returns a defaulted, validated copy of the item's pod with its UID and the config
// annotations set, or an error listing every problem found. The item's pod is not modified.
// A pod that is valid but asks for more than its source's policy allows gets a *PolicyError.
func (a Admitter) Admit(it source.Item) (*v1.Pod, error) {
	if it.Pod == nil {
		return nil, fmt.Errorf("no pod")
	}
	pod := it.Pod.DeepCopy()
	delete(pod.Annotations, AnnotationRefusedEphemeral) // only admission says what it left out
	// A manifest is desired state; a pasted `kubectl get -o yaml` may carry a status that
	// must not be mistaken for what is running here.
	pod.Status = v1.PodStatus{}
	setDefaults(pod, a.NodeName)
	errs := validatePod(pod)
	errs = append(errs, validateSecurity(pod, a.Sysctls)...)
	if pod.UID != "" {
		errs = append(errs, validateUID(pod.UID)...)
	}
	var violations []Violation
	if it.Ref.Kind == source.MQTT {
		violations = a.MQTTPolicy.Check(&pod.Spec)
	}
	if len(errs) > 0 {
		// Every problem in one message, the policy's too, so one round trip fixes the pod.
		msgs := make([]string, 0, len(errs)+len(violations))
		for _, e := range errs {
			msgs = append(msgs, e.Error())
		}
		for _, v := range violations {
			msgs = append(msgs, v.String())
		}
		return nil, fmt.Errorf("%s", strings.Join(msgs, "; "))
	}
	if len(violations) > 0 {
		refused, only := ephemeralViolations(violations)
		if !only {
			return nil, &PolicyError{Pod: pod.Namespace + "/" + pod.Name, Source: string(it.Ref.Kind), Violations: violations}
		}
		// Only ephemeral containers are refused: the rest of the pod is admitted without them
		// (ephemeral_refusal.go).
		if err := leaveOutEphemeral(pod, refused, string(it.Ref.Kind)); err != nil {
			return nil, err
		}
	}
	if pod.UID == "" {
		pod.UID = StableUID(a.NodeName, pod.Namespace, pod.Name)
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	delete(pod.Annotations, AnnotationConfigHash) // the hash must not depend on an old hash
	pod.Annotations[AnnotationConfigSource] = configSource(it.Ref.Kind)
	delete(pod.Annotations, AnnotationHostPathRoots) // only admission says where a hostPath may lead
	if it.Ref.Kind == source.MQTT {
		if roots := a.MQTTPolicy.hostPathRoots(&pod.Spec); len(roots) > 0 {
			b, err := json.Marshal(roots)
			if err != nil {
				return nil, fmt.Errorf("recording the hostPath roots of pod %s/%s: %w", pod.Namespace, pod.Name, err)
			}
			pod.Annotations[AnnotationHostPathRoots] = string(b)
		}
	}
	if err := setConfigHash(pod); err != nil {
		return nil, err
	}
	return pod, nil
}

// setConfigHash sets the pod's AnnotationConfigHash: a hash of the whole admitted pod.
func setConfigHash(pod *v1.Pod) error {
	delete(pod.Annotations, AnnotationConfigHash)
	sum, err := json.Marshal(pod)
	if err != nil {
		return fmt.Errorf("hashing pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	h := sha256.Sum256(sum)
	pod.Annotations[AnnotationConfigHash] = hex.EncodeToString(h[:16])
	return nil
}

// WithDeletion is the admitted pod running with the deletion that a newer version of it carries
// (deletionTimestamp and deletionGracePeriodSeconds), for a version admission refuses whole: a
// delete must reach what runs whatever else that version changed (a container made privileged, an
// invalid field). The result is a new admitted pod; running is not modified.
func WithDeletion(running, deleting *v1.Pod) (*v1.Pod, error) {
	p := running.DeepCopy()
	p.DeletionTimestamp = deleting.DeletionTimestamp.DeepCopy()
	if g := deleting.DeletionGracePeriodSeconds; g != nil {
		v := *g
		p.DeletionGracePeriodSeconds = &v
	}
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	if err := setConfigHash(p); err != nil {
		return nil, err
	}
	return p, nil
}

// configSource is the value kubelet would put in kubernetes.io/config.source.
func configSource(k source.Kind) string {
	switch k {
	case source.File:
		return ConfigSourceFile
	case source.MQTT:
		return ConfigSourceAPI
	}
	return string(k)
}

// maxUIDLength bounds a UID given in a manifest: it becomes a directory name, a containerd label
// and part of log paths.
const maxUIDLength = 64

// validateUID accepts what can safely name a directory under the state dir: a UUID or a short
// run of letters, digits, '-', '_' and '.', starting with a letter or digit (so never "." or "..").
// A UID is joined into paths that are later removed recursively; "../../etc" must never get there.
func validateUID(uid types.UID) field.ErrorList {
	p := field.NewPath("metadata", "uid")
	s := string(uid)
	if len(s) > maxUIDLength {
		return field.ErrorList{field.TooLong(p, "", maxUIDLength)}
	}
	for i, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
			i > 0 && (r == '-' || r == '_' || r == '.')
		if !ok {
			return field.ErrorList{field.Invalid(p, s,
				"must be a UUID or letters, digits, '-', '_' and '.' starting with a letter or digit (it names files on the node)")}
		}
	}
	return nil
}

// StableUID derives a pod UID from what identifies the pod on this node, and deliberately
// not from the manifest's content: editing one container must keep the pod (and its other
// containers) in place. The format is a version-5-style UUID made from a SHA-256.
func StableUID(nodeName, namespace, name string) types.UID {
	h := sha256.Sum256([]byte("mqlet/manifest-pod\x00" + nodeName + "\x00" + namespace + "\x00" + name))
	b := h[:16]
	b[6] = b[6]&0x0f | 0x50 // version 5 (name-based, SHA)
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	s := hex.EncodeToString(b)
	return types.UID(s[0:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:32])
}

// setDefaults applies the API server's defaults that matter to a node, so a pod from a file
// looks the same as one that went through the control plane.
func setDefaults(pod *v1.Pod, nodeName string) {
	if pod.Namespace == "" {
		pod.Namespace = "default"
	}
	s := &pod.Spec
	s.NodeName = nodeName
	if s.RestartPolicy == "" {
		s.RestartPolicy = v1.RestartPolicyAlways
	}
	if s.DNSPolicy == "" {
		s.DNSPolicy = v1.DNSClusterFirst
	}
	if s.SchedulerName == "" {
		s.SchedulerName = defaultSchedulerName
	}
	defaultVolumeSource(s) // fields.go
	if s.TerminationGracePeriodSeconds == nil {
		g := defaultTerminationGracePeriod
		s.TerminationGracePeriodSeconds = &g
	}
	for i := range s.InitContainers {
		defaultContainer(&s.InitContainers[i])
	}
	for i := range s.Containers {
		defaultContainer(&s.Containers[i])
	}
	for i := range s.EphemeralContainers {
		c := v1.Container(s.EphemeralContainers[i].EphemeralContainerCommon)
		defaultContainer(&c)
		s.EphemeralContainers[i].EphemeralContainerCommon = v1.EphemeralContainerCommon(c)
	}
}

func defaultContainer(c *v1.Container) {
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = DefaultPullPolicy(c.Image)
	}
	if c.TerminationMessagePath == "" {
		c.TerminationMessagePath = v1.TerminationMessagePathDefault
	}
	if c.TerminationMessagePolicy == "" {
		c.TerminationMessagePolicy = v1.TerminationMessageReadFile
	}
	for i := range c.Ports {
		if c.Ports[i].Protocol == "" {
			c.Ports[i].Protocol = v1.ProtocolTCP
		}
	}
	// Like the API server: a limit without a request requests the limit, which is what
	// makes a pod with only limits Guaranteed.
	for name, limit := range c.Resources.Limits {
		if _, ok := c.Resources.Requests[name]; !ok {
			if c.Resources.Requests == nil {
				c.Resources.Requests = v1.ResourceList{}
			}
			c.Resources.Requests[name] = limit.DeepCopy()
		}
	}
}

// DefaultPullPolicy is the API server's default: Always for ":latest" or an untagged,
// undigested image, IfNotPresent otherwise.
func DefaultPullPolicy(image string) v1.PullPolicy {
	ref, digest, _ := strings.Cut(image, "@")
	if digest != "" {
		return v1.PullIfNotPresent
	}
	last := ref
	if i := strings.LastIndexByte(ref, '/'); i >= 0 {
		last = ref[i+1:] // a ':' before the last '/' is a registry port, not a tag
	}
	_, tag, hasTag := strings.Cut(last, ":")
	if !hasTag || tag == "" || tag == "latest" {
		return v1.PullAlways
	}
	return v1.PullIfNotPresent
}

// validatePod is the subset of Kubernetes' ValidatePod that a node can check on its own and
// that catches the common mistakes in hand-written manifests.
func validatePod(pod *v1.Pod) field.ErrorList {
	var errs field.ErrorList
	meta := field.NewPath("metadata")
	switch {
	case pod.Name == "" && pod.GenerateName != "":
		errs = append(errs, field.Required(meta.Child("name"), "generateName is not supported for manifest pods"))
	case pod.Name == "":
		errs = append(errs, field.Required(meta.Child("name"), ""))
	default:
		for _, msg := range validation.IsDNS1123Subdomain(pod.Name) {
			errs = append(errs, field.Invalid(meta.Child("name"), pod.Name, msg))
		}
	}
	for _, msg := range validation.IsDNS1123Label(pod.Namespace) {
		errs = append(errs, field.Invalid(meta.Child("namespace"), pod.Namespace, msg))
	}

	spec := field.NewPath("spec")
	if len(pod.Spec.Containers) == 0 {
		errs = append(errs, field.Required(spec.Child("containers"), "a pod needs at least one container"))
	}
	switch pod.Spec.RestartPolicy {
	case v1.RestartPolicyAlways, v1.RestartPolicyOnFailure, v1.RestartPolicyNever:
	default:
		errs = append(errs, field.NotSupported(spec.Child("restartPolicy"), pod.Spec.RestartPolicy,
			[]v1.RestartPolicy{v1.RestartPolicyAlways, v1.RestartPolicyOnFailure, v1.RestartPolicyNever}))
	}
	errs = append(errs, validateDNS(&pod.Spec, spec)...) // dns.go
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil && *g < 0 {
		errs = append(errs, field.Invalid(spec.Child("terminationGracePeriodSeconds"), *g, "must be greater than or equal to 0"))
	}

	names := map[string]*field.Path{}
	for i := range pod.Spec.InitContainers {
		ic := &pod.Spec.InitContainers[i]
		if ic.RestartPolicy != nil && *ic.RestartPolicy != v1.ContainerRestartPolicyAlways {
			// Always makes a sidecar (agent/pod/sidecars.go); the API allows no other value on an
			// init container.
			errs = append(errs, field.NotSupported(spec.Child("initContainers").Index(i).Child("restartPolicy"), *ic.RestartPolicy,
				[]string{string(v1.ContainerRestartPolicyAlways)}))
		}
		errs = append(errs, validateContainer(ic, spec.Child("initContainers").Index(i), names)...)
	}
	for i := range pod.Spec.Containers {
		if c := &pod.Spec.Containers[i]; c.RestartPolicy != nil {
			// Per-container restart policies of app containers are alpha (ContainerRestartRules);
			// the pod's restartPolicy is what this node applies to them.
			errs = append(errs, field.Forbidden(spec.Child("containers").Index(i).Child("restartPolicy"),
				"not supported by mqlet on an app container (the pod's restartPolicy applies); only an init container may set it, to Always (a sidecar)"))
		}
		errs = append(errs, validateContainer(&pod.Spec.Containers[i], spec.Child("containers").Index(i), names)...)
	}
	errs = append(errs, validateEphemeral(&pod.Spec, spec, names)...)
	errs = append(errs, validateObjectVolumes(&pod.Spec, spec)...) // objvolumes.go
	errs = append(errs, validateImageVolumes(&pod.Spec, spec)...)  // imagevolumes.go
	return append(errs, checkFields(&pod.Spec, errs)...)           // fields.go: no field silently ignored
}

func validateContainer(c *v1.Container, path *field.Path, names map[string]*field.Path) field.ErrorList {
	var errs field.ErrorList
	namePath := path.Child("name")
	if c.Name == "" {
		errs = append(errs, field.Required(namePath, ""))
	} else {
		for _, msg := range validation.IsDNS1123Label(c.Name) {
			errs = append(errs, field.Invalid(namePath, c.Name, msg))
		}
		if first, dup := names[c.Name]; dup {
			e := field.Duplicate(namePath, c.Name)
			e.Detail = "already used by " + first.String()
			errs = append(errs, e)
		} else {
			names[c.Name] = namePath
		}
	}

	imagePath := path.Child("image")
	if c.Image == "" {
		errs = append(errs, field.Required(imagePath, ""))
	} else if strings.IndexFunc(c.Image, unicode.IsSpace) >= 0 {
		errs = append(errs, field.Invalid(imagePath, c.Image, "must not contain whitespace"))
	}
	switch c.ImagePullPolicy {
	case v1.PullAlways, v1.PullIfNotPresent, v1.PullNever:
	default:
		errs = append(errs, field.NotSupported(path.Child("imagePullPolicy"), c.ImagePullPolicy,
			[]v1.PullPolicy{v1.PullAlways, v1.PullIfNotPresent, v1.PullNever}))
	}

	for i, p := range c.Ports {
		pp := path.Child("ports").Index(i)
		for _, msg := range validation.IsValidPortNum(int(p.ContainerPort)) {
			errs = append(errs, field.Invalid(pp.Child("containerPort"), p.ContainerPort, msg))
		}
		if p.HostPort != 0 {
			for _, msg := range validation.IsValidPortNum(int(p.HostPort)) {
				errs = append(errs, field.Invalid(pp.Child("hostPort"), p.HostPort, msg))
			}
		}
		if p.Name != "" {
			for _, msg := range validation.IsValidPortName(p.Name) {
				errs = append(errs, field.Invalid(pp.Child("name"), p.Name, msg))
			}
		}
		switch p.Protocol {
		case v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP:
		default:
			errs = append(errs, field.NotSupported(pp.Child("protocol"), p.Protocol,
				[]v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP}))
		}
	}

	res := path.Child("resources")
	for _, kind := range []struct {
		name string
		list v1.ResourceList
	}{{"limits", c.Resources.Limits}, {"requests", c.Resources.Requests}} {
		for _, name := range sortedKeys(kind.list) {
			if q := kind.list[name]; q.Sign() < 0 {
				errs = append(errs, field.Invalid(res.Child(kind.name).Key(string(name)), q.String(), "must be greater than or equal to 0"))
			}
		}
	}
	for _, name := range sortedKeys(c.Resources.Requests) {
		req := c.Resources.Requests[name]
		if limit, ok := c.Resources.Limits[name]; ok && req.Cmp(limit) > 0 {
			errs = append(errs, field.Invalid(res.Child("requests").Key(string(name)), req.String(),
				fmt.Sprintf("must be less than or equal to the %s limit of %s", name, limit.String())))
		}
	}
	errs = append(errs, validateTermination(c, path)...) // termination.go
	return append(errs, validateExtended(c, res)...)
}

// validateExtended applies the API server's rules for extended resources (host devices here),
// which cannot be overcommitted: requested by a whole-number limit, any request equal to it.
// Without them a pod asking for half a device would be admitted and fail only at container start.
func validateExtended(c *v1.Container, res *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, name := range sortedKeys(c.Resources.Limits) {
		if lim := c.Resources.Limits[name]; isExtended(name) && lim.MilliValue()%1000 != 0 {
			errs = append(errs, field.Invalid(res.Child("limits").Key(string(name)), lim.String(), "must be an integer"))
		}
	}
	for _, name := range sortedKeys(c.Resources.Requests) {
		if !isExtended(name) {
			continue
		}
		req := c.Resources.Requests[name]
		if lim, ok := c.Resources.Limits[name]; !ok {
			errs = append(errs, field.Required(res.Child("limits").Key(string(name)), "an extended resource is requested by its limit"))
		} else if req.Cmp(lim) != 0 {
			errs = append(errs, field.Invalid(res.Child("requests").Key(string(name)), req.String(),
				fmt.Sprintf("must be equal to the %s limit of %s (extended resources cannot be overcommitted)", name, lim.String())))
		}
	}
	return errs
}

// isExtended is a domain-qualified resource name outside kubernetes.io (devices.IsExtended: that
// package cannot be imported from here).
func isExtended(name v1.ResourceName) bool {
	dom, _, ok := strings.Cut(string(name), "/")
	return ok && !strings.HasPrefix(string(name), "requests.") && dom != "kubernetes.io" && !strings.HasSuffix(dom, ".kubernetes.io")
}

func sortedKeys[K ~string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	return keys
}

// validateEphemeral checks the ephemeral containers like the others (names unique across all of
// the pod's containers) and their targetContainerName, which must name an init or app container
// (the API's rule). Fields the API forbids on them (ports, probes...) are refused by FieldRules.
func validateEphemeral(spec *v1.PodSpec, path *field.Path, names map[string]*field.Path) field.ErrorList {
	var errs field.ErrorList
	targets := map[string]bool{}
	for _, c := range podspec.AllContainers(spec) {
		targets[c.Name] = true
	}
	for i := range spec.EphemeralContainers {
		ec := &spec.EphemeralContainers[i]
		p := path.Child("ephemeralContainers").Index(i)
		c := v1.Container(ec.EphemeralContainerCommon)
		errs = append(errs, validateContainer(&c, p, names)...)
		if t := ec.TargetContainerName; t != "" && !targets[t] {
			errs = append(errs, field.NotFound(p.Child("targetContainerName"), t))
		}
	}
	return errs
}
