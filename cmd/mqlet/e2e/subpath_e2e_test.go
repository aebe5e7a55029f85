package e2e

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A subPath (or an expanded subPathExpr) that does not exist in its volume is made a directory
// there before the container starts, as kubelet does (the Variable Expansion conformance specs
// rely on it): with parents ("a/b"), with the volume's mode, in an emptyDir and in an object volume
// (made empty, mounted read-only). The container writes into it and the write lands in the volume.
// A missing subPath reached through a link that leads out of the volume is refused naming it, and
// nothing is made outside.
func TestMissingSubPathMadeForReal(t *testing.T) {
	h := newHarness(t)
	h.unmountObjectVolumesAtCleanup()
	outside := filepath.Join(h.dir, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	h.writeManifest("subpaths.yaml", `apiVersion: v1
kind: Pod
metadata: {name: subpaths, labels: {app: sp}}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - {name: v, emptyDir: {}}
  - name: info
    downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}
  initContainers:
  - name: plant
    image: mqlet.test/busybox:1
    volumeMounts: [{name: v, mountPath: /v}]
    command: ["sh", "-c", "ln -s `+outside+` /v/out"]
  containers:
  - name: writer
    image: mqlet.test/busybox:1
    env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    volumeMounts:
    - {name: v, mountPath: /sub, subPath: a/b}
    - {name: v, mountPath: /mine, subPathExpr: "$(POD_NAME)/x"}
    - {name: v, mountPath: /all}
    - {name: info, mountPath: /empty, subPath: nodir}
    command: ["sh", "-c", "echo hi > /sub/f && echo me > /mine/g && echo \"sub=$(cat /all/a/b/f) mine=$(cat /all/subpaths/x/g) modes=$(stat -c %a /all)/$(stat -c %a /all/a)/$(stat -c %a /all/a/b) empty=$(ls -A /empty | wc -l)\"; exec sleep 3600"]
  - name: escape
    image: mqlet.test/busybox:1
    volumeMounts: [{name: v, mountPath: /o, subPath: out/made}]
    command: ["sh", "-c", "exec sleep 3600"]
`)
	h.startAgent()
	h.waitContainerLog("subpaths", "writer", "sub=hi mine=me modes=777/777/777 empty=0")
	p := h.waitPod("subpaths", "escape waiting with CreateContainerConfigError", waitingFor("escape", "CreateContainerConfigError", `subPath "out/made"`))
	if msg := containerStatus(p, "escape").State.Waiting.Message; !strings.Contains(msg, "leads out of the volume") || !strings.Contains(msg, outside) {
		t.Errorf("message %q does not say the subPath leads out, to %s", msg, outside)
	}
	if _, err := os.Lstat(filepath.Join(outside, "made")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a directory was made outside the volume through the link: %v", err)
	}
}
