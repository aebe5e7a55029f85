package e2e

// ConfigMaps and Secrets in the manifest dir, used by pods in env, envFrom and volumes, on the real
// agent and containerd.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// unmountObjectVolumesAtCleanup unmounts the tmpfs of secret and projected volumes a test leaves
// behind (a failed test may stop before its pods are torn down), before the harness removes its dir.
func (h *harness) unmountObjectVolumesAtCleanup() {
	h.t.Cleanup(func() {
		vols, _ := filepath.Glob(filepath.Join(h.state, "pods", "*", "volumes", "kubernetes.io~*", "*"))
		for _, v := range vols {
			unix.Unmount(v, unix.MNT_DETACH)
		}
	})
}

func configMapYAML(name string, data map[string]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: %s}\ndata:\n", name)
	for k, v := range data {
		fmt.Fprintf(&b, "  %s: %q\n", k, v)
	}
	return b.String()
}

// waitingFor returns a condition: the container waits with reason and a message holding want.
func waitingFor(container, reason, want string) func(*v1.Pod) bool {
	return func(p *v1.Pod) bool {
		w := containerStatus(p, container).State.Waiting
		return w != nil && w.Reason == reason && strings.Contains(w.Message, want)
	}
}

// waitContainerLog waits (bounded) until the current log of container holds want, and returns it.
func (h *harness) waitContainerLog(name, container, want string) string {
	h.t.Helper()
	var log string
	waitFor(h.t, fmt.Sprintf("log of %s/%s to show %q", name, container, want), func() bool {
		p, err := h.getPod(name)
		if err != nil {
			return false
		}
		log = h.logOf(p, container)
		return strings.Contains(log, want)
	})
	return log
}

// A configMap volume's file is visible in the container and changes in place when the ConfigMap
// changes: same container, no restart. The mount is read-only, the item's mode applies, and a
// subPath mount of the same key keeps the content it started with, as with kubelet.
func TestConfigMapVolumeUpdatesInPlace(t *testing.T) {
	h := newHarness(t)
	h.unmountObjectVolumesAtCleanup()
	h.writeManifest("config.yaml", configMapYAML("app-config", map[string]string{"greeting": "hello-v1"}))
	h.writeManifest("pod.yaml", `apiVersion: v1
kind: Pod
metadata: {name: cmvol}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "touch /etc/cfg/x 2>/dev/null && echo WRITABLE || echo READONLY; echo mode=$(stat -L -c %a /etc/cfg/greeting); while true; do echo \"now=$(cat /etc/cfg/greeting) pinned=$(cat /etc/pinned)\"; sleep 0.2; done"]
    volumeMounts:
    - {name: cfg, mountPath: /etc/cfg}
    - {name: cfg, mountPath: /etc/pinned, subPath: greeting}
  volumes:
  - name: cfg
    configMap:
      name: app-config
      items: [{key: greeting, path: greeting, mode: 0600}]
`)
	h.startAgent()
	p := h.waitPod("cmvol", "running", allRunning)
	log := h.waitContainerLog("cmvol", "c", "now=hello-v1 pinned=hello-v1")
	if !strings.Contains(log, "READONLY") || strings.Contains(log, "WRITABLE") {
		t.Errorf("the configMap volume is writable in the container:\n%s", log)
	}
	if !strings.Contains(log, "mode=600") {
		t.Errorf("item mode 0600 not applied:\n%s", log)
	}
	before := containerStatus(p, "c").ContainerID

	h.writeManifest("config.yaml", configMapYAML("app-config", map[string]string{"greeting": "hello-v2"}))
	h.waitContainerLog("cmvol", "c", "now=hello-v2 pinned=hello-v1")
	p, err := h.getPod("cmvol")
	if err != nil {
		t.Fatal(err)
	}
	cs := containerStatus(p, "c")
	if cs.ContainerID != before || cs.RestartCount != 0 || cs.State.Running == nil {
		t.Errorf("the container was replaced for a ConfigMap change: %s (restarts %d) -> %s", before, cs.RestartCount, cs.ContainerID)
	}
}

