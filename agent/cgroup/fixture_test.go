package cgroup

// Tests on fixture cgroupfs trees (testdata/<board>/ mirrors /proc and /sys of a Raspberry Pi 4
// and 5 on cgroup v2, a Pi whose firmware turned the memory controller off, an x86 server on cgroup
// v1 and this machine's v1 hybrid layout). The trees are copied to a temp dir first: the manager
// writes into them. A fixture is plain files, so what the kernel would do on a write (turn
// "+memory" in cgroup.subtree_control into "memory") does not happen: tests read what was written.

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// fixture copies testdata/name (symlinks kept) to a temp dir and returns it.
func fixture(t *testing.T, name string) string {
	t.Helper()
	src := filepath.Join("testdata", name)
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
	return dst
}

func detect(t *testing.T, root string) Layout {
	t.Helper()
	l, err := Detect(filepath.Join(root, "proc/self/mountinfo"), root)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// read returns a file's content, trimmed. containerd/cgroups creates missing files with mode 0
// (on a real cgroupfs they always exist); make them readable for a non-root test run.
func read(t *testing.T, path string) string {
	t.Helper()
	os.Chmod(path, 0o644)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return strings.TrimSpace(string(b))
}

func TestDetectMode(t *testing.T) {
	for _, tt := range []struct {
		board   string
		mode    Mode
		unified string
		v1      map[string]string
	}{
		{board: "rpi4", mode: Unified, unified: "sys/fs/cgroup"},
		{board: "rpi5", mode: Unified, unified: "sys/fs/cgroup"},
		{board: "rpi4-nomemory", mode: Unified, unified: "sys/fs/cgroup"},
		{board: "x86", mode: Legacy, v1: map[string]string{"cpu": "sys/fs/cgroup/cpu,cpuacct", "cpuacct": "sys/fs/cgroup/cpu,cpuacct",
			"memory": "sys/fs/cgroup/memory", "pids": "sys/fs/cgroup/pids", "cpuset": "sys/fs/cgroup/cpuset", "name=systemd": "sys/fs/cgroup/systemd"}},
		{board: "hybrid", mode: Hybrid, unified: "sys/fs/cgroup/unified", v1: map[string]string{"cpu": "sys/fs/cgroup/cpu",
			"memory": "sys/fs/cgroup/memory", "pids": "sys/fs/cgroup/pids", "name=systemd": "sys/fs/cgroup/systemd"}},
	} {
		t.Run(tt.board, func(t *testing.T) {
			root := filepath.Join("testdata", tt.board)
			l := detect(t, root)
			if l.Mode != tt.mode {
				t.Errorf("mode = %s, want %s", l.Mode, tt.mode)
			}
			want := ""
			if tt.unified != "" {
				want = filepath.Join(root, tt.unified)
			}
			if l.Unified != want {
				t.Errorf("unified = %q, want %q", l.Unified, want)
			}
			for c, p := range tt.v1 {
				if got := l.V1[c]; got != filepath.Join(root, p) {
					t.Errorf("v1 %s at %q, want %q", c, got, filepath.Join(root, p))
				}
			}
			if tt.mode == Unified && len(l.V1) != 0 {
				t.Errorf("v2 host with v1 hierarchies: %v", l.V1)
			}
		})
	}
}

func TestDetectUnavailable(t *testing.T) {
	dir := t.TempDir()
	mi := filepath.Join(dir, "mountinfo")
	os.WriteFile(mi, []byte("28 1 179:2 / / rw,noatime shared:1 - ext4 /dev/mmcblk0p2 rw\n"), 0o644)
	l, err := Detect(mi, dir)
	if err != nil {
		t.Fatal(err)
	}
	if l.Mode != Unavailable {
		t.Fatalf("mode = %s, want unavailable", l.Mode)
	}
	var ce *ControllerError
	if err := l.Check("/mqlet"); !errors.As(err, &ce) || !strings.Contains(err.Error(), "cgroup2") {
		t.Errorf("check on a host without cgroups: %v", err)
	}
	if _, err := Detect(filepath.Join(dir, "missing"), dir); err == nil {
		t.Error("a missing mountinfo detected without error")
	}
}

// The Raspberry Pi as shipped: the firmware puts cgroup_disable=memory on the kernel command line,
// so the v2 root offers no memory controller. The agent must refuse to start, saying so and how to
// turn it on, not fail every pod at runc.
func TestCheckRefusesPiWithoutMemory(t *testing.T) {
	root := fixture(t, "rpi4-nomemory")
	err := detect(t, root).Check("/mqlet")
	var ce *ControllerError
	if !errors.As(err, &ce) {
		t.Fatalf("Check = %v, want a ControllerError", err)
	}
	if len(ce.Missing) != 1 || ce.Missing[0] != "memory" {
		t.Errorf("missing = %v, want [memory]", ce.Missing)
	}
	for _, want := range []string{"memory", "cgroup_enable=memory", "cmdline.txt", "cgroup_disable=memory", "enabled 0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "sys/fs/cgroup/mqlet")); err == nil {
		t.Error("a refused host got cgroups made anyway")
	}
}

// A v1 host whose kernel disabled memory has no memory hierarchy: same refusal, same remedy.
func TestCheckRefusesV1WithoutMemory(t *testing.T) {
	root := fixture(t, "x86")
	mi := filepath.Join(root, "proc/self/mountinfo")
	b, _ := os.ReadFile(mi)
	var kept []string
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, "/sys/fs/cgroup/memory ") {
			kept = append(kept, line)
		}
	}
	os.WriteFile(mi, []byte(strings.Join(kept, "\n")), 0o644)
	cg := filepath.Join(root, "proc/cgroups")
	b, _ = os.ReadFile(cg)
	os.WriteFile(cg, []byte(strings.Replace(string(b), "memory\t3\t108\t1", "memory\t0\t1\t0", 1)), 0o644)
	os.WriteFile(filepath.Join(root, "proc/cmdline"), []byte("ro quiet cgroup_disable=memory\n"), 0o644)

	err := detect(t, root).Check("/mqlet")
	var ce *ControllerError
	if !errors.As(err, &ce) || len(ce.Missing) != 1 || ce.Missing[0] != "memory" {
		t.Fatalf("Check = %v, want memory missing", err)
	}
	for _, want := range []string{"cgroup v1 (legacy)", "cgroup_enable=memory", "cgroup_disable=memory"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// A kernel without the pids controller, and one whose memory controller sits in a v1 hierarchy
// while the host is otherwise v2: each cause gets its own remedy.
func TestCheckDiagnosis(t *testing.T) {
	root := fixture(t, "rpi5")
	os.WriteFile(filepath.Join(root, "sys/fs/cgroup/cgroup.controllers"), []byte("cpuset cpu io rdma\n"), 0o644)
	cg := filepath.Join(root, "proc/cgroups")
	b, _ := os.ReadFile(cg)
	s := strings.Replace(string(b), "pids\t0\t71\t1\n", "", 1)
	s = strings.Replace(s, "memory\t0\t71\t1", "memory\t4\t71\t1", 1)
	os.WriteFile(cg, []byte(s), 0o644)
	err := detect(t, root).Check("/mqlet")
	var ce *ControllerError
	if !errors.As(err, &ce) || strings.Join(ce.Missing, ",") != "memory,pids" {
		t.Fatalf("Check = %v, want memory and pids missing", err)
	}
	for _, want := range []string{"CONFIG_CGROUP_PIDS", "systemd.unified_cgroup_hierarchy=1", "attached to a cgroup v1 hierarchy"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// On v2 the controllers must be delegated down to cgroupRoot. The root is mqlet's to enable them
// in (cpuset is off there on the Pi 4 fixture); an existing cgroup of someone else's that does not
// delegate one is reported by name; a parent that does not exist is made and enabled.
func TestCheckV2Delegation(t *testing.T) {
	root := fixture(t, "rpi4")
	l := detect(t, root)
	if err := l.Check("/mqlet"); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if got := read(t, filepath.Join(root, "sys/fs/cgroup/cgroup.subtree_control")); got != "+cpuset" {
		t.Errorf("root subtree_control written %q, want +cpuset (the others were on)", got)
	}
	if fi, err := os.Stat(filepath.Join(root, "sys/fs/cgroup/mqlet")); err != nil || !fi.IsDir() {
		t.Errorf("cgroupRoot not made: %v", err)
	}

	// system.slice (systemd's) passes cpu, io, memory and pids down but not cpuset, which is
	// optional: accepted, and mqlet's own level enables only what it gets.
	root = fixture(t, "rpi4")
	if err := detect(t, root).Check("/system.slice/mqlet"); err != nil {
		t.Fatalf("Check below system.slice: %v", err)
	}
	if got := read(t, filepath.Join(root, "sys/fs/cgroup/system.slice/cgroup.subtree_control")); got != "cpu io memory pids" {
		t.Errorf("mqlet wrote to system.slice, which it does not own: %q", got)
	}
	os.WriteFile(filepath.Join(root, "sys/fs/cgroup/system.slice/cgroup.subtree_control"), []byte("cpu io pids\n"), 0o644)
	err := detect(t, root).Check("/system.slice/mqlet")
	if err == nil || !strings.Contains(err.Error(), "memory controller is not delegated") || !strings.Contains(err.Error(), "system.slice") ||
		!strings.Contains(err.Error(), "Delegate=yes") {
		t.Fatalf("Check below a slice without memory = %v, want memory not delegated, naming system.slice", err)
	}

	root = fixture(t, "rpi4")
	if err := detect(t, root).Check("/edge/mqlet"); err != nil {
		t.Fatalf("Check below a new parent: %v", err)
	}
	if got := read(t, filepath.Join(root, "sys/fs/cgroup/edge/cgroup.subtree_control")); got != "+cpu +memory +pids +cpuset +io" {
		t.Errorf("new parent's subtree_control = %q, want every controller enabled", got)
	}
}

// A scope systemd delegated to mqlet existed before mqlet, yet it is mqlet's to enable
// controllers in (systemd leaves a delegated cgroup's subtree_control to the delegatee); the
// slice above it stays systemd's.
func TestCheckV2DelegatedScope(t *testing.T) {
	root := fixture(t, "rpi4")
	slice := filepath.Join(root, "sys/fs/cgroup/mqlet.slice")
	scope := filepath.Join(slice, "mqlet-pods.scope")
	if err := os.MkdirAll(scope, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(slice, "cgroup.controllers"), []byte("cpu io memory pids\n"), 0o644)
	os.WriteFile(filepath.Join(slice, "cgroup.subtree_control"), []byte("cpu io memory pids\n"), 0o644)
	os.WriteFile(filepath.Join(scope, "cgroup.controllers"), []byte("cpu io memory pids\n"), 0o644)
	os.WriteFile(filepath.Join(scope, "cgroup.subtree_control"), nil, 0o644)
	l := detect(t, root)
	if _, err := l.delegateV2("/mqlet.slice/mqlet-pods.scope/mqlet", "/mqlet.slice/mqlet-pods.scope"); err != nil {
		t.Fatalf("delegateV2 below a delegated scope: %v", err)
	}
	if got := read(t, filepath.Join(scope, "cgroup.subtree_control")); got != "+cpu +memory +pids +io" {
		t.Errorf("delegated scope's subtree_control = %q, want the controllers it has enabled", got)
	}
	if got := read(t, filepath.Join(slice, "cgroup.subtree_control")); got != "cpu io memory pids" {
		t.Errorf("mqlet wrote to mqlet.slice, which systemd owns: %q", got)
	}
	// Not delegated: the same scope is someone else's, and it delegates nothing.
	os.WriteFile(filepath.Join(scope, "cgroup.subtree_control"), nil, 0o644)
	if _, err := l.delegateV2("/mqlet.slice/mqlet-pods.scope/mqlet", ""); err == nil || !strings.Contains(err.Error(), "mqlet-pods.scope") {
		t.Errorf("delegateV2 below a scope not delegated = %v, want the scope named", err)
	}
}

func TestCheckV1(t *testing.T) {
	for _, board := range []string{"x86", "hybrid"} {
		if err := detect(t, fixture(t, board)).Check("/mqlet"); err != nil {
			t.Errorf("%s: %v", board, err)
		}
	}
	// cpu co-mounted with cpuacct and no "cpu" symlink: containerd/cgroups would look in the wrong
	// place; refused, naming the mount.
	root := fixture(t, "x86")
	os.Remove(filepath.Join(root, "sys/fs/cgroup/cpu"))
	if err := detect(t, root).Check("/mqlet"); err == nil || !strings.Contains(err.Error(), "cpu,cpuacct") {
		t.Errorf("cpu without its symlink: %v", err)
	}
}

func quantity(s string) resource.Quantity { return resource.MustParse(s) }

func pod(uid string, ctrs ...v1.Container) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: types.UID(uid)}, Spec: v1.PodSpec{Containers: ctrs}}
}

