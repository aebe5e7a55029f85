package admission

import (
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// No field of a pod is silently ignored: each field of v1.PodSpec, v1.Container (init and
// ephemeral containers too) and the volume sources is in FieldRules with one Class. A Refused
// field that a pod sets refuses the pod at validation with an error naming the field's path; a
// Warned field is accepted and becomes a Warning event (FieldWarnings), for fields kubelet ignores
// too or that mean nothing on a single node without a control plane (scheduling hints).
// TestFieldInventory walks the k8s.io/api types by reflection, so a field a newer k8s.io/api adds
// fails the test until it is classified here; it also keeps docs/pods.md's table equal to this one.

// Class is what mqlet does with a field.
type Class string

const (
	Implemented Class = "Implemented"
	Refused     Class = "Refused"
	Warned      Class = "Warned"
)

// ReasonFieldIgnored is the reason of the Warning event for a Warned field a pod sets.
const ReasonFieldIgnored = "Ignored"

// FieldRule classifies one field.
type FieldRule struct {
	// Path below the pod spec in JSON names; "[*]" marks each element of a list. Rules under
	// containers[*] apply to initContainers[*] as well (the same type).
	Path  string
	Class Class
	Note  string
	// used tells whether a pod uses the field in the way the class is about (a Refused or Warned
	// field left at its default is fine); nil means any value that is not empty.
	used func(reflect.Value) bool
	// derived rules repeat a containers[*] rule for ephemeral containers: checked like it, not
	// printed again in docs/pods.md (the containers[*] row says it).
	derived bool
}

// Usage predicates for rules whose default value is fine.
func isTrue(v reflect.Value) bool {
	return v.Kind() == reflect.Pointer && !v.IsNil() && v.Elem().Bool()
}
func stringNot(ok ...string) func(reflect.Value) bool {
	return func(v reflect.Value) bool {
		if v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return false
			}
			v = v.Elem()
		}
		return !slices.Contains(ok, v.String())
	}
}

