package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/mqlet/mqlet/agent/api"
	"github.com/mqlet/mqlet/agent/usage"
)

// TopCmd is `mqlet top`: the node's and the pods' CPU and memory, as `kubectl top node` and
// `kubectl top pod` show them, from the same cgroup figures as the agent's metrics.
type TopCmd struct {
	APISocket  string        `name:"api-socket" default:"${api_socket}" env:"MQLET_API_SOCKET" help:"Unix socket of the local mqlet agent's API."`
	Namespace  string        `short:"n" default:"" help:"only pods of this namespace (default: all)"`
	Containers bool          `help:"one line per container instead of per pod"`
	Interval   time.Duration `default:"1s" help:"time between the two readings the CPU rate is taken from"`
}

// Run prints the node and its pods on stdout.
func (c *TopCmd) Run() error {
	return c.run(context.Background(), os.Stdout, time.Sleep)
}

func (c *TopCmd) run(ctx context.Context, out io.Writer, sleep func(time.Duration)) error {
	if c.Interval <= 0 {
		return fmt.Errorf("--interval %s: must be positive (the CPU rate needs two readings apart)", c.Interval)
	}
	cl := api.NewClient(c.APISocket)
	a, err := cl.Usage(ctx)
	if err != nil {
		return err
	}
	sleep(c.Interval)
	b, err := cl.Usage(ctx)
	if err != nil {
		return err
	}
	rate, err := usage.Between(a, b)
	if err != nil {
		return err
	}
	node := "node"
	if list, err := cl.ListNodes(ctx); err == nil && len(list.Items) > 0 {
		node = list.Items[0].Name
	}
	return printTop(out, node, rate, c.Namespace, c.Containers)
}

// printTop writes the node table, then the pods (or containers) table, kubectl top's columns.
// CPU is in millicores, memory is the working set in MiB.
func printTop(out io.Writer, node string, r usage.Rate, namespace string, containers bool) error {
	tw := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "NODE\tCPU(cores)\tCPU(%)\tMEMORY(bytes)\tMEMORY(%)")
	cpuPct, memPct := "<unknown>", "<unknown>"
	if r.Node.CPUs > 0 {
		cpuPct = fmt.Sprintf("%d%%", r.Node.MilliCPU/int64(r.Node.CPUs*10))
	}
	if r.Node.MemoryCapacityBytes > 0 {
		memPct = fmt.Sprintf("%d%%", r.Node.MemoryWorkingSetBytes*100/r.Node.MemoryCapacityBytes)
	}
	fmt.Fprintf(tw, "%s\t%dm\t%s\t%s\t%s\n", node, r.Node.MilliCPU, cpuPct, mib(r.Node.MemoryWorkingSetBytes), memPct)
	fmt.Fprintln(tw)

	var rows []usage.ContainerRate
	for _, c := range r.Containers {
		if namespace == "" || c.Namespace == namespace {
			rows = append(rows, c)
		}
	}
	if !containers {
		rows = perPod(rows)
	}
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Pod != b.Pod {
			return a.Pod < b.Pod
		}
		return a.Container < b.Container
	})
	if containers {
		fmt.Fprintln(tw, "NAMESPACE\tPOD\tNAME\tCPU(cores)\tMEMORY(bytes)")
	} else {
		fmt.Fprintln(tw, "NAMESPACE\tNAME\tCPU(cores)\tMEMORY(bytes)")
	}
	for _, c := range rows {
		if containers {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%dm\t%s\n", c.Namespace, c.Pod, c.Container, c.MilliCPU, mib(c.MemoryWorkingSetBytes))
		} else {
			fmt.Fprintf(tw, "%s\t%s\t%dm\t%s\n", c.Namespace, c.Pod, c.MilliCPU, mib(c.MemoryWorkingSetBytes))
		}
	}
	if len(rows) == 0 {
		fmt.Fprintln(tw, "(no running containers with two readings)")
	}
	return tw.Flush()
}

// perPod sums the containers of each pod, as kubectl top pod does.
func perPod(cs []usage.ContainerRate) []usage.ContainerRate {
	sum := map[[2]string]*usage.ContainerRate{}
	var out []usage.ContainerRate
	for _, c := range cs {
		k := [2]string{c.Namespace, c.Pod}
		if s, ok := sum[k]; ok {
			s.MilliCPU += c.MilliCPU
			s.MemoryWorkingSetBytes += c.MemoryWorkingSetBytes
			continue
		}
		sum[k] = &usage.ContainerRate{Namespace: c.Namespace, Pod: c.Pod, MilliCPU: c.MilliCPU, MemoryWorkingSetBytes: c.MemoryWorkingSetBytes}
	}
	for _, s := range sum {
		out = append(out, *s)
	}
	return out
}

// mib is kubectl top's memory column: whole MiB.
func mib(b int64) string { return fmt.Sprintf("%dMi", b/(1<<20)) }
