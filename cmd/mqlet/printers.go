package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mqlet/mqlet/agent/podspec"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"
)

// Output formats accepted by -o.
const (
	outputTable = ""
	outputWide  = "wide"
	outputJSON  = "json"
	outputYAML  = "yaml"
)

// printPods writes list in the given format. The table formats report an
// empty list on errOut, like kubectl, so that a pipe reading out sees no
// rows; json and yaml always print the (possibly empty) list.
func printPods(out, errOut io.Writer, list *v1.PodList, format string, now time.Time) error {
	switch format {
	case outputJSON:
		b, err := json.MarshalIndent(list, "", "    ")
		if err != nil {
			return fmt.Errorf("encoding pod list as json: %w", err)
		}
		_, err = out.Write(append(b, '\n'))
		return err
	case outputYAML:
		b, err := yaml.Marshal(list)
		if err != nil {
			return fmt.Errorf("encoding pod list as yaml: %w", err)
		}
		_, err = out.Write(b)
		return err
	case outputTable, outputWide:
		if len(list.Items) == 0 {
			_, err := fmt.Fprintln(errOut, "No resources found.")
			return err
		}
		return printPodTable(out, list.Items, format == outputWide, now)
	default:
		return fmt.Errorf("unknown output format %q (want one of wide, json, yaml, or empty for the table)", format)
	}
}

