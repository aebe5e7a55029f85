// Command mkimage builds mqlet's test images from a static busybox binary,
// with nothing but the standard library: no registry, no docker, no network.
//
// It writes, into -out:
//
//	busybox.tar      docker-archive  mqlet.test/busybox:1     Cmd ["sh"]
//	busybox-2.tar    docker-archive  mqlet.test/busybox:2     as :1 plus Env MQLET_IMAGE_VERSION=2
//	echo.tar         docker-archive  mqlet.test/echo:1        Entrypoint ["/bin/echo"], Cmd ["hello from image"], WorkingDir /tmp
//	busybox-oci.tar  oci-archive     mqlet.test/busybox-oci:1 (index.json ref.name annotation holds the full reference)
//
// All images share one uncompressed layer. Every tar entry has a fixed mtime
// and owner and the entries are written in a fixed order, so the same busybox
// binary always gives the same digests: tests may compare digests across runs
// and machines with the same busybox.
//
// Usage (from the repository root):
//
//	go run ./tools/mkimage -busybox /bin/busybox -out /var/lib/mqlet-test/images
//
// With -file it writes one docker-archive instead, of an image holding one static binary and
// nothing else (the release's mqlet-bridge image, `make release`), in the same reproducible way:
//
//	go run ./tools/mkimage -file bin/mqlet-bridge=/usr/local/bin/mqlet-bridge -arch arm64 \
//	    -ref localhost/mqlet-bridge:v1.2.3 -o dist/mqlet-bridge-v1.2.3-linux-arm64.tar
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// epoch is the mtime of every tar entry and the "created" time of every
// image; a fixed value keeps the digests reproducible.
var epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

const defaultPath = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"

func main() {
	busybox := flag.String("busybox", "/bin/busybox", "path of a statically linked busybox binary")
	out := flag.String("out", "", "directory to write the image archives into (created if missing)")
	arch := flag.String("arch", runtime.GOARCH, "architecture recorded in the image config (that of the busybox binary)")
	fileSpec := flag.String("file", "", "SRC=DST: write one image holding the static binary SRC at DST (its entrypoint) instead of the test images")
	ref := flag.String("ref", "", "with -file: the image's reference (name:tag)")
	output := flag.String("o", "", "with -file: the archive to write")
	flag.Parse()
	if *fileSpec != "" {
		if err := binaryImage(*fileSpec, *ref, *arch, *output); err != nil {
			fmt.Fprintln(os.Stderr, "mkimage:", err)
			os.Exit(1)
		}
		return
	}
	if *out == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: mkimage [-busybox PATH] [-arch ARCH] -out DIR")
		os.Exit(2)
	}
	if err := run(*busybox, *out, *arch); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

// imageSpec describes one output archive.
type imageSpec struct {
	file   string
	ref    string
	oci    bool
	config containerConfig
}

func specs() []imageSpec {
	return []imageSpec{
		{file: "busybox.tar", ref: "mqlet.test/busybox:1", config: containerConfig{
			Env: []string{defaultPath}, Cmd: []string{"sh"},
		}},
		{file: "busybox-2.tar", ref: "mqlet.test/busybox:2", config: containerConfig{
			Env: []string{defaultPath, "MQLET_IMAGE_VERSION=2"}, Cmd: []string{"sh"},
		}},
		{file: "echo.tar", ref: "mqlet.test/echo:1", config: containerConfig{
			Env:        []string{defaultPath},
			Entrypoint: []string{"/bin/echo"},
			Cmd:        []string{"hello from image"},
			WorkingDir: "/tmp",
		}},
		{file: "busybox-oci.tar", ref: "mqlet.test/busybox-oci:1", oci: true, config: containerConfig{
			Env: []string{defaultPath}, Cmd: []string{"sh"},
		}},
	}
}

func run(busyboxPath, outDir, arch string) error {
	bin, err := os.ReadFile(busyboxPath)
	if err != nil {
		return fmt.Errorf("reading busybox: %w", err)
	}
	if err := requireStatic(busyboxPath); err != nil {
		return err
	}
	applets, err := listApplets(busyboxPath)
	if err != nil {
		return err
	}
	layer, err := buildLayer(bin, applets)
	if err != nil {
		return fmt.Errorf("building layer from %s: %w", busyboxPath, err)
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return fmt.Errorf("creating output directory: %w", err)
	}
	for _, s := range specs() {
		cfg, err := json.Marshal(newImageConfig(arch, s.config, digestOf(layer)))
		if err != nil {
			return fmt.Errorf("encoding config of %s: %w", s.ref, err)
		}
		var archive []byte
		if s.oci {
			archive, err = ociArchive(s.ref, cfg, layer)
		} else {
			archive, err = dockerArchive(s.ref, cfg, layer)
		}
		if err != nil {
			return fmt.Errorf("building %s: %w", s.ref, err)
		}
		dst := filepath.Join(outDir, s.file)
		if err := writeAtomic(dst, archive); err != nil {
			return err
		}
		fmt.Printf("%-16s %-26s config %s\n", s.file, s.ref, digestOf(cfg))
	}
	return nil
}

