package runtime

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func hostPathVol(path string, typ v1.HostPathType) v1.Volume {
	return v1.Volume{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: path, Type: &typ}}}
}

// Each hostPath type is checked as kubelet checks it; the *OrCreate types (and an unset type, as
// containerd's CRI does) make what is missing; a wrong or missing path is a MountError that names
// the path and the type.
func TestHostPathTypes(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("x"), 0o600)
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	missing := filepath.Join(dir, "missing")

	ok := []struct {
		path string
		typ  v1.HostPathType
	}{
		{dir, v1.HostPathUnset}, {dir, v1.HostPathDirectory}, {dir, v1.HostPathDirectoryOrCreate},
		{file, v1.HostPathFile}, {file, v1.HostPathFileOrCreate}, {file, v1.HostPathUnset},
		{sock, v1.HostPathSocket}, {"/dev/null", v1.HostPathCharDev},
	}
	for _, tc := range ok {
		if got, err := hostPathSource(hostPathVol(tc.path, tc.typ)); err != nil || got != tc.path {
			t.Errorf("%s as %q: %q, %v", tc.path, tc.typ, got, err)
		}
	}
	bad := []struct {
		path string
		typ  v1.HostPathType
		msg  string
	}{
		{missing, v1.HostPathFile, missing + " does not exist (type File expects an existing file)"},
		{missing, v1.HostPathDirectory, missing + " does not exist (type Directory expects an existing directory)"},
		{missing, v1.HostPathSocket, "does not exist"},
		{file, v1.HostPathDirectory, file + " is not a directory (type Directory), it is a file"},
		{dir, v1.HostPathFile, dir + " is not a file (type File), it is a directory"},
		{dir, v1.HostPathFileOrCreate, dir + " is not a file (type FileOrCreate), it is a directory"},
		{file, v1.HostPathSocket, "is not a socket"},
		{file, v1.HostPathCharDev, "is not a character device"},
		{"/dev/null", v1.HostPathBlockDev, "is not a block device (type BlockDevice), it is a character device"},
		{filepath.Join(dir, "no-parent", "f"), v1.HostPathFileOrCreate, "create file"},
	}
	for _, tc := range bad {
		_, err := hostPathSource(hostPathVol(tc.path, tc.typ))
		me, isMount := errors.AsType[*MountError](err)
		if !isMount || !strings.Contains(err.Error(), tc.msg) || me.Volume != "host" {
			t.Errorf("%s as %q: %v; want a MountError containing %q", tc.path, tc.typ, err, tc.msg)
		}
		if se := startErr(err); se.Reason != ReasonFailedMount {
			t.Errorf("%s as %q: start reason %s", tc.path, tc.typ, se.Reason)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "no-parent")); !os.IsNotExist(err) {
		t.Errorf("FileOrCreate made the missing parent (kubelet does not): %v", err)
	}

	// The *OrCreate types make what is missing: a 0644 file, a 0755 directory with its parents.
	newFile := filepath.Join(dir, "new-file")
	if _, err := hostPathSource(hostPathVol(newFile, v1.HostPathFileOrCreate)); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(newFile); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&^0o644 != 0 {
		t.Errorf("FileOrCreate made %v, %v", fi, err)
	}
	for _, typ := range []v1.HostPathType{v1.HostPathDirectoryOrCreate, v1.HostPathUnset} {
		newDir := filepath.Join(dir, "new-"+string(typ)+"x", "sub")
		if _, err := hostPathSource(hostPathVol(newDir, typ)); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(newDir); err != nil || !fi.IsDir() {
			t.Errorf("%q made %v, %v", typ, fi, err)
		}
	}
	if _, err := hostPathSource(hostPathVol(dir, "Bogus")); !isConfigErr(err) {
		t.Errorf("unknown type: %v, want a config error", err)
	}
}

func isConfigErr(err error) bool { _, ok := errors.AsType[*ConfigError](err); return ok }
