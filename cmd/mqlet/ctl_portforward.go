package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/mqlet/mqlet/sync/protocol"
)

// CtlPortForwardCmd is `mqlet ctl port-forward NODE/POD LOCAL:REMOTE`: each connection to the
// local port is one session through the broker, sealed end to end, to REMOTE on the pod's
// 127.0.0.1.
type CtlPortForwardCmd struct {
	Node      string `help:"Node of the pod (else POD is NODE/POD or NODE/NAMESPACE/POD)."`
	Namespace string `short:"n" default:"default" help:"Namespace of the pod."`
	Address   string `default:"127.0.0.1" help:"Local address to listen on."`
	Pod       string `arg:"" help:"NODE/POD, NODE/NAMESPACE/POD, or with --node POD or NAMESPACE/POD."`
	Ports     string `arg:"" placeholder:"LOCAL:REMOTE" help:"Local port (0: any free one) and the pod's port; REMOTE alone uses the same number locally."`
}

func parsePorts(s string) (int, int, error) {
	l, r, ok := strings.Cut(s, ":")
	if !ok {
		l, r = s, s
	}
	local, err := strconv.ParseUint(l, 10, 16)
	if err != nil {
		return 0, 0, fmt.Errorf("ports %q: local port %q is not a port number", s, l)
	}
	remote, err := strconv.ParseUint(r, 10, 16)
	if err != nil || remote == 0 {
		return 0, 0, fmt.Errorf("ports %q: remote port %q is not a port number (1-65535)", s, r)
	}
	return int(local), int(remote), nil
}

// Run forwards until interrupted.
func (c *CtlPortForwardCmd) Run(ctl *CtlCmd, env *ctlEnv) error {
	node, ns, name, err := ctlExecTarget(c.Node, c.Namespace, c.Pod)
	if err != nil {
		return fmt.Errorf("ctl port-forward: %w", err)
	}
	local, remote, err := parsePorts(c.Ports)
	if err != nil {
		return fmt.Errorf("ctl port-forward: %w", err)
	}
	ctx, stop := env.context()
	defer stop()
	cl, err := ctl.connect(ctx)
	if err != nil {
		return fmt.Errorf("ctl port-forward %s/%s: %w", ns, name, err)
	}
	defer cl.Close()
	ln, err := net.Listen("tcp", net.JoinHostPort(c.Address, strconv.Itoa(local)))
	if err != nil {
		return fmt.Errorf("ctl port-forward: %w", err)
	}
	context.AfterFunc(ctx, func() { ln.Close() })
	fmt.Fprintf(env.out, "Forwarding from %s -> %d\n", ln.Addr(), remote)
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("ctl port-forward: %w", err)
		}
		go func() {
			defer conn.Close()
			req := protocol.ExecRequest{Namespace: ns, Pod: name, Port: int32(remote)}
			if _, err := cl.Exec(ctx, node, req, conn, conn, nil, nil); err != nil && ctx.Err() == nil {
				fmt.Fprintf(env.errOut, "port-forward %s -> %s/%s:%d: %v\n", conn.RemoteAddr(), ns, name, remote, err)
			}
		}()
	}
}
