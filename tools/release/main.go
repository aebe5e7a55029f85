// Command release makes mqlet's release artifacts from binaries already built (`make release`
// builds them with the version stamped and runs this): for each architecture a static tarball
// (mqlet, the systemd unit, the example config, the licence) and a .deb (nfpm), then SHA256SUMS over
// everything in the output directory. It lives in a module of its own so that nfpm and its
// dependencies stay out of the mqlet binary's module graph.
//
// Usage (from this directory, as the Makefile runs it):
//
//	go run . -version v1.2.3 -repo ../.. -bin ../../bin/release -out ../../dist [-arch amd64,arm64,armv7] [-only deb]
//
// The binaries are <bin>/mqlet-linux-<arch>. With -only deb, no tarball is made (the v2 guest lane
// builds two .debs to test an upgrade).
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
	"github.com/goreleaser/nfpm/v2/files"
)

// arch is one target: Go's name for it (the binary's suffix) and Debian's.
type arch struct{ goName, debName string }

var arches = map[string]arch{
	"amd64": {"amd64", "amd64"},
	"arm64": {"arm64", "arm64"},
	"armv7": {"armv7", "armhf"},
}

// Depends of the .deb: the container runtime the agent drives, the CNI plugins of its default
// network, and iptables, which those plugins call.
var depends = []string{"containerd", "runc", "containernetworking-plugins", "iptables"}

// epoch is the mtime of every file in the artifacts: the same inputs give the same bytes.
var epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

var semverRE = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)

type options struct {
	version, repo, bin, out string
	arches                  []string
	debOnly                 bool
}

func main() {
	var o options
	var archList, only string
	flag.StringVar(&o.version, "version", "", "the release's semantic version vMAJOR.MINOR.PATCH[-PRE][+META] (scripts/version.sh)")
	flag.StringVar(&o.repo, "repo", "../..", "the checkout: configs/, LICENSE, README.md")
	flag.StringVar(&o.bin, "bin", "", "directory holding mqlet-linux-<arch>")
	flag.StringVar(&o.out, "out", "", "output directory (created)")
	flag.StringVar(&archList, "arch", "amd64,arm64,armv7", "architectures, comma-separated")
	flag.StringVar(&only, "only", "", `"deb": the .deb packages only`)
	flag.Parse()
	o.arches = strings.Split(archList, ",")
	o.debOnly = only == "deb"
	if err := o.check(only); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		flag.Usage()
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func (o options) check(only string) error {
	if !semverRE.MatchString(o.version) {
		return fmt.Errorf("-version %q is not a semantic version vMAJOR.MINOR.PATCH[-PRE][+META]", o.version)
	}
	if o.bin == "" || o.out == "" {
		return errors.New("-bin and -out are required")
	}
	for _, a := range o.arches {
		if _, ok := arches[a]; !ok {
			return fmt.Errorf("-arch %q: want amd64, arm64 or armv7", a)
		}
	}
	if only != "" && only != "deb" {
		return fmt.Errorf(`-only %q: want "deb" or nothing`, only)
	}
	return nil
}

func run(o options) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	unit, err := os.ReadFile(filepath.Join(o.repo, "configs/mqlet.service"))
	if err != nil {
		return err
	}
	for _, name := range o.arches {
		a := arches[name]
		binary := filepath.Join(o.bin, "mqlet-linux-"+a.goName)
		if _, err := os.Stat(binary); err != nil {
			return fmt.Errorf("binary for %s: %w", name, err)
		}
		if !o.debOnly {
			path, err := tarball(o, a, binary)
			if err != nil {
				return fmt.Errorf("tarball for %s: %w", name, err)
			}
			fmt.Println(path)
		}
		path, err := debPackage(o, a, binary, unit)
		if err != nil {
			return fmt.Errorf(".deb for %s: %w", name, err)
		}
		fmt.Println(path)
	}
	if err := bridgeDeployment(o); err != nil {
		return err
	}
	return checksums(o.out)
}

// plainVersion is the version without its leading v, as file names and packages carry it.
func plainVersion(v string) string { return strings.TrimPrefix(v, "v") }

// tarball writes mqlet-<version>-linux-<arch>.tar.gz: one directory holding the binary, the unit
// (ExecStart /usr/local/bin/mqlet), the example config and the licence.
func tarball(o options, a arch, binary string) (string, error) {
	dir := fmt.Sprintf("mqlet-%s-linux-%s", plainVersion(o.version), a.goName)
	path := filepath.Join(o.out, dir+".tar.gz")
	var buf bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	gz.ModTime = epoch
	tw := tar.NewWriter(gz)
	add := func(name, src string, mode int64) error {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: dir + "/" + name, Mode: mode, Size: int64(len(b)), ModTime: epoch,
			Typeflag: tar.TypeReg, Uname: "root", Gname: "root", Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: dir + "/", Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir,
		Uname: "root", Gname: "root", Format: tar.FormatPAX}); err != nil {
		return "", err
	}
	for _, f := range []struct {
		name, src string
		mode      int64
	}{
		{"mqlet", binary, 0o755},
		{"mqlet.service", filepath.Join(o.repo, "configs/mqlet.service"), 0o644},
		{"mqlet.yaml", filepath.Join(o.repo, "configs/mqlet.yaml"), 0o644},
		{"LICENSE", filepath.Join(o.repo, "LICENSE"), 0o644},
		{"README.md", filepath.Join(o.repo, "README.md"), 0o644},
	} {
		if err := add(f.name, f.src, f.mode); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	if err := gz.Close(); err != nil {
		return "", err
	}
	return path, writeFile(path, buf.Bytes())
}

