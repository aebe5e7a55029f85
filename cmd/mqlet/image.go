package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/mqlet/mqlet/agent/runtime"
)

// ImageCmd is `mqlet image`: it talks to containerd directly, so images can be loaded on a node
// before the agent ever runs (factory provisioning, OTA).
type ImageCmd struct {
	Import ImageImportCmd `cmd:"" help:"Import docker-archive or OCI archives (.tar, .tar.gz) into containerd."`
	Ls     ImageLsCmd     `cmd:"" help:"List images."`
}

type containerdFlags struct {
	ContainerdAddress   string        `name:"containerd-address" default:"${containerd_address}" env:"MQLET_CONTAINERD_ADDRESS" help:"containerd socket."`
	ContainerdNamespace string        `name:"containerd-namespace" default:"${containerd_namespace}" env:"MQLET_CONTAINERD_NAMESPACE" help:"containerd namespace."`
	ContainerdTimeout   time.Duration `name:"containerd-timeout" default:"${containerd_timeout}" env:"MQLET_CONTAINERD_TIMEOUT" help:"Timeout for connecting to containerd."`
}

func (f containerdFlags) runtime(ctx context.Context) (*runtime.Runtime, error) {
	return runtime.New(ctx, runtime.Options{Address: f.ContainerdAddress, Namespace: f.ContainerdNamespace, DialTimeout: f.ContainerdTimeout})
}

// ImageImportCmd is `mqlet image import FILE...`.
type ImageImportCmd struct {
	containerdFlags `embed:""`
	Files           []string `arg:"" type:"existingfile" help:"Archives to import."`
}

// Run imports each archive and prints the image names it created.
func (c *ImageImportCmd) Run() error {
	ctx := context.Background()
	rt, err := c.runtime(ctx)
	if err != nil {
		return err
	}
	defer rt.Close()
	for _, f := range c.Files {
		rc, err := runtime.OpenArchive(f)
		if err != nil {
			return fmt.Errorf("import %s: %w", f, err)
		}
		names, err := rt.ImportArchive(ctx, rc)
		rc.Close()
		if err != nil {
			return fmt.Errorf("import %s: %w", f, err)
		}
		for _, n := range names {
			fmt.Printf("imported %s\n", n)
		}
	}
	return nil
}

// ImageLsCmd is `mqlet image ls`.
type ImageLsCmd struct {
	containerdFlags `embed:""`
	Quiet           bool `short:"q" help:"Only names."`
}

// Run prints a table of images.
func (c *ImageLsCmd) Run() error {
	ctx := context.Background()
	rt, err := c.runtime(ctx)
	if err != nil {
		return err
	}
	defer rt.Close()
	imgs, err := rt.ListImages(ctx)
	if err != nil {
		return err
	}
	if c.Quiet {
		for _, i := range imgs {
			fmt.Println(i.Name)
		}
		return nil
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tDIGEST\tSIZE\tCREATED")
	for _, i := range imgs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", i.Name, shortDigest(i.Digest), humanSize(i.Size), i.Created.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

func shortDigest(d string) string {
	if len(d) > 19 {
		return d[:19]
	}
	return d
}

func humanSize(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n), 0
	for f >= unit && i < 4 {
		f /= unit
		i++
	}
	return fmt.Sprintf("%.3g %cB", f, " kMGT"[i])
}
