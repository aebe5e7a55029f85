package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseAllObjects(t *testing.T) {
	data := `apiVersion: v1
kind: ConfigMap
metadata: {name: cfg}
data: {a.txt: hello}
binaryData: {bin: AAE=}
---
apiVersion: v1
kind: Secret
metadata: {name: cfg, namespace: prod}
data: {token: c2VjcmV0}
stringData: {user: admin}
---
` + podYAML("cfg", "busybox") + `---
apiVersion: v1
kind: ConfigMap
metadata: {name: cfg}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: bad}
data: {"../x": v}
---
apiVersion: v1
kind: Secret
metadata: {name: pull}
type: kubernetes.io/dockerconfigjson
data: {other: e30=}
---
apiVersion: v1
kind: Secret
metadata: {name: b64}
data: {token: "not base64 Sup3rS3cret!"}
`
	pods, objs, probs := ParseAll("/m/all.yaml", []byte(data))
	if len(pods) != 1 || len(objs) != 2 {
		t.Fatalf("pods %d objects %d, want 1 and 2 (a pod, a ConfigMap and a Secret may share a name); problems %v", len(pods), len(objs), probs)
	}
	if objs[0].Key() != "ConfigMap default/cfg" || string(objs[0].ConfigMap.BinaryData["bin"]) != "\x00\x01" || objs[0].Index != 0 {
		t.Errorf("first object %+v", objs[0])
	}
	s := objs[1].Secret
	if objs[1].Key() != "Secret prod/cfg" || string(s.Data["token"]) != "secret" || string(s.Data["user"]) != "admin" || s.StringData != nil {
		t.Errorf("secret %+v: stringData must be folded into data", s)
	}
	want := map[int]string{
		3: "ConfigMap default/cfg is already declared in document 0",
		4: `data key "../x"`,
		5: "type kubernetes.io/dockerconfigjson needs data key .dockerconfigjson",
		6: "illegal base64",
	}
	if len(probs) != len(want) {
		t.Fatalf("problems %v, want %d", probs, len(want))
	}
	for _, p := range probs {
		if !strings.Contains(p.Error(), want[p.Index]) {
			t.Errorf("document %d: %q, want it to mention %q", p.Index, p.Error(), want[p.Index])
		}
		if strings.Contains(p.Error(), "Sup3rS3cret") {
			t.Errorf("a problem quotes secret data: %q", p.Error())
		}
	}
}

func TestScanKeepsObjectsOfABrokenFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\ndata: {a: b}\n"
	write("a.yaml", cm)
	write("b.yaml", cm) // the same name in a later file: a duplicate problem
	d := NewDir(dir)
	s, err := d.Scan()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Objects) != 1 || s.Objects[0].File != filepath.Join(dir, "a.yaml") {
		t.Fatalf("objects %+v, want a.yaml's", s.Objects)
	}
	if len(s.Problems) != 1 || !s.Problems[0].Duplicate || len(s.KeptFiles()) != 0 {
		t.Errorf("problems %v kept %v, want one duplicate that keeps nothing", s.Problems, s.KeptFiles())
	}
	write("a.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\ndata: {a: [\n") // half written
	s, _ = d.Scan()
	if len(s.Objects) != 1 || !s.Objects[0].Stale || s.Objects[0].File != filepath.Join(dir, "a.yaml") {
		t.Errorf("objects %+v, want a.yaml's ConfigMap kept from before, stale", s.Objects)
	}
	if kept := s.KeptFiles(); len(kept) != 1 || kept[0] != filepath.Join(dir, "a.yaml") {
		t.Errorf("kept %v, want a.yaml", kept)
	}
}
