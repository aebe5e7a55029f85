package manifest

import (
	"fmt"
	"strings"
	"testing"
)

func podYAML(name, image string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  containers:
  - name: main
    image: %s
`, name, image)
}

// parseOne parses data expecting exactly one pod and no problems.
func parseOne(t *testing.T, file, data string) Pod {
	t.Helper()
	pods, probs := Parse(file, []byte(data))
	if len(probs) != 0 || len(pods) != 1 {
		t.Fatalf("Parse(%s): want 1 pod and no problems, got %d pods and problems %v", file, len(pods), probs)
	}
	return pods[0]
}

// parseProblem parses data expecting no pods and exactly one problem, and returns its message.
func parseProblem(t *testing.T, data string) Problem {
	t.Helper()
	pods, probs := Parse("/m/p.yaml", []byte(data))
	if len(pods) != 0 || len(probs) != 1 {
		t.Fatalf("Parse: want 0 pods and 1 problem, got %d pods and problems %v", len(pods), probs)
	}
	return probs[0]
}

func TestParseMultiDocumentYAML(t *testing.T) {
	data := "---\n# leading comment\n" + podYAML("web", "nginx:1.25") +
		"---\n# only a comment: not a document\n---\n\n" +
		"--- # separator with a comment\n" + podYAML("db", "postgres:16")
	pods, probs := Parse("/m/a.yaml", []byte(data))
	if len(probs) != 0 {
		t.Fatalf("unexpected problems: %v", probs)
	}
	if len(pods) != 2 {
		t.Fatalf("want 2 pods, got %d", len(pods))
	}
	want := []struct {
		name  string
		index int
		line  int
	}{{"web", 0, 3}, {"db", 1, 16}}
	for i, w := range want {
		p := pods[i]
		if p.Pod.Name != w.name || p.Index != w.index || p.Line != w.line || p.File != "/m/a.yaml" {
			t.Errorf("pod %d: got %s index %d line %d file %s, want %s index %d line %d", i, p.Pod.Name, p.Index, p.Line, p.File, w.name, w.index, w.line)
		}
	}
	if got, want := pods[1].Ref().String(), "file /m/a.yaml#1"; got != want {
		t.Errorf("Ref() = %q, want %q", got, want)
	}
}

func TestParseJSON(t *testing.T) {
	data := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j","namespace":"edge"},
	"spec":{"containers":[{"name":"c","image":"busybox:1.36","command":["sleep","3600"]}]}}`
	p := parseOne(t, "/m/j.json", data)
	if p.Pod.Namespace != "edge" || p.Pod.Name != "j" || p.Pod.Spec.Containers[0].Command[1] != "3600" {
		t.Errorf("decoded pod wrong: %s/%s %v", p.Pod.Namespace, p.Pod.Name, p.Pod.Spec.Containers[0].Command)
	}

	_, probs := Parse("/m/j.json", []byte("{\"apiVersion\":\"v1\",\n\"kind\":\"Pod\",\n\"metadata\": {\"name\": \"x\",}}"))
	if len(probs) != 1 || !strings.Contains(probs[0].Error(), "line 3") {
		t.Errorf("JSON syntax error: want one problem naming line 3, got %v", probs)
	}
	_, probs = Parse("/m/j.json", []byte(`[{"apiVersion":"v1"}]`))
	if len(probs) != 1 || !strings.Contains(probs[0].Error(), "must be an object") {
		t.Errorf("JSON array: want one problem saying it must be an object, got %v", probs)
	}
}

func TestParseEmptyDocumentsSkipped(t *testing.T) {
	for _, data := range []string{"", "\n\n", "# nothing\n", "---\n# c\n---\n\n---\n", "---"} {
		pods, probs := Parse("/m/e.yaml", []byte(data))
		if len(pods) != 0 || len(probs) != 0 {
			t.Errorf("Parse(%q): want nothing, got pods %v problems %v", data, pods, probs)
		}
	}
}

