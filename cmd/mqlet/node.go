package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mqlet/mqlet/agent/api"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// NodeCmd is `mqlet node`: the local agent's node status.
type NodeCmd struct {
	APISocket string `name:"api-socket" default:"${api_socket}" env:"MQLET_API_SOCKET" help:"Unix socket of the local mqlet agent's API."`
	Output    string `short:"o" enum:"wide,json,yaml," default:"" help:"Output format: wide, json or yaml (default: a table like kubectl get nodes)."`
}

// Run prints the node on stdout.
func (c *NodeCmd) Run() error {
	return c.run(context.Background(), os.Stdout, os.Stderr, time.Now())
}

func (c *NodeCmd) run(ctx context.Context, out, errOut io.Writer, now time.Time) error {
	list, err := api.NewClient(c.APISocket).ListNodes(ctx)
	if err != nil {
		return err
	}
	if len(list.Items) == 0 {
		if c.Output == outputJSON || c.Output == outputYAML {
			return errors.New("the agent has not computed its node status yet; try again in a moment")
		}
		_, err := fmt.Fprintln(errOut, "No resources found.")
		return err
	}
	return printNode(out, &list.Items[0], c.Output, now)
}

// printNode writes one node: json and yaml print the whole v1.Node, the tables kubectl's columns.
func printNode(out io.Writer, n *v1.Node, format string, now time.Time) error {
	switch format {
	case outputJSON:
		b, err := json.MarshalIndent(n, "", "    ")
		if err != nil {
			return fmt.Errorf("encoding node as json: %w", err)
		}
		_, err = out.Write(append(b, '\n'))
		return err
	case outputYAML:
		b, err := yaml.Marshal(n)
		if err != nil {
			return fmt.Errorf("encoding node as yaml: %w", err)
		}
		_, err = out.Write(b)
		return err
	case outputTable, outputWide:
	default:
		return fmt.Errorf("unknown output format %q (want one of wide, json, yaml, or empty for the table)", format)
	}
	tw := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	header := "NAME\tSTATUS\tROLES\tAGE\tVERSION"
	if format == outputWide {
		header += "\tINTERNAL-IP\tEXTERNAL-IP\tOS-IMAGE\tKERNEL-VERSION\tCONTAINER-RUNTIME"
	}
	fmt.Fprintln(tw, header)
	info := n.Status.NodeInfo
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s", n.Name, nodeStatus(n), nodeRoles(n), humanAge(n.CreationTimestamp.Time, now), orNone(info.KubeletVersion))
	if format == outputWide {
		fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s\t%s", nodeAddress(n, v1.NodeInternalIP), nodeAddress(n, v1.NodeExternalIP),
			orUnknown(info.OSImage), orUnknown(info.KernelVersion), orUnknown(info.ContainerRuntimeVersion))
	}
	fmt.Fprintln(tw)
	return tw.Flush()
}

// nodeStatus is kubectl's STATUS column: Ready, NotReady or Unknown, with SchedulingDisabled
// appended for a cordoned node.
func nodeStatus(n *v1.Node) string {
	s := "Unknown"
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			switch c.Status {
			case v1.ConditionTrue:
				s = "Ready"
			case v1.ConditionFalse:
				s = "NotReady"
			}
		}
	}
	if n.Spec.Unschedulable {
		s += ",SchedulingDisabled"
	}
	return s
}

// nodeRoles is kubectl's ROLES column, from node-role.kubernetes.io/<role> and kubernetes.io/role
// labels.
func nodeRoles(n *v1.Node) string {
	var roles []string
	for k, v := range n.Labels {
		switch {
		case strings.HasPrefix(k, "node-role.kubernetes.io/"):
			if r := strings.TrimPrefix(k, "node-role.kubernetes.io/"); r != "" {
				roles = append(roles, r)
			}
		case k == "kubernetes.io/role" && v != "":
			roles = append(roles, v)
		}
	}
	if len(roles) == 0 {
		return "<none>"
	}
	sort.Strings(roles)
	return strings.Join(roles, ",")
}

func nodeAddress(n *v1.Node, t v1.NodeAddressType) string {
	for _, a := range n.Status.Addresses {
		if a.Type == t {
			return a.Address
		}
	}
	return "<none>"
}

func orUnknown(s string) string {
	if s == "" {
		return "<unknown>"
	}
	return s
}
