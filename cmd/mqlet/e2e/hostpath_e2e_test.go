package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/ctrd"
	"github.com/mqlet/mqlet/internal/mqtttest"
	v1 "k8s.io/api/core/v1"
)

// hostPath and subPath cannot be redirected by what a pod writes (issue "A broker that cannot run
// anything", point 3): the real agent on the real containerd, pods from MQTT with an allowed host
// path, and from the manifest dir.

// hostPathPod is a pod from the control plane with hostPath volume "v" at path (type typ) mounted at
// mount, running script.
func hostPathPod(name, path, typ, mount, script string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - {name: v, hostPath: {path: "` + path + `", type: "` + typ + `"}}
  containers:
  - name: c
    image: mqlet.test/busybox:1
    volumeMounts: [{name: v, mountPath: ` + mount + `}]
    command: ["sh", "-c", ` + quoteYAML(script) + `]
`
}

// quoteYAML is s as a YAML double-quoted scalar.
func quoteYAML(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// outsideMarker writes a file in the test's own temp dir, outside the allowed host path: a pod that
// reached the host's root could read it at <its mount><path>. The test dir's files stand in for the
// host's (/etc/shadow), so that a broken protection never touches anything but the test's own dir.
func outsideMarker(t *testing.T, dir string) string {
	t.Helper()
	marker := filepath.Join(dir, "outside-marker")
	if err := os.WriteFile(marker, []byte("host-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return marker
}

// The reproduction: with --mqtt-allowed-host-path <allowed>, pod A (from MQTT, hostPath <allowed>)
// runs `ln -sfn / <allowed>/escape`; pod B asks for hostPath <allowed>/escape. B must not get the
// host's root: its container is not started (FailedMount, an event naming the path and where it
// leads, pod Pending), it reads no file outside the allowed path and writes none. Links A makes
// that stay inside the allowed path (relative, or absolute into it) work for pod C. Once the path is
// fixed (a real directory), B starts at its next try. A manifest-dir pod, trusted, still follows a
// link out of the allowed path.
func TestHostPathSymlinkEscapeRefusedForReal(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	cp := newControlPlane(t, b.Plain)
	allowed := filepath.Join(h.dir, "allowed")
	outside := filepath.Join(h.dir, "outside")
	for _, d := range []string{allowed, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	marker := outsideMarker(t, h.dir)
	written := filepath.Join(h.dir, "written-by-b")
	os.WriteFile(filepath.Join(outside, "f"), []byte("outside-dir\n"), 0o644)
	h.writeManifest("trusted.yaml", hostPathPod("trusted", filepath.Join(allowed, "out"), "Directory", "/o", "cat /o/f; exec sleep 3600"))
	h.startMQTTAgent(b.Plain, "--mqtt-allowed-host-path", allowed)

	cp.applyYAML(hostPathPod("a", allowed, "Directory", "/data",
		"ln -sfn / /data/escape && mkdir -p /data/real && echo inside > /data/real/f && ln -sfn real /data/good && "+
			"ln -sfn "+filepath.Join(allowed, "real")+" /data/abs-good && ln -sfn "+outside+" /data/out && echo planted; exec sleep 3600"))
	h.waitPod("a", "running", allRunning)
	h.waitContainerLog("a", "c", "planted")
	if target, err := os.Readlink(filepath.Join(allowed, "escape")); err != nil || target != "/" {
		t.Fatalf("pod a did not plant the link: %q %v", target, err)
	}

	escape := filepath.Join(allowed, "escape")
	cp.applyYAML(
		hostPathPod("b", escape, "", "/host",
			"cat /host"+marker+" /host/f; echo pwned > /host"+written+"; exec sleep 3600"),
		hostPathPod("c", filepath.Join(allowed, "good"), "Directory", "/in", "cat /in/f; exec sleep 3600"),
		hostPathPod("d", filepath.Join(allowed, "abs-good", "f"), "File", "/in-f", "cat /in-f; exec sleep 3600"),
	)
	p := h.waitPod("b", "waiting with FailedMount", waitingFor("c", "FailedMount", escape))
	msg := containerStatus(p, "c").State.Waiting.Message
	for _, want := range []string{escape, "resolves to /,", "outside " + allowed, `volume "v"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("FailedMount message %q lacks %q", msg, want)
		}
	}
	if p.Status.Phase != v1.PodPending {
		t.Errorf("refused pod is %s, want Pending", p.Status.Phase)
	}
	evs, err := h.podEvents("b")
	if ev := eventOf(evs, "FailedMount"); err != nil || ev == nil || !strings.Contains(ev.Message, escape) || !strings.Contains(ev.Message, "resolves to /,") {
		t.Errorf("no FailedMount event naming %s and where it leads: %v %+v", escape, err, evs)
	}
	if n := h.runningTaskCount(p); n != 0 {
		t.Errorf("pod b runs %d tasks", n)
	}
	for _, id := range h.containerIDs() {
		if strings.HasPrefix(id, ctrd.ContainerIDPrefix(string(p.UID))) {
			t.Errorf("pod b has container %s", id)
		}
	}

	h.waitPod("c", "running through a relative link inside the allowed path", allRunning)
	h.waitContainerLog("c", "c", "inside")
	h.waitPod("d", "running through an absolute link into the allowed path", allRunning)
	h.waitContainerLog("d", "c", "inside")
	h.waitPod("trusted", "running (a manifest pod follows its links)", allRunning)
	h.waitContainerLog("trusted", "c", "outside-dir")

	if log := h.logOf(p, "c"); strings.Contains(log, "host-secret") {
		t.Errorf("pod b read the host file: %q", log)
	}
	if _, err := os.Stat(written); !os.IsNotExist(err) {
		t.Errorf("pod b wrote outside the allowed path: %v", err)
	}

	// Fixed: the link becomes a real directory; the container's next try starts it.
	if err := os.Remove(escape); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(escape, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(escape, "f"), []byte("fixed\n"), 0o644)
	h.waitPod("b", "running once its path is a directory", allRunning)
	h.waitContainerLog("b", "c", "fixed")
	if b, _ := os.ReadFile(marker); string(b) != "host-secret\n" {
		t.Errorf("marker changed: %q", b)
	}
	if _, err := os.Stat(written); !os.IsNotExist(err) {
		t.Errorf("pod b wrote outside the allowed path: %v", err)
	}
	// Nothing is left staged once the containers exist.
	if ents, _ := os.ReadDir(filepath.Join(h.state, "volume-mounts")); len(ents) != 0 {
		t.Errorf("volume mount stages left: %v", ents)
	}
}