// FieldRules is the classification of every field, in the order docs/pods.md lists them.
func FieldRules() []FieldRule {
	const (
		schedOnly = "used by a scheduler to pick a node; this node runs what it is given"
		notOnNode = "needs a control plane or a cluster object the node does not have"
	)
	podRules := []FieldRule{
		{Path: "volumes", Class: Implemented, Note: "the sources below"},
		{Path: "initContainers", Class: Implemented, Note: "in order, before the app containers; a sidecar (restartPolicy Always) starts in that order and runs beside them"},
		{Path: "containers", Class: Implemented},
		{Path: "ephemeralContainers", Class: Implemented, Note: "added to a running pod through the API's ephemeralcontainers subresource (kubectl debug, via mqlet-bridge) or with the pod's spec: started once in the pod's network, IPC and UTS namespaces, never restarted, not probed, not part of the pod's phase or readiness, stopped with the pod. Its fields are a container's (the containers[*] rows apply), except those below"},
		{Path: "restartPolicy", Class: Implemented},
		{Path: "terminationGracePeriodSeconds", Class: Implemented},
		{Path: "activeDeadlineSeconds", Class: Implemented, Note: "the pod fails with DeadlineExceeded"},
		{Path: "dnsPolicy", Class: Implemented},
		{Path: "nodeSelector", Class: Implemented, Note: "checked against the node's labels at admission, as kubelet does (NodeAffinity)"},
		{Path: "serviceAccountName", Class: Implemented, Note: "visible through the downward API; through mqlet-bridge the pod's token volume gets a token from the API (docs/kubernetes.md), standalone no token is mounted"},
		{Path: "serviceAccount", Class: Warned, Note: "deprecated alias of serviceAccountName; ignored", used: func(v reflect.Value) bool { return v.String() != "" }},
		{Path: "automountServiceAccountToken", Class: Warned, Note: "the node has no API server to issue a token for; warned when true", used: isTrue},
		{Path: "nodeName", Class: Implemented, Note: "set to this node's name, as kubelet does for static pods"},
		{Path: "hostNetwork", Class: Implemented},
		{Path: "hostPID", Class: Implemented},
		{Path: "hostIPC", Class: Implemented},
		{Path: "shareProcessNamespace", Class: Implemented},
		{Path: "securityContext", Class: Implemented},
		{Path: "imagePullSecrets", Class: Implemented},
		{Path: "hostname", Class: Implemented},
		{Path: "subdomain", Class: Implemented},
		{Path: "affinity", Class: Implemented, Note: "the parts below"},
		{Path: "affinity.nodeAffinity", Class: Implemented},
		{Path: "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution", Class: Implemented, Note: "checked against the node's labels at admission, as kubelet does (NodeAffinity)"},
		{Path: "affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution", Class: Warned, Note: schedOnly},
		{Path: "affinity.podAffinity", Class: Warned, Note: schedOnly},
		{Path: "affinity.podAntiAffinity", Class: Warned, Note: schedOnly},
		{Path: "schedulerName", Class: Warned, Note: schedOnly + "; warned when not default-scheduler", used: stringNot("", defaultSchedulerName)},
		{Path: "tolerations", Class: Implemented, Note: "NoExecute taints of the node (nodeTaints) refuse pods that do not tolerate them, except manifest-dir pods, as kubelet does; other effects matter to a scheduler only"},
		{Path: "hostAliases", Class: Implemented},
		{Path: "priorityClassName", Class: Warned, Note: "system-node-critical and system-cluster-critical make the pod critical; other classes are cluster objects the node does not have (set priority instead)", used: stringNot("", "system-node-critical", "system-cluster-critical")},
		{Path: "priority", Class: Implemented, Note: "eviction ranking; critical from 2000000000"},
		{Path: "dnsConfig", Class: Implemented},
		{Path: "readinessGates", Class: Refused, Note: "their conditions are set by controllers through the API; on this node the pod would never be Ready"},
		{Path: "runtimeClassName", Class: Refused, Note: "RuntimeClass objects are cluster objects; the node runs one runtime (runc)"},
		{Path: "enableServiceLinks", Class: Implemented, Note: "the service variables of the pod's namespace's Services with a cluster IP and of default/kubernetes (always), as kubelet injects them; the bridge computes them from the API's Services and sends them with the pod (annotation mqlet.io/service-env). A pod from mqlet ctl or the manifest dir has no Services to take them from, so true adds nothing there, as with a kubelet without an API server"},
		{Path: "preemptionPolicy", Class: Warned, Note: schedOnly + "; warned when Never", used: stringNot(string(v1.PreemptLowerPriority))},
		{Path: "overhead", Class: Implemented, Note: "added to the pod's requests, as kubelet does"},
		{Path: "topologySpreadConstraints", Class: Warned, Note: schedOnly},
		{Path: "setHostnameAsFQDN", Class: Implemented, Note: "the kernel hostname is the FQDN (hostname.subdomain.namespace.svc.clusterDomain)"},
		{Path: "os", Class: Implemented, Note: "os.name must be this node's OS (linux), as kubelet's admission requires"},
		{Path: "hostUsers", Class: Implemented, Note: "true (the default) only: false is refused, as user namespaces need id-mapped mounts mqlet does not set up"},
		{Path: "schedulingGates", Class: Refused, Note: "a gated pod waits for a scheduler to lift the gates; the node has none"},
		{Path: "resourceClaims", Class: Refused, Note: "dynamic resource allocation " + notOnNode + " (use extended resources for host devices)"},
		{Path: "resources", Class: Refused, Note: "pod-level resources (alpha) are not supported; give each container its resources"},
		{Path: "hostnameOverride", Class: Refused, Note: "alpha; use hostname"},
		{Path: "schedulingGroup", Class: Warned, Note: "gang scheduling: " + schedOnly},
		{Path: "evictionResponders", Class: Warned, Note: "the Eviction API is served by the API server, not the node"},
	}
	containerRules := []FieldRule{
		{Path: "name", Class: Implemented},
		{Path: "image", Class: Implemented},
		{Path: "command", Class: Implemented},
		{Path: "args", Class: Implemented},
		{Path: "workingDir", Class: Implemented},
		{Path: "ports", Class: Implemented},
		{Path: "ports[*].name", Class: Implemented, Note: "named ports for probes and lifecycle handlers"},
		{Path: "ports[*].containerPort", Class: Implemented},
		{Path: "ports[*].protocol", Class: Implemented},
		{Path: "ports[*].hostPort", Class: Implemented, Note: "published through CNI's portmap; a port in use refuses the pod"},
		{Path: "ports[*].hostIP", Class: Implemented},
		{Path: "envFrom", Class: Implemented},
		{Path: "env", Class: Implemented},
		{Path: "env[*].name", Class: Implemented},
		{Path: "env[*].value", Class: Implemented, Note: "$(VAR) expanded from earlier variables"},
		{Path: "env[*].valueFrom", Class: Implemented, Note: "the sources below"},
		{Path: "env[*].valueFrom.fieldRef", Class: Implemented, Note: "metadata name, namespace, uid, labels, annotations; spec.nodeName, serviceAccountName; status.podIP(s), hostIP(s)"},
		{Path: "env[*].valueFrom.resourceFieldRef", Class: Implemented, Note: "an unset cpu, memory or ephemeral-storage limit reads as node allocatable, as kubelet reads it (downwardAPI volumes too)"},
		{Path: "env[*].valueFrom.configMapKeyRef", Class: Implemented},
		{Path: "env[*].valueFrom.secretKeyRef", Class: Implemented},
		{Path: "env[*].valueFrom.fileKeyRef", Class: Refused, Note: "alpha (EnvFiles); variables come from configMaps, secrets and the downward API"},
		{Path: "resources", Class: Implemented},
		{Path: "resources.limits", Class: Implemented},
		{Path: "resources.requests", Class: Implemented},
		{Path: "resources.claims", Class: Refused, Note: "dynamic resource allocation " + notOnNode},
		{Path: "resizePolicy", Class: Implemented, Note: "a change of only cpu and memory requests and limits (the API's resize subresource), limits added, changed or removed, is written into the running container's cgroup with NotRequired (the default) once the node allocates it (else `PodResizePending`/`Deferred`); a memory limit below the usage is refused with `PodResizeInProgress`/`Error`; RestartContainer, another resource or a QoS class change replaces the container"},
		{Path: "restartPolicy", Class: Implemented, Note: "Always on an init container makes it a sidecar, as kubelet's; any other value, and any value on an app container (per-container restart policies, alpha), is refused"},
		{Path: "restartPolicyRules", Class: Refused, Note: "per-container restart rules (alpha) are not supported"},
		{Path: "volumeMounts", Class: Implemented},
		{Path: "volumeMounts[*].name", Class: Implemented},
		{Path: "volumeMounts[*].readOnly", Class: Implemented},
		{Path: "volumeMounts[*].recursiveReadOnly", Class: Refused, Note: "recursive read-only mounts are not supported; Disabled is accepted", used: stringNot(string(v1.RecursiveReadOnlyDisabled))},
		{Path: "volumeMounts[*].mountPath", Class: Implemented},
		{Path: "volumeMounts[*].subPath", Class: Implemented},
		{Path: "volumeMounts[*].mountPropagation", Class: Refused, Note: "mounts are private; HostToContainer and Bidirectional are refused, None is accepted", used: stringNot(string(v1.MountPropagationNone))},
		{Path: "volumeMounts[*].subPathExpr", Class: Implemented},
		{Path: "volumeMounts[*].bindMountOptions", Class: Refused, Note: "alpha; not supported"},
		{Path: "volumeDevices", Class: Refused, Note: "raw block devices come from PersistentVolumeClaims, which the node does not have"},
		{Path: "livenessProbe", Class: Implemented},
		{Path: "readinessProbe", Class: Implemented},
		{Path: "startupProbe", Class: Implemented},
		{Path: "lifecycle", Class: Implemented},
		{Path: "lifecycle.postStart", Class: Implemented, Note: "exec, httpGet, sleep; a failure kills the container"},
		{Path: "lifecycle.preStop", Class: Implemented, Note: "exec, httpGet, sleep; before the stop signal, within the grace period"},
		{Path: "lifecycle.stopSignal", Class: Refused, Note: "alpha (ContainerStopSignals); the image's stop signal is used"},
		{Path: "terminationMessagePath", Class: Implemented},
		{Path: "terminationMessagePolicy", Class: Implemented},
		{Path: "imagePullPolicy", Class: Implemented},
		{Path: "securityContext", Class: Implemented},
		{Path: "stdin", Class: Implemented, Note: "kept open by the shim between attaches and across agent restarts (kubectl attach, kubectl run -it)"},
		{Path: "stdinOnce", Class: Implemented, Note: "stdin closed when the first attach ends, unless the container has a terminal (tty), as containerd's CRI does: a cut kubectl run -it session can be resumed with kubectl attach"},
		{Path: "tty", Class: Implemented, Note: "a terminal, sized by the attach; its output is the log's stdout"},
	}
	const otherSources = "mqlet runs emptyDir, hostPath, configMap, secret, downwardAPI, projected and image volumes"
	refusedSource := func(name, why string) FieldRule {
		if why == "" {
			why = otherSources
		}
		return FieldRule{Path: "volumes[*]." + name, Class: Refused, Note: why}
	}
	volumeRules := []FieldRule{
		{Path: "volumes[*].name", Class: Implemented},
		{Path: "volumes[*].hostPath", Class: Implemented, Note: "the manifest dir's pods may use it; the MQTT source's policy decides for others"},
		{Path: "volumes[*].hostPath.path", Class: Implemented, Note: "the MQTT source's policy limits it (allowedHostPaths)"},
		{Path: "volumes[*].hostPath.type", Class: Implemented, Note: "checked at every container start as kubelet checks it; DirectoryOrCreate and FileOrCreate make what is missing; a wrong type waits with FailedMount"},
		{Path: "volumes[*].emptyDir", Class: Implemented},
		{Path: "volumes[*].emptyDir.medium", Class: Implemented, Note: `"" (the state dir's disk) or Memory (a tmpfs); HugePages media are refused`},
		{Path: "volumes[*].emptyDir.sizeLimit", Class: Implemented, Note: "Memory: the tmpfs's size (at most the pod's memory limit and node allocatable); disk: a pod whose volume holds more is evicted within evictionMonitoringPeriod (manifest-dir pods, like kubelet's static pods, are not: it is logged)"},
		{Path: "volumes[*].emptyDir.mode", Class: Implemented},
		{Path: "volumes[*].secret", Class: Implemented, Note: "on a tmpfs"},
		{Path: "volumes[*].secret.secretName", Class: Implemented},
		{Path: "volumes[*].secret.items", Class: Implemented},
		{Path: "volumes[*].secret.defaultMode", Class: Implemented},
		{Path: "volumes[*].secret.optional", Class: Implemented},
		{Path: "volumes[*].secret.defaultUser", Class: Refused, Note: "alpha; not supported"},
		{Path: "volumes[*].configMap", Class: Implemented},
		{Path: "volumes[*].configMap.name", Class: Implemented},
		{Path: "volumes[*].configMap.items", Class: Implemented},
		{Path: "volumes[*].configMap.defaultMode", Class: Implemented},
		{Path: "volumes[*].configMap.optional", Class: Implemented},
		{Path: "volumes[*].configMap.defaultUser", Class: Refused, Note: "alpha; not supported"},
		{Path: "volumes[*].downwardAPI", Class: Implemented},
		{Path: "volumes[*].downwardAPI.items", Class: Implemented},
		{Path: "volumes[*].downwardAPI.defaultMode", Class: Implemented},
		{Path: "volumes[*].downwardAPI.defaultUser", Class: Refused, Note: "alpha; not supported"},
		{Path: "volumes[*].projected", Class: Implemented},
		{Path: "volumes[*].projected.sources", Class: Implemented},
		{Path: "volumes[*].projected.sources[*].secret", Class: Implemented},
		{Path: "volumes[*].projected.sources[*].configMap", Class: Implemented},
		{Path: "volumes[*].projected.sources[*].downwardAPI", Class: Implemented},
		{Path: "volumes[*].projected.sources[*].serviceAccountToken", Class: Refused, Note: "the node has no API server to issue a token; mqlet-bridge turns it into a Secret holding a token from the API before the pod reaches the node"},
		{Path: "volumes[*].projected.sources[*].clusterTrustBundle", Class: Refused, Note: "ClusterTrustBundles are cluster objects the node does not have"},
		{Path: "volumes[*].projected.sources[*].podCertificate", Class: Refused, Note: "pod certificates are issued through the API server"},
		{Path: "volumes[*].projected.defaultMode", Class: Implemented},
		{Path: "volumes[*].projected.defaultUser", Class: Refused, Note: "alpha; not supported"},
		{Path: "volumes[*].image", Class: Implemented, Note: "the image's files, mounted read-only, nosuid, nodev, noexec, as the CRI mounts them; kept as first mounted for the pod's life"},
		{Path: "volumes[*].image.reference", Class: Implemented, Note: "pulled with the pod's imagePullSecrets; an unreachable registry falls back to a local copy, as for containers"},
		{Path: "volumes[*].image.pullPolicy", Class: Implemented, Note: "defaulted as the API does: Always for :latest or no tag, else IfNotPresent"},
		refusedSource("persistentVolumeClaim", "PersistentVolumeClaims "+notOnNode+"; use hostPath"),
		refusedSource("ephemeral", "generic ephemeral volumes are PersistentVolumeClaims, which "+notOnNode),
		refusedSource("csi", "CSI drivers are not supported"),
		refusedSource("gitRepo", "deprecated; clone in an init container into an emptyDir"),
		refusedSource("nfs", ""),
		refusedSource("iscsi", ""),
		refusedSource("glusterfs", ""),
		refusedSource("rbd", ""),
		refusedSource("cephfs", ""),
		refusedSource("fc", ""),
		refusedSource("flexVolume", ""),
		refusedSource("flocker", ""),
		refusedSource("cinder", ""),
		refusedSource("gcePersistentDisk", ""),
		refusedSource("awsElasticBlockStore", ""),
		refusedSource("azureFile", ""),
		refusedSource("azureDisk", ""),
		refusedSource("vsphereVolume", ""),
		refusedSource("quobyte", ""),
		refusedSource("photonPersistentDisk", ""),
		refusedSource("portworxVolume", ""),
		refusedSource("scaleIO", ""),
		refusedSource("storageos", ""),
	}
	out := podRules
	for _, r := range containerRules {
		r.Path = "containers[*]." + r.Path
		out = append(out, r)
	}
	out = append(out, volumeRules...)
	// An ephemeral container's fields are a container's and take the container's rule (derived:
	// checked, not printed again), except those the API forbids on an ephemeral container, which
	// are refused with their parts, and targetContainerName, which containers do not have.
	forbidden := map[string]bool{"ports": true, "resources": true, "resizePolicy": true, "restartPolicy": true, "restartPolicyRules": true,
		"livenessProbe": true, "readinessProbe": true, "startupProbe": true, "lifecycle": true}
	for _, r := range containerRules {
		top := r.Path
		if i := strings.IndexAny(top, ".["); i >= 0 {
			top = top[:i]
		}
		if forbidden[top] {
			if top == r.Path {
				out = append(out, FieldRule{Path: "ephemeralContainers[*]." + r.Path, Class: Refused,
					Note: "not allowed on an ephemeral container (the API forbids it too): it runs once, unprobed, with no resources of its own"})
			}
			continue
		}
		r.Path = "ephemeralContainers[*]." + r.Path
		r.derived = true
		out = append(out, r)
	}
	return append(out, FieldRule{Path: "ephemeralContainers[*].targetContainerName", Class: Implemented,
		Note: "the ephemeral container joins the PID namespace of the named container's running task (kubectl debug --target), unless the pod shares one process namespace (shareProcessNamespace), whose it joins. While the target runs no task, the start fails (CreateContainerConfigError) and is retried with back-off"})
}

