// Command mqlet is the edge agent (`mqlet agent`) and its local CLI.
package main

import (
	"fmt"
	"os"

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
	Logs     LogsCmd     `cmd:"" help:"Print the logs of a container of a pod."`
	Image    ImageCmd    `cmd:"" help:"Import and list images in containerd (works without the agent)."`
	Version  VersionCmd  `cmd:"" help:"Print the version."`

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

func main() {
	var c cli
	ctx := kong.Parse(&c,
		kong.Name("mqlet"),
		kong.Description("mqlet runs Kubernetes pods on containerd on edge devices."),
		kong.UsageOnError(),
		kong.Vars(config.Vars()),
	)
	if err := ctx.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "mqlet:", err)
		os.Exit(1)
	}
}
