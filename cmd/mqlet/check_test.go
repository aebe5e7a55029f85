package main

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/internal/testenv"
)

// checkRoot copies a machine fixture of agent/cgroup (a Raspberry Pi's /proc and /sys) and adds
// what mqlet check reads besides: the kernel release and /proc/swaps.
func checkRoot(t *testing.T, board, swaps string) string {
	t.Helper()
	src := filepath.Join("../../agent/cgroup/testdata", board)
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(dst, "proc/sys/kernel"), 0o755)
	os.WriteFile(filepath.Join(dst, "proc/sys/kernel/osrelease"), []byte("6.6.51+rpt-rpi-v8\n"), 0o644)
	os.WriteFile(filepath.Join(dst, "proc/swaps"), []byte("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"+swaps), 0o644)
	return dst
}

// cniBin is a directory with (empty, executable) CNI plugins of these names.
func cniBin(t *testing.T, plugins ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, p := range plugins {
		if err := os.WriteFile(filepath.Join(dir, p), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// checkFlags are agent flags for a check: the state dir, CNI dirs; the rest defaults.
func checkFlags(stateDir, cniConf, cniBin string) config.Flags {
	return config.Flags{StateDir: &stateDir, CNIConfDir: &cniConf, CNIBinDirs: []string{cniBin}}
}

// fakePreflight finds every program, and containerd answers 1.7.24.
func fakePreflight(root string) preflight {
	return preflight{
		root: root, now: time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC),
		lookPath: func(name string) (string, error) { return "/usr/sbin/" + name, nil },
		command:  func(context.Context, string, ...string) (string, error) { return "runc version 1.1.12", nil },
		containerd: func(context.Context, config.Config) (string, error) {
			return "1.7.24", nil
		},
	}
}

func itemsByName(items []checkItem) map[string]checkItem {
	m := map[string]checkItem{}
	for _, it := range items {
		m[it.name] = it
	}
	return m
}

// A Raspberry Pi 5 with everything in place passes every item; the report says so and exits 0.
func TestCheckHealthyPi(t *testing.T) {
	root := checkRoot(t, "rpi5", "")
	if err := os.MkdirAll(filepath.Join(root, "run/systemd/system"), 0o755); err != nil { // booted by systemd
		t.Fatal(err)
	}
	p := fakePreflight(root)
	items := p.run(context.Background(), checkFlags(t.TempDir(), t.TempDir(), cniBin(t, "bridge", "host-local", "portmap", "loopback")))
	want := []string{"config", "kernel", "cgroup mode", "cgroup controllers", "cgroup driver", "containerd", "runc", "CNI", "iptables", "state dir", "clock", "swap"}
	if len(items) != len(want) {
		t.Fatalf("items %+v, want %v", items, want)
	}
	for i, it := range items {
		if it.name != want[i] || it.status != checkOK || it.fix != "" {
			t.Errorf("item %d = %+v, want %s OK", i, it, want[i])
		}
	}
	got := itemsByName(items)
	for name, want := range map[string]string{"kernel": "Linux 6.6.51+rpt-rpi-v8", "cgroup mode": "v2 (unified)", "containerd": "1.7.24",
		"runc": "runc version 1.1.12", "CNI": "the agent writes its default (bridge mqlet0", "swap": "off",
		"cgroup driver": "systemd (auto: cgroup v2 host booted by systemd): pods below the scope systemd delegates to mqlet, /mqlet.slice/mqlet-pods.scope/mqlet/mqlet"} {
		if !strings.Contains(got[name].found, want) {
			t.Errorf("%s: %q lacks %q", name, got[name].found, want)
		}
	}
	var out bytes.Buffer
	if fails := printCheck(&out, items); fails != 0 || !strings.HasSuffix(out.String(), "\nThis node can run pods.\n") {
		t.Errorf("report (%d failed):\n%s", fails, out.String())
	}
}

// A Raspberry Pi as shipped (memory cgroup off), with containerd down, no runc, a CNI plugin
// missing, swap on and its clock at the image's date: each item FAILs or WARNs with its fix.
func TestCheckBrokenPi(t *testing.T) {
	p := fakePreflight(checkRoot(t, "rpi4-nomemory", "/var/swap                               file\t\t102396\t\t0\t\t-2\n"))
	p.now = time.Date(2025, 4, 1, 0, 0, 0, 0, time.UTC)
	p.containerd = func(context.Context, config.Config) (string, error) {
		return "", errors.New("containerd at /run/containerd/containerd.sock (--containerd-address) is not reachable: no such file")
	}
	p.lookPath = func(name string) (string, error) {
		if name == "runc" {
			return "", errors.New("not found")
		}
		return "/usr/sbin/" + name, nil
	}
	state := t.TempDir()
	items := p.run(context.Background(), checkFlags(state, t.TempDir(), cniBin(t, "bridge", "host-local", "loopback")))
	got := itemsByName(items)
	for _, tc := range []struct {
		name       string
		status     checkStatus
		found, fix string
	}{
		{"cgroup controllers", checkFail, "missing: memory", "cgroup_enable=memory cgroup_memory=1' to the single line of /boot/firmware/cmdline.txt"},
		{"containerd", checkFail, "is not reachable", "apt install containerd"},
		{"runc", checkFail, "runc not found", "apt install runc"},
		{"CNI", checkFail, `CNI plugin "portmap"`, "apt install containernetworking-plugins"},
		{"swap", checkWarn, "on (/var/swap)", "dphys-swapfile"},
		{"clock", checkWarn, "2025-04-01T00:00:00Z is before 2026-01-01", "timedatectl set-ntp true"},
		{"config", checkOK, "valid", ""},
		{"iptables", checkOK, "/usr/sbin/iptables", ""},
	} {
		it := got[tc.name]
		if it.status != tc.status || !strings.Contains(it.found, tc.found) || !strings.Contains(it.fix, tc.fix) {
			t.Errorf("%s = %+v, want %s, found ~%q, fix ~%q", tc.name, it, tc.status, tc.found, tc.fix)
		}
	}
	var out bytes.Buffer
	if fails := printCheck(&out, items); fails != 4 || !strings.Contains(out.String(), "4 of 12 items failed: this node cannot run pods") ||
		!strings.Contains(out.String(), "fix: apt install runc") {
		t.Errorf("report (%d failed):\n%s", fails, out.String())
	}
	if entries, _ := os.ReadDir(state); len(entries) != 0 {
		t.Errorf("check left %d files in the state dir", len(entries))
	}
}

// A config that does not load is a FAIL naming the setting; the other items still run, on the
// defaults.
func TestCheckBadConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "mqlet.yaml")
	os.WriteFile(file, []byte("stateDir: /var/lib/mqlet\nrelistPeriod: soon\n"), 0o644)
	flags := checkFlags(t.TempDir(), t.TempDir(), cniBin(t, "bridge", "host-local", "portmap", "loopback"))
	flags.Config = file
	items := fakePreflight(checkRoot(t, "rpi5", "")).run(context.Background(), flags)
	if it := items[0]; it.name != "config" || it.status != checkFail || !strings.Contains(it.found, "relistPeriod") || !strings.Contains(it.fix, "defaults") {
		t.Errorf("config item = %+v", it)
	}
	if len(items) != 12 {
		t.Errorf("%d items after a bad config, want all 12", len(items))
	}
}

