package kubeletapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/sync/protocol"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestRequestAttributes(t *testing.T) {
	for _, c := range []struct {
		method, path string
		want         Attributes
	}{
		{"GET", "/stats/summary", Attributes{"get", "stats", "n"}},
		{"GET", "/stats", Attributes{"get", "stats", "n"}},
		{"GET", "/statsfoo", Attributes{"get", "proxy", "n"}},
		{"GET", "/metrics/resource", Attributes{"get", "metrics", "n"}},
		{"GET", "/metrics", Attributes{"get", "metrics", "n"}},
		{"GET", "/logs/", Attributes{"get", "log", "n"}},
		{"GET", "/spec/", Attributes{"get", "spec", "n"}},
		{"POST", "/checkpoint/ns/p/c", Attributes{"create", "checkpoint", "n"}},
		{"GET", "/containerLogs/ns/p/c", Attributes{"get", "proxy", "n"}},
		{"POST", "/exec/ns/p/c", Attributes{"create", "proxy", "n"}},
		{"GET", "/exec/ns/p/c", Attributes{"get", "proxy", "n"}}, // websocket exec
		{"POST", "/portForward/ns/p", Attributes{"create", "proxy", "n"}},
		{"POST", "/attach/ns/p/c", Attributes{"create", "proxy", "n"}},
		{"POST", "/run/ns/p/c", Attributes{"create", "proxy", "n"}},
		{"GET", "/pods", Attributes{"get", "proxy", "n"}},
		{"GET", "/healthz", Attributes{"get", "proxy", "n"}},
		{"PUT", "/x", Attributes{"update", "proxy", "n"}},
		{"PATCH", "/x", Attributes{"patch", "proxy", "n"}},
		{"DELETE", "/x", Attributes{"delete", "proxy", "n"}},
		{"HEAD", "/x", Attributes{"get", "proxy", "n"}},
		{"OPTIONS", "/x", Attributes{"", "proxy", "n"}},
	} {
		if got := RequestAttributes(c.method, c.path, "n"); got != c.want {
			t.Errorf("%s %s: %+v, want %+v", c.method, c.path, got, c.want)
		}
	}
}

func TestParsePorts(t *testing.T) {
	got, err := ParsePorts("10300-10302, 10310,10301")
	if err != nil || !slices.Equal(got, []int32{10300, 10301, 10302, 10310}) {
		t.Errorf("ParsePorts: %v %v", got, err)
	}
	for _, bad := range []string{"", "none", "0", "70000", "10-5", "1-x"} {
		if _, err := ParsePorts(bad); err == nil {
			t.Errorf("ParsePorts(%q) accepted", bad)
		}
	}
}

func nodeWithPort(name string, port int32) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = port
	return n
}

// The ports the Nodes record come back to them (a new leader), before free ones are handed out;
// a recorded port outside the pool or taken is replaced; the pool running out is an error.
func TestPortsKeepRecordedAssignments(t *testing.T) {
	existing := []*v1.Node{nodeWithPort("b", 11), nodeWithPort("a", 12), nodeWithPort("c", 12), nodeWithPort("d", 99)}
	p, err := NewPorts("10.0.0.5", []int32{10, 11, 12, 13}, func() []*v1.Node { return existing })
	if err != nil {
		t.Fatal(err)
	}
	// "new" asks first, yet cannot take 11 or 12: they are b's and a's (a before c by name).
	ip, port, err := p.Endpoint("new", 0)
	if err != nil || ip != "10.0.0.5" || port != 10 {
		t.Errorf("new node: %s %d %v, want 10.0.0.5 10", ip, port, err)
	}
	for node, want := range map[string]int32{"b": 11, "a": 12, "new": 10} {
		if got, _ := p.Port(node, 0); got != want {
			t.Errorf("node %s: port %d, want %d", node, got, want)
		}
	}
	if got, _ := p.Port("c", 12); got != 13 {
		t.Errorf("node c (12 is a's): port %d, want 13", got)
	}
	if _, err := p.Port("d", 99); err == nil || !strings.Contains(err.Error(), "widen --kubelet-ports") {
		t.Errorf("pool used up: %v", err)
	}
	p.Release("b")
	if got, _ := p.Port("d", 0); got != 11 {
		t.Errorf("after b's release: port %d, want 11", got)
	}
	if _, err := NewPorts("edge-1", []int32{1}, nil); err == nil {
		t.Error("a host name was accepted as the kubelet address")
	}
}

