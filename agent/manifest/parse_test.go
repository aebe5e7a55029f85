package manifest

import (
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

const node = "edge-1"

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
	pods, probs := Parse(file, []byte(data), node)
	if len(probs) != 0 || len(pods) != 1 {
		t.Fatalf("Parse(%s): want 1 pod and no problems, got %d pods and problems %v", file, len(pods), probs)
	}
	return pods[0]
}

// parseProblem parses data expecting no pods and exactly one problem, and returns its message.
func parseProblem(t *testing.T, data string) Problem {
	t.Helper()
	pods, probs := Parse("/m/p.yaml", []byte(data), node)
	if len(pods) != 0 || len(probs) != 1 {
		t.Fatalf("Parse: want 0 pods and 1 problem, got %d pods and problems %v", len(pods), probs)
	}
	return probs[0]
}

func TestParseMultiDocumentYAML(t *testing.T) {
	data := "---\n# leading comment\n" + podYAML("web", "nginx:1.25") +
		"---\n# only a comment: not a document\n---\n\n" +
		"--- # separator with a comment\n" + podYAML("db", "postgres:16")
	pods, probs := Parse("/m/a.yaml", []byte(data), node)
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
	if got, want := pods[1].Source(), "file:/m/a.yaml#1"; got != want {
		t.Errorf("Source() = %q, want %q", got, want)
	}
}

