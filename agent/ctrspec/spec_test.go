package ctrspec

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func hashPod() *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "0b0e2c9e-5d1f-4a7b-9c3d-2e1f0a9b8c7d"},
		Spec: v1.PodSpec{Containers: []v1.Container{
			{Name: "app", Image: "busybox:1.36", Command: []string{"sleep", "3600"}, Env: []v1.EnvVar{{Name: "A", Value: "1"}}},
			{Name: "side", Image: "busybox:1.36"},
		}},
	}
}

func TestSpecHash(t *testing.T) {
	base := SpecHash(hashPod(), &hashPod().Spec.Containers[0])
	if again := SpecHash(hashPod(), &hashPod().Spec.Containers[0]); again != base {
		t.Fatalf("SpecHash of equal input differs: %s vs %s", base, again)
	}
	changes := map[string]func(p *v1.Pod){
		"command":     func(p *v1.Pod) { p.Spec.Containers[0].Command = []string{"sleep", "60"} },
		"image":       func(p *v1.Pod) { p.Spec.Containers[0].Image = "busybox:1.37" },
		"env":         func(p *v1.Pod) { p.Spec.Containers[0].Env[0].Value = "2" },
		"hostNetwork": func(p *v1.Pod) { p.Spec.HostNetwork = true },
		"mounted volume": func(p *v1.Pod) {
			p.Spec.Volumes = []v1.Volume{{Name: "data"}}
			p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "data", MountPath: "/data"}}
		},
	}
	for what, change := range changes {
		p := hashPod()
		change(p)
		if h := SpecHash(p, &p.Spec.Containers[0]); h == base {
			t.Errorf("SpecHash unchanged after changing %s", what)
		}
	}
	// Edits that do not shape this container must leave it running.
	same := map[string]func(p *v1.Pod){
		"other container":  func(p *v1.Pod) { p.Spec.Containers[1].Image = "alpine:3" },
		"labels":           func(p *v1.Pod) { p.Labels = map[string]string{"v": "2"} },
		"grace period":     func(p *v1.Pod) { g := int64(5); p.Spec.TerminationGracePeriodSeconds = &g },
		"unmounted volume": func(p *v1.Pod) { p.Spec.Volumes = []v1.Volume{{Name: "data"}} },
		"probes": func(p *v1.Pod) {
			p.Spec.Containers[0].ReadinessProbe = &v1.Probe{ProbeHandler: v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{}}}
			p.Spec.Containers[0].LivenessProbe = &v1.Probe{PeriodSeconds: 3}
		},
		"lifecycle": func(p *v1.Pod) {
			p.Spec.Containers[0].Lifecycle = &v1.Lifecycle{PreStop: &v1.LifecycleHandler{Sleep: &v1.SleepAction{Seconds: 1}}}
		},
	}
	for what, change := range same {
		p := hashPod()
		change(p)
		if h := SpecHash(p, &p.Spec.Containers[0]); h != base {
			t.Errorf("SpecHash changed after changing %s", what)
		}
	}
}

// A container an older mqlet labelled with its whole-container hash still matches, so an upgrade
// restarts nothing; after a real change it matches neither.
func TestSpecHashMatchesOlderHash(t *testing.T) {
	p := hashPod()
	p.Spec.Volumes = []v1.Volume{{Name: "data"}}
	p.Spec.Containers[0].LivenessProbe = &v1.Probe{PeriodSeconds: 3}
	c := &p.Spec.Containers[0]
	old := specHash(p, c, p.Spec.Volumes)
	if old == SpecHash(p, c) {
		t.Fatal("the older hash equals the new one for a container with a probe and an unmounted volume; the test proves nothing")
	}
	if !SpecHashMatches(old, p, c) || !SpecHashMatches(SpecHash(p, c), p, c) {
		t.Error("SpecHashMatches refuses the older or the current hash of the same spec")
	}
	c.Image = "busybox:1.37"
	if SpecHashMatches(old, p, c) {
		t.Error("SpecHashMatches accepts an older hash after the image changed")
	}
}

// applyOpts runs spec options on a fresh spec the way containerd would, minus the client.
func applyOpts(t *testing.T, opts []oci.SpecOpts) *oci.Spec {
	t.Helper()
	s := &oci.Spec{
		Root:    &specs.Root{Path: t.TempDir()},
		Process: &specs.Process{},
		Linux:   &specs.Linux{Resources: &specs.LinuxResources{}},
	}
	for i, opt := range opts {
		if err := opt(context.Background(), nil, &containers.Container{}, s); err != nil {
			t.Fatalf("spec option %d: %v", i, err)
		}
	}
	return s
}

