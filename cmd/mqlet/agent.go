package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"

	"github.com/mqlet/mqlet/agent"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/node"
	v1 "k8s.io/api/core/v1"
)

// AgentCmd is `mqlet agent`.
type AgentCmd struct {
	config.Flags `embed:""`
}

// Run validates the whole configuration, then runs until SIGTERM/SIGINT. Stopping the agent leaves
// pods running; the next start adopts them.
func (c *AgentCmd) Run() error {
	cfg, err := config.Load(c.Flags, os.Environ())
	if err != nil {
		return err
	}
	log := newLogger(cfg, os.Stderr)
	if err := cfg.CheckStateDir(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	// The agent's own binary holds shared PID namespaces (`mqlet sandbox-pause`). Without it only
	// pods with shareProcessNamespace fail, so a lookup error is a warning.
	exe, err := os.Executable()
	if err != nil {
		log.Warn("cannot find the mqlet executable; pods with shareProcessNamespace will be refused", "err", err)
		exe = ""
	}
	n, err := node.New(ctx, cfg, node.Deps{Log: log, Version: version, Commit: commit, Executable: exe})
	if err != nil {
		return err
	}
	defer n.Close()
	if cfg.Once {
		pods, err := n.RunOnce(ctx, cfg.OnceTimeout.Duration)
		printOnce(os.Stdout, pods)
		return err
	}
	if err := n.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var lvl slog.Level
	lvl.UnmarshalText([]byte(cfg.LogLevel)) // validated already
	o := &slog.HandlerOptions{Level: lvl}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, o))
	}
	return slog.New(slog.NewTextHandler(w, o))
}

func printOnce(w io.Writer, pods []v1.Pod) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tNAME\tPHASE\tRESULT")
	for i := range pods {
		failed, done := agent.OnceOutcome(&pods[i])
		res := "ok"
		switch {
		case failed:
			res = "failed: " + summarizePod(&pods[i]).status
		case !done:
			res = "not settled: " + summarizePod(&pods[i]).status
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", pods[i].Namespace, pods[i].Name, pods[i].Status.Phase, res)
	}
	tw.Flush()
}