func ctr(name string, req, lim v1.ResourceList) v1.Container {
	return v1.Container{Name: name, Resources: v1.ResourceRequirements{Requests: req, Limits: lim}}
}

func rl(cpu, mem string) v1.ResourceList {
	out := v1.ResourceList{}
	if cpu != "" {
		out[v1.ResourceCPU] = quantity(cpu)
	}
	if mem != "" {
		out[v1.ResourceMemory] = quantity(mem)
	}
	return out
}

// Test pods of each class: Guaranteed (two containers, 250m+250m, 32Mi+32Mi), Burstable with every
// container limited (300m request, limits 1 CPU and 64Mi), Burstable with one container unlimited,
// BestEffort.
var (
	guaranteed = pod("g-1", ctr("a", nil, rl("250m", "32Mi")), ctr("b", nil, rl("250m", "32Mi")))
	burstable  = pod("b-1", ctr("a", rl("300m", "16Mi"), rl("1", "64Mi")))
	partly     = pod("b-2", ctr("a", rl("200m", ""), rl("500m", "64Mi")), ctr("b", rl("100m", "8Mi"), nil))
	besteffort = pod("e-1", ctr("a", nil, nil))
)

func TestPodLimits(t *testing.T) {
	i64 := func(v int64) *int64 { return &v }
	for _, tt := range []struct {
		name string
		pod  *v1.Pod
		want Limits
	}{
		{"guaranteed", guaranteed, Limits{CPUShares: 512, CPUQuota: i64(50000), Memory: i64(64 << 20)}},
		{"burstable, all limited", burstable, Limits{CPUShares: 307, CPUQuota: i64(100000), Memory: i64(64 << 20)}},
		{"burstable, one unlimited", partly, Limits{CPUShares: 307}},
		{"besteffort", besteffort, Limits{CPUShares: 2}},
	} {
		got := PodLimits(tt.pod)
		if got.CPUShares != tt.want.CPUShares || !eq(got.CPUQuota, tt.want.CPUQuota) || !eq(got.Memory, tt.want.Memory) || got.Pids != nil {
			t.Errorf("%s: %s, want %s", tt.name, fmtLimits(got), fmtLimits(tt.want))
		}
	}
	// An init container without a limit makes the pod unlimited, as kubelet counts it.
	p := burstable.DeepCopy()
	p.Spec.InitContainers = []v1.Container{ctr("init", rl("100m", ""), nil)}
	if got := PodLimits(p); got.CPUQuota != nil || got.Memory != nil {
		t.Errorf("burstable with an unlimited init container: %s, want no quota and no memory limit", fmtLimits(got))
	}
}