func TestResourceOpts(t *testing.T) {
	list := func(kv ...string) v1.ResourceList {
		l := v1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			l[v1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return l
	}
	tests := []struct {
		name   string
		res    v1.ResourceRequirements
		memory int64 // 0: no limit
		quota  int64 // 0: no CFS quota
		shares uint64
	}{
		{name: "none", shares: 2},
		{name: "memory limit", res: v1.ResourceRequirements{Limits: list("memory", "64Mi")}, memory: 64 << 20, shares: 2},
		{name: "cpu limit", res: v1.ResourceRequirements{Limits: list("cpu", "500m")}, quota: 50000, shares: 512},
		{name: "two cpus", res: v1.ResourceRequirements{Limits: list("cpu", "2")}, quota: 200000, shares: 2048},
		{name: "tiny cpu limit hits the kernel minimum", res: v1.ResourceRequirements{Limits: list("cpu", "5m")}, quota: 1000, shares: 5},
		{name: "request only", res: v1.ResourceRequirements{Requests: list("cpu", "250m")}, shares: 256},
		{name: "request below the shares minimum", res: v1.ResourceRequirements{Requests: list("cpu", "1m")}, shares: 2},
		{name: "request and limit", res: v1.ResourceRequirements{Requests: list("cpu", "100m"), Limits: list("cpu", "1", "memory", "1Gi")},
			memory: 1 << 30, quota: 100000, shares: 102},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := applyOpts(t, ResourceOpts(&v1.Container{Name: "app", Resources: tt.res}, CgroupFeatures{}))
			r := s.Linux.Resources
			switch {
			case tt.memory == 0 && r.Memory != nil && r.Memory.Limit != nil:
				t.Errorf("memory limit = %d, want none", *r.Memory.Limit)
			case tt.memory != 0 && (r.Memory == nil || r.Memory.Limit == nil || *r.Memory.Limit != tt.memory):
				t.Errorf("memory = %+v, want limit %d", r.Memory, tt.memory)
			}
			if r.CPU == nil {
				t.Fatal("no CPU resources set; want at least shares")
			}
			switch {
			case tt.quota == 0 && r.CPU.Quota != nil:
				t.Errorf("CFS quota = %d, want none", *r.CPU.Quota)
			case tt.quota != 0 && (r.CPU.Quota == nil || *r.CPU.Quota != tt.quota || r.CPU.Period == nil || *r.CPU.Period != 100000):
				t.Errorf("CFS quota/period = %v/%v, want %d/100000", deref(r.CPU.Quota), deref(r.CPU.Period), tt.quota)
			}
			if r.CPU.Shares == nil || *r.CPU.Shares != tt.shares {
				t.Errorf("CPU shares = %v, want %d", deref(r.CPU.Shares), tt.shares)
			}
		})
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return "unset"
	}
	return *p
}

func TestCapNames(t *testing.T) {
	got := capNames([]v1.Capability{"NET_ADMIN", "cap_sys_time", "CAP_CHOWN", "all", "net_raw"})
	want := []string{"CAP_NET_ADMIN", "CAP_SYS_TIME", "CAP_CHOWN", "ALL", "CAP_NET_RAW"}
	if !slices.Equal(got, want) {
		t.Errorf("capNames = %v, want %v", got, want)
	}
	if got := capNames(nil); len(got) != 0 {
		t.Errorf("capNames(nil) = %v, want empty", got)
	}
}

func ptr[T any](v T) *T { return &v }