func printPodTable(out io.Writer, pods []v1.Pod, wide bool, now time.Time) error {
	tw := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	header := "NAMESPACE\tNAME\tREADY\tSTATUS\tRESTARTS\tAGE"
	if wide {
		header += "\tIP\tNODE\tCONTAINERS\tIMAGES"
	}
	fmt.Fprintln(tw, header)
	for i := range pods {
		p := &pods[i]
		s := summarizePod(p)
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s\t%s\t%s", p.Namespace, p.Name, s.ready, s.total, s.status, s.restartsColumn(now), humanAge(podAgeStart(p), now))
		if wide {
			var names, images []string
			for _, c := range p.Spec.Containers {
				names = append(names, c.Name)
				images = append(images, c.Image)
			}
			fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s", orNone(p.Status.PodIP), orNone(p.Spec.NodeName),
				orNone(strings.Join(names, ",")), orNone(strings.Join(images, ",")))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// podSummary is one row's computed columns.
type podSummary struct {
	ready, total int
	status       string
	restarts     int
	lastRestart  time.Time // zero when no container has restarted with a known time
}

// restartsColumn is RESTARTS as kubectl shows it: the count, and how long ago the last one was.
func (s podSummary) restartsColumn(now time.Time) string {
	if s.lastRestart.IsZero() {
		return fmt.Sprint(s.restarts)
	}
	return fmt.Sprintf("%d (%s ago)", s.restarts, humanAge(s.lastRestart, now))
}

// summarizePod computes READY, STATUS and RESTARTS the way kubectl's pod
// printer does, so the same pod reads the same here and in `kubectl get`.
// Notably, containers are walked last to first, so the reason shown is that
// of the first container (in spec order) that is not running and ready.
func summarizePod(pod *v1.Pod) podSummary {
	s := podSummary{total: len(pod.Spec.Containers), status: string(pod.Status.Phase)}
	if pod.Status.Reason != "" {
		s.status = pod.Status.Reason
	}
	noteRestart := func(cs *v1.ContainerStatus) {
		if t := cs.LastTerminationState.Terminated; cs.RestartCount > 0 && t != nil && t.FinishedAt.After(s.lastRestart) {
			s.lastRestart = t.FinishedAt.Time
		}
	}

	// Sidecars (init containers with restartPolicy Always) count as regular
	// containers for READY and RESTARTS.
	sidecar := map[string]bool{}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			sidecar[c.Name] = true
			s.total++
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonSchedulingGated {
			s.status = v1.PodReasonSchedulingGated
		}
	}

	initializing := false
	sidecarRestarts := 0
	for i := range pod.Status.InitContainerStatuses {
		cs := &pod.Status.InitContainerStatuses[i]
		s.restarts += int(cs.RestartCount)
		noteRestart(cs)
		if sidecar[cs.Name] {
			sidecarRestarts += int(cs.RestartCount)
		}
		term, wait := cs.State.Terminated, cs.State.Waiting
		switch {
		case term != nil && term.ExitCode == 0:
			continue
		case sidecar[cs.Name] && cs.Started != nil && *cs.Started:
			if cs.Ready {
				s.ready++
			}
			continue
		case term != nil:
			s.status = "Init:" + terminatedReason(term)
		case wait != nil && wait.Reason != "" && wait.Reason != "PodInitializing":
			s.status = "Init:" + wait.Reason
		default:
			s.status = fmt.Sprintf("Init:%d/%d", i, len(pod.Spec.InitContainers))
		}
		initializing = true
		break
	}

	if !initializing || podConditionTrue(pod, v1.PodInitialized) {
		s.restarts = sidecarRestarts
		hasRunning := false
		for i := len(pod.Status.ContainerStatuses) - 1; i >= 0; i-- {
			cs := &pod.Status.ContainerStatuses[i]
			s.restarts += int(cs.RestartCount)
			noteRestart(cs)
			switch {
			case cs.State.Waiting != nil && cs.State.Waiting.Reason != "":
				s.status = cs.State.Waiting.Reason
			case cs.State.Terminated != nil:
				s.status = terminatedReason(cs.State.Terminated)
			case cs.Ready && cs.State.Running != nil:
				hasRunning = true
				s.ready++
			}
		}
		// One container completed while another still runs: the pod is
		// still running, not completed.
		if s.status == "Completed" && hasRunning {
			if podConditionTrue(pod, v1.PodReady) {
				s.status = "Running"
			} else {
				s.status = "NotReady"
			}
		}
	}

	if pod.DeletionTimestamp != nil {
		switch {
		case pod.Status.Reason == "NodeLost":
			s.status = "Unknown"
		case pod.Status.Phase != v1.PodSucceeded && pod.Status.Phase != v1.PodFailed:
			s.status = "Terminating"
		}
	}
	return s
}

// terminatedReason is the runtime's reason (Completed, Error, OOMKilled),
// or, when it gave none, the signal or exit code.
func terminatedReason(t *v1.ContainerStateTerminated) string {
	switch {
	case t.Reason != "":
		return t.Reason
	case t.Signal != 0:
		return fmt.Sprintf("Signal:%d", t.Signal)
	default:
		return fmt.Sprintf("ExitCode:%d", t.ExitCode)
	}
}

func podConditionTrue(pod *v1.Pod, t v1.PodConditionType) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == t {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// podAgeStart is when the pod started on this node, falling back to when it
// was created: pods from the local manifest directory may carry no
// creationTimestamp, and for pods pushed while the node was offline the
// local start is the more telling time.
func podAgeStart(pod *v1.Pod) time.Time {
	if pod.Status.StartTime != nil && !pod.Status.StartTime.IsZero() {
		return pod.Status.StartTime.Time
	}
	return pod.CreationTimestamp.Time
}

// humanAge formats now-t like kubectl's AGE column (5s, 3m12s, 2h, 4d).
func humanAge(t time.Time, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t))
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// describePod writes a multi-section, human-readable view of one pod,
// modelled on `kubectl describe pod`.
func describePod(out io.Writer, pod *v1.Pod, now time.Time) error {
	tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	d := &describer{w: tw}

	d.line(0, "Name", pod.Name)
	d.line(0, "Namespace", pod.Namespace)
	d.line(0, "UID", orNone(string(pod.UID)))
	node := orNone(pod.Spec.NodeName)
	if pod.Status.HostIP != "" {
		node += "/" + pod.Status.HostIP
	}
	d.line(0, "Node", node)
	if pod.Status.StartTime != nil {
		d.line(0, "Start Time", formatTime(pod.Status.StartTime.Time))
	}
	d.mapLines(0, "Labels", pod.Labels)
	d.mapLines(0, "Annotations", pod.Annotations)
	status := string(pod.Status.Phase)
	if pod.DeletionTimestamp != nil {
		status = fmt.Sprintf("Terminating (since %s, %s ago)", formatTime(pod.DeletionTimestamp.Time), humanAge(pod.DeletionTimestamp.Time, now))
	}
	d.line(0, "Status", orNone(status))
	if pod.Status.Reason != "" {
		d.line(0, "Reason", pod.Status.Reason)
	}
	if pod.Status.Message != "" {
		d.line(0, "Message", pod.Status.Message)
	}
	d.line(0, "IP", orNone(pod.Status.PodIP))
	if pod.Status.QOSClass != "" {
		d.line(0, "QoS Class", string(pod.Status.QOSClass))
	}

	if len(pod.Spec.InitContainers) > 0 {
		d.header(0, "Init Containers")
		describeContainers(d, pod.Spec.InitContainers, pod.Status.InitContainerStatuses)
	}
	d.header(0, "Containers")
	describeContainers(d, pod.Spec.Containers, pod.Status.ContainerStatuses)
	if len(pod.Spec.EphemeralContainers) > 0 { // kubectl debug's, as kubectl describe lists them
		d.header(0, "Ephemeral Containers")
		describeContainers(d, podspec.EphemeralContainers(&pod.Spec), pod.Status.EphemeralContainerStatuses)
	}

	if len(pod.Status.Conditions) == 0 {
		d.line(0, "Conditions", "<none>")
	} else {
		d.header(0, "Conditions")
		d.raw("  Type\tStatus\tReason\tLast Transition")
		for _, c := range pod.Status.Conditions {
			last := "<unknown>"
			if !c.LastTransitionTime.IsZero() {
				last = humanAge(c.LastTransitionTime.Time, now) + " ago"
			}
			d.raw(fmt.Sprintf("  %s\t%s\t%s\t%s", c.Type, c.Status, orNone(c.Reason), last))
		}
	}

	if len(pod.Spec.Volumes) > 0 {
		d.header(0, "Volumes")
		for _, v := range pod.Spec.Volumes {
			d.line(1, v.Name, volumeSource(&v.VolumeSource))
		}
	}
	return tw.Flush()
}

func describeContainers(d *describer, specs []v1.Container, statuses []v1.ContainerStatus) {
	byName := make(map[string]*v1.ContainerStatus, len(statuses))
	for i := range statuses {
		byName[statuses[i].Name] = &statuses[i]
	}
	for i := range specs {
		c := &specs[i]
		cs := byName[c.Name]
		if cs == nil {
			cs = &v1.ContainerStatus{} // no status yet: print the spec with empty state
		}
		d.header(1, c.Name)
		d.line(2, "Container ID", orNone(cs.ContainerID))
		d.line(2, "Image", c.Image)
		d.line(2, "Image ID", orNone(cs.ImageID))
		if len(c.Ports) > 0 {
			var ports []string
			for _, p := range c.Ports {
				ports = append(ports, fmt.Sprintf("%d/%s", p.ContainerPort, orDefault(string(p.Protocol), "TCP")))
			}
			d.line(2, "Ports", strings.Join(ports, ", "))
		}
		d.list(2, "Command", c.Command)
		d.list(2, "Args", c.Args)
		describeState(d, "State", cs.State)
		if (cs.LastTerminationState != v1.ContainerState{}) {
			describeState(d, "Last State", cs.LastTerminationState)
		}
		d.line(2, "Ready", titleBool(cs.Ready))
		d.line(2, "Restart Count", fmt.Sprint(cs.RestartCount))
		d.resources(2, "Limits", c.Resources.Limits)
		d.resources(2, "Requests", c.Resources.Requests)
		describeEnv(d, c)
		if len(c.VolumeMounts) > 0 {
			d.header(2, "Mounts")
			for _, m := range c.VolumeMounts {
				mode := "rw"
				if m.ReadOnly {
					mode = "ro"
				}
				d.raw(fmt.Sprintf("%s%s from %s (%s)", indent(3), m.MountPath, m.Name, mode))
			}
		}
	}
}

func describeState(d *describer, label string, st v1.ContainerState) {
	switch {
	case st.Running != nil:
		d.line(2, label, "Running")
		d.line(3, "Started", formatTime(st.Running.StartedAt.Time))
	case st.Waiting != nil:
		d.line(2, label, "Waiting")
		if st.Waiting.Reason != "" {
			d.line(3, "Reason", st.Waiting.Reason)
		}
		if st.Waiting.Message != "" {
			d.line(3, "Message", st.Waiting.Message)
		}
	case st.Terminated != nil:
		t := st.Terminated
		d.line(2, label, "Terminated")
		d.line(3, "Reason", orNone(t.Reason))
		if t.Message != "" {
			d.line(3, "Message", t.Message)
		}
		d.line(3, "Exit Code", fmt.Sprint(t.ExitCode))
		if t.Signal != 0 {
			d.line(3, "Signal", fmt.Sprint(t.Signal))
		}
		d.line(3, "Started", formatTime(t.StartedAt.Time))
		d.line(3, "Finished", formatTime(t.FinishedAt.Time))
	default:
		d.line(2, label, "<none>")
	}
}

func describeEnv(d *describer, c *v1.Container) {
	if len(c.EnvFrom) > 0 {
		d.header(2, "Environment Variables from")
		for _, ef := range c.EnvFrom {
			kind, name, optional := "", "", (*bool)(nil)
			switch {
			case ef.ConfigMapRef != nil:
				kind, name, optional = "ConfigMap", ef.ConfigMapRef.Name, ef.ConfigMapRef.Optional
			case ef.SecretRef != nil:
				kind, name, optional = "Secret", ef.SecretRef.Name, ef.SecretRef.Optional
			default:
				kind = "<unknown source>"
			}
			prefix := ""
			if ef.Prefix != "" {
				prefix = fmt.Sprintf(" with prefix '%s'", ef.Prefix)
			}
			d.raw(fmt.Sprintf("%s%s\t%s%s\tOptional: %t", indent(3), name, kind, prefix, optional != nil && *optional))
		}
	}
	if len(c.Env) == 0 {
		d.line(2, "Environment", "<none>")
		return
	}
	d.header(2, "Environment")
	for _, e := range c.Env {
		d.line(3, e.Name, envValue(&e))
	}
}

// envValue says where a variable's value comes from; references are not
// resolved here because the agent resolves them only when starting the
// container.
func envValue(e *v1.EnvVar) string {
	vf := e.ValueFrom
	switch {
	case vf == nil:
		return e.Value
	case vf.FieldRef != nil:
		return fmt.Sprintf("(field %s)", vf.FieldRef.FieldPath)
	case vf.ResourceFieldRef != nil:
		r := vf.ResourceFieldRef
		if r.ContainerName != "" {
			return fmt.Sprintf("(resource %s of container %s)", r.Resource, r.ContainerName)
		}
		return fmt.Sprintf("(resource %s)", r.Resource)
	case vf.ConfigMapKeyRef != nil:
		r := vf.ConfigMapKeyRef
		return fmt.Sprintf("<set to the key '%s' of config map '%s'>\tOptional: %t", r.Key, r.Name, r.Optional != nil && *r.Optional)
	case vf.SecretKeyRef != nil:
		r := vf.SecretKeyRef
		return fmt.Sprintf("<set to the key '%s' in secret '%s'>\tOptional: %t", r.Key, r.Name, r.Optional != nil && *r.Optional)
	default:
		return "<unknown source>"
	}
}

func volumeSource(v *v1.VolumeSource) string {
	switch {
	case v.HostPath != nil:
		return "HostPath " + v.HostPath.Path
	case v.EmptyDir != nil:
		if v.EmptyDir.Medium != "" {
			return "EmptyDir (" + string(v.EmptyDir.Medium) + ")"
		}
		return "EmptyDir"
	case v.ConfigMap != nil:
		return "ConfigMap " + v.ConfigMap.Name
	case v.Secret != nil:
		return "Secret " + v.Secret.SecretName
	case v.Projected != nil:
		return "Projected"
	case v.PersistentVolumeClaim != nil:
		return "PersistentVolumeClaim " + v.PersistentVolumeClaim.ClaimName
	default:
		return "<other>"
	}
}

// describer writes "Key:<TAB>value" lines into one tabwriter so values line
// up within each section.
type describer struct {
	w io.Writer
}

func indent(level int) string { return strings.Repeat("  ", level) }

func (d *describer) raw(s string) { fmt.Fprintln(d.w, s) }

func (d *describer) line(level int, key, value string) {
	fmt.Fprintf(d.w, "%s%s:\t%s\n", indent(level), key, value)
}

func (d *describer) header(level int, key string) {
	fmt.Fprintf(d.w, "%s%s:\n", indent(level), key)
}

func (d *describer) mapLines(level int, key string, m map[string]string) {
	if len(m) == 0 {
		d.line(level, key, "<none>")
		return
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		label := key + ":"
		if i > 0 {
			label = ""
		}
		fmt.Fprintf(d.w, "%s%s\t%s=%s\n", indent(level), label, k, m[k])
	}
}

// list prints one item per line in the value column, like mapLines, so the
// items do not break the tabwriter block and the values stay aligned. Items
// with newlines (inline shell scripts) continue on further lines.
func (d *describer) list(level int, key string, items []string) {
	if len(items) == 0 {
		return
	}
	label := key + ":"
	for _, it := range items {
		for _, ln := range strings.Split(it, "\n") {
			fmt.Fprintf(d.w, "%s%s\t%s\n", indent(level), label, ln)
			label = ""
		}
	}
}

func (d *describer) resources(level int, key string, rl v1.ResourceList) {
	if len(rl) == 0 {
		return
	}
	d.header(level, key)
	names := make([]string, 0, len(rl))
	for n := range rl {
		names = append(names, string(n))
	}
	slices.Sort(names)
	for _, n := range names {
		q := rl[v1.ResourceName(n)]
		d.line(level+1, n, q.String())
	}
}

func titleBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// formatTime matches kubectl describe's timestamps.
func formatTime(t time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return t.Format(time.RFC1123Z)
}

// printObject writes v as indented JSON or as YAML (format json or yaml).
func printObject(out io.Writer, v any, format string) error {
	var b []byte
	var err error
	switch format {
	case outputJSON:
		b, err = json.MarshalIndent(v, "", "    ")
		b = append(b, '\n')
	case outputYAML:
		b, err = yaml.Marshal(v)
	default:
		return fmt.Errorf("unknown output format %q (want json or yaml)", format)
	}
	if err != nil {
		return fmt.Errorf("encoding %T as %s: %w", v, format, err)
	}
	_, err = out.Write(b)
	return err
}