// A pod whose ConfigMap is missing waits with CreateContainerConfigError naming it, and starts as
// soon as the ConfigMap is added: the agent nudges the pod, it does not wait out its back-off.
func TestMissingConfigMapHoldsPodUntilAdded(t *testing.T) {
	h := newHarness(t)
	h.unmountObjectVolumesAtCleanup()
	h.writeManifest("pod.yaml", `apiVersion: v1
kind: Pod
metadata: {name: waiter}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "echo level=$LEVEL file=$(cat /etc/late/level); sleep 3600"]
    env:
    - name: LEVEL
      valueFrom: {configMapKeyRef: {name: late, key: level}}
    volumeMounts: [{name: late, mountPath: /etc/late}]
  volumes:
  - name: late
    configMap: {name: late}
`)
	h.startAgent()
	p := h.waitPod("waiter", "waiting for its ConfigMap", waitingFor("c", "CreateContainerConfigError", "ConfigMap default/late not found"))
	if p.Status.Phase != v1.PodPending {
		t.Errorf("phase %s, want Pending", p.Status.Phase)
	}
	// Let it fail twice, so a back-off retry is pending when the ConfigMap arrives.
	waitFor(t, "a second failed start", func() bool {
		return strings.Count(h.agentLog.String(), `msg="container failed to start" pod=default/waiter`) >= 2
	})
	h.writeManifest("late.yaml", configMapYAML("late", map[string]string{"level": "debug"}))
	h.waitPod("waiter", "running", allRunning)
	// The start came from the agent noticing the ConfigMap (the worker dropped the pending back-off),
	// not from waiting the back-off out.
	log := h.agentLog.String()
	retry := strings.Index(log, `msg="an object the pod uses changed; retrying the container at once" pod=default/waiter container=c`)
	started := strings.LastIndex(log, `msg="container started" pod=default/waiter container=c`)
	if retry < 0 || started < retry {
		t.Errorf("the container did not start on the ConfigMap's arrival (retry-at-once at %d, start at %d):\n%s", retry, started, log)
	}
	h.waitContainerLog("waiter", "c", "level=debug file=debug")
}

