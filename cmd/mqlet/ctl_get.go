package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mqlet/mqlet/sync/ctlclient"
	"github.com/mqlet/mqlet/sync/protocol"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CtlGetCmd is `mqlet ctl get`.
type CtlGetCmd struct {
	Nodes CtlGetNodesCmd `cmd:"" help:"List the nodes the broker knows of."`
	Pods  CtlGetPodsCmd  `cmd:"" help:"List the pods the nodes report."`
}

// CtlGetNodesCmd is `mqlet ctl get nodes`.
type CtlGetNodesCmd struct {
	Output string `short:"o" enum:"json,yaml," default:"" help:"Output format: json or yaml, a v1.NodeList (default: a table)."`
}

// Run prints NAME STATUS SINCE SESSION READY VERSION, or the nodes as a v1.NodeList.
func (c *CtlGetNodesCmd) Run(ctl *CtlCmd, env *ctlEnv) error {
	ctx, stop := env.context()
	defer stop()
	cl, err := ctl.connect(ctx)
	if err != nil {
		return fmt.Errorf("ctl get nodes: %w", err)
	}
	defer cl.Close()
	l, err := cl.Nodes(ctx)
	if err != nil {
		return fmt.Errorf("ctl get nodes: %w", err)
	}
	defer warnSkipped(env.errOut, l.Skipped)
	if c.Output == outputJSON || c.Output == outputYAML {
		list := &v1.NodeList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "NodeList"}, Items: []v1.Node{}}
		for i := range l.Items {
			list.Items = append(list.Items, *vouchedNode(&l.Items[i]))
		}
		return printObject(env.out, list, c.Output)
	}
	if len(l.Items) == 0 {
		_, err := fmt.Fprintln(env.errOut, "No nodes found.")
		return err
	}
	return printNodes(env.out, l.Items, env.now())
}

func printNodes(out io.Writer, nodes []ctlclient.Node, now time.Time) error {
	tw := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATUS\tSINCE\tSESSION\tREADY\tVERSION")
	for i := range nodes {
		n := &nodes[i]
		session := "<none>"
		if n.Session > 0 {
			session = fmt.Sprint(n.Session)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.State, humanAge(n.Since, now), session, nodeReady(n), orNone(n.Version))
	}
	return tw.Flush()
}

// nodeReady is the READY column: the status of the node's Ready condition as the node last
// reported it while it is online; "Unknown (was True)" when it is not, since an offline node's
// retained status is only its last word; <none> without a node status.
func nodeReady(n *ctlclient.Node) string {
	s := n.Status
	if s == nil || s.Object == nil {
		return "<none>"
	}
	reported := string(v1.ConditionUnknown)
	for _, c := range s.Object.Status.Conditions {
		if c.Type == v1.NodeReady {
			reported = string(c.Status)
		}
	}
	if n.State == ctlclient.StateOnline {
		return reported
	}
	return fmt.Sprintf("Unknown (was %s)", reported)
}

// Annotations ctl get nodes -o json|yaml adds to each node: what the broker's liveness message says.
const (
	annotationLiveness      = "mqlet.io/liveness"       // online, offline or unknown
	annotationLivenessSince = "mqlet.io/liveness-since" // RFC 3339, by the node's clock
	annotationSession       = "mqlet.io/session"
)

// reasonNodeStatusUnknown is what Kubernetes' node lifecycle controller writes into the conditions
// of a node that stopped reporting.
const reasonNodeStatusUnknown = "NodeStatusUnknown"

