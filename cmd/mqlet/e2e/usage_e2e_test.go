package e2e

import (
	"strconv"
	"strings"
	"testing"
)

const busyPod = `apiVersion: v1
kind: Pod
metadata: {name: busy}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: burn
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "while :; do :; done"]
  - name: hold
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "head -c 24m /dev/zero > /dev/shm/fill && sleep 3600"]
  - name: idle
    image: mqlet.test/busybox:1
    command: ["sleep", "3600"]
`

// The real agent reads each running container's CPU and memory from the cgroups runc made on the
// test containerd: a busy loop's CPU seconds grow past an idle container's, a container that wrote
// 24 MiB to its pod's /dev/shm (tmpfs, charged to its memory cgroup and never inactive file) has a
// working set of at least that, under cAdvisor's names with namespace/pod/container labels;
// the node's figures are there; and `mqlet top` shows the same from two readings.
func TestContainerUsageMetricsAndTop(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("busy.yaml", busyPod)
	h.startAgent()
	h.waitPod("busy", "running", allRunning)

	of := func(c string) map[string]string {
		return map[string]string{"namespace": "default", "pod": "busy", "container": c}
	}
	var burnCPU, idleCPU, holdMem, idleMem float64
	waitFor(t, "the busy loop's CPU time and the holder's memory in the metrics", func() bool {
		fams := scrape(t, unixHTTP(h.sock), "http://mqlet/metrics")
		burnCPU, _ = sampleOf(fams, "container_cpu_usage_seconds_total", of("burn"))
		idleCPU, _ = sampleOf(fams, "container_cpu_usage_seconds_total", of("idle"))
		holdMem, _ = sampleOf(fams, "container_memory_working_set_bytes", of("hold"))
		idleMem, _ = sampleOf(fams, "container_memory_working_set_bytes", of("idle"))
		return burnCPU >= 0.5 && holdMem >= 24<<20
	})
	if idleCPU >= burnCPU {
		t.Errorf("idle container used %v CPU seconds, the busy loop %v", idleCPU, burnCPU)
	}
	if idleMem <= 0 || idleMem >= holdMem {
		t.Errorf("idle container's working set %v, the holder's %v: want 0 < idle < holder", idleMem, holdMem)
	}
	fams := scrape(t, unixHTTP(h.sock), "http://mqlet/metrics")
	if v, _ := sampleOf(fams, "node_cpu_usage_seconds_total", nil); v <= burnCPU {
		t.Errorf("node_cpu_usage_seconds_total %v, want more than the busy loop's %v", v, burnCPU)
	}
	if v, _ := sampleOf(fams, "node_memory_working_set_bytes", nil); v < holdMem {
		t.Errorf("node_memory_working_set_bytes %v, want at least the holder's %v", v, holdMem)
	}

	out := h.mqlet("top", "--containers", "--interval", "2s")
	cols := func(line string) []string { return strings.Fields(line) }
	milli := func(s string) int {
		n, err := strconv.Atoi(strings.TrimSuffix(s, "m"))
		if err != nil || !strings.HasSuffix(s, "m") {
			t.Fatalf("CPU column %q in:\n%s", s, out)
		}
		return n
	}
	mi := func(s string) int {
		n, err := strconv.Atoi(strings.TrimSuffix(s, "Mi"))
		if err != nil || !strings.HasSuffix(s, "Mi") {
			t.Fatalf("memory column %q in:\n%s", s, out)
		}
		return n
	}
	rows := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		if c := cols(l); len(c) == 5 && c[0] == "default" && c[1] == "busy" {
			rows[c[2]] = c
		}
	}
	if len(rows) != 3 {
		t.Fatalf("mqlet top --containers: rows %v, want burn, hold and idle:\n%s", rows, out)
	}
	if b, i := milli(rows["burn"][3]), milli(rows["idle"][3]); b <= i {
		t.Errorf("mqlet top: busy loop %dm, idle %dm:\n%s", b, i, out)
	}
	if m := mi(rows["hold"][4]); m < 24 {
		t.Errorf("mqlet top: holder %dMi, want at least 24Mi:\n%s", m, out)
	}
	if node := firstWith(out, "e2e-node"); len(cols(node)) != 5 || milli(cols(node)[1]) < milli(rows["burn"][3]) {
		t.Errorf("mqlet top: node line %q, want e2e-node with at least the busy loop's CPU:\n%s", node, out)
	}
	perPod := h.mqlet("top", "--interval", "1s")
	if c := cols(firstWith(perPod, "default")); len(c) != 4 || c[0] != "default" || mi(c[3]) < 24 {
		t.Errorf("mqlet top: pod line %v, want default busy with the containers summed:\n%s", c, perPod)
	}
}

// firstWith is the line of out whose first field is word.
func firstWith(out, word string) string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == word {
			return l
		}
	}
	return ""
}
