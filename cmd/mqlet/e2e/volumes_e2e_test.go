package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/sync/protocol"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// The volume tests run the real agent on the test containerd: emptyDirs on a real tmpfs or on the
// state dir's disk, hostPaths on the host, eviction by the agent's own eviction manager.

// unmountVolumes detaches the memory-backed emptyDirs a failed test may leave below the state dir
// (registered after newHarness, so it runs before the harness removes the dir).
func unmountVolumes(h *harness) {
	h.t.Cleanup(func() {
		h.stopAgent()
		vols, _ := filepath.Glob(filepath.Join(h.state, "pods", "*", "volumes", "*"))
		for _, v := range vols {
			unix.Unmount(v, unix.MNT_DETACH)
		}
	})
}

// hostMounts lists the mount points below dir in the host's mount table.
func hostMounts(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// A Memory emptyDir is a tmpfs inside the container, of its sizeLimit or, without one, of the
// pod's memory limit (kubelet's rule); writing past it fails; the disk emptyDir beside it is not a
// tmpfs; the tmpfs goes from the host's mount table when the pod is deleted.
func TestMemoryEmptyDirIsSizedTmpfs(t *testing.T) {
	h := newHarness(t)
	unmountVolumes(h)
	h.writeManifest("mem.yaml", `apiVersion: v1
kind: Pod
metadata: {name: mem}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - {name: small, emptyDir: {medium: Memory, sizeLimit: 8Mi}}
  - {name: capped, emptyDir: {medium: Memory}}
  - {name: disk, emptyDir: {}}
  containers:
  - name: c
    image: mqlet.test/busybox:1
    resources: {limits: {memory: 48Mi}}
    volumeMounts:
    - {name: small, mountPath: /small}
    - {name: capped, mountPath: /capped}
    - {name: disk, mountPath: /disk}
    command: ["sh", "-c", "grep -E ' /(small|capped|disk) ' /proc/mounts; df -k /small /capped; dd if=/dev/zero of=/small/fill bs=1M count=12 2>&1 | tail -1; ls -l /small/fill; echo done; exec sleep 3600"]
`)
	h.startAgent()
	p := h.waitPod("mem", "running", allRunning)
	var out string
	waitFor(t, "the container's report", func() bool {
		out = h.logOf(p, "c")
		return strings.Contains(out, "done")
	})
	t.Logf("container output:\n%s", out)
	lines := strings.Split(out, "\n")
	find := func(parts ...string) bool {
		for _, l := range lines {
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(l, p)
			}
			if ok {
				return true
			}
		}
		return false
	}
	if !find("tmpfs /small tmpfs", "size=8192k") {
		t.Errorf("/small is not a tmpfs of 8Mi in /proc/mounts")
	}
	if !find("tmpfs /capped tmpfs", "size=49152k") {
		t.Errorf("/capped is not a tmpfs of the pod's 48Mi memory limit in /proc/mounts")
	}
	if find("tmpfs /disk ") {
		t.Errorf("the disk emptyDir is a tmpfs")
	}
	if !find("8192", "/small") {
		t.Errorf("df does not show 8192 KiB for /small")
	}
	if !find("8388608", "/small/fill") {
		t.Errorf("writing 12Mi into the 8Mi tmpfs did not stop at 8Mi")
	}

	podDir := filepath.Join(h.state, "pods", string(p.UID))
	small := filepath.Join(podDir, "volumes", "small")
	if mounts := hostMounts(t, podDir); !strings.Contains(strings.Join(mounts, " "), small) {
		t.Fatalf("the host's mount table has no tmpfs at %s: %v", small, mounts)
	}
	if err := os.Remove(filepath.Join(h.manifests, "mem.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pod mem deleted", func() bool { _, err := h.getPod("mem"); return err != nil })
	waitFor(t, "the pod dir and its tmpfs mounts gone", func() bool {
		_, err := os.Stat(podDir)
		return os.IsNotExist(err) && len(hostMounts(t, podDir)) == 0
	})
}

// hostPath FileOrCreate makes the file the container then writes; File on a missing path holds the
// pod waiting with FailedMount and a message naming the path and the type, and the pod starts once
// the file exists.
func TestHostPathTypesForReal(t *testing.T) {
	h := newHarness(t)
	host := filepath.Join(h.dir, "host")
	if err := os.MkdirAll(host, 0o755); err != nil {
		t.Fatal(err)
	}
	created := filepath.Join(host, "created.txt")
	missing := filepath.Join(host, "later.conf")
	h.writeManifest("hp.yaml", `apiVersion: v1
kind: Pod
metadata: {name: hp}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - {name: out, hostPath: {path: `+created+`, type: FileOrCreate}}
  containers:
  - name: c
    image: mqlet.test/busybox:1
    volumeMounts: [{name: out, mountPath: /out.txt}]
    command: ["sh", "-c", "echo written-by-pod > /out.txt; exec sleep 3600"]
`)
	h.writeManifest("wait.yaml", `apiVersion: v1
kind: Pod
metadata: {name: wait}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - {name: conf, hostPath: {path: `+missing+`, type: File}}
  containers:
  - name: c
    image: mqlet.test/busybox:1
    volumeMounts: [{name: conf, mountPath: /etc/app.conf, readOnly: true}]
    command: ["sh", "-c", "cat /etc/app.conf; exec sleep 3600"]
`)
	h.startAgent()
	h.waitPod("hp", "running", allRunning)
	waitFor(t, "the pod's line in the FileOrCreate file", func() bool {
		b, _ := os.ReadFile(created)
		return string(b) == "written-by-pod\n"
	})
	if fi, err := os.Stat(created); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("FileOrCreate made %v, %v", fi, err)
	}

	p := h.waitPod("wait", "waiting with FailedMount", func(p *v1.Pod) bool {
		w := containerStatus(p, "c").State.Waiting
		return w != nil && w.Reason == "FailedMount"
	})
	msg := containerStatus(p, "c").State.Waiting.Message
	if !strings.Contains(msg, missing) || !strings.Contains(msg, "type File") || !strings.Contains(msg, `volume "conf"`) {
		t.Errorf("FailedMount message %q does not name the path, the type and the volume", msg)
	}
	if p.Status.Phase != v1.PodPending {
		t.Errorf("waiting pod is %s, want Pending", p.Status.Phase)
	}
	if err := os.WriteFile(missing, []byte("setting=1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p = h.waitPod("wait", "running once the file exists", allRunning)
	waitFor(t, "the file read by the pod", func() bool { return strings.Contains(h.logOf(p, "c"), "setting=1") })
}

// A control-plane pod whose disk emptyDir grows past its sizeLimit is evicted with kubelet's
// message (an Evicted event too) and not restarted; a manifest-dir pod doing the same is a critical
// pod, as kubelet's static pods are, and keeps running. A pod with an unsupported volume is refused
// with the field's path; a pod with fields only a scheduler reads runs, with an Ignored warning
// naming each.
func TestEmptyDirSizeLimitAndFieldsForReal(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	cp := newControlPlane(t, b.Plain)
	var mu sync.Mutex
	var events []protocol.Event
	ec := connectMQTT(t, b.Plain)
	ec.Subscribe(topics.Events(e2eNode), 1, func(_ mqtt.Client, m mqtt.Message) {
		if e, err := protocol.DecodeEvent(m.Payload(), 0); err == nil {
			mu.Lock()
			events = append(events, *e)
			mu.Unlock()
		}
	}).WaitTimeout(5 * time.Second)
	eventOf := func(reason, name string) *protocol.Event {
		mu.Lock()
		defer mu.Unlock()
		for i := range events {
			if events[i].Reason == reason && events[i].Object.Name == name {
				return &events[i]
			}
		}
		return nil
	}
	filler := func(name string) string {
		return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `}
spec:
  terminationGracePeriodSeconds: 30
  volumes: [{name: data, emptyDir: {sizeLimit: 1Mi}}]
  containers:
  - name: c
    image: mqlet.test/busybox:1
    volumeMounts: [{name: data, mountPath: /data}]
    command: ["sh", "-c", "dd if=/dev/zero of=/data/f bs=1M count=2 2>/dev/null; sync; exec sleep 3600"]
`
	}
	h.writeManifest("static.yaml", filler("static"))
	h.writeManifest("nfs.yaml", `apiVersion: v1
kind: Pod
metadata: {name: nfs}
spec:
  volumes: [{name: share, nfs: {server: nas.local, path: /exports}}]
  containers:
  - {name: c, image: mqlet.test/busybox:1, command: ["sleep", "3600"]}
`)
	h.startMQTTAgent(b.Plain, "--eviction-monitoring-period", "1s")
	cp.applyYAML(filler("writer"), `apiVersion: v1
kind: Pod
metadata: {name: hints}
spec:
  schedulerName: edge-scheduler
  topologySpreadConstraints: [{maxSkew: 1, topologyKey: zone, whenUnsatisfiable: DoNotSchedule}]
  containers:
  - {name: c, image: mqlet.test/busybox:1, command: ["sleep", "3600"]}
`)

	r := h.waitRejected("nfs.yaml", "spec.volumes[0].nfs: Forbidden: not supported by mqlet")
	t.Logf("nfs pod refused: %s", r.Reason)
	if _, err := h.getPod("nfs"); err == nil {
		t.Errorf("the nfs pod was admitted")
	}

	writer := h.waitPod("writer", "evicted", evicted)
	if want := `Usage of EmptyDir volume "data" exceeds the limit "1Mi". `; writer.Status.Message != want {
		t.Errorf("writer's status message %q, want %q", writer.Status.Message, want)
	}
	waitFor(t, "Evicted event for writer", func() bool { return eventOf("Evicted", "writer") != nil })
	h.waitLog("critical pod's overuse logged", "local storage over its limit, but the pod is never evicted", "default/static", "signal=emptydirfs.limit")
	if p, err := h.getPod("static"); err != nil || !allRunning(p) {
		t.Errorf("the manifest-dir pod did not keep running: %v %s", err, podSummaryForTest(p))
	}

	h.waitPod("hints", "running", allRunning)
	for _, f := range []string{"spec.schedulerName", "spec.topologySpreadConstraints"} {
		field := f
		waitFor(t, "Ignored warning for "+field, func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, e := range events {
				if e.Reason == "Ignored" && e.Object.Name == "hints" && e.Type == "Warning" && strings.HasPrefix(e.Message, field+" is ignored: ") {
					return true
				}
			}
			return false
		})
	}
	// The writer stays evicted: its containers stopped, nothing restarted.
	writer, _ = h.getPod("writer")
	if n := len(h.podTasks(writer)); n != 0 || !evicted(writer) {
		t.Errorf("evicted writer runs again: %d tasks, %s", n, podSummaryForTest(writer))
	}
}

// nodeSelector and required node affinity are checked against the node's labels (nodeLabels plus
// hostname, os and arch) as kubelet checks them: a pod meant for another node is held Failed with
// NodeAffinity and runs nothing; one that matches runs.
func TestNodeSelectorForReal(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("here.yaml", `apiVersion: v1
kind: Pod
metadata: {name: here}
spec:
  nodeSelector: {site: plant-3, kubernetes.io/hostname: e2e-node}
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions: [{key: kubernetes.io/os, operator: In, values: [linux]}]
  containers:
  - {name: c, image: mqlet.test/busybox:1, command: ["sleep", "3600"]}
`)
	h.writeManifest("elsewhere.yaml", `apiVersion: v1
kind: Pod
metadata: {name: elsewhere}
spec:
  nodeSelector: {site: plant-4}
  containers:
  - {name: c, image: mqlet.test/busybox:1, command: ["sleep", "3600"]}
`)
	h.startAgent("--node-label", "site=plant-3")
	h.waitPod("here", "running", allRunning)
	p := h.waitPod("elsewhere", "refused with NodeAffinity", func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodFailed && p.Status.Reason == "NodeAffinity"
	})
	if !strings.Contains(p.Status.Message, "didn't match Pod's node affinity/selector") {
		t.Errorf("message %q", p.Status.Message)
	}
	for _, id := range h.containerIDs() {
		if strings.HasPrefix(id, ctrd.ContainerIDPrefix(string(p.UID))) {
			t.Errorf("refused pod has container %s", id)
		}
	}
}
