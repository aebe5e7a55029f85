package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/cgroup"
	"github.com/mqlet/mqlet/agent/config"
	"github.com/mqlet/mqlet/core/event"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// What the pods' top cgroup gets: capacity minus systemReserved and agentReserved (kubelet's
// enforced limit: the hard eviction threshold, kubelet's default memory.available<100Mi here or a
// raised one, is not subtracted), pids only with a pid reservation; without
// enforceNodeAllocatable, the cpu capacity alone.
func TestPodsAllocatable(t *testing.T) {
	capacity := v1.ResourceList{
		v1.ResourceCPU:     resource.MustParse("4"),
		v1.ResourceMemory:  resource.MustParse("8Gi"),
		cgroup.ResourcePID: resource.MustParse("32768"),
	}
	load := func(f config.Flags) config.Config {
		t.Helper()
		name := "n1"
		f.NodeName = &name
		c, err := config.Load(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	got := podsAllocatable(load(config.Flags{SystemReserved: []string{"cpu=500m,memory=1Gi,pid=1000"}, AgentReserved: []string{"memory=100Mi"}}), capacity)
	want := map[v1.ResourceName]string{v1.ResourceCPU: "3500m", v1.ResourceMemory: "7068Mi", cgroup.ResourcePID: "31768"}
	for name, w := range want {
		if q, ok := got[name]; !ok || q.Cmp(resource.MustParse(w)) != 0 {
			t.Errorf("%s = %s, want %s", name, q.String(), w)
		}
	}
	got = podsAllocatable(load(config.Flags{SystemReserved: []string{"memory=1Gi"}, EvictionHard: []string{"memory.available<2Gi"}}), capacity)
	if q := got[v1.ResourceMemory]; q.Cmp(resource.MustParse("7Gi")) != 0 {
		t.Errorf("with evictionHard memory.available<2Gi: memory = %s, want 7Gi (the threshold is not in the enforced limit)", q.String())
	}
	got = podsAllocatable(load(config.Flags{}), capacity)
	if _, ok := got[cgroup.ResourcePID]; ok {
		t.Errorf("pids limited without a pid reservation: %v", got)
	}
	off := false
	got = podsAllocatable(load(config.Flags{EnforceNodeAllocatable: &off, SystemReserved: []string{"memory=1Gi"}}), capacity)
	if len(got) != 1 || got.Cpu().Cmp(resource.MustParse("4")) != 0 {
		t.Errorf("not enforced: %v, want the cpu capacity only", got)
	}
}

// A host with swap on gets a Warning node event naming the swap areas; one without, none.
func TestSwapWarning(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "proc"), 0o755)
	header := "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
	os.WriteFile(filepath.Join(root, "proc/swaps"), []byte(header), 0o644)
	if ev, on, err := swapWarning(root, "n1"); on || err != nil {
		t.Errorf("swap off: %+v, %v, %v; want no event", ev, on, err)
	}
	os.WriteFile(filepath.Join(root, "proc/swaps"), []byte(header+"/var/swap                               file\t\t102396\t\t0\t\t-2\n"), 0o644)
	ev, on, err := swapWarning(root, "n1")
	if !on || err != nil || ev.Type != event.Warning || ev.Reason != ReasonSwapOn || !strings.Contains(ev.Message, "swap is on (/var/swap)") || ev.Object.Name != "n1" {
		t.Errorf("swap on: %+v, %v, %v; want a Warning %s naming /var/swap about node n1", ev, on, err, ReasonSwapOn)
	}
}

// cgroupDriver: auto asks systemd for its delegated scope only where systemd is init and the
// host is cgroup v2, and leaves pods already in a cgroupfs tree there; an explicit systemd where
// it cannot work is refused, naming why.
func TestCgroupDriver(t *testing.T) {
	v2 := cgroup.Layout{Mode: cgroup.Unified, Unified: t.TempDir()}
	hybrid := cgroup.Layout{Mode: cgroup.Hybrid, Unified: t.TempDir()}
	withPods := cgroup.Layout{Mode: cgroup.Unified, Unified: t.TempDir()}
	base := filepath.Join(withPods.Unified, "mqlet", "mqlet")
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "cgroup.events"), []byte("populated 1\nfrozen 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	emptied := cgroup.Layout{Mode: cgroup.Unified, Unified: t.TempDir()}
	base = filepath.Join(emptied.Unified, "mqlet", "mqlet")
	os.MkdirAll(base, 0o755)
	os.WriteFile(filepath.Join(base, "cgroup.events"), []byte("populated 0\nfrozen 0\n"), 0o644)
	for _, tc := range []struct {
		setting string
		layout  cgroup.Layout
		booted  bool
		want    string
		err     string
	}{
		{"auto", v2, true, config.CgroupDriverSystemd, ""},
		{"auto", v2, false, config.CgroupDriverCgroupfs, ""},
		{"auto", hybrid, true, config.CgroupDriverCgroupfs, ""},
		{"auto", withPods, true, config.CgroupDriverCgroupfs, ""},
		{"auto", emptied, true, config.CgroupDriverSystemd, ""},
		{"cgroupfs", v2, true, config.CgroupDriverCgroupfs, ""},
		{"systemd", withPods, true, config.CgroupDriverSystemd, ""},
		{"systemd", v2, false, "", "systemd is not this host's init system"},
		{"systemd", hybrid, true, "", "needs cgroup v2"},
	} {
		cfg := config.Defaults()
		cfg.CgroupDriver = tc.setting
		got, why, err := CgroupDriver(cfg, tc.layout, tc.booted)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s on %s (booted %v) = %q, %v; want an error with %q", tc.setting, tc.layout.Mode, tc.booted, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want || why == "" {
			t.Errorf("%s on %s (booted %v) = %q (%q), %v; want %q with a reason", tc.setting, tc.layout.Mode, tc.booted, got, why, err, tc.want)
		}
	}
}
