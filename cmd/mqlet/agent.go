package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
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
// pods running; the next start adopts them. Under systemd, a start that fails waits before it
// returns, longer after each failure in a row (agent_backoff.go).
func (c *AgentCmd) Run() error {
	// From the first moment: a stop must also end the wait after a failed start.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// Read before the node takes systemd's variables out of the environment.
	backoff := newStartBackoff(os.Getenv)
	var started atomic.Bool
	log, once, err := c.run(ctx, func(log *slog.Logger) {
		started.Store(true)
		backoff.ready(log)
	})
	// A start that failed (not a node that ran and then stopped with an error, nor --once, whose
	// failures are its pods'): wait, then exit for systemd to restart the agent.
	if err != nil && !started.Load() && !once {
		backoff.failed(ctx, log, err)
	}
	return err
}

// run is Run's attempt: it returns the logger the config asks for (a plain one on stderr when the
// config cannot be read) and whether this was a --once run. ready is called once the node has
// started (node.Deps.Ready).
func (c *AgentCmd) run(ctx context.Context, ready func(*slog.Logger)) (*slog.Logger, bool, error) {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	once := c.Flags.Once != nil && *c.Flags.Once
	cfg, err := config.Load(c.Flags, os.Environ())
	if err != nil {
		return log, once, err
	}
	log, once = newLogger(cfg, os.Stderr), cfg.Once
	if err := cfg.CheckStateDir(); err != nil {
		return log, once, err
	}

	// The agent's own binary holds shared PID namespaces (`mqlet sandbox-pause`). Without it only
	// pods with shareProcessNamespace fail, so a lookup error is a warning.
	exe, err := os.Executable()
	if err != nil {
		log.Warn("cannot find the mqlet executable; pods with shareProcessNamespace will be refused", "err", err)
		exe = ""
	}
	n, err := node.New(ctx, cfg, node.Deps{Log: log, Version: version, Commit: commit, Executable: exe,
		Ready: func() { ready(log) }})
	if err != nil {
		return log, once, err
	}
	defer n.Close()
	if cfg.Once {
		pods, err := n.RunOnce(ctx, cfg.OnceTimeout.Duration)
		printOnce(os.Stdout, pods)
		return log, once, err
	}
	if err := n.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return log, once, err
	}
	return log, once, nil
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