func eq(a, b *int64) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }

func fmtLimits(l Limits) string {
	s := func(p *int64) string {
		if p == nil {
			return "max"
		}
		return resource.NewQuantity(*p, resource.DecimalSI).String()
	}
	return "shares=" + resource.NewQuantity(int64(l.CPUShares), resource.DecimalSI).String() + " quota=" + s(l.CPUQuota) + " memory=" + s(l.Memory) + " pids=" + s(l.Pids)
}

func TestCPUConversions(t *testing.T) {
	for milli, want := range map[int64]uint64{0: 2, 1: 2, 2: 2, 100: 102, 250: 256, 1000: 1024, 300000: 262144} {
		if got := MilliCPUToShares(milli); got != want {
			t.Errorf("MilliCPUToShares(%d) = %d, want %d", milli, got, want)
		}
	}
	for milli, want := range map[int64]int64{1: 1000, 10: 1000, 250: 25000, 2000: 200000} {
		if got := MilliCPUToQuota(milli); got != want {
			t.Errorf("MilliCPUToQuota(%d) = %d, want %d", milli, got, want)
		}
	}
	// runc's conversion: 2 -> 1, 1024 (the v1 default) -> 100 (the v2 default), max -> 10000.
	for shares, want := range map[uint64]uint64{2: 1, 1024: 100, 262144: 10000} {
		if got := SharesToWeight(shares); got != want {
			t.Errorf("SharesToWeight(%d) = %d, want %d", shares, got, want)
		}
	}
}