func TestParseLogOptions(t *testing.T) {
	q := url.Values{"follow": {"true"}, "tailLines": {"5"}, "limitBytes": {"10"}, "sinceTime": {"2026-01-02T03:04:05Z"},
		"previous": {"1"}, "timestamps": {"false"}}
	o, err := parseLogOptions(q)
	if err != nil {
		t.Fatal(err)
	}
	r := o.request("ns", "p", "c", o.sinceTime.Add(0))
	if !r.Follow || !r.Previous || r.Timestamps || r.Tail != 5 || r.SinceTime.Format("2006-01-02T15:04:05Z07:00") != "2026-01-02T03:04:05Z" ||
		r.Namespace != "ns" || r.Pod != "p" || r.Container != "c" {
		t.Errorf("request %+v", r)
	}
	for _, bad := range []url.Values{
		{"follow": {"yes please"}}, {"tailLines": {"-1"}}, {"limitBytes": {"0"}}, {"sinceSeconds": {"0"}},
		{"sinceSeconds": {"5"}, "sinceTime": {"2026-01-02T03:04:05Z"}}, {"sinceTime": {"yesterday"}},
	} {
		if _, err := parseLogOptions(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// The byte limit cuts inside a chunk and stops the stream; the status goes out with the first
// bytes.
func TestLogWriterLimit(t *testing.T) {
	rec := httptest.NewRecorder()
	l := &logWriter{w: rec, limit: 5}
	if _, err := l.Write([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Write([]byte("defg")); err == nil {
		t.Error("the write past the limit did not stop the stream")
	}
	if rec.Code != http.StatusOK || rec.Body.String() != "abcde" {
		t.Errorf("%d %q, want 200 abcde", rec.Code, rec.Body.String())
	}
}

func TestSummaryAndResourceMetrics(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prev := &protocol.Usage{Time: t0, Node: protocol.NodeUsage{CPUSeconds: 100},
		Containers: []protocol.ContainerUsage{{Namespace: "ns", Pod: "p", Container: "a", ID: "a1", CPUSeconds: 1}}}
	u := &protocol.Usage{Time: t0.Add(2 * time.Second), Node: protocol.NodeUsage{CPUSeconds: 101, MemoryWorkingSetBytes: 300, MemoryCapacityBytes: 1000},
		Containers: []protocol.ContainerUsage{
			{Namespace: "ns", Pod: "p", Container: "a", ID: "a1", CPUSeconds: 1.5, MemoryWorkingSetBytes: 10},
			{Namespace: "ns", Pod: "p", Container: "b", ID: "b2", CPUSeconds: 2, MemoryWorkingSetBytes: 20},
		}}
	started := metav1.NewTime(t0)
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-p"},
		Status: v1.PodStatus{StartTime: &started, ContainerStatuses: []v1.ContainerStatus{{Name: "a", State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: started}}}}}}

	s := buildSummary("edge-1", u, prev, []*v1.Pod{pod})
	n := s.Node
	if n.NodeName != "edge-1" || *n.CPU.UsageCoreNanoSeconds != 101e9 || *n.CPU.UsageNanoCores != 5e8 ||
		*n.Memory.WorkingSetBytes != 300 || *n.Memory.AvailableBytes != 700 {
		t.Errorf("node stats %+v cpu %+v memory %+v", n, *n.CPU, *n.Memory)
	}
	if len(s.Pods) != 1 {
		t.Fatalf("pods %+v", s.Pods)
	}
	p := s.Pods[0]
	if p.PodRef.UID != "uid-p" || len(p.Containers) != 2 || *p.CPU.UsageCoreNanoSeconds != 3.5e9 || *p.Memory.WorkingSetBytes != 30 ||
		!p.Containers[0].StartTime.Equal(&started) {
		t.Errorf("pod stats %+v", p)
	}
	// a's rate is known (0.5 s over 2 s); b has no earlier reading, so the pod's rate is a's only.
	if r := p.Containers[0].CPU.UsageNanoCores; r == nil || *r != 2.5e8 {
		t.Errorf("container a's rate %v, want 2.5e8", r)
	}
	if p.Containers[1].CPU.UsageNanoCores != nil {
		t.Errorf("container b has a rate without an earlier reading")
	}
	if first := buildSummary("edge-1", u, nil, nil); first.Node.CPU.UsageNanoCores != nil {
		t.Errorf("a first reading has a rate")
	}

	text := resourceMetricsText(u)
	for _, want := range []string{
		"node_cpu_usage_seconds_total 101 1767225602000\n",
		"node_memory_working_set_bytes 300 1767225602000\n",
		`container_cpu_usage_seconds_total{container="a",namespace="ns",pod="p"} 1.5 1767225602000` + "\n",
		`container_memory_working_set_bytes{container="b",namespace="ns",pod="p"} 20 1767225602000` + "\n",
		`pod_cpu_usage_seconds_total{namespace="ns",pod="p"} 3.5 1767225602000` + "\n",
		`pod_memory_working_set_bytes{namespace="ns",pod="p"} 30 1767225602000` + "\n",
		"# TYPE container_cpu_usage_seconds_total counter\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics/resource lacks %q:\n%s", want, text)
		}
	}
}