// vouchedNode is n's reported v1.Node (a bare one named n.Name when it reported none) with its
// liveness as annotations. When the node is not online, every condition becomes Unknown, as the
// node lifecycle controller marks a node that stopped reporting: the retained status is what the
// node said before it went away, not what holds now.
func vouchedNode(n *ctlclient.Node) *v1.Node {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}
	if n.Status != nil && n.Status.Object != nil {
		node = n.Status.Object.DeepCopy()
	}
	node.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[annotationLiveness] = n.State
	if n.Session > 0 {
		node.Annotations[annotationSession] = fmt.Sprint(n.Session)
	}
	if !n.Since.IsZero() {
		node.Annotations[annotationLivenessSince] = n.Since.UTC().Format(time.RFC3339)
	}
	if n.State == ctlclient.StateOnline {
		return node
	}
	since := metav1.Time{}
	if !n.Since.IsZero() {
		since = metav1.NewTime(n.Since)
	}
	for i := range node.Status.Conditions {
		c := &node.Status.Conditions[i]
		if c.Status == v1.ConditionUnknown {
			continue
		}
		said := fmt.Sprintf("The node is %s (its liveness message on the broker); it last reported %s %s", n.State, c.Type, c.Status)
		if c.Message != "" {
			said += ": " + c.Message
		}
		c.Message = said
		c.Status, c.Reason = v1.ConditionUnknown, reasonNodeStatusUnknown
		if !since.IsZero() {
			c.LastTransitionTime = since
		}
	}
	if len(node.Status.Conditions) == 0 {
		node.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionUnknown, Reason: reasonNodeStatusUnknown,
			Message: fmt.Sprintf("The node is %s (its liveness message on the broker) and has reported no status", n.State), LastTransitionTime: since}}
	}
	return node
}

// CtlGetPodsCmd is `mqlet ctl get pods`.
type CtlGetPodsCmd struct {
	Node          string `help:"Only this node's pods (default: every node's)."`
	Namespace     string `short:"n" help:"Namespace (default: default)."`
	AllNamespaces bool   `short:"A" name:"all-namespaces" help:"Pods of every namespace."`
	Output        string `short:"o" enum:"wide,json,yaml," default:"" help:"Output format: wide, json or yaml (default: a table)."`
}

