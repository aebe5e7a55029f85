package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/mqlet/mqlet/agent/api"
)

// PodsCmd is `mqlet pods`: list the pods the local agent runs.
type PodsCmd struct {
	APISocket string `name:"api-socket" default:"/run/mqlet/mqlet.sock" env:"MQLET_API_SOCKET" help:"Unix socket of the local mqlet agent's API."`
	Output    string `short:"o" enum:"wide,json,yaml," default:"" help:"Output format: wide, json or yaml (default: a table)."`
	Namespace string `short:"n" default:"" help:"only this namespace (default: all)"`
}

// Run lists the pods on stdout.
func (c *PodsCmd) Run() error {
	return c.run(context.Background(), os.Stdout, os.Stderr, time.Now())
}

func (c *PodsCmd) run(ctx context.Context, out, errOut io.Writer, now time.Time) error {
	list, err := api.NewClient(c.APISocket).ListPods(ctx, c.Namespace)
	if err != nil {
		return err
	}
	return printPods(out, errOut, list, c.Output, now)
}

// DescribeCmd is `mqlet describe`.
type DescribeCmd struct {
	Pod DescribePodCmd `cmd:"" help:"Show one pod in detail."`
}

// DescribePodCmd is `mqlet describe pod NAME`.
type DescribePodCmd struct {
	APISocket string `name:"api-socket" default:"/run/mqlet/mqlet.sock" env:"MQLET_API_SOCKET" help:"Unix socket of the local mqlet agent's API."`
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
	// The API's not-found error already reads "pod NS/NAME not found".
	pod, err := api.NewClient(c.APISocket).GetPod(ctx, ns, name)
	if err != nil {
		return err
	}
	return describePod(out, pod, now)
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