// checkFields returns an error for each Refused field pod uses and each value of an Implemented
// field that mqlet cannot honour, each naming the field's path. Fields that found already have an
// error for (an app container's restartPolicy) get no second one.
func checkFields(spec *v1.PodSpec, found field.ErrorList) field.ErrorList {
	reported := map[string]bool{}
	for _, e := range found {
		reported[e.Field] = true
	}
	var errs field.ErrorList
	for _, r := range FieldRules() {
		if r.Class != Refused {
			continue
		}
		for _, p := range usedAt(spec, r) {
			if !reported[p.String()] {
				errs = append(errs, field.Forbidden(p, "not supported by mqlet: "+r.Note))
			}
		}
	}
	return append(errs, checkValues(spec)...)
}

// FieldWarnings lists, for each Warned field pod uses, a message naming the field's path and why
// it has no effect.
func FieldWarnings(pod *v1.Pod) []string {
	var out []string
	for _, r := range FieldRules() {
		if r.Class != Warned {
			continue
		}
		for _, p := range usedAt(&pod.Spec, r) {
			out = append(out, fmt.Sprintf("%s is ignored: %s", p, r.Note))
		}
	}
	// Inside securityContext (Implemented as a whole), the SELinux and Windows parts are ignored.
	return append(out, SecurityWarnings(pod)...)
}

