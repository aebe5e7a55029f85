// Command kubecluster runs internal/kubetest's control plane (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler on loopback) until interrupted: for trying
// mqlet-bridge by hand with kubectl, and for benchmarks driven from a shell.
//
// It prints KUBECONFIG=<admin kubeconfig> and the components' pids once the cluster is ready,
// then waits for SIGINT or SIGTERM and stops every component.
//
// Usage (from the repository root, after scripts/testenv.sh):
//
//	go run ./tools/kubecluster [-dir DIR] [-user NAME[:GROUP,...]]...
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/mqlet/mqlet/internal/kubetest"
)

type users []string

func (u *users) String() string     { return strings.Join(*u, " ") }
func (u *users) Set(v string) error { *u = append(*u, v); return nil }

func main() {
	dir := flag.String("dir", "", "directory for certificates, kubeconfigs and logs (kept); default: a temporary one, removed at exit")
	kubeTiming := flag.Bool("kube-node-timing", false, "keep Kubernetes' default node lifecycle timing instead of kubetest's fast one")
	var us users
	flag.Var(&us, "user", "also write a kubeconfig for this client-certificate identity, NAME or NAME:GROUP1,GROUP2 (repeatable)")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintf(os.Stderr, "kubecluster: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, err := kubetest.StartCluster(ctx, kubetest.Options{
		Dir:            *dir,
		KeepDir:        *dir != "",
		KubeNodeTiming: *kubeTiming,
		Logf:           func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) },
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubecluster: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("KUBECONFIG=%s\n", c.Kubeconfig())
	for _, u := range us {
		name, groups, _ := strings.Cut(u, ":")
		var gs []string
		if groups != "" {
			gs = strings.Split(groups, ",")
		}
		fmt.Printf("USER_KUBECONFIG_%s=%s\n", name, c.UserKubeconfig(name, gs...))
	}
	pids := c.PIDs()
	names := make([]string, 0, len(pids))
	for n := range pids {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Printf("PID_%s=%d\n", strings.ReplaceAll(n, "-", "_"), pids[n])
	}
	fmt.Fprintf(os.Stderr, "kubecluster: logs in %s; Ctrl-C stops it\n", c.Dir())
	<-ctx.Done()
	if err := c.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "kubecluster: %v\n", err)
		os.Exit(1)
	}
}