func TestParseUnknownField(t *testing.T) {
	data := strings.Replace(podYAML("web", "nginx"), "    image:", "    imagee:", 1)
	prob := parseProblem(t, data)
	if got := prob.Error(); !strings.Contains(got, `unknown field "spec.containers[0].imagee"`) {
		t.Errorf("unknown field problem = %q, want it to name spec.containers[0].imagee", got)
	}
	// Field names are case-sensitive like the API server's.
	prob = parseProblem(t, strings.Replace(podYAML("web", "nginx"), "metadata:", "Metadata:", 1))
	if !strings.Contains(prob.Error(), `unknown field "Metadata"`) {
		t.Errorf("case-mismatched field problem = %q", prob.Error())
	}
	prob = parseProblem(t, podYAML("web", "nginx")+"metadata:\n  name: again\n")
	if !strings.Contains(prob.Error(), `"metadata" already set`) {
		t.Errorf("duplicate key problem = %q", prob.Error())
	}
}

func TestParseBadSyntaxIndexAndLine(t *testing.T) {
	bad := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: broken\n   labels: {}\n"
	data := podYAML("a", "nginx") + "---\n" + bad + "---\n" + podYAML("c", "nginx")
	pods, probs := Parse("/m/s.yaml", []byte(data))
	if len(pods) != 2 || pods[0].Pod.Name != "a" || pods[1].Pod.Name != "c" || pods[1].Index != 2 {
		t.Fatalf("want pods a (#0) and c (#2), got %v", pods)
	}
	if len(probs) != 1 {
		t.Fatalf("want 1 problem, got %v", probs)
	}
	p := probs[0]
	// The bad document starts on line 10; its syntax error is on its line 5 = file line 14.
	if p.Index != 1 || p.Line != 10 {
		t.Errorf("problem at document %d line %d, want document 1 line 10", p.Index, p.Line)
	}
	if want := "manifest /m/s.yaml, document 1 (line 10): yaml: line 14:"; !strings.HasPrefix(p.Error(), want) {
		t.Errorf("problem = %q, want prefix %q", p.Error(), want)
	}
}

func TestParseDuplicateInOneFile(t *testing.T) {
	data := podYAML("web", "nginx:1") + "---\n" + podYAML("web", "nginx:2")
	pods, probs := Parse("/m/d.yaml", []byte(data))
	if len(pods) != 1 || pods[0].Pod.Spec.Containers[0].Image != "nginx:1" {
		t.Fatalf("want the first web (nginx:1) to win, got %v", pods)
	}
	if len(probs) != 1 || probs[0].Index != 1 || !strings.Contains(probs[0].Error(), "default/web is already declared in document 0") {
		t.Errorf("want a problem on document 1 naming document 0, got %v", probs)
	}
}

func TestParseKindsAndVersions(t *testing.T) {
	cases := map[string]string{
		"apiVersion: v1\nkind: Deployment\nmetadata:\n  name: c\n":                     "kind Deployment is not supported (want Pod, ConfigMap or Secret)",
		"apiVersion: apps/v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: b\n":  `apiVersion "apps/v1" is not supported for kind ConfigMap`,
		strings.Replace(podYAML("p", "x"), "apiVersion: v1", "apiVersion: apps/v1", 1): `apiVersion "apps/v1" is not supported`,
		strings.Replace(podYAML("p", "x"), "kind: Pod\n", "", 1):                       "kind is required",
		strings.Replace(podYAML("p", "x"), "apiVersion: v1\n", "", 1):                  "apiVersion is required",
		"just a string\n": "must be an object",
	}
	for data, want := range cases {
		if got := parseProblem(t, data).Error(); !strings.Contains(got, want) {
			t.Errorf("Parse(%q) problem = %q, want it to contain %q", data, got, want)
		}
	}
}

func TestProblemError(t *testing.T) {
	err := fmt.Errorf("boom")
	cases := map[string]Problem{
		"manifest /p/a.yaml: boom":                      {File: "/p/a.yaml", Index: -1, Err: err},
		"manifest /p/a.yaml, document 2: boom":          {File: "/p/a.yaml", Index: 2, Err: err},
		"manifest /p/a.yaml, document 0 (line 7): boom": {File: "/p/a.yaml", Index: 0, Line: 7, Err: err},
	}
	for want, p := range cases {
		if got := p.Error(); got != want {
			t.Errorf("Error() = %q, want %q", got, want)
		}
	}
}
