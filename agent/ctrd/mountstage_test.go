package ctrd

import (
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// mounted reports whether anything is mounted at or below dir.
func mounted(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			return true
		}
	}
	return false
}

// A stage holds the staged files as bind mounts until Release, which leaves nothing behind and may
// be called again; the host directory staged keeps its content.
func TestMountStageRelease(t *testing.T) {
	needRoot(t)
	r := &Runtime{opts: Options{StateDir: t.TempDir()}}
	host := t.TempDir()
	os.WriteFile(filepath.Join(host, "f"), []byte("x"), 0o644)
	s, err := r.newMountStage("ctr-0")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.Open(host)
	if err != nil {
		t.Fatal(err)
	}
	file, err := os.Open(filepath.Join(host, "f"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.add(dir)
	dir.Close()
	if err != nil {
		t.Fatal(err)
	}
	f, err := s.add(file)
	file.Close()
	if err != nil {
		t.Fatal(err)
	}
	// A socket (hostPath type Socket) is staged like any other file.
	l, err := net.Listen("unix", filepath.Join(host, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	sock, err := openHostPath(manifestPod(), hostPathVol(filepath.Join(host, "sock"), v1.HostPathSocket))
	if err != nil {
		t.Fatal(err)
	}
	sp, err := s.add(sock)
	sock.Close()
	if err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("unix", sp); err != nil {
		t.Errorf("staged socket %s: %v", sp, err)
	} else {
		c.Close()
	}
	if b, err := os.ReadFile(filepath.Join(d, "f")); err != nil || string(b) != "x" {
		t.Errorf("staged dir %s: %q %v", d, b, err)
	}
	if b, err := os.ReadFile(f); err != nil || string(b) != "x" {
		t.Errorf("staged file %s: %q %v", f, b, err)
	}
	stages := filepath.Join(r.opts.StateDir, mountStagesDir)
	if err := s.Release(); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(); err != nil {
		t.Errorf("second Release: %v", err)
	}
	if ents, _ := os.ReadDir(stages); len(ents) != 0 || mounted(t, stages) {
		t.Errorf("left after Release: %v (mounted: %v)", ents, mounted(t, stages))
	}
	if b, err := os.ReadFile(filepath.Join(host, "f")); err != nil || string(b) != "x" {
		t.Errorf("the staged host dir lost its file: %q %v", b, err)
	}
	var nilStage *mountStage
	if err := nilStage.Release(); err != nil {
		t.Errorf("nil stage: %v", err)
	}
}

// At start, the stages of agents that no longer run (killed while creating a container) are
// unmounted and removed; those of running processes are left to them.
func TestSweepMountStages(t *testing.T) {
	needRoot(t)
	state := t.TempDir()
	stages := filepath.Join(state, mountStagesDir)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead := strconv.Itoa(gone.Process.Pid) + "-ctr-0"
	alive := "1-ctr-0"
	for _, n := range []string{dead, alive} {
		d := filepath.Join(stages, n)
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", d, "tmpfs", 0, "size=64k"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(d, unix.MNT_DETACH) })
	}
	r := &Runtime{opts: Options{StateDir: state}, log: slog.New(slog.DiscardHandler)}
	r.sweepMountStages()
	if _, err := os.Stat(filepath.Join(stages, dead)); !os.IsNotExist(err) || mounted(t, filepath.Join(stages, dead)) {
		t.Errorf("the stage of a dead agent is left: %v", err)
	}
	if !mounted(t, filepath.Join(stages, alive)) {
		t.Errorf("the stage of a running process was swept")
	}
}
