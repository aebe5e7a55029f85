package ctrd

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/agent/ctrspec"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func hostPathVol(path string, typ v1.HostPathType) v1.Volume {
	return v1.Volume{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: path, Type: &typ}}}
}

// manifestPod is a pod as admission passes it from the manifest dir: trusted with any host path.
func manifestPod() *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{admission.AnnotationConfigSource: admission.ConfigSourceFile}}}
}

// hostPathSource opens v as a manifest-dir pod's volume and returns the path of what it opened.
func hostPathSource(v v1.Volume) (string, error) {
	f, err := openHostPath(manifestPod(), v)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return f.Name(), nil
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

func isConfigErr(err error) bool { _, ok := errors.AsType[*ctrspec.ConfigError](err); return ok }

// mqttPod is a pod as admission passes it from MQTT with its hostPath volume "host" allowed under
// root (admission.AnnotationHostPathRoots).
func mqttPod(root string) *v1.Pod {
	a := map[string]string{admission.AnnotationConfigSource: admission.ConfigSourceAPI}
	if root != "" {
		a[admission.AnnotationHostPathRoots] = `{"host":"` + root + `"}`
	}
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: a}}
}

// hostPathTree makes <tmp>/allowed (an MQTT pod's allowed host path) holding sub/f and the links a
// pod with that hostPath could plant: to /, to <tmp>/outside (which holds a secret), and one inside.
func hostPathTree(t *testing.T) (allowed, outside string) {
	t.Helper()
	tmp := t.TempDir()
	allowed, outside = filepath.Join(tmp, "allowed"), filepath.Join(tmp, "outside")
	for _, d := range []string{filepath.Join(allowed, "sub"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(allowed, "sub", "f"), []byte("inside"), 0o644)
	os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600)
	for name, target := range map[string]string{"escape": "/", "out": outside, "inside": "sub", "abs-inside": filepath.Join(allowed, "sub")} {
		if err := os.Symlink(target, filepath.Join(allowed, name)); err != nil {
			t.Fatal(err)
		}
	}
	return allowed, outside
}

