package main

import (
	"fmt"
	"strings"

	"github.com/mqlet/mqlet/core/execio"
	"github.com/mqlet/mqlet/sync/protocol"
)

// CtlExecCmd is `mqlet ctl exec NODE/POD -- CMD...` (or --node NODE POD): a command in a pod's
// container on a node, through the broker, sealed end to end.
type CtlExecCmd struct {
	Node      string   `help:"Node of the pod (else POD is NODE/POD or NODE/NAMESPACE/POD)."`
	Namespace string   `short:"n" default:"default" help:"Namespace of the pod."`
	Container string   `short:"c" help:"Container (default: the pod's first)."`
	Stdin     bool     `short:"i" help:"Pass stdin to the command."`
	TTY       bool     `short:"t" help:"Give the command a terminal (stdin must be one)."`
	Pod       string   `arg:"" help:"NODE/POD, NODE/NAMESPACE/POD, or with --node POD or NAMESPACE/POD."`
	Command   []string `arg:"" passthrough:"" help:"The command and its arguments (after --)."`
}

// ctlExecTarget splits the pod reference of ctl exec into node, namespace and name.
func ctlExecTarget(node, defaultNS, ref string) (string, string, string, error) {
	if node == "" {
		var ok bool
		node, ref, ok = strings.Cut(ref, "/")
		if !ok || node == "" {
			return "", "", "", fmt.Errorf("%q: want NODE/POD (or --node NODE)", ref)
		}
	}
	ns, name, err := splitPodRef(defaultNS, ref)
	return node, ns, name, err
}

// Run runs the command and exits with its exit code.
func (c *CtlExecCmd) Run(ctl *CtlCmd, env *ctlEnv) error {
	node, ns, name, err := ctlExecTarget(c.Node, c.Namespace, c.Pod)
	if err != nil {
		return fmt.Errorf("ctl exec: %w", err)
	}
	cmd := c.Command
	if len(cmd) > 0 && cmd[0] == "--" {
		cmd = cmd[1:]
	}
	if len(cmd) == 0 {
		return fmt.Errorf("ctl exec %s: no command given (mqlet ctl exec NODE/POD -- CMD [ARG...])", c.Pod)
	}
	return runSession(ctl, env, "exec", node, protocol.ExecRequest{Namespace: ns, Pod: name, Container: c.Container, Command: cmd}, c.Stdin, c.TTY)
}

// runSession runs one exec or attach session with the terminal's streams and exits with the exit
// code it brings back.
func runSession(ctl *CtlCmd, env *ctlEnv, verb, node string, req protocol.ExecRequest, stdin, tty bool) error {
	ctx, stop := env.context()
	defer stop()
	cl, err := ctl.connect(ctx)
	if err != nil {
		return fmt.Errorf("ctl %s %s/%s: %w", verb, req.Namespace, req.Pod, err)
	}
	defer cl.Close()
	streams, restore, err := execTerminal(ctx, env, stdin, tty)
	if err != nil {
		return err
	}
	defer restore()
	req.TTY = streams.TTY
	if streams.TTY && streams.Size.Width > 0 {
		req.Size = &protocol.TermSize{Width: streams.Size.Width, Height: streams.Size.Height}
	}
	var resize chan protocol.TermSize
	if streams.Resize != nil {
		resize = make(chan protocol.TermSize, 1)
		go forwardSizes(ctx.Done(), streams.Resize, resize)
	}
	code, err := cl.Exec(ctx, node, req, streams.Stdin, streams.Stdout, streams.Stderr, resize)
	restore()
	if err != nil {
		return fmt.Errorf("ctl %w", err)
	}
	if code != 0 {
		return exitStatus(code)
	}
	return nil
}

// CtlAttachCmd is `mqlet ctl attach NODE/POD`: the container's own process (like kubectl attach),
// through the broker, sealed end to end: its output from now on, stdin with -i when its spec has
// stdin, its terminal with -t. It ends when the container does, with its exit code.
type CtlAttachCmd struct {
	Node      string `help:"Node of the pod (else POD is NODE/POD or NODE/NAMESPACE/POD)."`
	Namespace string `short:"n" default:"default" help:"Namespace of the pod."`
	Container string `short:"c" help:"Container (default: the pod's first)."`
	Stdin     bool   `short:"i" help:"Pass stdin to the container (its spec must have stdin)."`
	TTY       bool   `short:"t" help:"The container has a terminal (its spec's tty; stdin must be one)."`
	Pod       string `arg:"" help:"NODE/POD, NODE/NAMESPACE/POD, or with --node POD or NAMESPACE/POD."`
}

// Run attaches and exits with the container's exit code once it ended.
func (c *CtlAttachCmd) Run(ctl *CtlCmd, env *ctlEnv) error {
	node, ns, name, err := ctlExecTarget(c.Node, c.Namespace, c.Pod)
	if err != nil {
		return fmt.Errorf("ctl attach: %w", err)
	}
	return runSession(ctl, env, "attach", node, protocol.ExecRequest{Namespace: ns, Pod: name, Container: c.Container, Attach: true}, c.Stdin, c.TTY)
}

// forwardSizes turns the terminal's sizes into the protocol's until done.
func forwardSizes(done <-chan struct{}, in <-chan execio.TermSize, out chan protocol.TermSize) {
	for {
		select {
		case <-done:
			return
		case sz := <-in:
			select {
			case <-out:
			default:
			}
			out <- protocol.TermSize{Width: sz.Width, Height: sz.Height}
		}
	}
}
