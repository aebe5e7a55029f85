package ctrd

import (
	"errors"
	"os"
	"path/filepath"
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