func TestParseJSON(t *testing.T) {
	data := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j","namespace":"edge"},
	"spec":{"containers":[{"name":"c","image":"busybox:1.36","command":["sleep","3600"]}]}}`
	p := parseOne(t, "/m/j.json", data)
	if p.Pod.Namespace != "edge" || p.Pod.Name != "j" || p.Pod.Spec.Containers[0].Command[1] != "3600" {
		t.Errorf("decoded pod wrong: %s/%s %v", p.Pod.Namespace, p.Pod.Name, p.Pod.Spec.Containers[0].Command)
	}

	_, probs := Parse("/m/j.json", []byte("{\"apiVersion\":\"v1\",\n\"kind\":\"Pod\",\n\"metadata\": {\"name\": \"x\",}}"), node)
	if len(probs) != 1 || !strings.Contains(probs[0].Error(), "line 3") {
		t.Errorf("JSON syntax error: want one problem naming line 3, got %v", probs)
	}
	_, probs = Parse("/m/j.json", []byte(`[{"apiVersion":"v1"}]`), node)
	if len(probs) != 1 || !strings.Contains(probs[0].Error(), "must be an object") {
		t.Errorf("JSON array: want one problem saying it must be an object, got %v", probs)
	}
}

func TestParseEmptyDocumentsSkipped(t *testing.T) {
	for _, data := range []string{"", "\n\n", "# nothing\n", "---\n# c\n---\n\n---\n", "---"} {
		pods, probs := Parse("/m/e.yaml", []byte(data), node)
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

func TestParseMissingImage(t *testing.T) {
	prob := parseProblem(t, podYAML("web", `""`))
	if got := prob.Error(); !strings.Contains(got, "spec.containers[0].image: Required value") {
		t.Errorf("missing image problem = %q", got)
	}
}

func TestParseBadSyntaxIndexAndLine(t *testing.T) {
	bad := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: broken\n   labels: {}\n"
	data := podYAML("a", "nginx") + "---\n" + bad + "---\n" + podYAML("c", "nginx")
	pods, probs := Parse("/m/s.yaml", []byte(data), node)
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
	pods, probs := Parse("/m/d.yaml", []byte(data), node)
	if len(pods) != 1 || pods[0].Pod.Spec.Containers[0].Image != "nginx:1" {
		t.Fatalf("want the first web (nginx:1) to win, got %v", pods)
	}
	if len(probs) != 1 || probs[0].Index != 1 || !strings.Contains(probs[0].Error(), "default/web is already declared in document 0") {
		t.Errorf("want a problem on document 1 naming document 0, got %v", probs)
	}
}

func TestParseKindsAndVersions(t *testing.T) {
	cases := map[string]string{
		"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: b\n":       "kind ConfigMap is not supported yet",
		"apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n":                         "kind Secret is not supported yet",
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

func TestParseValidation(t *testing.T) {
	base := podYAML("web", "nginx")
	cases := []struct {
		name, data string
		want       []string
	}{
		{"bad name", podYAML("Web_1", "nginx"), []string{`metadata.name: Invalid value: "Web_1"`}},
		{"no name", strings.Replace(base, "  name: web\n", "", 1), []string{"metadata.name: Required value"}},
		{"generateName", strings.Replace(base, "  name: web\n", "  generateName: web-\n", 1), []string{"generateName is not supported"}},
		{"bad namespace", strings.Replace(base, "  name: web\n", "  name: web\n  namespace: my.ns\n", 1), []string{`metadata.namespace: Invalid value: "my.ns"`}},
		{"no containers", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers: []\n", []string{"spec.containers: Required value"}},
		{"container name", strings.Replace(base, "name: main", "name: Main", 1), []string{`spec.containers[0].name: Invalid value: "Main"`}},
		{"container name missing", strings.Replace(base, "  - name: main\n    image", "  - image", 1), []string{"spec.containers[0].name: Required value"}},
		{"duplicate container across init", base + "  initContainers:\n  - name: main\n    image: busybox\n",
			[]string{`spec.containers[0].name: Duplicate value: "main": already used by spec.initContainers[0].name`}},
		{"image whitespace", podYAML("web", `"nginx :1"`), []string{`spec.containers[0].image: Invalid value: "nginx :1": must not contain whitespace`}},
		{"restart policy", base + "  restartPolicy: Sometimes\n", []string{`spec.restartPolicy: Unsupported value: "Sometimes"`}},
		{"grace", base + "  terminationGracePeriodSeconds: -1\n", []string{"spec.terminationGracePeriodSeconds: Invalid value: -1"}},
		{"port", base + "    ports:\n    - containerPort: 70000\n      hostPort: -2\n",
			[]string{"spec.containers[0].ports[0].containerPort: Invalid value: 70000", "spec.containers[0].ports[0].hostPort: Invalid value: -2"}},
		{"port missing", base + "    ports:\n    - name: http\n", []string{"spec.containers[0].ports[0].containerPort: Invalid value: 0"}},
		{"pull policy", base + "    imagePullPolicy: Sometimes\n", []string{`spec.containers[0].imagePullPolicy: Unsupported value: "Sometimes"`}},
		{"bad quantity", base + "    resources:\n      limits:\n        memory: 10Xi\n",
			[]string{`spec.containers[0].resources.limits[memory]: invalid quantity "10Xi"`}},
		{"request over limit", base + "    resources:\n      limits:\n        cpu: 100m\n      requests:\n        cpu: 200m\n",
			[]string{`spec.containers[0].resources.requests[cpu]: Invalid value: "200m": must be less than or equal to the cpu limit of 100m`}},
		{"negative", base + "    resources:\n      requests:\n        memory: -1Mi\n", []string{`resources.requests[memory]: Invalid value: "-1Mi"`}},
		{"init container validated", base + "  initContainers:\n  - name: init\n", []string{"spec.initContainers[0].image: Required value"}},
		{"wrong type", strings.Replace(base, "name: main", "name: [a]", 1), []string{"cannot unmarshal array", "spec.containers.name"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := parseProblem(t, c.data).Error()
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("problem = %q\nwant it to contain %q", got, w)
				}
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	data := `apiVersion: v1
kind: Pod
metadata:
  name: d
spec:
  nodeName: somewhere-else
  initContainers:
  - name: init
    image: busybox
  containers:
  - {name: c1, image: busybox}
  - {name: c2, image: "busybox:latest"}
  - {name: c3, image: "busybox:1.36"}
  - {name: c4, image: "reg:5000/busybox"}
  - {name: c5, image: "reg:5000/busybox:1"}
  - {name: c6, image: "busybox@sha256:9ae97d36d26566ff84e8893c64a6dc4fe8ca6d1144bf5b87b2b85a32def253c7"}
  - {name: c7, image: "busybox:latest", imagePullPolicy: Never}
  - name: c8
    image: busybox:1
    ports: [{containerPort: 80}]
    resources: {limits: {memory: 64Mi}, requests: {cpu: 10m}}
