package ctrd

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func statGid(t *testing.T, p string) (uint32, os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Gid, fi.Mode()
}

// fsGroup: the volume and what is in it get the group, group rw, setgid dirs; a symlink's target
// outside the volume is not touched.
func TestSetVolumeGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	vol := filepath.Join(t.TempDir(), "vol")
	os.MkdirAll(filepath.Join(vol, "sub"), 0o700)
	os.WriteFile(filepath.Join(vol, "sub", "f"), []byte("x"), 0o600)
	outside := filepath.Join(t.TempDir(), "host-file")
	os.WriteFile(outside, []byte("x"), 0o600)
	os.Symlink(outside, filepath.Join(vol, "link"))
	os.Chmod(vol, 0o777)

	skipped, err := setVolumeGroup(vol, 4321, false)
	if err != nil || skipped != nil {
		t.Fatalf("setVolumeGroup: %v, skipped %v", err, skipped)
	}
	for _, p := range []string{vol, filepath.Join(vol, "sub"), filepath.Join(vol, "sub", "f")} {
		gid, mode := statGid(t, p)
		if gid != 4321 || mode.Perm()&0o060 != 0o060 {
			t.Errorf("%s: gid %d mode %v, want group 4321 with rw", p, gid, mode)
		}
		if mode.IsDir() && (mode&os.ModeSetgid == 0 || mode.Perm()&0o010 == 0) {
			t.Errorf("%s: mode %v, want setgid and g+x on a directory", p, mode)
		}
	}
	if gid, mode := statGid(t, outside); gid == 4321 || mode.Perm() != 0o600 {
		t.Errorf("file outside the volume changed through a symlink: gid %d mode %v", gid, mode)
	}
	// A volume whose root is already right is not walked again.
	os.Chown(filepath.Join(vol, "sub", "f"), -1, 0)
	if _, err := setVolumeGroup(vol, 4321, false); err != nil {
		t.Fatal(err)
	}
	if gid, _ := statGid(t, filepath.Join(vol, "sub", "f")); gid != 0 {
		t.Errorf("a volume whose root matched was walked again (file gid %d)", gid)
	}
}
