package ctrd

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/ctrspec"
	v1 "k8s.io/api/core/v1"
)

func TestContainerID(t *testing.T) {
	uid := "0b0e2c9e-5d1f-4a7b-9c3d-2e1f0a9b8c7d"
	prefix := ContainerIDPrefix(uid)
	if len(prefix) != 13 || !strings.HasSuffix(prefix, "-") {
		t.Errorf("ContainerIDPrefix(%q) = %q, want 12 hash characters and a dash", uid, prefix)
	}
	// UIDs that share a long prefix must not share container ids.
	if a, b := ContainerIDPrefix("demo-pod-uid-0001"), ContainerIDPrefix("demo-pod-uid-0002"); a == b {
		t.Errorf("ContainerIDPrefix collides for UIDs differing after 13 characters: %q", a)
	}
	if got := ContainerID(uid, "app", 3); got != prefix+"app-3" {
		t.Errorf("ContainerID(app, 3) = %q, want %q", got, prefix+"app-3")
	}

	shared := strings.Repeat("a", 48)
	long1 := shared + strings.Repeat("b", 15) // 63 characters, the longest DNS label
	long2 := shared + strings.Repeat("c", 15)
	ids := map[string]string{}
	for _, name := range []string{long1, long2} {
		for _, attempt := range []int{0, 999} {
			id := ContainerID(uid, name, attempt)
			if len(id) > 76 {
				t.Errorf("ContainerID(%d-char name, %d) = %q: %d characters, containerd allows 76", len(name), attempt, id, len(id))
			}
			if !strings.HasPrefix(id, prefix) {
				t.Errorf("ContainerID = %q, want prefix %q", id, prefix)
			}
			if other, dup := ids[id]; dup {
				t.Errorf("ContainerID %q for both %s and %s", id, other, name)
			}
			ids[id] = name
		}
	}
	first, again := ContainerID(uid, long1, 1), ContainerID(uid, long1, 1)
	if first != again {
		t.Errorf("ContainerID is not deterministic: %q then %q", first, again)
	}
}

