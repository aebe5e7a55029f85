package eviction

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/hw"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func emptyDirVol(name, medium, limit string) podOpt {
	return func(p *Pod) {
		ed := &v1.EmptyDirVolumeSource{Medium: v1.StorageMedium(medium)}
		if limit != "" {
			q := resource.MustParse(limit)
			ed.SizeLimit = &q
		}
		p.Pod.Spec.Volumes = append(p.Pod.Spec.Volumes, v1.Volume{Name: name, VolumeSource: v1.VolumeSource{EmptyDir: ed}})
	}
}

// fill writes n bytes of real data (allocated blocks, not a sparse file) into dir/name.
func fill(t *testing.T, dir, name string, n int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.Repeat("x", n)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A disk emptyDir over its sizeLimit gets its pod evicted at once, with kubelet's message, whatever
// the thresholds (none here); a volume within its limit, one without a limit, a Memory one and a
// manifest-dir pod's are left alone; the evicted pod is not evicted again.
func TestEmptyDirSizeLimitEviction(t *testing.T) {
	f := newFakeNode()
	root := t.TempDir()
	f.addPod("within", emptyDirVol("data", "", "1Mi"))
	f.addPod("nolimit", emptyDirVol("data", "", ""))
	f.addPod("memory", emptyDirVol("data", "Memory", "1Ki"))
	f.addPod("static", fromFile, emptyDirVol("data", "", "1Ki"))
	f.addPod("hog", emptyDirVol("small", "", "1Mi"), emptyDirVol("data", "", "64Ki"))
	for _, p := range f.pods {
		fill(t, filepath.Join(root, p.Pod.Name, p.Pod.Spec.Volumes[len(p.Pod.Spec.Volumes)-1].Name), "f", 512<<10)
	}
	var walked []string
	c := &clock{t: time.Unix(1000, 0)}
	m := newTestManager(f, c, Options{EmptyDirPath: func(pod *v1.Pod, vol string) (string, error) {
		walked = append(walked, pod.Name+"/"+vol)
		return filepath.Join(root, pod.Name, vol), nil
	}})
	if p := m.round(); p == nil || p.Pod.Name != "hog" {
		t.Fatalf("evicted %v, want hog", p)
	}
	if got := f.evictedNames(); len(got) != 1 || got[0] != "hog" {
		t.Fatalf("evicted %v, want [hog]", got)
	}
	e := f.evicted[0]
	if want := `Usage of EmptyDir volume "data" exceeds the limit "64Ki". `; e.msg != want {
		t.Errorf("message %q, want %q", e.msg, want)
	}
	if e.grace == nil || *e.grace != 0 {
		t.Errorf("grace %v, want 0", e.grace)
	}
	if len(f.events) != 1 || f.events[0].Reason != Reason || f.events[0].Message != e.msg || f.events[0].Object.Name != "hog" {
		t.Errorf("events %+v", f.events)
	}
	if n := m.Evictions()[SignalEmptyDirFsLimit]; n != 1 {
		t.Errorf("evictions counted %d, want 1", n)
	}
	for _, w := range walked {
		if strings.HasPrefix(w, "memory/") || strings.HasPrefix(w, "nolimit/") {
			t.Errorf("walked %s: only disk emptyDirs with a sizeLimit are measured", w)
		}
	}
	if p := m.round(); p != nil {
		t.Errorf("second round evicted %s", p.Pod.Name)
	}
	if len(f.evicted) != 1 {
		t.Errorf("evictions %v", f.evictedNames())
	}
}

// The walk stops once the limit is passed and reports what it counted; blocks, not apparent
// sizes, count (a sparse file uses next to nothing).
func TestDiskUsageOver(t *testing.T) {
	dir := t.TempDir()
	for i := range 20 {
		fill(t, filepath.Join(dir, "sub"), "f"+string(rune('a'+i)), 64<<10)
	}
	used, over, err := hw.DiskUsageOver(dir, 256<<10)
	if err != nil || !over || used <= 256<<10 || used > 400<<10 {
		t.Errorf("usageOver 256Ki of 1.25Mi: used %d, over %v, %v; want just over 256Ki", used, over, err)
	}
	used, over, err = hw.DiskUsageOver(dir, 4<<20)
	if err != nil || over || used < 20*64<<10 {
		t.Errorf("usageOver 4Mi: used %d, over %v, %v; want all of it counted, not over", used, over, err)
	}
	sparse := filepath.Join(t.TempDir(), "sparse")
	f, _ := os.Create(sparse)
	f.Truncate(100 << 20)
	f.Close()
	if _, over, err := hw.DiskUsageOver(filepath.Dir(sparse), 1<<20); err != nil || over {
		t.Errorf("sparse 100Mi file counted over 1Mi: %v", err)
	}
	if used, over, err := hw.DiskUsageOver(filepath.Join(dir, "missing"), 1); used != 0 || over || err != nil {
		t.Errorf("missing dir: %d, %v, %v", used, over, err)
	}
}

func storageLimit(container, limit string) podOpt {
	return func(p *Pod) {
		for i := range p.Pod.Spec.Containers {
			if p.Pod.Spec.Containers[i].Name == container {
				p.Pod.Spec.Containers[i].Resources.Limits = v1.ResourceList{v1.ResourceEphemeralStorage: resource.MustParse(limit)}
				return
			}
		}
		c := v1.Container{Name: container, Image: "busybox"}
		c.Resources.Limits = v1.ResourceList{v1.ResourceEphemeralStorage: resource.MustParse(limit)}
		p.Pod.Spec.Containers = append(p.Pod.Spec.Containers, c)
	}
}

// ephemeral-storage limits (kubelet's localStorageEviction, the pod's sum checked before each
// container's): a container whose writable layer and logs pass its own limit while the pod stays
// within the sum evicts its pod with kubelet's container message; a pod whose containers
// plus disk emptyDirs pass the sum of its containers' limits is evicted with the pod message,
// although no container is over its own; pods within their limits, without limits, and a
// manifest-dir pod over its limit stay. Only pods with a limit are measured.
func TestEphemeralStorageLimitEviction(t *testing.T) {
	f := newFakeNode()
	root := t.TempDir()
	f.addPod("within", storageLimit("c", "10Mi"))
	f.addPod("nolimit")
	f.addPod("static", fromFile, storageLimit("c", "1Mi"))
	f.addPod("ctr", storageLimit("c", "4Mi"), storageLimit("d", "10Mi")) // 6 MiB of 14: only c is over
	f.addPod("sum", storageLimit("c", "3Mi"), storageLimit("d", "3Mi"), emptyDirVol("data", "", ""))
	usage := map[string]map[string]int64{
		"within": {"c": 9 * Mi}, "nolimit": {"c": 100 * Mi}, "static": {"c": 5 * Mi},
		"ctr": {"c": 5 * Mi, "d": 1 * Mi}, "sum": {"c": 2 * Mi, "d": 2 * Mi},
	}
	fill(t, filepath.Join(root, "sum", "data"), "f", 3<<20) // 2 + 2 + 3 MiB > 6 MiB
	var measured []string
	c := &clock{t: time.Unix(1000, 0)}
	m := newTestManager(f, c, Options{
		EmptyDirPath: func(pod *v1.Pod, vol string) (string, error) { return filepath.Join(root, pod.Name, vol), nil },
		ContainerStorage: func(pod *v1.Pod) (map[string]int64, error) {
			measured = append(measured, pod.Name)
			return usage[pod.Name], nil
		},
	})
	for range 2 {
		if m.round() == nil {
			t.Fatalf("a round evicted nothing; evicted so far %v", f.evictedNames())
		}
	}
	if p := m.round(); p != nil {
		t.Errorf("third round evicted %s", p.Pod.Name)
	}
	want := map[string]string{
		"ctr": `Container c exceeded its local ephemeral storage limit "4Mi". `,
		"sum": "Pod ephemeral local storage usage exceeds the total limit of containers 6Mi. ",
	}
	if got := f.evictedNames(); len(got) != 2 {
		t.Fatalf("evicted %v, want ctr and sum", got)
	}
	for _, e := range f.evicted {
		name := strings.TrimPrefix(string(e.uid), "uid-")
		if e.msg != want[name] {
			t.Errorf("%s: message %q, want %q", name, e.msg, want[name])
		}
		if e.grace == nil || *e.grace != 0 {
			t.Errorf("%s: grace %v, want 0", name, e.grace)
		}
	}
	if ev := m.Evictions(); ev[SignalContainerFsLimit] != 1 || ev[SignalPodFsLimit] != 1 {
		t.Errorf("evictions %v, want one of each limit", ev)
	}
	for _, n := range measured {
		if n == "nolimit" {
			t.Errorf("a pod without an ephemeral-storage limit was measured")
		}
	}
}