// Run lists the reported pods, and the pods the nodes refused.
func (c *CtlGetPodsCmd) Run(ctl *CtlCmd, env *ctlEnv) error {
	ctx, stop := env.context()
	defer stop()
	ns := c.Namespace
	switch {
	case c.AllNamespaces && ns != "":
		return errors.New("ctl get pods: -n and -A exclude each other")
	case c.AllNamespaces:
	case ns == "":
		ns = "default"
	}
	cl, err := ctl.connect(ctx)
	if err != nil {
		return fmt.Errorf("ctl get pods: %w", err)
	}
	defer cl.Close()
	l, err := cl.Pods(ctx, c.Node)
	if err != nil {
		return fmt.Errorf("ctl get pods: %w", err)
	}
	skipped := l.Skipped
	// The refusals come from the nodes' retained acks: a pod the node refused has no status to
	// show it by, and nobody may have been reading the node's events when it was refused.
	acks := map[string]*protocol.Acks{}
	if c.Node != "" {
		a, err := cl.Acks(ctx, c.Node)
		if err != nil {
			return fmt.Errorf("ctl get pods: %w", err)
		}
		if a != nil {
			acks[c.Node] = a
		}
	} else {
		var bad []error
		if acks, bad, err = cl.AllAcks(ctx); err != nil {
			return fmt.Errorf("ctl get pods: %w", err)
		}
		skipped = append(skipped, bad...)
		// A node with a status summary keeps acks too: one whose acks did not arrive (a
		// fleet-wide read larger than the broker's queue for this client loses messages without
		// a word) is read again alone, so its refused pods are not left out.
		for _, node := range slices.Sorted(maps.Keys(l.Summaries)) {
			if acks[node] != nil {
				continue
			}
			a, err := cl.Acks(ctx, node)
			if err != nil {
				return fmt.Errorf("ctl get pods: read the acks of node %s again: %w", node, err)
			}
			if a != nil {
				acks[node] = a
			}
		}
	}
	rows := podRows(l.Items, acks, ns)
	// Whatever is printed, a read that lacks statuses is said so after it, and fails.
	defer func() { warnSkipped(env.errOut, skipped) }()
	defer warnIncomplete(env.errOut, l)
	if c.Output == outputWide {
		for _, n := range l.Unchecked {
			fmt.Fprintf(env.errOut, "note: node %s publishes no status summary: whether all its pod statuses arrived is not checked\n", n)
		}
	}
	incomplete := func() error {
		if err := l.Incomplete(); err != nil {
			return fmt.Errorf("ctl get pods: %w", err)
		}
		return nil
	}

	if c.Output == outputJSON || c.Output == outputYAML {
		list := &v1.PodList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodList"}, Items: []v1.Pod{}}
		for _, r := range rows {
			list.Items = append(list.Items, *r.pod())
		}
		if err := printPods(env.out, env.errOut, list, c.Output, env.now()); err != nil {
			return err
		}
		return incomplete()
	}
	if len(rows) == 0 {
		if _, err := fmt.Fprintln(env.errOut, "No resources found."); err != nil {
			return err
		}
		return incomplete()
	}
	// The desired generations, to show pods the node has not caught up with.
	var indexes map[string]*protocol.Index
	if c.Node != "" {
		idx, err := cl.Index(ctx, c.Node)
		if err != nil {
			return fmt.Errorf("ctl get pods: %w", err)
		}
		indexes = map[string]*protocol.Index{c.Node: idx}
	} else {
		var bad []error
		if indexes, bad, err = cl.Indexes(ctx); err != nil {
			return fmt.Errorf("ctl get pods: %w", err)
		}
		skipped = append(skipped, bad...)
		// A node whose acks name an index has one retained: one that did not arrive in the
		// fleet-wide read (the broker's queue for this client loses messages without a word) is
		// read again alone, so its "(desired N)" is not left out as if it had caught up.
		for _, node := range slices.Sorted(maps.Keys(acks)) {
			if a := acks[node]; a == nil || a.IndexRevision == 0 || indexes[node] != nil {
				continue
			}
			idx, err := cl.Index(ctx, node)
			if err != nil {
				return fmt.Errorf("ctl get pods: read the index of node %s again: %w", node, err)
			}
			if idx != nil {
				if indexes == nil {
					indexes = map[string]*protocol.Index{}
				}
				indexes[node] = idx
			}
		}
	}
	if err := printPodRows(env.out, rows, indexes, c.Output == outputWide, env.now()); err != nil {
		return err
	}
	return incomplete()
}

// warnIncomplete names, after the output, every node whose pod statuses did not all arrive.
func warnIncomplete(w io.Writer, l *ctlclient.PodList) {
	for _, s := range l.Short {
		fmt.Fprintf(w, "warning: incomplete: %s; its pods above are only those received\n", s)
	}
}

// podRow is one pod of `ctl get pods`: reported by its node, or refused by it.
type podRow struct {
	node, namespace, name string
	// status is the node's report; nil when the node runs no version of the pod because it refused
	// the one it was given.
	status *protocol.PodStatus
	// refusal is the node's refusal of the pod's desired generation (from its acks), or nil.
	refusal *protocol.Refusal
}

// podRows joins the reported pods with the pods the nodes' acks say they refused, in namespace ns
// ("" for all), sorted by node, namespace and name.
func podRows(statuses []protocol.PodStatus, acks map[string]*protocol.Acks, ns string) []podRow {
	byKey := map[string]*podRow{}
	var keys []string
	for i := range statuses {
		s := &statuses[i]
		if ns != "" && s.Namespace != ns {
			continue
		}
		k := s.Node + "\x00" + s.Namespace + "\x00" + s.Name
		byKey[k] = &podRow{node: s.Node, namespace: s.Namespace, name: s.Name, status: s}
		keys = append(keys, k)
	}
	for node, a := range acks {
		if a == nil {
			continue
		}
		for key, r := range a.Refused {
			kind, namespace, name, err := protocol.ParseObjectKey(key)
			if err != nil || kind != protocol.KindPod || ns != "" && namespace != ns {
				continue
			}
			k := node + "\x00" + namespace + "\x00" + name
			row := byKey[k]
			if row == nil {
				row = &podRow{node: node, namespace: namespace, name: name}
				byKey[k] = row
				keys = append(keys, k)
			}
			row.refusal = &r
		}
	}
	slices.Sort(keys)
	rows := make([]podRow, len(keys))
	for i, k := range keys {
		rows[i] = *byKey[k]
	}
	return rows
}

