package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mqlet/mqlet/agent/api"
)

// LogsCmd is `mqlet logs POD`, like kubectl logs.
type LogsCmd struct {
	APISocket  string        `name:"api-socket" default:"${api_socket}" env:"MQLET_API_SOCKET" help:"Unix socket of the agent's local API."`
	Namespace  string        `short:"n" default:"default" help:"Namespace of the pod."`
	Container  string        `short:"c" help:"Container (may be omitted when the pod has one)."`
	Previous   bool          `short:"p" help:"The previous attempt's log (after a restart)."`
	Follow     bool          `short:"f" help:"Keep streaming new output."`
	Tail       int64         `default:"-1" help:"Only the last N lines (-1: the whole log; 0 with -f: only new lines)."`
	Since      time.Duration `help:"Only lines newer than this, e.g. 5m or 2h (rounded up to whole seconds)."`
	SinceTime  string        `name:"since-time" placeholder:"RFC3339" help:"Only lines from this time on, e.g. 2026-11-27T10:25:00Z (whole seconds, as kubectl's)."`
	Timestamps bool          `help:"Put each line's RFC 3339 timestamp first."`
	Pod        string        `arg:"" help:"Pod name (or NAMESPACE/NAME)."`
}

// Run copies the log to stdout.
func (c *LogsCmd) Run() error {
	ns, name, err := splitPodRef(c.Namespace, c.Pod)
	if err != nil {
		return err
	}
	if c.Since < 0 {
		return fmt.Errorf("--since %s: must not be negative", c.Since)
	}
	o := api.LogOptions{Container: c.Container, Previous: c.Previous, Follow: c.Follow, Since: c.Since, Timestamps: c.Timestamps}
	if c.SinceTime != "" {
		if c.Since != 0 {
			return fmt.Errorf("--since %s and --since-time %s: give at most one", c.Since, c.SinceTime)
		}
		if o.SinceTime, err = time.Parse(time.RFC3339, c.SinceTime); err != nil {
			return fmt.Errorf("--since-time %q: want an RFC 3339 time, e.g. 2026-11-27T10:25:00Z: %w", c.SinceTime, err)
		}
	}
	if c.Tail >= 0 {
		o.TailLines = &c.Tail
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return api.NewClient(c.APISocket).Logs(ctx, ns, name, o, os.Stdout)
}

// sinceSeconds is --since as the protocol's whole seconds, rounded up as kubectl does.
func sinceSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