// usedAt returns the paths where spec uses the rule's field: one per list element.
func usedAt(spec *v1.PodSpec, r FieldRule) []*field.Path {
	used := r.used
	if used == nil {
		used = nonEmpty
	}
	var out []*field.Path
	visit := func(p *field.Path, v reflect.Value) {
		if used(v) {
			out = append(out, p)
		}
	}
	segs := strings.Split(r.Path, ".")
	root := reflect.ValueOf(spec).Elem()
	spath := field.NewPath("spec")
	walk(root, spath, segs, visit)
	if segs[0] == "containers[*]" {
		walk(root, spath, append([]string{"initContainers[*]"}, segs[1:]...), visit)
	}
	return out
}

// walk follows segs (JSON names, "[*]" for every element) from v and calls visit at the end of
// each branch that exists.
func walk(v reflect.Value, p *field.Path, segs []string, visit func(*field.Path, reflect.Value)) {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	if len(segs) == 0 {
		return
	}
	name, each := strings.CutSuffix(segs[0], "[*]")
	f, ok := jsonField(v, name)
	if !ok {
		return
	}
	p = p.Child(name)
	if !each {
		if len(segs) == 1 {
			visit(p, f)
			return
		}
		walk(f, p, segs[1:], visit)
		return
	}
	for i := 0; i < f.Len(); i++ {
		if len(segs) == 1 {
			visit(p.Index(i), f.Index(i))
			continue
		}
		walk(f.Index(i), p.Index(i), segs[1:], visit)
	}
}

