package testenv

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// ArchiveWithUser writes into dir a copy of the docker-archive src (one image, such as
// Env.Image(Busybox)) named ref, whose image config's User is user ("1000", "nobody",
// "1000:1000"...), and returns the new archive's path. The layers are shared with src, so
// importing it costs one small config blob.
func ArchiveWithUser(src, dir, ref, user string) (string, error) {
	f, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer f.Close()
	type entry struct {
		hdr  *tar.Header
		data []byte
	}
	var entries []entry
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		} else if err != nil {
			return "", fmt.Errorf("read %s: %w", src, err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return "", fmt.Errorf("read %s: %s: %w", src, hdr.Name, err)
		}
		entries = append(entries, entry{hdr, data})
		files[hdr.Name] = data
	}
	var manifest []map[string]any
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		return "", fmt.Errorf("%s: want a docker-archive of one image (manifest.json: %v)", src, err)
	}
	oldConfig, _ := manifest[0]["Config"].(string)
	var cfg map[string]any
	if err := json.Unmarshal(files[oldConfig], &cfg); err != nil {
		return "", fmt.Errorf("%s: image config %s: %w", src, oldConfig, err)
	}
	cc, _ := cfg["config"].(map[string]any)
	if cc == nil {
		cc = map[string]any{}
		cfg["config"] = cc
	}
	cc["User"] = user
	newCfg, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(newCfg)
	newConfig := hex.EncodeToString(sum[:]) + ".json"
	manifest[0]["Config"] = newConfig
	manifest[0]["RepoTags"] = []string{ref}
	newManifest, err := json.Marshal(manifest)
	if err != nil {
		return "", err
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	write := func(hdr *tar.Header, data []byte) error {
		h := *hdr
		h.Size = int64(len(data))
		if err := tw.WriteHeader(&h); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, e := range entries {
		switch e.hdr.Name {
		case oldConfig:
			e.hdr.Name, e.data = newConfig, newCfg
		case "manifest.json":
			e.data = newManifest
		}
		if err := write(e.hdr, e.data); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "image-"+hex.EncodeToString(sum[:8])+".tar")
	return out, os.WriteFile(out, buf.Bytes(), 0o644)
}
