package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// mknodAs makes a character device node at path with the numbers of the host's node like.
func mknodAs(t *testing.T, path, like string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(like, &st); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(st.Rdev)); err != nil {
		t.Fatalf("mknod %s: %v", path, err)
	}
}

// devicePod asks for one mqlet.io/serial device, says which serial nodes it sees, and exits 1
// (to be restarted) when the trigger file appears.
func devicePod(name, devDir, trigger string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - {name: trigger, hostPath: {path: ` + trigger + `}}
  containers:
  - name: main
    image: mqlet.test/busybox:1
    volumeMounts: [{name: trigger, mountPath: /trigger}]
    command: ["sh", "-c", "for f in ` + devDir + `/ttyUSB*; do echo sees=$f; done; echo hi > ` + devDir + `/ttyUSB* && echo wrote; while [ ! -e /trigger/` + name + ` ]; do sleep 0.2; done; rm /trigger/` + name + `; exit 1"]
    resources:
      limits: {mqlet.io/serial: 1}
`
}

// seen is the serial nodes a container's log says it sees.
func seen(log string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if s, ok := strings.CutPrefix(l, "sees="); ok {
			out = append(out, s)
		}
	}
	return out
}

// The agent gives a pod the serial device configured with --device, and only that one; after a
// kill -9 and restart the pod keeps it (from devices.json in its pod dir) even though a device that
// sorts first has appeared meanwhile, which a new pod then gets.
func TestDeviceKeptAcrossAgentKill9(t *testing.T) {
	h := newHarness(t)
	devDir := filepath.Join(h.dir, "dev")
	trigger := filepath.Join(h.dir, "trigger")
	for _, d := range []string{devDir, trigger} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mknodAs(t, filepath.Join(devDir, "ttyUSB1"), "/dev/zero")
	h.writeManifest("kept.yaml", devicePod("kept", devDir, trigger))
	device := []string{"--device", "mqlet.io/serial=" + devDir + "/ttyUSB*"}
	h.startAgent(device...)

	p := h.waitPod("kept", "running with its device", func(p *v1.Pod) bool {
		return allRunning(p) && strings.Contains(h.logOf(p, "main"), "wrote\n")
	})
	want := filepath.Join(devDir, "ttyUSB1")
	if got := seen(h.logOf(p, "main")); len(got) != 1 || got[0] != want {
		t.Fatalf("container sees %v, want only %s", got, want)
	}
	record := filepath.Join(h.state, "pods", string(p.UID), "devices.json")
	before, err := os.ReadFile(record)
	if err != nil || !strings.Contains(string(before), `"path":"`+want+`"`) {
		t.Fatalf("devices.json = %s (%v), want it to record %s", before, err, want)
	}

	h.kill9Agent()
	mknodAs(t, filepath.Join(devDir, "ttyUSB0"), "/dev/null") // sorts first: a fresh allocation would take it
	h.startAgent(device...)
	// The container restarts after the agent's restart, with the sandbox the new agent set up.
	if err := os.WriteFile(filepath.Join(trigger, "kept"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p = h.waitPod("kept", "restarted once with a device", func(p *v1.Pod) bool {
		return allRunning(p) && containerStatus(p, "main").RestartCount == 1 && strings.Contains(h.logOf(p, "main"), "wrote\n")
	})
	if got := seen(h.logOf(p, "main")); len(got) != 1 || got[0] != want {
		t.Errorf("after the agent restart the container sees %v, want still only %s", got, want)
	}
	if after, err := os.ReadFile(record); err != nil || string(after) != string(before) {
		t.Errorf("devices.json after restart = %s (%v), want unchanged %s", after, err, before)
	}

	h.writeManifest("second.yaml", devicePod("second", devDir, trigger))
	s := h.waitPod("second", "running with a device", func(p *v1.Pod) bool {
		return allRunning(p) && strings.Contains(h.logOf(p, "main"), "wrote\n")
	})
	if got, other := seen(h.logOf(s, "main")), filepath.Join(devDir, "ttyUSB0"); len(got) != 1 || got[0] != other {
		t.Errorf("second pod sees %v, want only %s", got, other)
	}
}

// With one device and a share of 1, the node offers mqlet.io/serial: 1: the first pod gets the
// device, the second is refused at admission with kubelet's reason for a resource that does not
// fit (it never starts), and `mqlet node` shows the resource in capacity and allocatable.
func TestDeviceRefusedToSecondPod(t *testing.T) {
	h := newHarness(t)
	devDir := filepath.Join(h.dir, "dev")
	trigger := filepath.Join(h.dir, "trigger")
	for _, d := range []string{devDir, trigger} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mknodAs(t, filepath.Join(devDir, "ttyUSB0"), "/dev/null")
	h.writeManifest("first.yaml", devicePod("first", devDir, trigger))
	h.startAgent("--device", "mqlet.io/serial="+devDir+"/ttyUSB*:1")
	first := h.waitPod("first", "running with its device", func(p *v1.Pod) bool {
		return allRunning(p) && strings.Contains(h.logOf(p, "main"), "wrote\n")
	})
	if got := seen(h.logOf(first, "main")); len(got) != 1 || got[0] != filepath.Join(devDir, "ttyUSB0") {
		t.Fatalf("first pod sees %v, want only ttyUSB0", got)
	}

	h.writeManifest("second.yaml", devicePod("second", devDir, trigger))
	second := h.waitPod("second", "refused for the device", refusedWith("OutOfmqlet.io/serial"))
	if !strings.Contains(second.Status.Message, "mqlet.io/serial") {
		t.Errorf("refusal message %q does not name the resource", second.Status.Message)
	}
	if n := h.runningTaskCount(second); n != 0 {
		t.Errorf("refused pod has %d running tasks", n)
	}
	node := h.mqlet("node", "-o", "json")
	for _, want := range []string{`"capacity"`, `"allocatable"`, `"mqlet.io/serial": "1"`} {
		if !strings.Contains(node, want) {
			t.Errorf("mqlet node -o json lacks %s:\n%s", want, node)
		}
	}
}
