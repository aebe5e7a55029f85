// Command mqlet is the edge agent (`mqlet agent`) and its local CLI.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/runtime"

	"github.com/alecthomas/kong"
)

// Stamped by the Makefile with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = "unknown"
)

type cli struct {
	Agent    AgentCmd    `cmd:"" help:"Run the agent daemon."`
	Pods     PodsCmd     `cmd:"" help:"List the pods of the local agent."`
	Describe DescribeCmd `cmd:"" help:"Show details of an object of the local agent."`
	Node     NodeCmd     `cmd:"" help:"Show the local agent's node status."`
	Logs     LogsCmd     `cmd:"" help:"Print the logs of a container of a pod."`
	Image    ImageCmd    `cmd:"" help:"Import and list images in containerd (works without the agent)."`
	Version  VersionCmd  `cmd:"" help:"Print the version."`
	Ctl      CtlCmd      `cmd:"" help:"Control plane over MQTT: apply to, read from and stream logs of nodes through the broker."`
	FleetSim FleetSimCmd `cmd:"" name:"fleet-sim" help:"Run many simulated nodes (the real agent over an in-memory runtime) against a broker, for scale tests of a control plane."`

	SandboxPause SandboxPauseCmd `cmd:"" name:"sandbox-pause" hidden:"" help:"PID 1 of a pod's shared PID namespace (started by the agent)."`
}

// SandboxPauseCmd is the holder of a pod's shared PID namespace (shareProcessNamespace): the agent
// runs its own binary with it, as PID 1 of a new PID namespace, in place of kubelet's pause
// container. Its name must be runtime.PauseCommand.
type SandboxPauseCmd struct{}

// Run never returns in the holder; run by hand (not PID 1) it fails.
func (SandboxPauseCmd) Run() error { return runtime.RunPause() }

// VersionCmd prints the build's version and commit.
type VersionCmd struct{}

// Run prints "mqlet VERSION (commit COMMIT)".
func (VersionCmd) Run() error {
	fmt.Printf("mqlet %s (commit %s)\n", version, commit)
	return nil
}

// parser builds the command line parser of c; tests add their own options (writers, exit).
func parser(c *cli, opts ...kong.Option) (*kong.Kong, error) {
	return kong.New(c, append([]kong.Option{
		kong.Name("mqlet"),
		kong.Description("mqlet runs Kubernetes pods on containerd on edge devices."),
		kong.UsageOnError(),
		kong.Vars(config.Vars()),
	}, opts...)...)
}

func main() {
	var c cli
	p, err := parser(&c)
	if err != nil {
		panic(err) // the CLI's own tags are wrong: a bug, caught by every test
	}
	kctx, err := p.Parse(os.Args[1:])
	p.FatalIfErrorf(err)
	err = kctx.Run(&ctlEnv{ctx: context.Background(), signals: true, in: os.Stdin, out: os.Stdout, errOut: os.Stderr, now: time.Now})
	if err != nil {
		fmt.Fprintln(os.Stderr, "mqlet:", err)
		os.Exit(1)
	}
}