// The real command on this machine, against the test environment's containerd: every item holds
// (exit 0); pointed at a socket nobody serves, containerd FAILs and the exit status is 1.
func TestCheckCommand(t *testing.T) {
	env := testenv.Require(t)
	state := filepath.Join(t.TempDir(), "state")
	args := []string{"check", "--containerd-address", env.ContainerdAddress, "--state-dir", state,
		"--cni-conf-dir", t.TempDir(), "--cni-bin-dir", "/usr/lib/cni"}
	status, out, errOut := mqletProcess(t, args...)
	if status != 0 || !strings.Contains(out, "OK    containerd") && !strings.Contains(out, "OK  containerd") || strings.Contains(out, "FAIL") {
		t.Errorf("mqlet check = %d:\n%s%s", status, out, errOut)
	}
	if _, err := os.Stat(state); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("check made the state dir: %v", err)
	}
	args[2] = filepath.Join(t.TempDir(), "nobody.sock")
	status, out, errOut = mqletProcess(t, append(args, "--containerd-timeout", "1s")...)
	if status != 1 || !strings.Contains(out, "FAIL") || !strings.Contains(out, "nobody.sock") || errOut != "mqlet: check: 1 of 12 items failed\n" {
		t.Errorf("mqlet check without containerd = %d:\n%s%s", status, out, errOut)
	}
}
