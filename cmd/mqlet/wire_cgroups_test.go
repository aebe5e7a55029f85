package main

import (
	"testing"

	"github.com/mqlet/mqlet/agent/cgroup"
	"github.com/mqlet/mqlet/agent/config"
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
