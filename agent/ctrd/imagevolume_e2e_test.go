package ctrd_test

// Image volumes on a real containerd: an image's files in the container, read-only and not
// executable, shared by the pod's containers, counted as in use by image garbage collection, and
// gone with the pod.

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/internal/testenv"
	v1 "k8s.io/api/core/v1"
)

func TestImageVolume(t *testing.T) {
	g := newRig(t)
	ctx := context.Background()
	env := testenv.Require(t)
	if _, err := g.r.ImportArchiveIfMissing(ctx, env.Image(testenv.Echo)); err != nil {
		t.Fatal(err)
	}
	script := `ls /vol/bin/busybox && echo files-there
if touch /vol/x 2>/dev/null; then echo vol-writable; else echo vol-read-only; fi
if /vol/bin/busybox true 2>/dev/null; then echo vol-exec; else echo vol-noexec; fi
echo @@END; sleep 3600`
	a, b := shell("a", script), shell("b", script)
	mount := v1.VolumeMount{Name: "img", MountPath: "/vol"}
	a.VolumeMounts, b.VolumeMounts = []v1.VolumeMount{mount}, []v1.VolumeMount{mount}
	p := newPod("c9f50101-imgvol", a, b)
	p.Spec.Volumes = []v1.Volume{{Name: "img", VolumeSource: v1.VolumeSource{Image: &v1.ImageVolumeSource{
		Reference: testenv.EchoRef, PullPolicy: v1.PullNever}}}}
	sb := g.sandbox(p)
	for i := range p.Spec.Containers {
		c := g.start(p, sb, &p.Spec.Containers[i])
		g.waitLog(c, "@@END")
		out, err := readLog(c.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"files-there", "vol-read-only", "vol-noexec"} {
			if !strings.Contains(string(out), want+"\n") {
				t.Errorf("container %s: want %q; it printed:\n%s", c.Name, want, out)
			}
		}
	}
	uses, err := g.r.ContainerImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := false
	for _, u := range uses {
		held = held || u.Name == "docker.io/"+testenv.EchoRef || u.Name == testenv.EchoRef
	}
	if !held {
		t.Errorf("image GC does not see the volume's image in use: %+v", uses)
	}

	// An image that is not there with pullPolicy Never is the container's ErrImageNeverPull.
	q := newPod("c9f50102-imgvol", shell("c", "sleep 3600"))
	q.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{mount}
	q.Spec.Volumes = []v1.Volume{{Name: "img", VolumeSource: v1.VolumeSource{Image: &v1.ImageVolumeSource{
		Reference: "mqlet.test/not-here:1", PullPolicy: v1.PullNever}}}}
	qsb := g.sandbox(q)
	_, err = g.r.StartContainer(ctx, q, qsb, &q.Spec.Containers[0], 0)
	var se *ctrd.StartError
	if err == nil || !asStartError(err, &se) || se.Reason != "ErrImageNeverPull" || !strings.Contains(err.Error(), `image volume "img"`) {
		t.Errorf("start with a missing image volume: %v; want ErrImageNeverPull naming the volume", err)
	}

	// The pod removed, its view is unmounted and its snapshot gone.
	cs, _ := g.r.ListContainers(ctx, string(p.UID))
	for _, c := range cs {
		if err := g.r.RemoveContainer(ctx, c.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.r.RemoveSandbox(ctx, ctrd.RefOf(p)); err != nil {
		t.Fatalf("RemoveSandbox: %v", err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), string(p.UID)) {
		t.Errorf("a mount of the removed pod is left:\n%s", mi)
	}
	if uses, err = g.r.ContainerImages(ctx); err != nil {
		t.Fatal(err)
	}
	for _, u := range uses {
		if strings.Contains(u.Container, string(p.UID)) {
			t.Errorf("the removed pod's image volume is still in use: %+v", u)
		}
	}
}

func asStartError(err error, se **ctrd.StartError) bool {
	e, ok := err.(*ctrd.StartError)
	*se = e
	return ok
}
