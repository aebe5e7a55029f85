package ctrd_test

// In-place resize against real containerd and runc: the cgroup of a running container changes and
// the container keeps running (the same task), including limits added to a container made without
// them, limits removed, and a memory limit below the usage refused with nothing changed.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/ctrd"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// cgroupValue reads the first line of a container's cgroup file: v1name under the v1 controller's
// hierarchy, v2name on cgroup v2.
func cgroupValue(t *testing.T, path, controller, v1name, v2name string) string {
	t.Helper()
	var st unix.Statfs_t
	var file string
	if unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		file = filepath.Join("/sys/fs/cgroup", path, v2name)
	} else {
		file = filepath.Join("/sys/fs/cgroup", controller, path, v1name)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read cgroup: %v", err)
	}
	return strings.SplitN(strings.TrimSpace(string(b)), "\n", 2)[0]
}

func TestResizeContainerInPlace(t *testing.T) {
	g := newRig(t)
	ctx := context.Background()
	rl := func(kv ...string) v1.ResourceList {
		l := v1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			l[v1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return l
	}
	c := shell("c", "echo up; sleep 3600")
	c.Resources = v1.ResourceRequirements{Requests: rl("cpu", "20m", "memory", "35Mi")}
	p := newPod("7e512e00-resize", c)
	sb := g.sandbox(p)
	ctr := g.start(p, sb, &p.Spec.Containers[0])
	g.waitLog(ctr, "up")
	path, err := g.r.ContainerCgroup(ctx, ctr.ID)
	if err != nil {
		t.Fatal(err)
	}
	quota := func() string { return cgroupValue(t, path, "cpu", "cpu.cfs_quota_us", "cpu.max") }
	memLimit := func() string { return cgroupValue(t, path, "memory", "memory.limit_in_bytes", "memory.max") }
	unlimitedQuota, unlimitedMem := quota(), memLimit()
	same := func(what string) {
		t.Helper()
		cs, err := g.r.ListContainers(ctx, string(p.UID))
		if err != nil || len(cs) != 1 {
			t.Fatalf("%s: containers %+v, %v", what, cs, err)
		}
		if cs[0].ID != ctr.ID || cs[0].State != ctrd.StateRunning || cs[0].Pid != ctr.Pid {
			t.Fatalf("%s: the container did not keep running as it was: %+v (was pid %d)", what, cs[0], ctr.Pid)
		}
	}
	recorded := func() string {
		cs, _ := g.r.ListContainers(ctx, string(p.UID))
		return cs[0].Resources
	}

	// Limits added (the conformance spec's c1 and c2).
	limited := p.DeepCopy()
	limited.Spec.Containers[0].Resources = v1.ResourceRequirements{Requests: rl("cpu", "25m", "memory", "30Mi"), Limits: rl("cpu", "35m", "memory", "50Mi")}
	if err := g.r.ResizeContainer(ctx, limited, &limited.Spec.Containers[0], ctr.ID); err != nil {
		t.Fatalf("add limits: %v", err)
	}
	same("limits added")
	if q := quota(); q != "3500" && q != "3500 100000" {
		t.Errorf("cpu quota after a 35m limit was added: %s", q)
	}
	if m := memLimit(); m != "52428800" {
		t.Errorf("memory limit after a 50Mi limit was added: %s", m)
	}
	if r := recorded(); !strings.Contains(r, `"memory":"50Mi"`) || !strings.Contains(r, `"cpu":"35m"`) {
		t.Errorf("recorded resources %s, want the new limits", r)
	}

	// A memory limit below what the container uses: refused, nothing changed.
	tiny := limited.DeepCopy()
	tiny.Spec.Containers[0].Resources.Limits[v1.ResourceMemory] = resource.MustParse("10Ki")
	err = g.r.ResizeContainer(ctx, tiny, &tiny.Spec.Containers[0], ctr.ID)
	if !errors.Is(err, ctrd.ErrBelowUsage) || !strings.Contains(err.Error(), `container "c" memory limit (10240) below current usage`) {
		t.Errorf("memory limit below usage: %v, want kubelet's refusal", err)
	}
	same("memory limit below usage")
	if m := memLimit(); m != "52428800" {
		t.Errorf("memory limit after a refused resize: %s, want it unchanged", m)
	}

	// A memory limit lowered above the usage, in place.
	lower := limited.DeepCopy()
	lower.Spec.Containers[0].Resources.Limits[v1.ResourceMemory] = resource.MustParse("40Mi")
	if err := g.r.ResizeContainer(ctx, lower, &lower.Spec.Containers[0], ctr.ID); err != nil {
		t.Fatalf("lower the memory limit: %v", err)
	}
	same("memory limit lowered")
	if m := memLimit(); m != "41943040" {
		t.Errorf("memory limit after lowering to 40Mi: %s", m)
	}

	// Limits removed: back to unlimited.
	if err := g.r.ResizeContainer(ctx, p, &p.Spec.Containers[0], ctr.ID); err != nil {
		t.Fatalf("remove limits: %v", err)
	}
	same("limits removed")
	if q, m := quota(), memLimit(); q != unlimitedQuota || m != unlimitedMem {
		t.Errorf("after the limits were removed: quota %s, memory %s; want %s and %s as made", q, m, unlimitedQuota, unlimitedMem)
	}
}
