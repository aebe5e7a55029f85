package usage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func write(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for rel, content := range files {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func running(name, id string) v1.ContainerStatus {
	return v1.ContainerStatus{Name: name, ContainerID: "containerd://" + id, State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}
}

// A cgroup v2 tree (as Raspberry Pi OS mounts it): the running containers of the pods are read
// from the paths the runtime gives, once per container; a waiting container, one whose cgroup is
// gone and one the runtime does not know are left out; the node's figures come from /proc and the
// root cgroup.
func TestReadV2Tree(t *testing.T) {
	root := t.TempDir()
	write(t, root, map[string]string{
		"proc/stat":                                   "cpu  400 0 100 1000 0 0 0 0 0 0\ncpu0 200 0 50 500 0 0 0 0 0 0\ncpu1 200 0 50 500 0 0 0 0 0 0\n",
		"proc/meminfo":                                "MemTotal: 4096 kB\nMemFree: 1024 kB\n",
		"sys/fs/cgroup/memory.stat":                   "inactive_file 1048576\n",
		"sys/fs/cgroup/mqlet/pod1/aaa/cpu.stat":       "usage_usec 1500000\n",
		"sys/fs/cgroup/mqlet/pod1/aaa/memory.current": "3145728\n",
		"sys/fs/cgroup/mqlet/pod1/aaa/memory.stat":    "inactive_file 1048576\n",
	})
	pod := v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}, Status: v1.PodStatus{
		ContainerStatuses: []v1.ContainerStatus{
			running("app", "aaa"), running("gone", "bbb"), running("unknown", "ccc"),
			{Name: "waiting", ContainerID: "containerd://ddd", State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{}}},
		}}}
	asked := map[string]int{}
	now := time.Unix(100, 0)
	r := New(Options{Root: root, Pods: func() []v1.Pod { return []v1.Pod{pod} }, Now: func() time.Time { return now },
		CgroupOf: func(_ context.Context, id string) (string, error) {
			asked[id]++
			switch id {
			case "aaa":
				return "/mqlet/pod1/aaa", nil
			case "bbb":
				return "/mqlet/pod1/bbb", nil
			}
			return "", errors.New("no such container")
		}})
	s, err := r.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Containers) != 1 {
		t.Fatalf("containers %+v, want app only", s.Containers)
	}
	c := s.Containers[0]
	if c != (Container{Namespace: "default", Pod: "web", Container: "app", ID: "aaa", CPUSeconds: 1.5, MemoryWorkingSetBytes: 2 << 20}) {
		t.Errorf("app = %+v", c)
	}
	// MemTotal - MemFree = 3 MiB, minus 1 MiB inactive file; 500 busy ticks.
	if s.Node != (Node{CPUSeconds: 5, CPUs: 2, MemoryWorkingSetBytes: 2 << 20, MemoryCapacityBytes: 4 << 20}) {
		t.Errorf("node = %+v", s.Node)
	}
	// A second read asks the runtime only for what it could not place before.
	if _, err := r.Read(context.Background()); err != nil {
		t.Fatal(err)
	}
	if asked["aaa"] != 1 || asked["bbb"] != 1 || asked["ccc"] != 2 || asked["ddd"] != 0 {
		t.Errorf("runtime asked %v, want aaa and bbb once (kept), ccc each time, ddd never", asked)
	}
	// Recent serves the last reading while it is young.
	write(t, root, map[string]string{"sys/fs/cgroup/mqlet/pod1/aaa/cpu.stat": "usage_usec 2500000\n"})
	if s, _ := r.Recent(context.Background(), time.Second); s.Containers[0].CPUSeconds != 1.5 {
		t.Errorf("Recent read again: %v", s.Containers[0].CPUSeconds)
	}
	now = now.Add(2 * time.Second)
	if s, _ := r.Recent(context.Background(), time.Second); s.Containers[0].CPUSeconds != 2.5 {
		t.Errorf("Recent after maxAge: %v, want a new reading", s.Containers[0].CPUSeconds)
	}
}

// The rate between two readings: millicores over the interval, containers matched by id (a
// restarted container has no rate yet), a counter that went back reads as 0.
func TestBetween(t *testing.T) {
	a := Snapshot{Time: time.Unix(0, 0), Node: Node{CPUSeconds: 10}, Containers: []Container{
		{Container: "app", ID: "1", CPUSeconds: 1}, {Container: "old", ID: "2", CPUSeconds: 5}}}
	b := Snapshot{Time: time.Unix(2, 0), Node: Node{CPUSeconds: 13, CPUs: 4, MemoryWorkingSetBytes: 7}, Containers: []Container{
		{Container: "app", ID: "1", CPUSeconds: 1.5, MemoryWorkingSetBytes: 9}, {Container: "old", ID: "3", CPUSeconds: 0.1}}}
	r, err := Between(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if r.Node.MilliCPU != 1500 || r.Node.CPUs != 4 || r.Node.MemoryWorkingSetBytes != 7 {
		t.Errorf("node %+v, want 1500m", r.Node)
	}
	if len(r.Containers) != 1 || r.Containers[0].MilliCPU != 250 || r.Containers[0].MemoryWorkingSetBytes != 9 {
		t.Errorf("containers %+v, want app at 250m", r.Containers)
	}
	if _, err := Between(b, a); err == nil {
		t.Error("Between accepted readings out of order")
	}
}