// An MQTT pod's hostPath is opened beneath the allowed host path admission recorded: a planted link
// to / or elsewhere outside is refused with a MountError naming the path and where it leads, and
// nothing is made through it; links that stay inside work. A manifest pod follows any link (it is
// trusted); a policed pod with no recorded root follows none.
func TestHostPathBeneathAllowedRoot(t *testing.T) {
	allowed, outside := hostPathTree(t)
	open := func(pod *v1.Pod, path string, typ v1.HostPathType) (*os.File, error) {
		return openHostPath(pod, hostPathVol(path, typ))
	}
	for _, tc := range []struct {
		path string
		typ  v1.HostPathType
		to   string
	}{
		{filepath.Join(allowed, "escape"), v1.HostPathDirectory, "/"},
		{filepath.Join(allowed, "escape"), v1.HostPathUnset, "/"},
		{filepath.Join(allowed, "escape", "etc"), v1.HostPathDirectory, "/etc"},
		{filepath.Join(allowed, "out", "secret"), v1.HostPathFile, filepath.Join(outside, "secret")},
		{filepath.Join(allowed, "out", "made"), v1.HostPathDirectoryOrCreate, filepath.Join(outside, "made")},
		{filepath.Join(allowed, "out", "made-file"), v1.HostPathFileOrCreate, filepath.Join(outside, "made-file")},
	} {
		f, err := open(mqttPod(allowed), tc.path, tc.typ)
		me, ok := errors.AsType[*MountError](err)
		if !ok || me.Volume != "host" || !strings.Contains(err.Error(), tc.path) || !strings.Contains(err.Error(), "resolves to "+tc.to+",") ||
			!strings.Contains(err.Error(), "the allowed host path "+allowed) {
			t.Errorf("%s (%q): %v; want a MountError naming it, %s and the allowed path", tc.path, tc.typ, err, tc.to)
		}
		if f != nil {
			f.Close()
		}
		if se := startErr(err); se.Reason != ReasonFailedMount {
			t.Errorf("%s: start reason %s", tc.path, se.Reason)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Errorf("a refused *OrCreate made something outside the allowed path: %v", ents)
	}
	for _, p := range []string{filepath.Join(allowed, "inside", "f"), filepath.Join(allowed, "abs-inside", "f"), filepath.Join(allowed, "sub", "f")} {
		f, err := open(mqttPod(allowed), p, v1.HostPathFile)
		if err != nil {
			t.Errorf("%s (a link staying inside): %v", p, err)
			continue
		}
		// The open file is what gets staged: its /proc link reaches the file opened.
		if b, err := os.ReadFile("/proc/self/fd/" + strconv.Itoa(int(f.Fd()))); err != nil || string(b) != "inside" {
			t.Errorf("%s opened %s: %q, %v", p, f.Name(), b, err)
		}
		f.Close()
	}
	if _, err := open(mqttPod(filepath.Join(allowed, "sub")), filepath.Join(allowed, "inside"), v1.HostPathDirectory); err == nil || !strings.Contains(err.Error(), "is not beneath") {
		t.Errorf("a path outside its recorded root: %v", err)
	}

	// A manifest-dir pod is trusted: its links are followed wherever they lead.
	f, err := open(manifestPod(), filepath.Join(allowed, "out", "secret"), v1.HostPathFile)
	if err != nil {
		t.Errorf("manifest pod through a link: %v", err)
	} else {
		f.Close()
	}
	// ... with the kernel's own lookup: a /proc magic link (a namespace file) too.
	if f, err := open(manifestPod(), "/proc/self/ns/net", v1.HostPathUnset); err != nil {
		t.Errorf("manifest pod, a namespace file: %v", err)
	} else {
		f.Close()
	}
	// No recorded root: no link at all, not even one staying inside; a plain path works.
	if _, err := open(mqttPod(""), filepath.Join(allowed, "inside", "f"), v1.HostPathFile); err == nil || !strings.Contains(err.Error(), "is a symlink") {
		t.Errorf("policed pod without a recorded root, through a link: %v", err)
	}
	if f, err := open(mqttPod(""), filepath.Join(allowed, "sub", "f"), v1.HostPathFile); err != nil {
		t.Errorf("policed pod without a recorded root, plain path: %v", err)
	} else {
		f.Close()
	}
	// A missing allowed path is the operator's: made for the *OrCreate types.
	root := filepath.Join(t.TempDir(), "later")
	if f, err := open(mqttPod(root), filepath.Join(root, "x"), v1.HostPathDirectoryOrCreate); err != nil {
		t.Errorf("missing allowed path: %v", err)
	} else {
		f.Close()
	}
}

// A subPath of a hostPath volume is opened beneath the hostPath's own open directory: a link in it
// leading out is refused, whatever the pod's trust; one staying inside is staged for runc as the
// file it leads to, and the stage goes with Release.
func TestHostPathSubPath(t *testing.T) {
	needRoot(t)
	allowed, _ := hostPathTree(t)
	r := &Runtime{opts: Options{StateDir: t.TempDir()}}
	for _, pod := range []*v1.Pod{mqttPod(allowed), manifestPod()} {
		pod.Spec.Volumes = []v1.Volume{hostPathVol(allowed, v1.HostPathDirectory)}
		for sub, ok := range map[string]bool{"escape": false, "out/secret": false, "inside/f": true, "new/dir": true} {
			c := &v1.Container{Name: "c", VolumeMounts: []v1.VolumeMount{{Name: "host", MountPath: "/x", SubPath: sub}}}
			m, stage, err := r.volumeMounts(pod, &Sandbox{}, c, nil, "cid-0")
			if ok && sub == "inside/f" && err == nil {
				if b, err := os.ReadFile(m[0].Source); err != nil || string(b) != "inside" {
					t.Errorf("subPath %q staged at %s: %q, %v", sub, m[0].Source, b, err)
				}
			}
			if err := stage.Release(); err != nil {
				t.Errorf("subPath %q: release: %v", sub, err)
			}
			if ents, _ := os.ReadDir(filepath.Join(r.opts.StateDir, mountStagesDir)); len(ents) != 0 {
				t.Errorf("subPath %q: stage left after Release: %v", sub, ents)
			}
			if ok && (err != nil || len(m) != 1) {
				t.Errorf("subPath %q: %v", sub, err)
			}
			if !ok && (err == nil || !isConfigErr(err) || !strings.Contains(err.Error(), "leads out of the volume")) {
				t.Errorf("subPath %q: %v; want a ConfigError saying it leads out", sub, err)
			}
		}
	}
}

// What runc mounts is the file opened and checked, not the path: once volumeMounts returned, the
// path swapped for a link to the outside (a container racing the agent) changes nothing staged.
func TestHostPathMountedFromTheOpenFile(t *testing.T) {
	needRoot(t)
	allowed, outside := hostPathTree(t)
	os.WriteFile(filepath.Join(outside, "f"), []byte("outside"), 0o644)
	r := &Runtime{opts: Options{StateDir: t.TempDir()}}
	pod := mqttPod(allowed)
	pod.Spec.Volumes = []v1.Volume{hostPathVol(filepath.Join(allowed, "sub"), v1.HostPathDirectory)}
	for _, sub := range []string{"", "."} {
		c := &v1.Container{Name: "c", VolumeMounts: []v1.VolumeMount{{Name: "host", MountPath: "/x", SubPath: sub}}}
		m, stage, err := r.volumeMounts(pod, &Sandbox{}, c, nil, "cid-0")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(allowed, "sub"), filepath.Join(allowed, "sub.old")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, filepath.Join(allowed, "sub")); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(m[0].Source, "f")); err != nil || string(b) != "inside" {
			t.Errorf("subPath %q: the mount source %s shows %q (%v) after the path was swapped; want the directory opened", sub, m[0].Source, b, err)
		}
		stage.Release()
		os.Remove(filepath.Join(allowed, "sub"))
		os.Rename(filepath.Join(allowed, "sub.old"), filepath.Join(allowed, "sub"))
	}
}

