package ctrd

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/mqlet/mqlet/agent/cgroup"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
)

// With a cgroup manager the sandbox puts the pod in its QoS tier; ListSandboxes finds pods by a
// cgroup in any tier or at the path an older release used (/mqlet/<ns>/pod<uid>, here apart from
// the manager's root), and RemoveSandbox by UID removes them all.
func TestSandboxCgroupInTier(t *testing.T) {
	needRoot(t)
	r := testSandboxRuntime(t)
	ctx := context.Background()
	top := "/mqlet-rt-" + r.opts.Namespace[len(r.opts.Namespace)-8:]
	l, err := cgroup.Detect("/proc/self/mountinfo", "/")
	if err != nil {
		t.Fatal(err)
	}
	if l.Mode == cgroup.Unified {
		t.Skip("checks v1 hierarchies")
	}
	t.Cleanup(func() {
		RemoveCgroupTree(top)
		RemoveCgroupTree(filepath.Join("/mqlet", r.opts.Namespace))
	})
	m, err := cgroup.New(cgroup.Options{CgroupRoot: top, Namespace: r.opts.Namespace, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	r.opts.Cgroups = m
	memDir := func(rel string) string { return filepath.Join(l.V1["memory"], rel) }
	isDir := func(rel string) bool { fi, err := os.Stat(memDir(rel)); return err == nil && fi.IsDir() }

	pod := sandboxPod("6f1c2d3e-00c1", "burst")
	pod.Spec.Containers = []v1.Container{{Name: "a", Resources: v1.ResourceRequirements{
		Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m")}}}}
	t.Cleanup(func() { r.RemoveSandbox(ctx, RefOf(pod)) })
	sb, err := r.EnsureSandbox(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(top, r.opts.Namespace, "burstable", "pod"+string(pod.UID))
	if sb.CgroupParent != want || !isDir(want) {
		t.Fatalf("cgroup parent %q (exists %v), want %q", sb.CgroupParent, isDir(sb.CgroupParent), want)
	}

	// Leftovers: a BestEffort pod's cgroup alone, and a pod at the old path.
	leftover := sandboxPod("6f1c2d3e-00c2", "left")
	dir, err := m.EnsurePod(leftover)
	if err != nil {
		t.Fatal(err)
	}
	legacy := filepath.Join("/mqlet", r.opts.Namespace, "pod6f1c2d3e-00c3")
	if err := os.MkdirAll(memDir(legacy), 0o755); err != nil {
		t.Fatal(err)
	}
	refs, err := r.ListSandboxes()
	if err != nil {
		t.Fatal(err)
	}
	var uids []string
	for _, ref := range refs {
		uids = append(uids, string(ref.UID))
	}
	for _, u := range []string{"6f1c2d3e-00c1", "6f1c2d3e-00c2", "6f1c2d3e-00c3"} {
		if !slices.Contains(uids, u) {
			t.Errorf("ListSandboxes = %v, lacks %s", uids, u)
		}
	}
	for _, u := range []string{"6f1c2d3e-00c1", "6f1c2d3e-00c2", "6f1c2d3e-00c3"} {
		if err := r.RemoveSandbox(ctx, PodRef{UID: types.UID(u)}); err != nil {
			t.Errorf("RemoveSandbox %s: %v", u, err)
		}
	}
	for _, rel := range []string{want, dir, legacy} {
		if isDir(rel) {
			t.Errorf("%s left after RemoveSandbox", rel)
		}
	}
}