// A subPath escape (kubelet's CVE-2017-1002101): an init container plants `sub -> /` (and a link
// staying inside) in an emptyDir; a container mounting subPath "sub" is not started
// (CreateContainerConfigError naming the subPath and where it leads), the host is not reached; the
// container whose subPath link stays inside runs and sees the directory it leads to.
func TestSubPathSymlinkEscapeRefusedForReal(t *testing.T) {
	h := newHarness(t)
	marker := outsideMarker(t, h.dir)
	written := filepath.Join(h.dir, "written-by-sub")
	h.writeManifest("sub.yaml", `apiVersion: v1
kind: Pod
metadata: {name: sub}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - {name: v, emptyDir: {}}
  initContainers:
  - name: plant
    image: mqlet.test/busybox:1
    volumeMounts: [{name: v, mountPath: /v}]
    command: ["sh", "-c", "ln -s / /v/sub && mkdir -p /v/dir && echo inside > /v/dir/f && ln -s dir /v/ok && ln -s /v/dir /v/abs"]
  containers:
  - name: escape
    image: mqlet.test/busybox:1
    volumeMounts: [{name: v, mountPath: /host, subPath: sub}]
    command: ["sh", "-c", `+quoteYAML("cat /host"+marker+"; echo pwned > /host"+written+"; exec sleep 3600")+`]
  - name: fine
    image: mqlet.test/busybox:1
    volumeMounts: [{name: v, mountPath: /in, subPath: ok}]
    command: ["sh", "-c", "cat /in/f; exec sleep 3600"]
  - name: abs
    image: mqlet.test/busybox:1
    volumeMounts: [{name: v, mountPath: /in, subPath: abs}]
    command: ["sh", "-c", "cat /in/f; exec sleep 3600"]
`)
	h.startAgent()
	p := h.waitPod("sub", "escape waiting with CreateContainerConfigError", waitingFor("escape", "CreateContainerConfigError", `subPath "sub"`))
	msg := containerStatus(p, "escape").State.Waiting.Message
	if !strings.Contains(msg, "leads out of the volume") || !strings.Contains(msg, "resolves to /,") {
		t.Errorf("message %q does not say the subPath leads out, to /", msg)
	}
	evs, err := h.podEvents("sub")
	found := false
	for _, ev := range evs {
		found = found || ev.Reason == "Failed" && strings.Contains(ev.Message, `subPath "sub"`) && strings.Contains(ev.Message, "resolves to /,")
	}
	if err != nil || !found {
		t.Errorf("no Failed event naming the subPath and where it leads: %v %+v", err, evs)
	}
	h.waitContainerLog("sub", "fine", "inside")
	// A link whose absolute target is a path of the container's view (/v/dir) leads, on the host,
	// out of the volume: refused like kubelet does, never resolved against the host's /v.
	p = h.waitPod("sub", "abs waiting", waitingFor("abs", "CreateContainerConfigError", `subPath "abs"`))
	if cs := containerStatus(p, "escape"); cs.State.Running != nil || cs.RestartCount != 0 {
		t.Errorf("escape ran: %+v", cs.State)
	}
	if p.Status.Phase != v1.PodPending {
		t.Errorf("pod is %s, want Pending while a container cannot start", p.Status.Phase)
	}
	if _, err := os.Stat(written); !os.IsNotExist(err) {
		t.Errorf("the subPath container wrote outside its volume: %v", err)
	}
	if log := h.logOf(p, "escape"); strings.Contains(log, "host-secret") {
		t.Errorf("the subPath container read the host file: %q", log)
	}
}
