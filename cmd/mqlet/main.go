// Command mqlet is the edge agent (`mqlet agent`) and its local CLI.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/internal/buildversion"

	"github.com/alecthomas/kong"
)

// Stamped by the Makefile with -ldflags "-X main.stampedVersion=... -X main.stampedCommit=...".
var stampedVersion, stampedCommit string

// version and commit are what the binary reports (version, --version, node status, liveness): the
// stamps, or for a plain `go build` what the go command recorded of the checkout.
var version, commit = buildversion.Resolve(stampedVersion, stampedCommit, debug.ReadBuildInfo)

type cli struct {
	Version kong.VersionFlag `help:"Print the version and exit."`

	Agent     AgentCmd     `cmd:"" help:"Run the agent daemon."`
	Pods      PodsCmd      `cmd:"" help:"List the pods of the local agent."`
	Describe  DescribeCmd  `cmd:"" help:"Show details of an object of the local agent."`
	Node      NodeCmd      `cmd:"" help:"Show the local agent's node status."`
	Logs      LogsCmd      `cmd:"" help:"Print the logs of a container of a pod."`
	Exec      ExecCmd      `cmd:"" help:"Run a command in a container of a pod, like kubectl exec."`
	Top       TopCmd       `cmd:"" help:"Show the CPU (millicores) and memory (working set) of the node and its pods, like kubectl top."`
	Image     ImageCmd     `cmd:"" help:"Import and list images in containerd (works without the agent)."`
	VersionC  VersionCmd   `cmd:"" name:"version" help:"Print the version."`
	Ctl       CtlCmd       `cmd:"" help:"Control plane over MQTT: apply to, read from and stream logs of nodes through the broker."`
	Check     CheckCmd     `cmd:"" help:"Check that this machine can run pods: kernel, cgroups, containerd, runc, CNI, iptables, state dir, clock, swap, config; each item with its fix."`
	Uninstall UninstallCmd `cmd:"" help:"Remove what mqlet made on this host: pods, their network and cgroups, images, state (--purge; without it, list what would go)."`

	Completion CompletionCmd `cmd:"" help:"Print a shell completion script for bash, zsh or fish."`
	Complete   CompleteCmd   `cmd:"" name:"__complete" hidden:"" passthrough:"" help:"Print the completions of a command line (the completion scripts call it)."`

	SandboxPause SandboxPauseCmd `cmd:"" name:"sandbox-pause" hidden:"" help:"PID 1 of a pod's shared PID namespace (started by the agent)."`
	CgroupHolder CgroupHolderCmd `cmd:"" name:"cgroup-holder" hidden:"" help:"Keep the systemd scope of the pods' cgroups alive (started by the agent)."`
}

// SandboxPauseCmd is the holder of a pod's shared PID namespace (shareProcessNamespace): the agent
// runs its own binary with it, as PID 1 of a new PID namespace, in place of kubelet's pause
// container. Its name must be ctrd.PauseCommand.
type SandboxPauseCmd struct{}

// Run never returns in the holder; run by hand (not PID 1) it fails.
func (SandboxPauseCmd) Run() error { return ctrd.RunPause() }

// VersionCmd prints the build's version and commit.
type VersionCmd struct{}

// Run prints "mqlet VERSION (commit COMMIT)".
func (VersionCmd) Run(env *ctlEnv) error {
	_, err := fmt.Fprintln(env.out, versionLine())
	return err
}

// versionLine is what `mqlet version` and `mqlet --version` print.
func versionLine() string { return fmt.Sprintf("mqlet %s (commit %s)", version, commit) }

// parser builds the command line parser of c; tests add their own options (writers, exit).
func parser(c *cli, opts ...kong.Option) (*kong.Kong, error) {
	vars := kong.Vars(config.Vars())
	vars["version"] = versionLine()
	return kong.New(c, append([]kong.Option{
		kong.Name("mqlet"),
		kong.Description("mqlet runs Kubernetes pods on containerd on edge devices."),
		vars,
	}, opts...)...)
}

// kongExit carries the status kong asked to exit with (after --help or --version) out of the
// parse, so that run returns it instead of kong ending the process from inside.
type kongExit int

// run runs the command line args with env and returns the process's exit status: 0, or 1 with a
// short error and a hint on env.errOut (not the full usage, which --help prints).
func run(args []string, env *ctlEnv) (status int) {
	var c cli
	p, err := parser(&c, kong.Writers(env.out, env.errOut), kong.Exit(func(code int) { panic(kongExit(code)) }))
	if err != nil {
		panic(err) // the CLI's own tags are wrong: a bug, caught by every test
	}
	kctx, err := parse(p, args)
	var exit kongExit
	if errors.As(err, &exit) {
		return int(exit)
	}
	if err != nil {
		fmt.Fprintf(env.errOut, "mqlet: %v\n%s\n", err, usageHint(err))
		return 1
	}
	if err := kctx.Run(env); err != nil {
		var es exitStatus
		if errors.As(err, &es) {
			return int(es)
		}
		fmt.Fprintln(env.errOut, "mqlet:", err)
		return 1
	}
	return 0
}

// parse is p.Parse with kong's exits (help, version) turned into a kongExit error.
func parse(p *kong.Kong, args []string) (kctx *kong.Context, err error) {
	defer func() {
		if r := recover(); r != nil {
			code, ok := r.(kongExit)
			if !ok {
				panic(r)
			}
			kctx, err = nil, code
		}
	}()
	return p.Parse(args)
}

func (e kongExit) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// usageHint names the help of the command the parse got to, e.g. "Run 'mqlet ctl get --help'
// for usage."
func usageHint(err error) string {
	path := "mqlet"
	var pe *kong.ParseError
	if errors.As(err, &pe) && pe.Context != nil {
		var words []string
		for n := pe.Context.Selected(); n != nil && n.Parent != nil; n = n.Parent {
			switch n.Type {
			case kong.CommandNode:
				words = append([]string{n.Name}, words...)
			case kong.ArgumentNode:
				words = append([]string{"<" + n.Name + ">"}, words...)
			}
		}
		if len(words) == 0 { // no command selected yet: the deepest one the parse entered
			for _, el := range pe.Context.Path {
				if el.Command != nil {
					words = append(words, el.Command.Name)
				}
			}
		}
		if len(words) > 0 {
			path += " " + strings.Join(words, " ")
		}
	}
	return fmt.Sprintf("Run '%s --help' for usage.", path)
}

func main() {
	os.Exit(run(os.Args[1:], &ctlEnv{ctx: context.Background(), signals: true, in: os.Stdin, out: os.Stdout, errOut: os.Stderr, now: time.Now}))
}