func TestSecurityOpts(t *testing.T) {
	tests := []struct {
		name      string
		pod       *v1.PodSecurityContext
		ctr       *v1.SecurityContext
		uid, gid  uint32
		noNewPriv bool
	}{
		{name: "nothing set: root, escalation allowed", uid: 0, gid: 0},
		{name: "pod user and group", pod: &v1.PodSecurityContext{RunAsUser: ptr[int64](1000), RunAsGroup: ptr[int64](3000)}, uid: 1000, gid: 3000},
		{name: "container overrides pod user", pod: &v1.PodSecurityContext{RunAsUser: ptr[int64](1000), RunAsGroup: ptr[int64](3000)},
			ctr: &v1.SecurityContext{RunAsUser: ptr[int64](2000)}, uid: 2000, gid: 3000},
		{name: "container overrides pod group", pod: &v1.PodSecurityContext{RunAsUser: ptr[int64](1000)},
			ctr: &v1.SecurityContext{RunAsGroup: ptr[int64](4000)}, uid: 1000, gid: 4000},
		{name: "container only", ctr: &v1.SecurityContext{RunAsUser: ptr[int64](65534), AllowPrivilegeEscalation: ptr(false)},
			uid: 65534, gid: 0, noNewPriv: true},
		{name: "escalation explicitly allowed", ctr: &v1.SecurityContext{AllowPrivilegeEscalation: ptr(true)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &v1.Pod{Spec: v1.PodSpec{SecurityContext: tt.pod}}
			s := applyOpts(t, mustSecurityOpts(t, pod, &v1.Container{Name: "app", SecurityContext: tt.ctr}))
			u := s.Process.User
			if u.UID != tt.uid || u.GID != tt.gid {
				t.Errorf("user = %d:%d, want %d:%d", u.UID, u.GID, tt.uid, tt.gid)
			}
			// The process must not keep the group it would have had without runAsGroup (root).
			for _, g := range u.AdditionalGids {
				if g != tt.gid {
					t.Errorf("supplementary groups %v include %d besides the primary group %d", u.AdditionalGids, g, tt.gid)
				}
			}
			if s.Process.NoNewPrivileges != tt.noNewPriv {
				t.Errorf("NoNewPrivileges = %v, want %v", s.Process.NoNewPrivileges, tt.noNewPriv)
			}
		})
	}
}

func TestSecurityOptsCapabilitiesAndReadOnly(t *testing.T) {
	sc := &v1.SecurityContext{
		Capabilities:           &v1.Capabilities{Add: []v1.Capability{"NET_ADMIN"}, Drop: []v1.Capability{"chown"}},
		ReadOnlyRootFilesystem: ptr(true),
	}
	s := applyOpts(t, mustSecurityOpts(t, &v1.Pod{}, &v1.Container{Name: "app", SecurityContext: sc}))
	if !s.Root.Readonly {
		t.Error("root filesystem writable, want read-only")
	}
	caps := s.Process.Capabilities
	if caps == nil || !slices.Contains(caps.Bounding, "CAP_NET_ADMIN") || !slices.Contains(caps.Effective, "CAP_NET_ADMIN") {
		t.Errorf("capabilities %+v lack the added CAP_NET_ADMIN", caps)
	}
	if caps != nil && (slices.Contains(caps.Bounding, "CAP_CHOWN") || slices.Contains(caps.Effective, "CAP_CHOWN")) {
		t.Errorf("capabilities %+v keep the dropped CAP_CHOWN", caps)
	}
}

func TestPodHostname(t *testing.T) {
	long := strings.Repeat("a", 62) + "-tail"
	tests := []struct {
		name, hostname, want string
	}{
		{"web", "", "web"},
		{"web", "custom", "custom"},
		{long, "", strings.Repeat("a", 62)}, // cut at 63 leaves a trailing dash, which is dropped
		{strings.Repeat("b", 70), "", strings.Repeat("b", 63)},
	}
	for _, tt := range tests {
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: tt.name}, Spec: v1.PodSpec{Hostname: tt.hostname}}
		if got := PodHostname(pod); got != tt.want {
			t.Errorf("PodHostname(name %q, hostname %q) = %q, want %q", tt.name, tt.hostname, got, tt.want)
		}
	}
}

func TestCapabilityOptsAll(t *testing.T) {
	s := applyOpts(t, capabilityOpts(&v1.Capabilities{Drop: []v1.Capability{"ALL"}, Add: []v1.Capability{"NET_ADMIN"}}))
	if got := s.Process.Capabilities.Bounding; len(got) != 1 || got[0] != "CAP_NET_ADMIN" {
		t.Errorf("drop ALL + add NET_ADMIN: bounding = %v, want [CAP_NET_ADMIN]", got)
	}
	s = applyOpts(t, capabilityOpts(&v1.Capabilities{Add: []v1.Capability{"ALL"}, Drop: []v1.Capability{"SYS_ADMIN"}}))
	got := s.Process.Capabilities.Effective
	if len(got) < 20 || slices.Contains(got, "CAP_SYS_ADMIN") || slices.Contains(got, "ALL") {
		t.Errorf("add ALL + drop SYS_ADMIN: effective = %v", got)
	}
}

