package ctrd

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// OpenArchive opens an image archive, transparently un-gzipping *.gz files.
func OpenArchive(path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(path, ".gz") {
		return f, nil
	}
	z, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return struct {
		io.Reader
		io.Closer
	}{z, f}, nil
}

// ArchiveImageNames lists the image names an archive declares (docker-archive RepoTags, OCI ref
// annotations), normalized. It reads only the small metadata files.
func ArchiveImageNames(path string) ([]string, error) {
	rc, err := OpenArchive(path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: not a readable tar archive: %w", path, err)
		}
		switch strings.TrimPrefix(h.Name, "./") {
		case "manifest.json":
			var m []struct{ RepoTags []string }
			if err := json.NewDecoder(io.LimitReader(tr, 1<<20)).Decode(&m); err != nil {
				return nil, fmt.Errorf("%s: manifest.json: %w", path, err)
			}
			for _, e := range m {
				names = append(names, e.RepoTags...)
			}
		case "index.json":
			var idx struct {
				Manifests []struct{ Annotations map[string]string }
			}
			if err := json.NewDecoder(io.LimitReader(tr, 1<<20)).Decode(&idx); err != nil {
				return nil, fmt.Errorf("%s: index.json: %w", path, err)
			}
			for _, m := range idx.Manifests {
				if n := m.Annotations["io.containerd.image.name"]; n != "" {
					names = append(names, n)
				} else if n := m.Annotations["org.opencontainers.image.ref.name"]; strings.ContainsAny(n, "/:") {
					names = append(names, n)
				}
			}
		}
	}
	out := names[:0]
	for _, n := range names {
		if nn, err := NormalizeImage(n); err == nil {
			out = append(out, nn)
		}
	}
	return out, nil
}

// ImportArchiveIfMissing imports the archive at path unless containerd already has every image it
// names. It returns the names imported (none when nothing was missing).
func (r *Runtime) ImportArchiveIfMissing(ctx context.Context, path string) ([]string, error) {
	names, err := ArchiveImageNames(path)
	if err != nil {
		return nil, err
	}
	missing := len(names) == 0
	for _, n := range names {
		ok, err := r.HasImage(ctx, n)
		if err != nil {
			return nil, err
		}
		if !ok {
			missing = true
		}
	}
	if !missing {
		return nil, nil
	}
	rc, err := OpenArchive(path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	imported, err := r.ImportArchive(ctx, rc)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", path, err)
	}
	return imported, nil
}