// debUnit is the shipped unit with the packaged binary's path.
func debUnit(unit []byte) ([]byte, error) {
	const from, to = "ExecStart=/usr/local/bin/mqlet ", "ExecStart=/usr/bin/mqlet "
	if !bytes.Contains(unit, []byte(from)) {
		return nil, fmt.Errorf("configs/mqlet.service has no %q line to point at /usr/bin/mqlet", strings.TrimSpace(from))
	}
	return bytes.Replace(unit, []byte(from), []byte(to), 1), nil
}

// debPackage writes mqlet_<version>_<arch>.deb with nfpm: /usr/bin/mqlet, the unit in
// /lib/systemd/system, /etc/mqlet/mqlet.yaml as a conffile, /etc/mqlet/pods/, the licence as
// the copyright file, and the maintainer scripts of debian/.
func debPackage(o options, a arch, binary string, unit []byte) (string, error) {
	tmp, err := os.MkdirTemp("", "mqlet-release-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	u, err := debUnit(unit)
	if err != nil {
		return "", err
	}
	unitFile := filepath.Join(tmp, "mqlet.service")
	if err := os.WriteFile(unitFile, u, 0o644); err != nil {
		return "", err
	}
	scripts := filepath.Join(o.repo, "tools/release/debian")
	mode := func(m os.FileMode) *files.ContentFileInfo {
		return &files.ContentFileInfo{Owner: "root", Group: "root", Mode: m, MTime: epoch}
	}
	info := &nfpm.Info{
		Name:        "mqlet",
		Arch:        a.debName,
		Platform:    "linux",
		Version:     o.version,
		Section:     "admin",
		Priority:    "optional",
		Maintainer:  "The mqlet authors",
		Description: "Kubernetes pods on containerd for edge devices, without Kubernetes\nmqlet runs the Pod manifests dropped into /etc/mqlet/pods on containerd and keeps them\nrunning through reboots, crashes and days without network; optionally a fleet is driven\nover MQTT, by mqlet ctl or a Kubernetes cluster through mqlet-bridge.",
		License:     "Apache-2.0",
		MTime:       epoch,
		Overridables: nfpm.Overridables{
			Depends: depends,
			Contents: files.Contents{
				{Source: binary, Destination: "/usr/bin/mqlet", FileInfo: mode(0o755)},
				{Source: unitFile, Destination: "/lib/systemd/system/mqlet.service", FileInfo: mode(0o644)},
				{Source: filepath.Join(o.repo, "configs/mqlet.yaml"), Destination: "/etc/mqlet/mqlet.yaml", Type: files.TypeConfigNoReplace, FileInfo: mode(0o644)},
				{Destination: "/etc/mqlet/pods", Type: files.TypeDir, FileInfo: mode(0o755)},
				{Source: filepath.Join(o.repo, "LICENSE"), Destination: "/usr/share/doc/mqlet/copyright", FileInfo: mode(0o644)},
				{Source: filepath.Join(o.repo, "README.md"), Destination: "/usr/share/doc/mqlet/README.md", FileInfo: mode(0o644)},
			},
			Scripts: nfpm.Scripts{
				PostInstall: filepath.Join(scripts, "postinst"),
				PreRemove:   filepath.Join(scripts, "prerm"),
				PostRemove:  filepath.Join(scripts, "postrm"),
			},
		},
	}
	info = nfpm.WithDefaults(info)
	if err := nfpm.PrepareForPackager(info, "deb"); err != nil {
		return "", err
	}
	path := filepath.Join(o.out, deb.Default.ConventionalFileName(info))
	var buf bytes.Buffer
	if err := deb.Default.Package(info, &buf); err != nil {
		return "", err
	}
	return path, writeFile(path, buf.Bytes())
}

// imageTag is the version as an image tag, which allows no "+": build metadata joins with "-".
func imageTag(v string) string { return strings.ReplaceAll(v, "+", "-") }

// bridgeDeployment writes configs/bridge/deployment.yaml with the image the release's bridge
// archive holds (mkimage -ref localhost/mqlet-bridge:<tag>), when the Makefile made such an archive.
func bridgeDeployment(o options) error {
	archives, _ := filepath.Glob(filepath.Join(o.out, "mqlet-bridge-*.image.tar"))
	if len(archives) == 0 {
		return nil
	}
	src := filepath.Join(o.repo, "configs/bridge/deployment.yaml")
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	const placeholder = "image: localhost/mqlet-bridge:VERSION"
	if !bytes.Contains(b, []byte(placeholder)) {
		return fmt.Errorf("%s has no %q line for the release's image", src, placeholder)
	}
	b = bytes.Replace(b, []byte(placeholder), []byte("image: localhost/mqlet-bridge:"+imageTag(o.version)), 1)
	return writeFile(filepath.Join(o.out, "mqlet-bridge-deployment.yaml"), b)
}

// checksums writes SHA256SUMS over every file in dir (sha256sum -c reads it).
func checksums(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && e.Name() != "SHA256SUMS" {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	var out bytes.Buffer
	for _, n := range names {
		f, err := os.Open(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return err
		}
		fmt.Fprintf(&out, "%s  %s\n", hex.EncodeToString(h.Sum(nil)), n)
	}
	path := filepath.Join(dir, "SHA256SUMS")
	fmt.Println(path)
	return writeFile(path, out.Bytes())
}

// writeFile replaces path in one rename, so no half-written artifact is ever seen.
func writeFile(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