// requireStatic refuses a dynamically linked busybox: the image holds no
// libc, so such a binary would fail only later, inside the container, with a
// confusing "no such file or directory".
func requireStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("reading %s as ELF: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; install busybox-static", path)
		}
	}
	return nil
}

func listApplets(busybox string) ([]string, error) {
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("running %s --list: %w", busybox, err)
	}
	seen := map[string]bool{}
	var applets []string
	for _, name := range strings.Fields(string(out)) {
		if name == "busybox" || strings.Contains(name, "/") || seen[name] {
			continue
		}
		seen[name] = true
		applets = append(applets, name)
	}
	if len(applets) == 0 {
		return nil, fmt.Errorf("%s --list printed no applets", busybox)
	}
	sort.Strings(applets)
	return applets, nil
}

// tarEntry is one file of a tar stream; the order of a []tarEntry is the
// order in the stream.
type tarEntry struct {
	name     string
	typ      byte
	mode     int64
	linkname string
	data     []byte
}

func dir(name string, mode int64) tarEntry {
	return tarEntry{name: name + "/", typ: tar.TypeDir, mode: mode}
}
func file(name string, mode int64, data []byte) tarEntry {
	return tarEntry{name: name, typ: tar.TypeReg, mode: mode, data: data}
}

func writeTar(entries []tarEntry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{
			Typeflag: e.typ,
			Name:     e.name,
			Linkname: e.linkname,
			Mode:     e.mode,
			Size:     int64(len(e.data)),
			ModTime:  epoch,
			Format:   tar.FormatPAX,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("writing tar header for %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("writing tar data for %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func buildLayer(busybox []byte, applets []string) ([]byte, error) {
	entries := []tarEntry{
		dir("bin", 0o755),
		file("bin/busybox", 0o755, busybox),
	}
	for _, a := range applets {
		// Relative targets keep the links valid wherever the rootfs is mounted.
		entries = append(entries, tarEntry{name: "bin/" + a, typ: tar.TypeSymlink, mode: 0o777, linkname: "busybox"})
	}
	entries = append(entries,
		dir("dev", 0o755),
		dir("etc", 0o755),
		file("etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n")),
		file("etc/hosts", 0o644, []byte("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")),
		file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")),
		dir("proc", 0o555),
		dir("root", 0o700),
		dir("sys", 0o555),
		dir("tmp", 0o1777),
		dir("var", 0o755),
	)
	return writeTar(entries)
}

// The JSON types below cover the fields of the OCI image config, manifest
// and index that these images use; docker's config format is a superset of
// the OCI one, so the same config serves both archive kinds.

type containerConfig struct {
	Env        []string `json:"Env,omitempty"`
	Entrypoint []string `json:"Entrypoint,omitempty"`
	Cmd        []string `json:"Cmd,omitempty"`
	WorkingDir string   `json:"WorkingDir,omitempty"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

type history struct {
	Created   time.Time `json:"created"`
	CreatedBy string    `json:"created_by"`
}

type imageConfig struct {
	Created      time.Time       `json:"created"`
	Architecture string          `json:"architecture"`
	OS           string          `json:"os"`
	Config       containerConfig `json:"config"`
	RootFS       rootFS          `json:"rootfs"`
	History      []history       `json:"history"`
}

func newImageConfig(arch string, cc containerConfig, diffID string) imageConfig {
	return imageConfig{
		Created:      epoch,
		Architecture: arch,
		OS:           "linux",
		Config:       cc,
		RootFS:       rootFS{Type: "layers", DiffIDs: []string{diffID}},
		History:      []history{{Created: epoch, CreatedBy: "mqlet scripts/mkimage: busybox-static"}},
	}
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type ociManifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type ociIndex struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

type dockerManifestEntry struct {
	Config   string
	RepoTags []string
	Layers   []string
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func hexOf(b []byte) string { return strings.TrimPrefix(digestOf(b), "sha256:") }

// dockerArchive lays the image out the way `docker save` does, which is what
// containerd's importer and skopeo's docker-archive transport read.
func dockerArchive(ref string, config, layer []byte) ([]byte, error) {
	layerPath := hexOf(layer) + "/layer.tar"
	configPath := hexOf(config) + ".json"
	manifest, err := json.Marshal([]dockerManifestEntry{{
		Config:   configPath,
		RepoTags: []string{ref},
		Layers:   []string{layerPath},
	}})
	if err != nil {
		return nil, err
	}
	return writeTar([]tarEntry{
		dir(hexOf(layer), 0o755),
		file(layerPath, 0o644, layer),
		file(configPath, 0o644, config),
		file("manifest.json", 0o644, manifest),
	})
}

// ociArchive writes an OCI image layout as a tar. The ref.name annotation
// holds the full reference (as skopeo writes for oci-archive:FILE:REF), so a
// plain containerd import names the image without a ref translator.
func ociArchive(ref string, config, layer []byte) ([]byte, error) {
	manifest, err := json.Marshal(ociManifest{
		SchemaVersion: 2,
		MediaType:     "application/vnd.oci.image.manifest.v1+json",
		Config: descriptor{
			MediaType: "application/vnd.oci.image.config.v1+json",
			Digest:    digestOf(config),
			Size:      int64(len(config)),
		},
		Layers: []descriptor{{
			MediaType: "application/vnd.oci.image.layer.v1.tar",
			Digest:    digestOf(layer),
			Size:      int64(len(layer)),
		}},
	})
	if err != nil {
		return nil, err
	}
	index, err := json.Marshal(ociIndex{
		SchemaVersion: 2,
		MediaType:     "application/vnd.oci.image.index.v1+json",
		Manifests: []descriptor{{
			MediaType:   "application/vnd.oci.image.manifest.v1+json",
			Digest:      digestOf(manifest),
			Size:        int64(len(manifest)),
			Annotations: map[string]string{"org.opencontainers.image.ref.name": ref},
		}},
	})
	if err != nil {
		return nil, err
	}
	blobs := [][]byte{config, layer, manifest}
	sort.Slice(blobs, func(i, j int) bool { return hexOf(blobs[i]) < hexOf(blobs[j]) })
	entries := []tarEntry{
		file("oci-layout", 0o644, []byte(`{"imageLayoutVersion":"1.0.0"}`)),
		file("index.json", 0o644, index),
		dir("blobs", 0o755),
		dir("blobs/sha256", 0o755),
	}
	for _, b := range blobs {
		entries = append(entries, file("blobs/sha256/"+hexOf(b), 0o644, b))
	}
	return writeTar(entries)
}

// writeAtomic replaces dst in one rename so a reader (a test, or a second
// run of testenv.sh) never sees a half-written archive.
func writeAtomic(dst string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", dst, err)
	}
	// After a successful rename this Remove fails harmlessly.
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", dst, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", dst, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", dst, err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("writing %s: %w", dst, err)
	}
	return nil
}

// binaryImage writes a docker-archive of one image that holds the static binary src at dst (and
// the directories above it, /tmp and an /etc/passwd naming root and nobody), with dst as its
// entrypoint.
func binaryImage(spec, ref, arch, out string) error {
	src, dst, ok := strings.Cut(spec, "=")
	if !ok || src == "" || !strings.HasPrefix(dst, "/") || ref == "" || out == "" {
		return fmt.Errorf("-file %q: want -file SRC=/ABS/DST with -ref NAME:TAG and -o FILE", spec)
	}
	bin, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := requireStatic(src); err != nil {
		return err
	}
	var entries []tarEntry
	parts := strings.Split(strings.TrimPrefix(dst, "/"), "/")
	for i := 1; i < len(parts); i++ {
		entries = append(entries, dir(strings.Join(parts[:i], "/"), 0o755))
	}
	entries = append(entries,
		file(strings.TrimPrefix(dst, "/"), 0o755, bin),
		dir("etc", 0o755),
		file("etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n")),
		file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n")),
		dir("tmp", 0o1777),
	)
	layer, err := writeTar(entries)
	if err != nil {
		return err
	}
	cfg, err := json.Marshal(newImageConfig(arch, containerConfig{Env: []string{defaultPath}, Entrypoint: []string{dst}}, digestOf(layer)))
	if err != nil {
		return err
	}
	archive, err := dockerArchive(ref, cfg, layer)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return writeAtomic(out, archive)
}