// Answers are cached as kubelet caches them: an allowed request for 5 min, a denied one for 30 s,
// a token for 2 min; the cache never keys on a token's text alone being equal to another.
func TestAuthCaches(t *testing.T) {
	cs := fake.NewSimpleClientset()
	var reviews, sars int
	allowed := false
	cs.PrependReactor("create", "tokenreviews", func(action k8stesting.Action) (bool, runtime.Object, error) {
		reviews++
		tr := action.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview)
		tr.Status = authnv1.TokenReviewStatus{Authenticated: tr.Spec.Token == "good", User: authnv1.UserInfo{Username: "sa", Groups: []string{"g"}}}
		return true, tr, nil
	})
	cs.PrependReactor("create", "subjectaccessreviews", func(action k8stesting.Action) (bool, runtime.Object, error) {
		sars++
		sar := action.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview)
		sar.Status.Allowed = allowed
		return true, sar, nil
	})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := &Auth{Kube: cs, Now: func() time.Time { return now }}
	req := httptest.NewRequest("GET", "/pods", nil)
	req.Header.Set("Authorization", "Bearer good")
	for range 2 {
		if u, err := a.Authenticate(context.Background(), req); err != nil || u.Name != "sa" {
			t.Fatalf("Authenticate: %+v %v", u, err)
		}
	}
	bad := httptest.NewRequest("GET", "/pods", nil)
	bad.Header.Set("Authorization", "Bearer bad")
	if _, err := a.Authenticate(context.Background(), bad); err == nil {
		t.Error("a token the API does not authenticate was taken")
	}
	if reviews != 2 {
		t.Errorf("%d TokenReviews, want 2 (the good token's second use cached)", reviews)
	}

	u := &User{Name: "sa", Groups: []string{"g"}}
	at := RequestAttributes("GET", "/pods", "n")
	authorize := func() bool {
		ok, _, err := a.Authorize(context.Background(), u, at)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if authorize() || authorize() || sars != 1 {
		t.Errorf("denied twice with %d SubjectAccessReviews, want 1", sars)
	}
	allowed = true
	now = now.Add(29 * time.Second)
	if authorize() {
		t.Error("a denial was forgotten before 30 s")
	}
	now = now.Add(2 * time.Second)
	if !authorize() || !authorize() || sars != 2 {
		t.Errorf("after the denial expired: %d SubjectAccessReviews, want 2", sars)
	}
	if _, _, err := a.Authorize(context.Background(), u, RequestAttributes("GET", "/stats/summary", "n")); err != nil || sars != 3 {
		t.Errorf("other attributes share the cached answer (%d reviews)", sars)
	}
}

// The stats of a node name only the pods the API binds to it: a node (or the broker, as the
// answer is not signed) cannot report figures for other nodes' pods (found by review).
func TestUsageOnlyOfBoundPods(t *testing.T) {
	u := &protocol.Usage{Containers: []protocol.ContainerUsage{
		{Namespace: "default", Pod: "mine", Container: "c"},
		{Namespace: "default", Pod: "elsewhere", Container: "c"},
		{Namespace: "other", Pod: "mine", Container: "c"},
	}}
	mine := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "mine"}}
	got := onlyBoundPods(u, []*v1.Pod{mine})
	if len(got.Containers) != 1 || got.Containers[0].Pod != "mine" || got.Containers[0].Namespace != "default" {
		t.Errorf("containers %+v, want only default/mine's", got.Containers)
	}
	if len(u.Containers) != 3 {
		t.Error("the reading itself was changed")
	}
	text := resourceMetricsText(got)
	if strings.Contains(text, "elsewhere") {
		t.Errorf("metrics name a pod not bound to the node:\n%s", text)
	}
}