`
	p := parseOne(t, "/m/d.yaml", data).Pod
	wantPull := []v1.PullPolicy{v1.PullAlways, v1.PullAlways, v1.PullIfNotPresent, v1.PullAlways, v1.PullIfNotPresent, v1.PullIfNotPresent, v1.PullNever, v1.PullIfNotPresent}
	for i, c := range p.Spec.Containers {
		if c.ImagePullPolicy != wantPull[i] {
			t.Errorf("image %q: pull policy %s, want %s", c.Image, c.ImagePullPolicy, wantPull[i])
		}
		if c.TerminationMessagePath != "/dev/termination-log" || c.TerminationMessagePolicy != v1.TerminationMessageReadFile {
			t.Errorf("container %s: termination message %q %q", c.Name, c.TerminationMessagePath, c.TerminationMessagePolicy)
		}
	}
	if got := p.Spec.InitContainers[0].ImagePullPolicy; got != v1.PullAlways {
		t.Errorf("init container pull policy %s, want Always", got)
	}
	c8 := p.Spec.Containers[7]
	if c8.Ports[0].Protocol != v1.ProtocolTCP {
		t.Errorf("port protocol %q, want TCP", c8.Ports[0].Protocol)
	}
	if q := c8.Resources.Requests[v1.ResourceMemory]; q.String() != "64Mi" {
		t.Errorf("memory request %s, want the limit 64Mi", q.String())
	}
	if q := c8.Resources.Requests[v1.ResourceCPU]; q.String() != "10m" {
		t.Errorf("cpu request %s, want 10m kept", q.String())
	}
	s := p.Spec
	if p.Namespace != "default" || s.RestartPolicy != v1.RestartPolicyAlways || s.DNSPolicy != v1.DNSClusterFirst ||
		s.SchedulerName != "default-scheduler" || s.TerminationGracePeriodSeconds == nil || *s.TerminationGracePeriodSeconds != 30 ||
		s.NodeName != node {
		t.Errorf("pod defaults wrong: ns %q restart %q dns %q scheduler %q grace %v node %q",
			p.Namespace, s.RestartPolicy, s.DNSPolicy, s.SchedulerName, s.TerminationGracePeriodSeconds, s.NodeName)
	}
	if p.Annotations[AnnotationConfigSource] != "file" || len(p.Annotations[AnnotationConfigHash]) != 32 {
		t.Errorf("annotations %v", p.Annotations)
	}
}

func TestUIDStableAcrossEdits(t *testing.T) {
	a := parseOne(t, "/m/u.yaml", podYAML("web", "nginx:1")).Pod
	b := parseOne(t, "/m/other.yaml", podYAML("web", "nginx:2")).Pod
	if a.UID == "" || a.UID != b.UID {
		t.Errorf("UID changed across an edit: %q vs %q", a.UID, b.UID)
	}
	if a.Annotations[AnnotationConfigHash] == b.Annotations[AnnotationConfigHash] {
		t.Errorf("config hash did not change across an edit: %q", a.Annotations[AnnotationConfigHash])
	}
	c := parseOne(t, "/m/u.yaml", podYAML("web2", "nginx:1")).Pod
	if c.UID == a.UID {
		t.Errorf("pods web and web2 got the same UID %q", a.UID)
	}
	if other := StableUID("edge-2", "default", "web"); other == a.UID {
		t.Errorf("same pod on another node got the same UID %q", a.UID)
	}
	if got := string(a.UID); len(got) != 36 || got[14] != '5' {
		t.Errorf("UID %q is not UUIDv5-shaped", got)
	}
	explicit := strings.Replace(podYAML("web", "nginx"), "  name: web\n", "  name: web\n  uid: 11111111-2222-3333-4444-555555555555\n", 1)
	if got := parseOne(t, "/m/u.yaml", explicit).Pod.UID; got != "11111111-2222-3333-4444-555555555555" {
		t.Errorf("explicit UID replaced by %q", got)
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

func TestParseSidecarInitContainerRefused(t *testing.T) {
	p := parseProblem(t, `apiVersion: v1
kind: Pod
metadata: {name: side}
spec:
  initContainers:
  - {name: proxy, image: busybox:1, restartPolicy: Always}
  containers:
  - {name: main, image: busybox:1}
`)
	if !strings.Contains(p.Error(), "spec.initContainers[0].restartPolicy") {
		t.Errorf("problem does not name the field: %v", p)
	}
}
