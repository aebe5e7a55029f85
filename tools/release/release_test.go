package main

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// build runs the release tool on stand-in binaries (the packaging is what is tested, not mqlet)
// and returns the output directory.
func build(t *testing.T, version string, debOnly bool) string {
	t.Helper()
	bin, out := t.TempDir(), t.TempDir()
	for a := range arches {
		if err := os.WriteFile(filepath.Join(bin, "mqlet-linux-"+a), []byte("#!/bin/sh\necho mqlet "+a+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	o := options{version: version, repo: "../..", bin: bin, out: out, arches: []string{"amd64", "arm64", "armv7"}, debOnly: debOnly}
	if err := run(o); err != nil {
		t.Fatal(err)
	}
	return out
}

func dpkgDeb(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("dpkg-deb", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg-deb %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// The .deb as dpkg reads it: what goes where with which mode, the conffile, the dependencies, the
// architecture names Debian uses, and the maintainer scripts.
func TestDebContents(t *testing.T) {
	out := build(t, "v1.2.3", false)
	for goArch, debArch := range map[string]string{"amd64": "amd64", "arm64": "arm64", "armv7": "armhf"} {
		deb := filepath.Join(out, "mqlet_1.2.3_"+debArch+".deb")
		if _, err := os.Stat(deb); err != nil {
			t.Fatalf("%s: %v", goArch, err)
		}
		list := dpkgDeb(t, "-c", deb)
		for _, want := range []string{
			"-rwxr-xr-x root/root", "./usr/bin/mqlet",
			"-rw-r--r-- root/root", "./lib/systemd/system/mqlet.service",
			"./etc/mqlet/mqlet.yaml", "./etc/mqlet/pods/", "./usr/share/doc/mqlet/copyright",
		} {
			if !strings.Contains(list, want) {
				t.Errorf("%s: dpkg-deb -c has no %q:\n%s", deb, want, list)
			}
		}
		for _, line := range strings.Split(list, "\n") {
			if strings.HasSuffix(line, "./usr/bin/mqlet") && !strings.HasPrefix(line, "-rwxr-xr-x root/root") {
				t.Errorf("%s: %s", deb, line)
			}
		}
		info := dpkgDeb(t, "-I", deb)
		for _, want := range []string{
			"Package: mqlet", "Version: 1.2.3", "Architecture: " + debArch,
			"Depends: containerd, runc, containernetworking-plugins, iptables",
			"postinst", "prerm", "postrm", "conffiles",
		} {
			if !strings.Contains(info, want) {
				t.Errorf("%s: dpkg-deb -I has no %q:\n%s", deb, want, info)
			}
		}
		if c := dpkgDeb(t, "-I", deb, "conffiles"); strings.TrimSpace(c) != "/etc/mqlet/mqlet.yaml" {
			t.Errorf("%s: conffiles %q, want /etc/mqlet/mqlet.yaml alone", deb, c)
		}
		x := t.TempDir()
		dpkgDeb(t, "-x", deb, x)
		u, err := os.ReadFile(filepath.Join(x, "lib/systemd/system/mqlet.service"))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"ExecStart=/usr/bin/mqlet agent --config /etc/mqlet/mqlet.yaml", "Type=notify", "WatchdogSec=", "KillMode=process", "Restart=always"} {
			if !strings.Contains(string(u), "\n"+want) {
				t.Errorf("%s: the unit has no line %q:\n%s", deb, want, u)
			}
		}
		if b, _ := os.ReadFile(filepath.Join(x, "usr/bin/mqlet")); !strings.Contains(string(b), "mqlet "+goArch) {
			t.Errorf("%s holds the %q binary, want %s's", deb, b, goArch)
		}
		ctl := t.TempDir()
		dpkgDeb(t, "-e", deb, ctl)
		for _, s := range []string{"postinst", "prerm", "postrm"} {
			if out, err := exec.Command("sh", "-n", filepath.Join(ctl, s)).CombinedOutput(); err != nil {
				t.Errorf("%s: %s is not valid sh: %v\n%s", deb, s, err, out)
			}
		}
	}
}

// Version strings from scripts/version.sh become Debian versions that sort as semver does: a
// build after v1.2.3 (v1.2.4-dev.N) comes after 1.2.3 and before 1.2.4, so an upgrade is an upgrade.
func TestDebVersionsSort(t *testing.T) {
	dev := build(t, "v1.2.4-dev.3+g0123456789ab", true)
	rel := build(t, "v1.2.4", true)
	name := func(dir string) string {
		m, _ := filepath.Glob(filepath.Join(dir, "mqlet_*_amd64.deb"))
		if len(m) != 1 {
			t.Fatalf("debs in %s: %v", dir, m)
		}
		return strings.Split(filepath.Base(m[0]), "_")[1]
	}
	d, r := name(dev), name(rel)
	for _, c := range [][3]string{{"1.2.3", "lt", d}, {d, "lt", r}} {
		if err := exec.Command("dpkg", "--compare-versions", c[0], c[1], c[2]).Run(); err != nil {
			t.Errorf("dpkg --compare-versions %s %s %s is false", c[0], c[1], c[2])
		}
	}
	if tgz, _ := filepath.Glob(filepath.Join(dev, "*.tar.gz")); len(tgz) != 0 {
		t.Errorf("-only deb made tarballs: %v", tgz)
	}
}

// The tarball holds the binary, the unit, the example config and the licence; SHA256SUMS covers
// every artifact and sha256sum -c accepts it.
func TestTarballAndChecksums(t *testing.T) {
	out := build(t, "v1.2.3", false)
	f, err := os.Open(filepath.Join(out, "mqlet-1.2.3-linux-arm64.tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	got := map[string]int64{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h.Mode
	}
	for name, mode := range map[string]int64{"mqlet": 0o755, "mqlet.service": 0o644, "mqlet.yaml": 0o644, "LICENSE": 0o644} {
		if m, ok := got["mqlet-1.2.3-linux-arm64/"+name]; !ok || m != mode {
			t.Errorf("tarball entry %s: mode %o (present %v), want %o; entries %v", name, m, ok, mode, got)
		}
	}
	cmd := exec.Command("sha256sum", "-c", "SHA256SUMS")
	cmd.Dir = out
	res, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sha256sum -c: %v\n%s", err, res)
	}
	if n := strings.Count(string(res), ": OK"); n != 6 {
		t.Errorf("SHA256SUMS covers %d files, want 6 (3 tarballs, 3 .debs):\n%s", n, res)
	}
}
