package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/mqlet/mqlet/agent/api"
)

// PodsCmd is `mqlet pods`: list the pods the local agent runs.
type PodsCmd struct {
	APISocket string `name:"api-socket" default:"${api_socket}" env:"MQLET_API_SOCKET" help:"Unix socket of the local mqlet agent's API."`
	Output    string `short:"o" enum:"wide,json,yaml," default:"" help:"Output format: wide, json or yaml (default: a table)."`
	Namespace string `short:"n" default:"" help:"only this namespace (default: all)"`
}

// Run lists the pods on stdout.
func (c *PodsCmd) Run() error {
	return c.run(context.Background(), os.Stdout, os.Stderr, time.Now())
}

func (c *PodsCmd) run(ctx context.Context, out, errOut io.Writer, now time.Time) error {
	cl := api.NewClient(c.APISocket)
	list, err := cl.ListPods(ctx, c.Namespace)
	if err != nil {
		return err
	}
	if err := printPods(out, errOut, list, c.Output, now); err != nil {
		return err
	}
	// What was refused goes to stderr, so -o json/yaml stays a clean PodList on stdout.
	rej, err := cl.Rejected(ctx)
	if err != nil {
		return err
	}
	return printRejected(errOut, rej, c.Namespace)
}

// printRejected lists refused manifests and messages after the pods (kubelet only logs them; a
// user of a headless gateway has nowhere else to look).
func printRejected(w io.Writer, rej []api.Rejected, namespace string) error {
	var shown []api.Rejected
	for _, r := range rej {
		if namespace == "" || r.Pod == "" || strings.HasPrefix(r.Pod, namespace+"/") {
			shown = append(shown, r)
		}
	}
	if len(shown) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nRejected (%d):\n", len(shown))
	for _, r := range shown {
		fmt.Fprintf(w, "  %s\n", rejectedLine(r))
	}
	return nil
}

// rejectedLine renders one rejection: where, which pod, why, and whether the old pods stay.
func rejectedLine(r api.Rejected) string {
	where := r.Source
	if r.Origin != "" {
		where += " " + r.Origin
	}
	if r.Source == "file" && r.Document >= 0 {
		where += fmt.Sprintf(", document %d", r.Document)
	}
	if r.Line > 0 {
		where += fmt.Sprintf(" (line %d)", r.Line)
	}
	if r.Pod != "" {
		where += ": pod " + r.Pod
	}
	s := where + ": " + r.Reason
	if r.Kept {
		s += " [pods from it kept as they were]"
	}
	return s
}

// DescribeCmd is `mqlet describe`.
type DescribeCmd struct {
	Pod DescribePodCmd `cmd:"" help:"Show one pod in detail."`
}

// DescribePodCmd is `mqlet describe pod NAME`.
type DescribePodCmd struct {
	APISocket string `name:"api-socket" default:"${api_socket}" env:"MQLET_API_SOCKET" help:"Unix socket of the local mqlet agent's API."`
	Namespace string `short:"n" default:"default" help:"Namespace of the pod."`
	Name      string `arg:"" help:"pod name (or NAMESPACE/NAME)"`
}

// Run describes the pod on stdout.
func (c *DescribePodCmd) Run() error {
	return c.run(context.Background(), os.Stdout, time.Now())
}

func (c *DescribePodCmd) run(ctx context.Context, out io.Writer, now time.Time) error {
	ns, name, err := splitPodRef(c.Namespace, c.Name)
	if err != nil {
		return err
	}
	cl := api.NewClient(c.APISocket)
	rej, rerr := cl.Rejected(ctx)
	var mine []string
	for _, r := range rej {
		if r.Pod == ns+"/"+name {
			mine = append(mine, rejectedLine(r))
		}
	}
	// The API's not-found error already reads "pod NS/NAME not found".
	pod, err := cl.GetPod(ctx, ns, name)
	if err != nil {
		if errors.Is(err, api.ErrNotFound) && len(mine) > 0 {
			return fmt.Errorf("pod %s/%s is not running: it was rejected:\n  %s", ns, name, strings.Join(mine, "\n  "))
		}
		return err
	}
	if rerr != nil {
		return rerr
	}
	if err := describePod(out, pod, now); err != nil {
		return err
	}
	if len(mine) > 0 {
		fmt.Fprintf(out, "Rejected:\n  %s\n", strings.Join(mine, "\n  "))
	}
	return describePodEvents(ctx, out, cl, pod, now)
}

// splitPodRef accepts NAME (in defaultNS) or NAMESPACE/NAME.
func splitPodRef(defaultNS, ref string) (ns, name string, err error) {
	ns, name = defaultNS, ref
	if before, after, ok := strings.Cut(ref, "/"); ok {
		ns, name = before, after
	}
	if ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("invalid pod reference %q: want NAME or NAMESPACE/NAME", ref)
	}
	return ns, name, nil
}