// jsonField finds the field of struct v whose JSON name is name, looking into inlined structs.
func jsonField(v reflect.Value, name string) (reflect.Value, bool) {
	if v.Kind() != reflect.Struct {
		return reflect.Value{}, false
	}
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		tag, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if sf.Anonymous && tag == "" {
			if f, ok := jsonField(v.Field(i), name); ok {
				return f, true
			}
			continue
		}
		if tag == name {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

func nonEmpty(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Slice, reflect.Map, reflect.String:
		return v.Len() > 0
	case reflect.Pointer, reflect.Interface:
		return !v.IsNil()
	}
	return !v.IsZero()
}

// checkValues refuses values of implemented fields that mqlet does not support, and applies the
// API server's rules for them that the node relies on.
func checkValues(spec *v1.PodSpec) field.ErrorList {
	var errs field.ErrorList
	sp := field.NewPath("spec")
	if spec.OS != nil && string(spec.OS.Name) != runtime.GOOS {
		errs = append(errs, field.NotSupported(sp.Child("os", "name"), spec.OS.Name, []string{runtime.GOOS}))
	}
	for i := range spec.Volumes {
		errs = append(errs, checkVolume(&spec.Volumes[i], sp.Child("volumes").Index(i))...)
	}
	return errs
}

func checkVolume(v *v1.Volume, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if n := setSources(&v.VolumeSource); len(n) > 1 {
		errs = append(errs, field.Forbidden(p, fmt.Sprintf("may not specify more than 1 volume type (has %s)", strings.Join(n, ", "))))
	}
	if ed := v.EmptyDir; ed != nil {
		ep := p.Child("emptyDir")
		switch {
		case ed.Medium == v1.StorageMediumDefault, ed.Medium == v1.StorageMediumMemory:
		case strings.HasPrefix(string(ed.Medium), string(v1.StorageMediumHugePages)):
			e := field.NotSupported(ep.Child("medium"), ed.Medium, []string{"", string(v1.StorageMediumMemory)})
			e.Detail += " (huge pages are not supported by mqlet)"
			errs = append(errs, e)
		default:
			errs = append(errs, field.NotSupported(ep.Child("medium"), ed.Medium, []string{"", string(v1.StorageMediumMemory)}))
		}
		if ed.SizeLimit != nil && ed.SizeLimit.Sign() < 0 {
			errs = append(errs, field.Invalid(ep.Child("sizeLimit"), ed.SizeLimit.String(), "must be greater than or equal to 0"))
		}
		if ed.Mode != nil && (*ed.Mode < 0 || *ed.Mode > 0o1777) {
			errs = append(errs, field.Invalid(ep.Child("mode"), fmt.Sprintf("%#o", *ed.Mode), "must be between 0000 and 01777"))
		}
	}
	// hostPath.path ('..', relative paths) is the MQTT policy's to judge (policy.go): the manifest
	// dir is trusted.
	if hp := v.HostPath; hp != nil && hp.Type != nil {
		valid := []v1.HostPathType{v1.HostPathUnset, v1.HostPathDirectoryOrCreate, v1.HostPathDirectory,
			v1.HostPathFileOrCreate, v1.HostPathFile, v1.HostPathSocket, v1.HostPathCharDev, v1.HostPathBlockDev}
		if !slices.Contains(valid, *hp.Type) {
			errs = append(errs, field.NotSupported(p.Child("hostPath", "type"), *hp.Type, valid))
		}
	}
	return errs
}

// setSources names the volume sources set in s.
func setSources(s *v1.VolumeSource) []string {
	var out []string
	v := reflect.ValueOf(s).Elem()
	for i := 0; i < v.NumField(); i++ {
		if !v.Field(i).IsNil() {
			name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
			out = append(out, name)
		}
	}
	return out
}

// defaultVolumeSource is the API server's default: a volume that names no source is an emptyDir.
func defaultVolumeSource(spec *v1.PodSpec) {
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		if len(setSources(&v.VolumeSource)) == 0 {
			v.EmptyDir = &v1.EmptyDirVolumeSource{}
		}
		if v.Image != nil && v.Image.PullPolicy == "" {
			v.Image.PullPolicy = DefaultPullPolicy(v.Image.Reference)
		}
	}
}
