package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/mqlet/mqlet/agent/ctrd"
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

func (f containerdFlags) runtime(ctx context.Context) (*ctrd.Runtime, error) {
	return ctrd.New(ctx, ctrd.Options{Address: f.ContainerdAddress, Namespace: f.ContainerdNamespace, DialTimeout: f.ContainerdTimeout})
}

// ImageImportCmd is `mqlet image import FILE...`.
type ImageImportCmd struct {
	containerdFlags `embed:""`
	Files           []string `arg:"" type:"existingfile" help:"Archives to import."`
}

// Run imports each archive and prints the image names it created.
func (c *ImageImportCmd) Run(env *ctlEnv) error {
	ctx := context.Background()
	rt, err := c.runtime(ctx)
	if err != nil {
		return err
	}
	defer rt.Close()
	for _, f := range c.Files {
		rc, err := ctrd.OpenArchive(f)
		if err != nil {
			return fmt.Errorf("import %s: %w", f, err)
		}
		names, err := rt.ImportArchive(ctx, rc)
		rc.Close()
		if err != nil {
			return fmt.Errorf("import %s: %w", f, err)
		}
		for _, n := range names {
			fmt.Fprintf(env.out, "imported %s\n", n)
		}
	}
	return nil
}

// ImageLsCmd is `mqlet image ls`.
type ImageLsCmd struct {
	containerdFlags `embed:""`
	Quiet           bool   `short:"q" help:"Only names."`
	Output          string `short:"o" enum:"json," default:"" help:"Output format: json (default: a table)."`
}

// Run prints the images.
func (c *ImageLsCmd) Run(env *ctlEnv) error {
	if c.Quiet && c.Output != "" {
		return fmt.Errorf("image ls: -q and -o %s exclude each other", c.Output)
	}
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
	return printImages(env.out, imgs, c.Quiet, c.Output)
}

// imageListJSON is `image ls -o json`: an object, so that fields can be added beside the list.
type imageListJSON struct {
	Images []imageJSON `json:"images"`
}

type imageJSON struct {
	Name    string    `json:"name"`
	Digest  string    `json:"digest"`
	Size    int64     `json:"size"` // bytes: what the image's content takes in containerd
	Created time.Time `json:"created"`
}

// printImages writes imgs as names (quiet), JSON or a table.
func printImages(out io.Writer, imgs []ctrd.ImageInfo, quiet bool, format string) error {
	switch {
	case quiet:
		for _, i := range imgs {
			if _, err := fmt.Fprintln(out, i.Name); err != nil {
				return err
			}
		}
		return nil
	case format == outputJSON:
		l := imageListJSON{Images: make([]imageJSON, 0, len(imgs))}
		for _, i := range imgs {
			l.Images = append(l.Images, imageJSON{Name: i.Name, Digest: i.Digest, Size: i.Size, Created: i.Created.UTC()})
		}
		b, err := json.MarshalIndent(l, "", "    ")
		if err != nil {
			return fmt.Errorf("encoding the image list as json: %w", err)
		}
		_, err = out.Write(append(b, '\n'))
		return err
	case format == outputTable:
		tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "IMAGE\tDIGEST\tSIZE\tCREATED")
		for _, i := range imgs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", i.Name, shortDigest(i.Digest), humanSize(i.Size), i.Created.UTC().Format(time.RFC3339))
		}
		return tw.Flush()
	}
	return fmt.Errorf("image ls: unknown output format %q (want json, or empty for the table)", format)
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