// pod is the row as a v1.Pod. A refused pod the node does not run is shown as kubelet shows a pod
// its admission rejected: phase Failed, reason Refused and the node's reason as the message.
func (r podRow) pod() *v1.Pod {
	if r.status != nil {
		return reportedPod(r.status)
	}
	return &v1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: r.namespace, Name: r.name},
		Spec:       v1.PodSpec{NodeName: r.node},
		Status:     v1.PodStatus{Phase: v1.PodFailed, Reason: "Refused", Message: r.refusalText()},
	}
}

// refusalText is the node's refusal in words, "" when there is none.
func (r podRow) refusalText() string {
	if r.refusal == nil {
		return ""
	}
	return fmt.Sprintf("node %s refused generation %d: %s", r.node, r.refusal.Generation, r.refusal.Reason)
}

// reportedPod is the pod of a status message as a v1.Pod: the node's object, or the names alone
// when the node sent none.
func reportedPod(s *protocol.PodStatus) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, UID: s.UID}}
	if s.Object != nil {
		p = s.Object.DeepCopy()
	}
	p.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
	if p.Spec.NodeName == "" {
		p.Spec.NodeName = s.Node
	}
	return p
}

func printPodRows(out io.Writer, rows []podRow, indexes map[string]*protocol.Index, wide bool, now time.Time) error {
	tw := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	header := "NAMESPACE\tNAME\tNODE\tREADY\tSTATUS\tRESTARTS\tGENERATION\tAGE"
	if wide {
		header += "\tIP\tSOURCE\tMESSAGE"
	}
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		p := r.pod()
		sum := summarizePod(p)
		ready, restarts, source := fmt.Sprintf("%d/%d", sum.ready, sum.total), sum.restartsColumn(now), "mqtt"
		if r.status == nil {
			ready, restarts = "-", "-" // nothing runs, and the node sent no spec to count containers in
		} else {
			source = r.status.Source
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", r.namespace, r.name, r.node, ready, orNone(sum.status),
			restarts, generationColumn(r.status, r.refusal, indexes[r.node], r.namespace, r.name), humanAge(podAgeStart(p), now))
		if wide {
			fmt.Fprintf(tw, "\t%s\t%s\t%s", orNone(p.Status.PodIP), orNone(source), orNone(r.refusalText()))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// generationColumn is the generation the node runs (observedGeneration; "-" for a pod of the
// node's manifest dir, "<none>" when it runs none), and the desired one when they differ: the pod is
// then on its way to a newer spec, or to deletion, or the node refused the newer spec.
func generationColumn(s *protocol.PodStatus, refusal *protocol.Refusal, idx *protocol.Index, namespace, name string) string {
	key := protocol.ObjectKey(protocol.KindPod, namespace, name)
	if s != nil && (s.Source == "file" || s.Generation == 0 && refusal == nil && (idx == nil || idx.Objects[key].Generation == 0)) {
		return "-" // from the node's manifest dir: no generation
	}
	got := "<none>"
	if s != nil {
		got = fmt.Sprint(s.Generation)
	}
	want, listed := protocol.IndexEntry{}, false
	if idx != nil {
		want, listed = idx.Objects[key]
	}
	switch {
	case refusal != nil && (!listed || want.Generation == refusal.Generation):
		return fmt.Sprintf("%s (refused %d)", got, refusal.Generation)
	case refusal != nil:
		// The node's refusal is of an older generation than the index lists now: the newer
		// one has yet to reach it.
		return fmt.Sprintf("%s (refused %d, desired %d)", got, refusal.Generation, want.Generation)
	case idx == nil:
		return got
	case !listed:
		return got + " (deleting)"
	case s == nil || want.Generation != s.Generation:
		return fmt.Sprintf("%s (desired %d)", got, want.Generation)
	}
	return got
}

// CtlDescribeCmd is `mqlet ctl describe`.
type CtlDescribeCmd struct {
	Node CtlDescribeNodeCmd `cmd:"" help:"Show a node in detail."`
	Pod  CtlDescribePodCmd  `cmd:"" help:"Show a pod of a node in detail."`
}

// CtlDescribeNodeCmd is `mqlet ctl describe node NAME`.
type CtlDescribeNodeCmd struct {
	Name string `arg:"" help:"Node name."`
}

// Run prints the node's liveness, status, desired set and acks.
func (c *CtlDescribeNodeCmd) Run(ctl *CtlCmd, env *ctlEnv) error {
	ctx, stop := env.context()
	defer stop()
	what := "ctl describe node " + c.Name
	cl, err := ctl.connect(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer cl.Close()
	n, skipped, err := cl.Node(ctx, c.Name)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	idx, err := cl.Index(ctx, c.Name)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	pods, err := cl.Pods(ctx, c.Name)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	skipped = append(skipped, pods.Skipped...)
	defer warnSkipped(env.errOut, skipped)
	defer warnIncomplete(env.errOut, pods)
	if err := describeNode(env.out, n, idx, pods, env.now()); err != nil {
		return err
	}
	// What the node keeps on the broker: mosquitto bounds no client's retained volume, so a node
	// filling it is said here.
	live := 0
	if sum := pods.Summaries[c.Name]; sum != nil {
		live = sum.Pods
	}
	if r, err := cl.RetainedUsage(ctx, c.Name, idx, live); err != nil {
		fmt.Fprintf(env.errOut, "Warning: %v\n", err)
	} else {
		fmt.Fprintf(env.out, "Retained:\t%d messages, %d bytes on the broker\n", r.Messages, r.Bytes)
		if r.Warning != "" {
			fmt.Fprintf(env.errOut, "Warning: %s\n", r.Warning)
		}
	}
	if err := pods.Incomplete(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

func describeNode(out io.Writer, n *ctlclient.Node, idx *protocol.Index, pl *ctlclient.PodList, now time.Time) error {
	pods := pl.Items
	tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	d := &describer{w: tw}
	d.line(0, "Name", n.Name)
	state := n.State
	if n.Session > 0 {
		state += fmt.Sprintf(" (session %d)", n.Session)
	}
	d.line(0, "Status", state)
	if !n.Since.IsZero() {
		d.line(0, "Since", fmt.Sprintf("%s (%s ago, by the node's clock)", formatTime(n.Since), humanAge(n.Since, now)))
	}
	if n.StaleOffline {
		d.line(0, "Note", fmt.Sprintf("ignored a late offline message of session %d (the Will of an earlier connection)", n.Liveness.Session))
	}
	d.line(0, "Version", orNone(n.Version))

	if n.Status == nil || n.Status.Object == nil {
		d.line(0, "Node Status", "<none reported>")
	} else {
		node := vouchedNode(n) // an offline node's conditions are Unknown, with what it last said
		if !n.Status.Time.IsZero() {
			d.line(0, "Reported", fmt.Sprintf("%s (%s ago)", formatTime(n.Status.Time), humanAge(n.Status.Time, now)))
		}
		d.mapLines(0, "Labels", node.Labels)
		if len(node.Status.Conditions) == 0 {
			d.line(0, "Conditions", "<none>")
		} else {
			d.header(0, "Conditions")
			d.raw("  Type\tStatus\tReason\tLast Transition\tMessage")
			for _, c := range node.Status.Conditions {
				last := "<unknown>"
				if !c.LastTransitionTime.IsZero() {
					last = humanAge(c.LastTransitionTime.Time, now) + " ago"
				}
				d.raw(fmt.Sprintf("  %s\t%s\t%s\t%s\t%s", c.Type, c.Status, orNone(c.Reason), last, c.Message))
			}
		}
		if len(node.Status.Addresses) > 0 {
			d.header(0, "Addresses")
			for _, a := range node.Status.Addresses {
				d.line(1, string(a.Type), a.Address)
			}
		}
		d.resources(0, "Capacity", node.Status.Capacity)
		d.resources(0, "Allocatable", node.Status.Allocatable)
		info := node.Status.NodeInfo
		if info != (v1.NodeSystemInfo{}) {
			d.header(0, "System Info")
			d.line(1, "OS Image", orNone(info.OSImage))
			d.line(1, "Kernel Version", orNone(info.KernelVersion))
			d.line(1, "Architecture", orNone(info.Architecture))
			d.line(1, "Container Runtime", orNone(info.ContainerRuntimeVersion))
			d.line(1, "Kubelet Version", orNone(info.KubeletVersion))
		}
	}

	counts := map[string]int{}
	for k := range idx.Objects {
		kind, _, _ := strings.Cut(k, "/")
		counts[kind]++
	}
	d.line(0, "Desired", fmt.Sprintf("index revision %d: %d pods, %d configmaps, %d secrets",
		idx.Revision, counts["pods"], counts["configmaps"], counts["secrets"]))
	if a := n.Acks; a == nil {
		d.line(0, "Acknowledged", "<nothing yet>")
	} else {
		caughtUp := "caught up"
		if a.IndexRevision < idx.Revision {
			caughtUp = fmt.Sprintf("behind: the index is at %d", idx.Revision)
		}
		// Compact acks tell the applied count only against the index they name.
		applied := "? applied (the node runs another index than the broker holds)"
		if m, ok := a.AppliedIn(idx); ok {
			applied = fmt.Sprintf("%d applied", len(m))
		}
		d.line(0, "Acknowledged", fmt.Sprintf("index revision %d (%s), %s, %d refused, %d missing, session %d",
			a.IndexRevision, caughtUp, applied, len(a.Refused), len(a.Missing), a.Session))
		if a.IndexRefused != nil {
			d.line(0, "Index refused", fmt.Sprintf("revision %d: %s", a.IndexRefused.Generation, a.IndexRefused.Reason))
		}
		if len(a.Refused) > 0 {
			d.header(0, "Refused")
			for _, k := range slices.Sorted(maps.Keys(a.Refused)) {
				r := a.Refused[k]
				d.raw(fmt.Sprintf("  %s\tgeneration %d: %s", k, r.Generation, r.Reason))
			}
		}
		if len(a.Missing) > 0 {
			// Listed by the node's index, not (or not with the listed digest) received yet: the
			// node asked for them again.
			d.header(0, "Missing")
			for _, k := range slices.Sorted(maps.Keys(a.Missing)) {
				d.raw(fmt.Sprintf("  %s\tgeneration %d", k, a.Missing[k].Generation))
			}
		}
	}
	switch sum := pl.Summaries[n.Name]; {
	case sum != nil && len(pods) < sum.Pods:
		d.line(0, "Status Summary", fmt.Sprintf("%d pods, %d of them received: the list below is incomplete", sum.Pods, len(pods)))
	case sum != nil:
		d.line(0, "Status Summary", fmt.Sprintf("%d pods (all received)", sum.Pods))
	default:
		d.line(0, "Status Summary", "<none>: the node publishes none, so whether all its pod statuses arrived is not checked")
	}
	var refused []podRow
	if n.Acks != nil {
		refused = podRows(nil, map[string]*protocol.Acks{n.Name: n.Acks}, "")
	}
	if len(pods) == 0 {
		d.line(0, "Pods", "<none reported>")
	} else {
		d.header(0, "Pods")
		d.raw("  Namespace\tName\tStatus\tGeneration")
		for i := range pods {
			s := &pods[i]
			var refusal *protocol.Refusal
			for _, r := range refused {
				if r.namespace == s.Namespace && r.name == s.Name {
					refusal = r.refusal
				}
			}
			d.raw(fmt.Sprintf("  %s\t%s\t%s\t%s", s.Namespace, s.Name, orNone(summarizePod(reportedPod(s)).status),
				generationColumn(s, refusal, idx, s.Namespace, s.Name)))
		}
	}
	return tw.Flush()
}

// CtlDescribePodCmd is `mqlet ctl describe pod NAME --node NODE`.
type CtlDescribePodCmd struct {
	Name      string `arg:"" help:"Pod name (or NAMESPACE/NAME)."`
	Node      string `required:"" help:"Node of the pod."`
	Namespace string `short:"n" default:"default" help:"Namespace of the pod."`
}

// Run prints the pod as the node reports it, with its desired generation and any refusal.
func (c *CtlDescribePodCmd) Run(ctl *CtlCmd, env *ctlEnv) error {
	ctx, stop := env.context()
	defer stop()
	ns, name, err := splitPodRef(c.Namespace, c.Name)
	if err != nil {
		return fmt.Errorf("ctl describe pod: %w", err)
	}
	what := fmt.Sprintf("ctl describe pod %s/%s on node %s", ns, name, c.Node)
	cl, err := ctl.connect(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer cl.Close()
	pods, err := cl.Pods(ctx, c.Node)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	idx, err := cl.Index(ctx, c.Node)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	acks, err := cl.Acks(ctx, c.Node)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	var st *protocol.PodStatus
	for i := range pods.Items {
		if p := &pods.Items[i]; p.Namespace == ns && p.Name == name {
			st = p
		}
	}
	key := protocol.ObjectKey(protocol.KindPod, ns, name)
	want, listed := idx.Objects[key]
	var refusal *protocol.Refusal
	if acks != nil {
		if r, ok := acks.Refused[key]; ok {
			refusal = &r
		}
	}
	if st == nil {
		// Not among the statuses read: with some of the node's statuses lost on the way, that
		// says nothing about whether the node reports the pod.
		warnIncomplete(env.errOut, pods)
		if err := pods.Incomplete(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	if st == nil && !listed && refusal == nil {
		return fmt.Errorf("%s: not found (neither reported by the node nor in its desired index)", what)
	}

	tw := tabwriter.NewWriter(env.out, 0, 8, 2, ' ', 0)
	d := &describer{w: tw}
	gen := "<not reported>"
	if st != nil {
		gen = fmt.Sprintf("observed %d", st.Generation)
	}
	switch {
	case listed:
		gen += fmt.Sprintf(", desired %d (index revision %d)", want.Generation, idx.Revision)
	case st != nil && st.Source == "mqtt":
		gen += fmt.Sprintf(", deleted from the desired index (revision %d)", idx.Revision)
	}
	d.line(0, "Node", c.Node)
	if st != nil {
		d.line(0, "Source", orNone(st.Source))
		if !st.Time.IsZero() {
			d.line(0, "Reported", fmt.Sprintf("%s (%s ago)", formatTime(st.Time), humanAge(st.Time, env.now())))
		}
	}
	d.line(0, "Generation", gen)
	if refusal != nil {
		d.line(0, "Refused", fmt.Sprintf("generation %d: %s", refusal.Generation, refusal.Reason))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case st == nil && refusal != nil:
		fmt.Fprintf(env.out, "The node refused this pod and runs no version of it.\n")
		return nil
	case st == nil:
		fmt.Fprintf(env.out, "The node has not reported this pod yet.\n")
		return nil
	}
	fmt.Fprintln(env.out)
	return describePod(env.out, reportedPod(st), env.now())
}