func TestResourceOptsSwap(t *testing.T) {
	c := &v1.Container{Resources: v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}}}
	s := applyOpts(t, ResourceOpts(c, CgroupFeatures{Swap: true}))
	if m := s.Linux.Resources.Memory; m == nil || m.Swap == nil || *m.Swap != 64<<20 {
		t.Errorf("memory+swap limit = %+v, want 64Mi (no swap)", m)
	}
	s = applyOpts(t, ResourceOpts(c, CgroupFeatures{}))
	if m := s.Linux.Resources.Memory; m.Swap != nil {
		t.Errorf("swap limit set where the kernel has no swap accounting: %d", *m.Swap)
	}
}

// memory.oom.group=1 on cgroup v2 for every container (kubelet's default), none with
// singleProcessOOMKill or on v1 (no such file).
func TestResourceOptsOOMGroup(t *testing.T) {
	for _, c := range []*v1.Container{
		{Resources: v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}}},
		{}, // BestEffort
	} {
		s := applyOpts(t, ResourceOpts(c, CgroupFeatures{V2: true, OOMGroup: true}))
		if got := s.Linux.Resources.Unified["memory.oom.group"]; got != "1" {
			t.Errorf("v2, limits %v: memory.oom.group = %q, want 1", c.Resources.Limits, got)
		}
		for _, cg := range []CgroupFeatures{{V2: true}, {OOMGroup: true}} {
			s := applyOpts(t, ResourceOpts(c, cg))
			if got, ok := s.Linux.Resources.Unified["memory.oom.group"]; ok {
				t.Errorf("%+v: memory.oom.group = %q, want unset", cg, got)
			}
		}
	}
}

// No swap for any container (kubelet's NoSwap): on v2 memory.swap.max=0 for BestEffort and limited
// containers alike where the kernel accounts swap; on v1 memory+swap = the limit, and swappiness 0
// for a container without one.
func TestResourceOptsNoSwap(t *testing.T) {
	limited := &v1.Container{Resources: v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}}}
	bestEffort := &v1.Container{}
	for _, c := range []*v1.Container{limited, bestEffort} {
		s := applyOpts(t, ResourceOpts(c, CgroupFeatures{V2: true, Swap: true}))
		if got := s.Linux.Resources.Unified["memory.swap.max"]; got != "0" {
			t.Errorf("v2, limits %v: memory.swap.max = %q, want 0", c.Resources.Limits, got)
		}
		s = applyOpts(t, ResourceOpts(c, CgroupFeatures{V2: true}))
		if got, ok := s.Linux.Resources.Unified["memory.swap.max"]; ok {
			t.Errorf("v2 without swap accounting: memory.swap.max = %q, want unset (runc would fail)", got)
		}
	}
	s := applyOpts(t, ResourceOpts(bestEffort, CgroupFeatures{Swap: true}))
	if m := s.Linux.Resources.Memory; m == nil || m.Swappiness == nil || *m.Swappiness != 0 {
		t.Errorf("v1 BestEffort: memory = %+v, want swappiness 0", m)
	}
	s = applyOpts(t, ResourceOpts(limited, CgroupFeatures{Swap: true}))
	if m := s.Linux.Resources.Memory; m.Swappiness != nil {
		t.Errorf("v1 limited: swappiness %d set, want only memory+swap", *m.Swappiness)
	}
}

func TestSpecHashDNSFields(t *testing.T) {
	yes := true
	base := hashPod()
	h0 := SpecHash(base, &base.Spec.Containers[0])
	for what, change := range map[string]func(p *v1.Pod){
		"hostAliases": func(p *v1.Pod) { p.Spec.HostAliases = []v1.HostAlias{{IP: "10.0.0.5", Hostnames: []string{"db"}}} },
		"dnsConfig":   func(p *v1.Pod) { p.Spec.DNSConfig = &v1.PodDNSConfig{Nameservers: []string{"1.1.1.1"}} },
		"dnsPolicy":   func(p *v1.Pod) { p.Spec.DNSPolicy = v1.DNSDefault },
		"subdomain":   func(p *v1.Pod) { p.Spec.Subdomain = "api" },
	} {
		p := hashPod()
		change(p)
		if SpecHash(p, &p.Spec.Containers[0]) != h0 {
			t.Errorf("changing %s restarts the containers; the files are rewritten in place instead", what)
		}
	}
	p := hashPod()
	p.Spec.SetHostnameAsFQDN, p.Spec.Subdomain = &yes, "api"
	h1 := SpecHash(p, &p.Spec.Containers[0])
	p.Spec.Subdomain = "other"
	if h1 == h0 || SpecHash(p, &p.Spec.Containers[0]) == h1 {
		t.Errorf("with setHostnameAsFQDN the subdomain is the kernel hostname and must recreate the containers")
	}
}