// An allowed host path may be a file (an operator allowing /etc/hosts): the pod's hostPath of
// exactly that file opens it, with its type checked; nothing beneath a file exists, and an allowed
// path that is a symlink is refused rather than followed.
func TestHostPathAllowedFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "hosts")
	if err := os.WriteFile(file, []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "hosts-link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []v1.HostPathType{v1.HostPathUnset, v1.HostPathFile, v1.HostPathFileOrCreate} {
		f, err := openHostPath(mqttPod(file), hostPathVol(file, typ))
		if err != nil {
			t.Errorf("the allowed file itself (%q): %v", typ, err)
			continue
		}
		if b, err := os.ReadFile("/proc/self/fd/" + strconv.Itoa(int(f.Fd()))); err != nil || string(b) != "127.0.0.1 localhost\n" {
			t.Errorf("opened %q, %v", b, err)
		}
		f.Close()
	}
	if _, err := openHostPath(mqttPod(file), hostPathVol(file, v1.HostPathDirectory)); err == nil || !strings.Contains(err.Error(), "is not a directory") {
		t.Errorf("the allowed file as a Directory: %v, want the type check's error", err)
	}
	if _, err := openHostPath(mqttPod(file), hostPathVol(filepath.Join(file, "x"), v1.HostPathFileOrCreate)); err == nil {
		t.Error("a path beneath an allowed file opened")
	}
	if _, err := openHostPath(mqttPod(link), hostPathVol(link, v1.HostPathFile)); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("an allowed path that is a symlink: %v, want it refused", err)
	}
}