// A subPath is refused as written when absolute or with ".."; a missing one is made in the volume
// (as kubelet does) with the volume's mode, whatever the umask, and staged.
func TestSubPathEscapeRefused(t *testing.T) {
	needRoot(t)
	pod := &v1.Pod{Spec: v1.PodSpec{Volumes: []v1.Volume{{Name: "v", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}}}
	pod.UID = "u1"
	vol := t.TempDir()
	os.Chmod(vol, 0o777)
	sb := &Sandbox{Volumes: map[string]string{"v": vol}}
	r := &Runtime{opts: Options{StateDir: t.TempDir()}}
	for _, sub := range []string{"../../etc", "/etc", "a/../../b"} {
		c := &v1.Container{Name: "c", VolumeMounts: []v1.VolumeMount{{Name: "v", MountPath: "/x", SubPath: sub}}}
		var ce *ctrspec.ConfigError
		if _, _, err := r.volumeMounts(pod, sb, c, nil, "cid-0"); !errors.As(err, &ce) {
			t.Errorf("subPath %q: err = %v, want a ConfigError", sub, err)
		}
	}
	c := &v1.Container{Name: "c", VolumeMounts: []v1.VolumeMount{{Name: "v", MountPath: "/x", SubPath: "data/more"}}}
	m, stage, err := r.volumeMounts(pod, sb, c, nil, "cid-0")
	defer stage.Release()
	if err != nil || len(m) != 1 || !strings.HasPrefix(m[0].Source, filepath.Join(r.opts.StateDir, mountStagesDir)) {
		t.Fatalf("subPath data/more: %v %v", m, err)
	}
	for _, d := range []string{filepath.Join(vol, "data"), filepath.Join(vol, "data", "more")} {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o777 {
			t.Errorf("made %s: %v %v; want a 0777 directory like its volume", d, fi, err)
		}
	}
	os.WriteFile(filepath.Join(vol, "data", "more", "f"), []byte("x"), 0o644)
	if b, err := os.ReadFile(filepath.Join(m[0].Source, "f")); err != nil || string(b) != "x" {
		t.Errorf("the staged subPath does not show the volume's directory: %q %v", b, err)
	}
}

// A missing subPath of a downwardAPI volume (any object volume) is made a directory in the
// volume, as kubelet's makeMounts does for every kind, and mounted read-only like the volume. A
// missing subPath through a symlink leading out of its volume is refused naming where it leads, and
// nothing is made there.
func TestSubPathMadeInObjectVolume(t *testing.T) {
	needRoot(t)
	pod := &v1.Pod{Spec: v1.PodSpec{Volumes: []v1.Volume{{Name: "info", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{
		Items: []v1.DownwardAPIVolumeFile{{Path: "labels", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels"}}},
	}}}}}}
	pod.UID, pod.Name, pod.Namespace, pod.Labels = "u1", "p", "default", map[string]string{"a": "b"}
	podDir, outside := t.TempDir(), t.TempDir()
	sb := &Sandbox{Dir: podDir}
	r := &Runtime{opts: Options{StateDir: t.TempDir()}}
	c := &v1.Container{Name: "c", VolumeMounts: []v1.VolumeMount{{Name: "info", MountPath: "/x", SubPath: "made/here"}}}
	m, stage, err := r.volumeMounts(pod, sb, c, nil, "cid-0")
	defer stage.Release()
	if err != nil || len(m) != 1 || !slices.Contains(m[0].Options, "ro") {
		t.Fatalf("subPath made/here of a downwardAPI volume: %+v %v; want one read-only mount", m, err)
	}
	vol := filepath.Join(podDir, "volumes", volDirDownwardAPI, "info")
	if fi, err := os.Stat(filepath.Join(vol, "made", "here")); err != nil || !fi.IsDir() {
		t.Fatalf("subPath made/here not made in the volume %s: %v", vol, err)
	}
	os.WriteFile(filepath.Join(vol, "made", "here", "f"), []byte("x"), 0o644)
	if b, err := os.ReadFile(filepath.Join(m[0].Source, "f")); err != nil || string(b) != "x" {
		t.Errorf("the staged subPath does not show the made directory: %q %v", b, err)
	}
	stage.Release()

	// A link leading out of a volume a container can write (an emptyDir; the writer of object
	// volumes removes links it did not make): following it to make "out/made" would make a
	// directory outside the volume.
	pod.Spec.Volumes = append(pod.Spec.Volumes, v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}})
	scratch := t.TempDir()
	sb.Volumes = map[string]string{"scratch": scratch}
	if err := os.Symlink(outside, filepath.Join(scratch, "out")); err != nil {
		t.Fatal(err)
	}
	c.VolumeMounts[0] = v1.VolumeMount{Name: "scratch", MountPath: "/x", SubPath: "out/made"}
	_, stage, err = r.volumeMounts(pod, sb, c, nil, "cid-1")
	defer stage.Release()
	var ce *ctrspec.ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), `subPath "out/made"`) || !strings.Contains(err.Error(), "outside "+scratch) {
		t.Errorf("subPath through a link out of the volume: err = %v, want a ConfigError naming the subPath and that it leads outside %s", err, scratch)
	}
	if _, err := os.Lstat(filepath.Join(outside, "made")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a directory was made outside the volume through the link: %v", err)
	}
}

// subPathExpr expands $(VAR) from the container's env; a variable not defined or defined empty is
// refused naming it, as kubelet's ExpandContainerVolumeMounts does ("missing value for"), rather
// than mounting the whole volume or an absolute path; $$ escapes.
func TestSubPathExprExpansion(t *testing.T) {
	env := []v1.EnvVar{{Name: "POD_NAME", Value: "web-0"}, {Name: "EMPTY", Value: ""}}
	c := &v1.Container{Name: "c"}
	for expr, want := range map[string]string{
		"$(POD_NAME)":      "web-0",
		"logs/$(POD_NAME)": "logs/web-0",
		"a$$(POD_NAME)":    "a$(POD_NAME)",
	} {
		if got, err := mountSubPath(c, v1.VolumeMount{Name: "v", SubPathExpr: expr}, env); err != nil || got != want {
			t.Errorf("subPathExpr %q = %q, %v; want %q", expr, got, err, want)
		}
	}
	for expr, names := range map[string]string{
		"$(EMPTY)":             "EMPTY",
		"$(EMPTY)/$(POD_NAME)": "EMPTY",
		"$(NOPE)/$(EMPTY)":     "NOPE, EMPTY",
	} {
		_, err := mountSubPath(c, v1.VolumeMount{Name: "v", SubPathExpr: expr}, env)
		var ce *ctrspec.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "missing value for "+names) {
			t.Errorf("subPathExpr %q: err = %v; want a ConfigError saying missing value for %s", expr, err, names)
		}
	}
}
