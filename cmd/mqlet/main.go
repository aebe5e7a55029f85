// Command mqlet is the edge agent (`mqlet agent`) and its local CLI.
package main

import (
	"fmt"
	"github.com/mqlet/mqlet/agent/config"
	"os"
	goruntime "runtime"

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
}

// VersionCmd prints the build's version and commit.
type VersionCmd struct{}

// Run prints "mqlet VERSION (commit COMMIT)".
func (VersionCmd) Run() error {
	fmt.Printf("mqlet %s (commit %s)\n", version, commit)
	return nil
}

// The pod sandbox creates namespaces by unshare on a locked thread that the Go runtime throws away
// afterwards; the main thread cannot be thrown away and would stay in a pod's namespace, taking
// /proc/self/ns/* with it. Keeping the main goroutine on the main thread keeps that work off it.
func init() { goruntime.LockOSThread() }

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
