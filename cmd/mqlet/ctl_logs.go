package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"
)

// CtlLogsCmd is `mqlet ctl logs POD --node NODE`: the log comes from the node over MQTT.
type CtlLogsCmd struct {
	Pod        string        `arg:"" help:"Pod name (or NAMESPACE/NAME)."`
	Node       string        `required:"" help:"Node of the pod."`
	Namespace  string        `short:"n" default:"default" help:"Namespace of the pod."`
	Container  string        `short:"c" help:"Container (may be omitted when the pod has one)."`
	Follow     bool          `short:"f" help:"Keep streaming new output."`
	Tail       int64         `default:"-1" help:"Only the last N lines (0 or less: the whole log)."`
	Previous   bool          `short:"p" help:"The previous attempt's log (after a restart)."`
	Since      time.Duration `help:"Only lines newer than this, e.g. 5m or 2h (rounded up to whole seconds)."`
	Timestamps bool          `help:"Put each line's RFC 3339 timestamp first."`
}

// Run copies the log to stdout; with -f until interrupted.
func (c *CtlLogsCmd) Run(ctl *CtlCmd, env *ctlEnv) error {
	ctx, stop := env.context()
	defer stop()
	ns, name, err := splitPodRef(c.Namespace, c.Pod)
	if err != nil {
		return fmt.Errorf("ctl logs: %w", err)
	}
	if c.Since < 0 {
		return fmt.Errorf("ctl logs: --since %s: must not be negative", c.Since)
	}
	cl, err := ctl.connect(ctx)
	if err != nil {
		return fmt.Errorf("ctl logs %s/%s: %w", ns, name, err)
	}
	defer cl.Close()
	req := protocol.LogsRequest{Namespace: ns, Pod: name, Container: c.Container, Follow: c.Follow, Tail: c.Tail, Previous: c.Previous,
		SinceSeconds: sinceSeconds(c.Since), Timestamps: c.Timestamps}
	if req.Tail < 0 {
		req.Tail = 0 // the protocol's "whole log"
	}
	err = cl.Logs(ctx, c.Node, req, env.out)
	if c.Follow && errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil // interrupted: the way a followed log ends
	}
	if err != nil {
		return fmt.Errorf("ctl %w", err)
	}
	return nil
}
