package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/mqlet/mqlet/agent/api"
)

// LogsCmd is `mqlet logs POD`, like kubectl logs.
type LogsCmd struct {
	APISocket string `name:"api-socket" default:"${api_socket}" env:"MQLET_API_SOCKET" help:"Unix socket of the agent's local API."`
	Namespace string `short:"n" default:"default" help:"Namespace of the pod."`
	Container string `short:"c" help:"Container (may be omitted when the pod has one)."`
	Previous  bool   `short:"p" help:"The previous attempt's log (after a restart)."`
	Follow    bool   `short:"f" help:"Keep streaming new output."`
	Pod       string `arg:"" help:"Pod name (or NAMESPACE/NAME)."`
}

// Run copies the log to stdout.
func (c *LogsCmd) Run() error {
	ns, name, err := splitPodRef(c.Namespace, c.Pod)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return api.NewClient(c.APISocket).Logs(ctx, ns, name, api.LogOptions{Container: c.Container, Previous: c.Previous, Follow: c.Follow}, os.Stdout)
}
