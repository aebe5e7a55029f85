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
type CtlGetNodesCmd struct{}

// Run prints NAME STATUS SINCE SESSION READY VERSION.
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
	if len(l.Items) == 0 {
		fmt.Fprintln(env.errOut, "No nodes found.")
	} else if err := printNodes(env.out, l.Items, env.now()); err != nil {
		return err
	}
	warnSkipped(env.errOut, l.Skipped)
	return nil
}

func printNodes(out io.Writer, nodes []ctlclient.Node, now time.Time) error {
	tw := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATUS\tSINCE\tSESSION\tREADY\tVERSION")
	for _, n := range nodes {
		session := "<none>"
		if n.Session > 0 {
			session = fmt.Sprint(n.Session)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.State, humanAge(n.Since, now), session, nodeReady(n.Status), orNone(n.Version))
	}
	return tw.Flush()
}

// nodeReady is the status of the node's Ready condition, <none> without a node status.
func nodeReady(s *protocol.NodeStatus) string {
	if s == nil || s.Object == nil {
		return "<none>"
	}
	for _, c := range s.Object.Status.Conditions {
		if c.Type == v1.NodeReady {
			return string(c.Status)
		}
	}
	return "Unknown"
}

// CtlGetPodsCmd is `mqlet ctl get pods`.
type CtlGetPodsCmd struct {
	Node          string `help:"Only this node's pods (default: every node's)."`
	Namespace     string `short:"n" help:"Namespace (default: default)."`
	AllNamespaces bool   `short:"A" name:"all-namespaces" help:"Pods of every namespace."`
	Output        string `short:"o" enum:"wide,json,yaml," default:"" help:"Output format: wide, json or yaml (default: a table)."`
}

// Run lists the reported pods.
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
	var pods []protocol.PodStatus
	for _, p := range l.Items {
		if ns == "" || p.Namespace == ns {
			pods = append(pods, p)
		}
	}
	skipped := l.Skipped
	defer func() { warnSkipped(env.errOut, skipped) }()

	if c.Output == outputJSON || c.Output == outputYAML {
		list := &v1.PodList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodList"}, Items: []v1.Pod{}}
		for i := range pods {
			list.Items = append(list.Items, *reportedPod(&pods[i]))
		}
		return printPods(env.out, env.errOut, list, c.Output, env.now())
	}
	if len(pods) == 0 {
		_, err := fmt.Fprintln(env.errOut, "No resources found.")
		return err
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
	}
	return printReportedPods(env.out, pods, indexes, c.Output == outputWide, env.now())
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

func printReportedPods(out io.Writer, pods []protocol.PodStatus, indexes map[string]*protocol.Index, wide bool, now time.Time) error {
	tw := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	header := "NAMESPACE\tNAME\tNODE\tREADY\tSTATUS\tRESTARTS\tGENERATION\tAGE"
	if wide {
		header += "\tIP\tSOURCE"
	}
	fmt.Fprintln(tw, header)
	for i := range pods {
		s := &pods[i]
		p := reportedPod(s)
		sum := summarizePod(p)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%s", s.Namespace, s.Name, s.Node, sum.ready, sum.total, orNone(sum.status),
			sum.restartsColumn(now), generationColumn(s, indexes[s.Node]), humanAge(podAgeStart(p), now))
		if wide {
			fmt.Fprintf(tw, "\t%s\t%s", orNone(p.Status.PodIP), orNone(s.Source))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// generationColumn is the generation the node runs, and the desired one when they differ: the
// pod is then on its way to a newer spec, or to deletion.
func generationColumn(s *protocol.PodStatus, idx *protocol.Index) string {
	if s.Source == "file" || s.Generation == 0 && (idx == nil || idx.Objects[podKey(s)].Generation == 0) {
		return "-" // from the node's manifest dir: no generation
	}
	got := fmt.Sprint(s.Generation)
	if idx == nil {
		return got
	}
	switch want, listed := idx.Objects[podKey(s)]; {
	case !listed:
		return got + " (deleting)"
	case want.Generation != s.Generation:
		return fmt.Sprintf("%s (desired %d)", got, want.Generation)
	}
	return got
}

func podKey(s *protocol.PodStatus) string {
	return protocol.ObjectKey(protocol.KindPod, s.Namespace, s.Name)
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
	return describeNode(env.out, n, idx, pods.Items, env.now())
}

func describeNode(out io.Writer, n *ctlclient.Node, idx *protocol.Index, pods []protocol.PodStatus, now time.Time) error {
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
		node := n.Status.Object
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
		d.line(0, "Acknowledged", fmt.Sprintf("index revision %d (%s), %d applied, %d refused, %d missing, session %d",
			a.IndexRevision, caughtUp, len(a.Applied), len(a.Refused), len(a.Missing), a.Session))
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
	}
	if len(pods) == 0 {
		d.line(0, "Pods", "<none reported>")
	} else {
		d.header(0, "Pods")
		d.raw("  Namespace\tName\tStatus\tGeneration")
		for i := range pods {
			s := &pods[i]
			d.raw(fmt.Sprintf("  %s\t%s\t%s\t%s", s.Namespace, s.Name, orNone(summarizePod(reportedPod(s)).status), generationColumn(s, idx)))
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
	if st == nil && !listed {
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
		gen += fmt.Sprintf(", desired %d (index revision %d)", want, idx.Revision)
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
	if st == nil {
		fmt.Fprintf(env.out, "The node has not reported this pod yet.\n")
		return nil
	}
	fmt.Fprintln(env.out)
	return describePod(env.out, reportedPod(st), env.now())
}