func newFixtureManager(t *testing.T, root string, alloc v1.ResourceList) *Manager {
	t.Helper()
	m, err := New(Options{Mountinfo: filepath.Join(root, "proc/self/mountinfo"), Root: root, CgroupRoot: "/mqlet",
		Namespace: "k8s.io", Allocatable: alloc, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m
}

// The QoS hierarchy on cgroup v2 (Raspberry Pi 5): node allocatable on the base, tiers, and one
// cgroup per pod with memory.max, cpu.max and cpu.weight; the Burstable tier's weight follows its
// pods' requests.
func TestManagerV2Fixture(t *testing.T) {
	root := fixture(t, "rpi5")
	alloc := v1.ResourceList{v1.ResourceCPU: quantity("3500m"), v1.ResourceMemory: quantity("7Gi"), ResourcePID: quantity("30000")}
	m := newFixtureManager(t, root, alloc)
	cg := filepath.Join(root, "sys/fs/cgroup")
	base := filepath.Join(cg, "mqlet/k8s.io")
	want := map[string]string{
		"mqlet/cpu.weight":                    "272", // 3584 shares, by runc's conversion
		"mqlet/k8s.io/cpu.weight":             "272",
		"mqlet/k8s.io/memory.max":             "7516192768",
		"mqlet/k8s.io/pids.max":               "30000",
		"mqlet/k8s.io/cpu.max":                "max 100000",
		"mqlet/k8s.io/besteffort/cpu.weight":  "1",
		"mqlet/k8s.io/burstable/cpu.weight":   "1",
		"mqlet/cgroup.subtree_control":        "+cpu +memory +pids +cpuset +io",
		"mqlet/k8s.io/cgroup.subtree_control": "+cpu +memory +pids +cpuset +io",
	}
	for f, v := range want {
		if got := read(t, filepath.Join(cg, f)); got != v {
			t.Errorf("%s = %q, want %q", f, got, v)
		}
	}
	for _, p := range []*v1.Pod{guaranteed, burstable, partly, besteffort} {
		dir, err := m.EnsurePod(p)
		if err != nil {
			t.Fatalf("EnsurePod %s: %v", p.UID, err)
		}
		if wantDir := filepath.Join("/mqlet/k8s.io", Tier(classOf(p)), "pod"+string(p.UID)); dir != wantDir {
			t.Errorf("pod %s in %s, want %s", p.UID, dir, wantDir)
		}
	}
	want = map[string]string{
		"podg-1/memory.max":                "67108864",
		"podg-1/cpu.max":                   "50000 100000",
		"podg-1/cpu.weight":                "59", // 512 shares
		"burstable/podb-1/memory.max":      "67108864",
		"burstable/podb-1/cpu.max":         "100000 100000",
		"burstable/podb-2/memory.max":      "max",
		"burstable/podb-2/cpu.max":         "max 100000",
		"besteffort/pode-1/cpu.weight":     "1",
		"besteffort/pode-1/memory.max":     "max",
		"burstable/cgroup.subtree_control": "+cpu +memory +pids +cpuset +io",
		"burstable/cpu.weight":             "67", // 600m of requests -> 614 shares
	}
	for f, v := range want {
		if got := read(t, filepath.Join(base, f)); got != v {
			t.Errorf("%s = %q, want %q", f, got, v)
		}
	}
	uids, err := m.PodUIDs()
	if err != nil || strings.Join(uids, ",") != "b-1,b-2,e-1,g-1" {
		t.Errorf("PodUIDs = %v, %v", uids, err)
	}
	// Leaving the tier shrinks its weight (the fixture's files keep the directory itself: a real
	// cgroupfs is tested on this machine's v1 hierarchies).
	m.RemovePod("b-1")
	if got := read(t, filepath.Join(base, "burstable/cpu.weight")); got != "40" { // 200m -> 204 shares
		t.Errorf("burstable weight after b-1 left = %q, want 40", got)
	}
}

// The QoS hierarchy on a cgroup v1 server whose cpu hierarchy is co-mounted with cpuacct (found
// through the "cpu" symlink): shares, CFS quota, memory limit, and each new level's cpuset taken
// from its parent.
func TestManagerV1Fixture(t *testing.T) {
	root := fixture(t, "x86")
	m := newFixtureManager(t, root, v1.ResourceList{v1.ResourceCPU: quantity("7"), v1.ResourceMemory: quantity("30Gi")})
	for _, p := range []*v1.Pod{guaranteed, burstable, besteffort} {
		if _, err := m.EnsurePod(p); err != nil {
			t.Fatalf("EnsurePod %s: %v", p.UID, err)
		}
	}
	cg := filepath.Join(root, "sys/fs/cgroup")
	for f, v := range map[string]string{
		"cpu,cpuacct/mqlet/cpu.shares":                                "7168",
		"cpu,cpuacct/mqlet/k8s.io/cpu.shares":                         "7168",
		"memory/mqlet/k8s.io/memory.limit_in_bytes":                   "32212254720",
		"pids/mqlet/k8s.io/pids.max":                                  "max",
		"cpu,cpuacct/mqlet/k8s.io/besteffort/cpu.shares":              "2",
		"cpu,cpuacct/mqlet/k8s.io/burstable/cpu.shares":               "307",
		"cpu,cpuacct/mqlet/k8s.io/podg-1/cpu.shares":                  "512",
		"cpu,cpuacct/mqlet/k8s.io/podg-1/cpu.cfs_quota_us":            "50000",
		"cpu,cpuacct/mqlet/k8s.io/podg-1/cpu.cfs_period_us":           "100000",
		"memory/mqlet/k8s.io/podg-1/memory.limit_in_bytes":            "67108864",
		"cpu,cpuacct/mqlet/k8s.io/burstable/podb-1/cpu.shares":        "307",
		"memory/mqlet/k8s.io/besteffort/pode-1/memory.limit_in_bytes": "-1",
		"cpu,cpuacct/mqlet/k8s.io/besteffort/pode-1/cpu.cfs_quota_us": "-1",
		"cpuset/mqlet/k8s.io/burstable/podb-1/cpuset.cpus":            "0-7",
		"cpuset/mqlet/k8s.io/burstable/podb-1/cpuset.mems":            "0",
	} {
		if got := read(t, filepath.Join(cg, f)); got != v {
			t.Errorf("%s = %q, want %q", f, got, v)
		}
	}
}

func TestNewRefusesBadInput(t *testing.T) {
	root := fixture(t, "rpi4")
	mi := filepath.Join(root, "proc/self/mountinfo")
	for _, tt := range []struct {
		o    Options
		want string
	}{
		{Options{CgroupRoot: "mqlet", Namespace: "n"}, "absolute"},
		{Options{CgroupRoot: "/", Namespace: "n"}, "below the root"},
		{Options{CgroupRoot: "/mqlet", Namespace: "../x"}, "containerd namespace"},
		{Options{CgroupRoot: "/mqlet", Namespace: "n", Allocatable: v1.ResourceList{v1.ResourceMemory: quantity("0")}}, "allocatable memory"},
	} {
		tt.o.Mountinfo, tt.o.Root = mi, root
		if _, err := New(tt.o); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v, want an error about %s", tt.o, err, tt.want)
		}
	}
	m := newFixtureManager(t, root, nil)
	if _, err := m.EnsurePod(pod("../../etc")); err == nil {
		t.Error("a pod UID that climbs out was given a cgroup")
	}
}

func TestOOMCounters(t *testing.T) {
	// cgroup v2: memory.events of the container's cgroup.
	root := fixture(t, "rpi4")
	m := newFixtureManager(t, root, nil)
	ctrDir := filepath.Join(root, "sys/fs/cgroup/mqlet/k8s.io/podg-1/c1")
	os.MkdirAll(ctrDir, 0o755)
	events := "low 0\nhigh 0\nmax 14\noom 1\noom_kill %s\noom_group_kill 0\n"
	for n, want := range map[string]bool{"1": true, "0": false} {
		os.WriteFile(filepath.Join(ctrDir, "memory.events"), []byte(strings.Replace(events, "%s", n, 1)), 0o644)
		if got, err := m.OOMKilled("/mqlet/k8s.io/podg-1/c1", 137); err != nil || got != want {
			t.Errorf("v2 oom_kill %s: OOMKilled = %v, %v; want %v", n, got, err, want)
		}
	}
	if _, err := m.OOMKilled("/mqlet/k8s.io/podg-1/gone", 137); !errors.Is(err, ErrNoCgroup) {
		t.Errorf("removed cgroup: err = %v, want ErrNoCgroup", err)
	}
	// A path that climbs out of the hierarchy (it comes from containerd, not from mqlet) is refused.
	os.WriteFile(filepath.Join(root, "sys/fs/memory.events"), []byte(strings.Replace(events, "%s", "1", 1)), 0o644)
	if got, err := m.OOMKilled("/../memory.events/..", 137); err == nil || got {
		t.Errorf("path out of the hierarchy: OOMKilled = %v, %v; want an error", got, err)
	}

	// cgroup v1 on a kernel before 4.13 (the x86 fixture's 3.10): no oom_kill line, so SIGKILL
	// plus a hit limit (failcnt) is the sign.
	root = fixture(t, "x86")
	m = newFixtureManager(t, root, nil)
	ctrDir = filepath.Join(root, "sys/fs/cgroup/memory/mqlet/k8s.io/podg-1/c1")
	os.MkdirAll(ctrDir, 0o755)
	os.WriteFile(filepath.Join(ctrDir, "memory.oom_control"), []byte("oom_kill_disable 0\nunder_oom 0\n"), 0o644)
	os.WriteFile(filepath.Join(ctrDir, "memory.failcnt"), []byte("12\n"), 0o644)
	for code, want := range map[int32]bool{137: true, 1: false} {
		if got, err := m.OOMKilled("/mqlet/k8s.io/podg-1/c1", code); err != nil || got != want {
			t.Errorf("v1 without oom_kill, exit %d: OOMKilled = %v, %v; want %v", code, got, err, want)
		}
	}
	os.WriteFile(filepath.Join(ctrDir, "memory.failcnt"), []byte("0\n"), 0o644)
	if got, _ := m.OOMKilled("/mqlet/k8s.io/podg-1/c1", 137); got {
		t.Error("exit 137 with failcnt 0 read as an OOM kill")
	}
	// Kernel 4.13+: the counter decides, whatever the exit code.
	os.WriteFile(filepath.Join(ctrDir, "memory.oom_control"), []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"), 0o644)
	if got, err := m.OOMKilled("/mqlet/k8s.io/podg-1/c1", 1); err != nil || !got {
		t.Errorf("v1 oom_kill 2: OOMKilled = %v, %v", got, err)
	}
}

// Preflight (mqlet check) judges as Check does, and changes nothing: a v2 Pi without memory is
// refused with the cmdline.txt remedy, the Pi 5, the x86 v1 server and the hybrid host pass, and no
// cgroup is made or enabled on any of them.
func TestPreflightJudgesAndTouchesNothing(t *testing.T) {
	for _, tc := range []struct {
		board   string
		missing []string
	}{
		{"rpi4-nomemory", []string{"memory"}}, {"rpi5", nil}, {"rpi4", nil}, {"x86", nil}, {"hybrid", nil},
	} {
		root := fixture(t, tc.board)
		before := treeState(t, root)
		err := detect(t, root).Preflight()
		var ce *ControllerError
		switch {
		case tc.missing == nil && err != nil:
			t.Errorf("%s: Preflight = %v, want nil", tc.board, err)
		case tc.missing != nil && (!errors.As(err, &ce) || !slices.Equal(ce.Missing, tc.missing) || !strings.Contains(err.Error(), "cmdline.txt")):
			t.Errorf("%s: Preflight = %v, want missing %v with the cmdline.txt remedy", tc.board, err, tc.missing)
		}
		if after := treeState(t, root); after != before {
			t.Errorf("%s: Preflight changed the fixture tree (made or enabled a cgroup)", tc.board)
		}
	}
}

// treeState is every path under root with its content, for comparing before and after.
func treeState(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		b.WriteString(p)
		if d.Type().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			b.Write(data)
		}
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
