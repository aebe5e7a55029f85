// Command mqlet-fleetsim runs many simulated edge nodes in one process against an MQTT broker:
// each is the real agent code, built by the same composition root as `mqlet agent` (package
// node), over an in-memory store and runtime and a made-up machine. It is for scale tests of a
// control plane (mqlet-bridge, `mqlet ctl`) and for sizing a broker; it is not shipped in the
// edge binary.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/alecthomas/kong"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/internal/buildversion"
)

// Stamped by the Makefile with -ldflags "-X main.stampedVersion=... -X main.stampedCommit=...".
var stampedVersion, stampedCommit string

var version, commit = buildversion.Resolve(stampedVersion, stampedCommit, debug.ReadBuildInfo)

// cli is the command line: the simulator's flags, and --version.
type cli struct {
	Version kong.VersionFlag `help:"Print the version and exit."`
	FleetSimCmd
}

// parser builds the command line parser of c; tests add their own options.
func parser(c *cli, opts ...kong.Option) (*kong.Kong, error) {
	vars := kong.Vars(config.Vars())
	vars["version"] = fmt.Sprintf("mqlet-fleetsim %s (commit %s)", version, commit)
	return kong.New(c, append([]kong.Option{
		kong.Name("mqlet-fleetsim"),
		kong.Description("mqlet-fleetsim runs many simulated mqlet nodes against an MQTT broker, for scale tests of a control plane."),
		vars,
	}, opts...)...)
}

func main() {
	var c cli
	p, err := parser(&c)
	if err != nil {
		panic(err) // the CLI's own tags are wrong: a bug, caught by every test
	}
	if _, err := p.Parse(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "mqlet-fleetsim: %v\nRun 'mqlet-fleetsim --help' for usage.\n", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := c.Run(ctx, os.Stderr); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "mqlet-fleetsim:", err)
		os.Exit(1)
	}
}

// Run runs the fleet until ctx ends; then every node stops (publishing offline) and Run returns
// once every goroutine has ended. The simulator's and the nodes' log lines go to errOut.
func (c *FleetSimCmd) Run(ctx context.Context, errOut io.Writer) error {
	f, err := c.fleet(errOut)
	if err != nil {
		return err
	}
	return f.run(ctx)
}
