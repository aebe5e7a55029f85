package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mqlet/mqlet/agent/api"
	v1 "k8s.io/api/core/v1"
)

// describePodEvents ends `mqlet describe pod` with the pod's events, as kubectl's describe does.
// An agent that cannot list them (an older one) leaves the section saying so rather than failing
// the whole description.
func describePodEvents(ctx context.Context, out io.Writer, cl *api.Client, pod *v1.Pod, now time.Time) error {
	list, err := cl.PodEvents(ctx, pod.Namespace, pod.Name)
	if err != nil {
		fmt.Fprintf(out, "Events:\t<unavailable: %v>\n", err)
		return nil
	}
	return printEvents(out, list.Items, now)
}

// printEvents writes kubectl's Events table: Type, Reason, Age ("5s (x3 over 2m)" for repeated
// events), From and Message, least recently seen first.
func printEvents(out io.Writer, events []v1.Event, now time.Time) error {
	if len(events) == 0 {
		_, err := fmt.Fprintln(out, "Events:\t<none>")
		return err
	}
	evs := append([]v1.Event(nil), events...)
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].LastTimestamp.Before(&evs[j].LastTimestamp) })
	fmt.Fprintln(out, "Events:")
	tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "  Type\tReason\tAge\tFrom\tMessage")
	fmt.Fprintln(tw, "  ----\t------\t----\t----\t-------")
	for _, e := range evs {
		age := humanAge(e.FirstTimestamp.Time, now)
		if e.Count > 1 {
			age = fmt.Sprintf("%s (x%d over %s)", humanAge(e.LastTimestamp.Time, now), e.Count, humanAge(e.FirstTimestamp.Time, now))
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", e.Type, e.Reason, age, e.Source.Component, strings.TrimSpace(e.Message))
	}
	return tw.Flush()
}
