package admission

import (
	"fmt"
	"strings"
	"testing"

	"github.com/mqlet/mqlet/agent/manifest"
	"github.com/mqlet/mqlet/core/source"
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

// admit runs a manifest through the real pipeline: the manifest dir's decoder, then Admit.
func admit(file, data string) (*v1.Pod, error) {
	pods, probs := manifest.Parse(file, []byte(data))
	if len(probs) > 0 {
		return nil, probs[0]
	}
	if len(pods) != 1 {
		return nil, fmt.Errorf("want 1 document, got %d", len(pods))
	}
	return Admitter{NodeName: node}.Admit(source.Item{Pod: pods[0].Pod, Ref: pods[0].Ref()})
}

// parseOne admits data expecting success.
func parseOne(t *testing.T, file, data string) *v1.Pod {
	t.Helper()
	p, err := admit(file, data)
	if err != nil {
		t.Fatalf("admit %s: %v", file, err)
	}
	return p
}

// parseProblem admits data expecting it to be refused, and returns the error.
func parseProblem(t *testing.T, data string) error {
	t.Helper()
	_, err := admit("/m/p.yaml", data)
	if err == nil {
		t.Fatalf("admit: want an error, got none")
	}
	return err
}

func TestMissingImage(t *testing.T) {
	prob := parseProblem(t, podYAML("web", `""`))
	if got := prob.Error(); !strings.Contains(got, "spec.containers[0].image: Required value") {
		t.Errorf("missing image problem = %q", got)
	}
}

func TestValidation(t *testing.T) {
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
		{"fractional device", base + "    resources:\n      limits:\n        mqlet.io/serial: 500m\n",
			[]string{`spec.containers[0].resources.limits[mqlet.io/serial]: Invalid value: "500m": must be an integer`}},
		{"device request only", base + "    resources:\n      requests:\n        mqlet.io/serial: 1\n",
			[]string{`spec.containers[0].resources.limits[mqlet.io/serial]: Required value`}},
		{"device request below limit", base + "    resources:\n      limits:\n        mqlet.io/serial: 2\n      requests:\n        mqlet.io/serial: 1\n",
			[]string{`spec.containers[0].resources.requests[mqlet.io/serial]: Invalid value: "1": must be equal to the mqlet.io/serial limit of 2`}},
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
	p := parseOne(t, "/m/d.yaml", data)
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
	a := parseOne(t, "/m/u.yaml", podYAML("web", "nginx:1"))
	b := parseOne(t, "/m/other.yaml", podYAML("web", "nginx:2"))
	if a.UID == "" || a.UID != b.UID {
		t.Errorf("UID changed across an edit: %q vs %q", a.UID, b.UID)
	}
	if a.Annotations[AnnotationConfigHash] == b.Annotations[AnnotationConfigHash] {
		t.Errorf("config hash did not change across an edit: %q", a.Annotations[AnnotationConfigHash])
	}
	c := parseOne(t, "/m/u.yaml", podYAML("web2", "nginx:1"))
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
	if got := parseOne(t, "/m/u.yaml", explicit).UID; got != "11111111-2222-3333-4444-555555555555" {
		t.Errorf("explicit UID replaced by %q", got)
	}
}

// restartPolicy Always on an init container is a sidecar and is admitted; any other value on an
// init container, and any value on an app container, is refused naming the field.
func TestSidecarRestartPolicy(t *testing.T) {
	p := parseOne(t, "/m/side.yaml", `apiVersion: v1
kind: Pod
metadata: {name: side}
spec:
  initContainers:
  - {name: proxy, image: busybox:1, restartPolicy: Always}
  containers:
  - {name: main, image: busybox:1}
`)
	if rp := p.Spec.InitContainers[0].RestartPolicy; rp == nil || *rp != v1.ContainerRestartPolicyAlways {
		t.Errorf("sidecar's restartPolicy = %v after admission, want Always", rp)
	}
	for _, tc := range []struct{ name, spec, want string }{
		{"init container OnFailure", `  initContainers:
  - {name: proxy, image: busybox:1, restartPolicy: OnFailure}
  containers:
  - {name: main, image: busybox:1}
`, `spec.initContainers[0].restartPolicy: Unsupported value: "OnFailure": supported values: "Always"`},
		{"app container Always", `  containers:
  - {name: main, image: busybox:1, restartPolicy: Always}
`, "spec.containers[0].restartPolicy: Forbidden: not supported by mqlet on an app container"},
	} {
		err := parseProblem(t, "apiVersion: v1\nkind: Pod\nmetadata: {name: side}\nspec:\n"+tc.spec)
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: problem %q does not contain %q", tc.name, err, tc.want)
		}
		if strings.Count(err.Error(), "].restartPolicy:") != 1 {
			t.Errorf("%s: restartPolicy reported more or less than once: %v", tc.name, err)
		}
	}
}