// Env from configMapKeyRef and secretKeyRef, envFrom with prefixes, and optional references to
// what is missing.
func TestEnvFromConfigMapAndSecret(t *testing.T) {
	h := newHarness(t)
	h.unmountObjectVolumesAtCleanup()
	h.writeManifest("all.yaml", configMapYAML("settings", map[string]string{"level": "info", "port": "8080", "1st": "x"})+`---
apiVersion: v1
kind: Secret
metadata: {name: creds}
stringData: {user: admin}
data: {token: `+base64.StdEncoding.EncodeToString([]byte("tok-123"))+`}
---
apiVersion: v1
kind: Pod
metadata: {name: envpod}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "env | sort | grep -E '^(LEVEL|TOKEN|CFG_|SEC_|OPT|URL|port)'; tr '\\0' '\\n' </proc/1/environ | grep '^1st='; echo done; sleep 3600"]
    envFrom:
    - {prefix: CFG_, configMapRef: {name: settings}}
    - {prefix: SEC_, secretRef: {name: creds}}
    - {configMapRef: {name: absent, optional: true}}
    - {configMapRef: {name: settings}}
    env:
    - {name: LEVEL, valueFrom: {configMapKeyRef: {name: settings, key: level}}}
    - {name: TOKEN, valueFrom: {secretKeyRef: {name: creds, key: token}}}
    - {name: OPT, valueFrom: {secretKeyRef: {name: absent, key: x, optional: true}}}
    - {name: URL, value: "http://$(SEC_user)@host:$(CFG_port)"}
`)
	h.startAgent()
	h.waitPod("envpod", "running", allRunning)
	log := h.waitContainerLog("envpod", "c", "done")
	for _, want := range []string{"LEVEL=info\n", "TOKEN=tok-123\n", "CFG_level=info\n", "CFG_port=8080\n",
		"SEC_user=admin\n", "SEC_token=tok-123\n", "URL=http://admin@host:8080\n", "port=8080\n", "CFG_1st=x\n",
		"\n1st=x\n"} { // not a shell name, but the API's relaxed one: kubelet sets it too. Read from
		// the container's own environment (busybox sh leaves such names out of env's).
		if !strings.Contains(log, want) {
			t.Errorf("env lacks %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "OPT=") {
		t.Errorf("an optional missing key was set:\n%s", log)
	}
}

// downwardAPI and projected volumes: pod metadata, keys of a ConfigMap and a Secret under one
// directory with defaultMode, the files' group set to fsGroup; a serviceAccountToken projection
// is refused at admission.
func TestDownwardAPIAndProjectedVolumes(t *testing.T) {
	h := newHarness(t)
	h.unmountObjectVolumesAtCleanup()
	h.writeManifest("all.yaml", configMapYAML("proj-cm", map[string]string{"colour": "blue"})+`---
apiVersion: v1
kind: Secret
metadata: {name: proj-secret}
stringData: {pin: "4321"}
---
apiVersion: v1
kind: Pod
metadata:
  name: proj
  labels: {app: proj, tier: edge}
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {fsGroup: 1234}
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "cat /etc/pod/labels; echo; echo name=$(cat /etc/pod/name) mem=$(cat /etc/pod/mem); echo colour=$(cat /etc/proj/cfg/colour) pin=$(cat /etc/proj/pin) ns=$(cat /etc/proj/ns); echo perm=$(stat -L -c %a:%g /etc/proj/pin); echo done; sleep 3600"]
    resources: {limits: {memory: 64Mi}}
    volumeMounts:
    - {name: pod, mountPath: /etc/pod}
    - {name: proj, mountPath: /etc/proj}
  volumes:
  - name: pod
    downwardAPI:
      items:
      - {path: labels, fieldRef: {fieldPath: metadata.labels}}
      - {path: name, fieldRef: {fieldPath: metadata.name}}
      - {path: mem, resourceFieldRef: {containerName: c, resource: limits.memory, divisor: 1Mi}}
  - name: proj
    projected:
      defaultMode: 0400
      sources:
      - configMap: {name: proj-cm, items: [{key: colour, path: cfg/colour}]}
      - secret: {name: proj-secret}
      - downwardAPI: {items: [{path: ns, fieldRef: {fieldPath: metadata.namespace}}]}
`)
	h.writeManifest("token.yaml", `apiVersion: v1
kind: Pod
metadata: {name: token}
spec:
  containers:
  - {name: c, image: mqlet.test/busybox:1}
  volumes:
  - name: t
    projected:
      sources: [{serviceAccountToken: {path: token}}]
`)
	h.startAgent()
	h.waitPod("proj", "running", allRunning)
	log := h.waitContainerLog("proj", "c", "done")
	for _, want := range []string{"app=\"proj\"\ntier=\"edge\"\n", "name=proj mem=64\n", "colour=blue pin=4321 ns=default\n",
		// 0400 with fsGroup: group read added, group set, as kubelet does.
		"perm=440:1234\n"} {
		if !strings.Contains(log, want) {
			t.Errorf("volume content lacks %q:\n%s", want, log)
		}
	}
	h.waitRejected("token.yaml", "spec.volumes[0].projected.sources[0].serviceAccountToken")
}

// An item path that would leave its volume is refused at admission with the field and the reason,
// and nothing is written for it.
func TestVolumeItemPathEscapeRefused(t *testing.T) {
	h := newHarness(t)
	h.writeManifest("escape.yaml", configMapYAML("esc", map[string]string{"k": "v"})+`---
apiVersion: v1
kind: Pod
metadata: {name: escape}
spec:
  containers:
  - name: c
    image: mqlet.test/busybox:1
    volumeMounts: [{name: v, mountPath: /v}]
  volumes:
  - name: v
    configMap:
      name: esc
      items: [{key: k, path: ../x}]
`)
	h.startAgent()
	r := h.waitRejected("escape.yaml", `spec.volumes[0].configMap.items[0].path: Invalid value: "../x": must not contain '..'`)
	if r.Pod != "default/escape" {
		t.Errorf("rejection names %q, want default/escape", r.Pod)
	}
	if _, err := h.getPod("escape"); err == nil {
		t.Errorf("the refused pod is listed")
	}
	if _, err := os.Stat(filepath.Join(h.state, "pods")); err == nil {
		found, _ := filepath.Glob(filepath.Join(h.state, "pods", "*", "volumes", "*", "*", "x"))
		if len(found) > 0 {
			t.Errorf("files were written for the refused pod: %v", found)
		}
	}
}

// A Secret's value, used by a pod in env and in a volume, is found nowhere on disk in the state
// dir (the store seals it; the secret volume is a tmpfs), nor in the agent's log, `mqlet pods -o
// json`, `mqlet describe` or the API's pod listing.
func TestSecretValueNeverInClear(t *testing.T) {
	h := newHarness(t)
	h.unmountObjectVolumesAtCleanup()
	value := fmt.Sprintf("Sup3r-S3cret-%d", time.Now().UnixNano())
	h.writeManifest("secret.yaml", `apiVersion: v1
kind: Secret
metadata: {name: db}
data: {password: `+base64.StdEncoding.EncodeToString([]byte(value))+`}
`)
	h.writeManifest("pod.yaml", `apiVersion: v1
kind: Pod
metadata: {name: user}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: mqlet.test/busybox:1
    command: ["sh", "-c", "[ -n \"$PASSWORD\" ] && [ \"$PASSWORD\" = \"$(cat /etc/db/password)\" ] && echo match || echo mismatch; sleep 3600"]
    env:
    - {name: PASSWORD, valueFrom: {secretKeyRef: {name: db, key: password}}}
    volumeMounts: [{name: db, mountPath: /etc/db}]
  volumes:
  - name: db
    secret: {secretName: db}
`)
	h.startAgent()
	p := h.waitPod("user", "running", allRunning)
	h.waitContainerLog("user", "c", "match")
	if log := h.logOf(p, "c"); strings.Contains(log, "mismatch") {
		t.Fatalf("the container did not see the secret in env and volume alike:\n%s", log)
	}

	// The secret volume is a tmpfs: the only place under the state dir with the value in it.
	vol := filepath.Join(h.state, "pods", string(p.UID), "volumes", "kubernetes.io~secret", "db")
	if !isTmpfs(vol) {
		t.Errorf("secret volume %s is not on a tmpfs", vol)
	}
	if b, err := os.ReadFile(filepath.Join(vol, "password")); err != nil || string(b) != value {
		t.Errorf("secret volume file: %q, %v (the check below would prove nothing)", b, err)
	}

	needles := [][]byte{[]byte(value), []byte(base64.StdEncoding.EncodeToString([]byte(value)))}
	checked := 0
	err := filepath.WalkDir(h.state, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != h.state && isTmpfs(path) {
				return filepath.SkipDir // memory, not disk
			}
			return nil
		}
		if !d.Type().IsRegular() || isNsfs(path) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
		checked++
		for _, n := range needles {
			if bytes.Contains(b, n) {
				t.Errorf("the secret's value is in clear in %s", path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 3 { // state.db, the hosts file, the container log at least
		t.Errorf("only %d files checked in %s", checked, h.state)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := h.client.ListPods(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	apiJSON, _ := json.Marshal(list)
	outputs := map[string]string{
		"agent log":           h.agentLog.String(),
		"mqlet pods -o json":  h.mqlet("pods", "-o", "json"),
		"mqlet describe pod":  h.mqlet("describe", "pod", "user"),
		"API /api/v1/pods":    string(apiJSON),
		"mqlet pods -o yaml":  h.mqlet("pods", "-o", "yaml"),
		"container statuses":  fmt.Sprint(p.Status),
		"pod annotations etc": fmt.Sprint(p.ObjectMeta),
	}
	if !strings.Contains(outputs["mqlet pods -o json"], `"user"`) {
		t.Fatalf("mqlet pods -o json does not list the pod:\n%s", outputs["mqlet pods -o json"])
	}
	for what, out := range outputs {
		for _, n := range needles {
			if strings.Contains(out, string(n)) {
				t.Errorf("the secret's value appears in %s", what)
			}
		}
	}

	// Deleting the pod unmounts its secret tmpfs and removes its files.
	if err := os.Remove(filepath.Join(h.manifests, "pod.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pod's dir to be removed", func() bool {
		_, err := os.Stat(filepath.Join(h.state, "pods", string(p.UID)))
		return errors.Is(err, fs.ErrNotExist)
	})
	if mounted(vol) {
		t.Errorf("%s is still mounted after the pod was removed", vol)
	}
}

func isTmpfs(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.TMPFS_MAGIC
}

func isNsfs(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// mounted reports whether path is a mount point, from the kernel's mount table.
func mounted(path string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}
