package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/mqlet/mqlet/agent/api"
	"github.com/mqlet/mqlet/core/execio"
	"golang.org/x/term"
)

// ExecCmd is `mqlet exec POD -- CMD...`, like kubectl exec, through the local agent's API.
type ExecCmd struct {
	APISocket string   `name:"api-socket" default:"${api_socket}" env:"MQLET_API_SOCKET" help:"Unix socket of the agent's local API."`
	Namespace string   `short:"n" default:"default" help:"Namespace of the pod."`
	Container string   `short:"c" help:"Container (default: the pod's first)."`
	Stdin     bool     `short:"i" help:"Pass stdin to the command."`
	TTY       bool     `short:"t" help:"Give the command a terminal (stdin must be one)."`
	Pod       string   `arg:"" help:"Pod name (or NAMESPACE/NAME)."`
	Command   []string `arg:"" passthrough:"" help:"The command and its arguments (after --)."`
}

// exitStatus is an error that carries the exit code of a command run remotely: run exits with
// it and prints nothing (the command said what it had to).
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("command exited with %d", int(e)) }

// Run runs the command and exits with its exit code.
func (c *ExecCmd) Run(env *ctlEnv) error {
	ns, name, err := splitPodRef(c.Namespace, c.Pod)
	if err != nil {
		return err
	}
	cmd := c.Command
	if len(cmd) > 0 && cmd[0] == "--" {
		cmd = cmd[1:]
	}
	if len(cmd) == 0 {
		return fmt.Errorf("exec %s: no command given (mqlet exec POD -- CMD [ARG...])", c.Pod)
	}
	ctx, stop := env.context()
	defer stop()
	streams, restore, err := execTerminal(ctx, env, c.Stdin, c.TTY)
	if err != nil {
		return err
	}
	defer restore()
	code, err := api.NewClient(c.APISocket).Exec(ctx, ns, name, api.ExecOptions{Container: c.Container, Command: cmd, Streams: streams})
	restore()
	if err != nil {
		return err
	}
	if code != 0 {
		return exitStatus(code)
	}
	return nil
}

// execTerminal sets up the local end of an exec: stdin when asked, and with tty a raw terminal
// whose size goes along and follows SIGWINCH. restore puts the terminal back (idempotent).
func execTerminal(ctx context.Context, env *ctlEnv, stdin, tty bool) (execio.Streams, func(), error) {
	s := execio.Streams{Stdout: env.out, Stderr: env.errOut}
	if stdin {
		s.Stdin = env.in
	}
	nop := func() {}
	if !tty {
		return s, nop, nil
	}
	f, ok := env.in.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		// kubectl's behaviour: go on without a terminal rather than fail a scripted call.
		fmt.Fprintln(env.errOut, "Unable to use a TTY - input is not a terminal or the right kind of file")
		return s, nop, nil
	}
	fd := int(f.Fd())
	s.TTY = true
	if w, h, err := term.GetSize(fd); err == nil {
		s.Size = execio.TermSize{Width: uint16(w), Height: uint16(h)}
	}
	old, err := term.MakeRaw(fd)
	if err != nil {
		return s, nop, fmt.Errorf("exec: put the terminal in raw mode: %w", err)
	}
	resize := make(chan execio.TermSize, 1)
	s.Resize = resize
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	wctx, cancel := context.WithCancel(ctx)
	go func() {
		for {
			select {
			case <-wctx.Done():
				return
			case <-winch:
				w, h, err := term.GetSize(fd)
				if err != nil {
					continue
				}
				select { // only the latest size matters
				case <-resize:
				default:
				}
				resize <- execio.TermSize{Width: uint16(w), Height: uint16(h)}
			}
		}
	}()
	done := false
	return s, func() {
		if done {
			return
		}
		done = true
		cancel()
		signal.Stop(winch)
		term.Restore(fd, old)
	}, nil
}
