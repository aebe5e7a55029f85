package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/mqlet/mqlet/agent/api"
	"github.com/mqlet/mqlet/agent/config"
)

var now = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) *metav1.Time { t := metav1.NewTime(now.Add(-d)); return &t }

func running(name string, ready bool, restarts int32) v1.ContainerStatus {
	return v1.ContainerStatus{Name: name, Ready: ready, RestartCount: restarts,
		State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: *ago(time.Minute)}}}
}

func waiting(name, reason string) v1.ContainerStatus {
	return v1.ContainerStatus{Name: name, State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: reason}}}
}

func terminated(name, reason string, code, signal int32) v1.ContainerStatus {
	return v1.ContainerStatus{Name: name, State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{
		Reason: reason, ExitCode: code, Signal: signal}}}
}

// mkPod builds a pod whose spec has one container per status, in order.
func mkPod(phase v1.PodPhase, statuses ...v1.ContainerStatus) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p"},
		Status:     v1.PodStatus{Phase: phase, ContainerStatuses: statuses},
	}
	for _, s := range statuses {
		p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: s.Name, Image: "img-" + s.Name})
	}
	return p
}

func TestSummarizePodStatus(t *testing.T) {
	boolp := func(b bool) *bool { return &b }
	always := v1.ContainerRestartPolicyAlways
	tests := []struct {
		name   string
		pod    *v1.Pod
		status string
		ready  string
	}{
		{"phase when all run", mkPod(v1.PodRunning, running("a", true, 0), running("b", true, 0)), "Running", "2/2"},
		{"pending with no statuses", mkPod(v1.PodPending), "Pending", "0/0"},
		{"pod reason wins over phase", func() *v1.Pod {
			p := mkPod(v1.PodFailed, terminated("a", "Error", 1, 0))
			p.Status.Reason = "Evicted"
			p.Status.ContainerStatuses = nil
			return p
		}(), "Evicted", "0/1"},
		{"waiting reason", mkPod(v1.PodPending, waiting("a", "ContainerCreating")), "ContainerCreating", "0/1"},
		{"image pull error", mkPod(v1.PodPending, waiting("a", "ErrImagePull")), "ErrImagePull", "0/1"},
		{"crashloop beside a running one", mkPod(v1.PodRunning, running("a", true, 0), waiting("b", "CrashLoopBackOff")), "CrashLoopBackOff", "1/2"},
		{"first non-running container in spec order wins", mkPod(v1.PodPending, waiting("a", "ErrImagePull"), waiting("b", "ContainerCreating")), "ErrImagePull", "0/2"},
		{"terminated completed", mkPod(v1.PodSucceeded, terminated("a", "Completed", 0, 0)), "Completed", "0/1"},
		{"terminated error", mkPod(v1.PodFailed, terminated("a", "Error", 2, 0)), "Error", "0/1"},
		{"oom killed", mkPod(v1.PodRunning, terminated("a", "OOMKilled", 137, 0)), "OOMKilled", "0/1"},
		{"signal without reason", mkPod(v1.PodFailed, terminated("a", "", 0, 9)), "Signal:9", "0/1"},
		{"exit code without reason", mkPod(v1.PodFailed, terminated("a", "", 3, 0)), "ExitCode:3", "0/1"},
		{"completed sidecar-style but another running and pod ready", func() *v1.Pod {
			p := mkPod(v1.PodRunning, running("a", true, 0), terminated("b", "Completed", 0, 0))
			p.Status.Conditions = []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}
			return p
		}(), "Running", "1/2"},
		{"completed but another running and pod not ready", mkPod(v1.PodRunning, running("a", true, 0), terminated("b", "Completed", 0, 0)), "NotReady", "1/2"},
		{"running but not ready", mkPod(v1.PodRunning, running("a", false, 0)), "Running", "0/1"},
		{"terminating", func() *v1.Pod {
			p := mkPod(v1.PodRunning, running("a", true, 0))
			p.DeletionTimestamp = ago(time.Second)
			return p
		}(), "Terminating", "1/1"},
		{"deleted after it finished is not terminating", func() *v1.Pod {
			p := mkPod(v1.PodSucceeded, terminated("a", "Completed", 0, 0))
			p.DeletionTimestamp = ago(time.Second)
			return p
		}(), "Completed", "0/1"},
		{"init container running", func() *v1.Pod {
			p := mkPod(v1.PodPending, waiting("a", "PodInitializing"))
			p.Spec.InitContainers = []v1.Container{{Name: "i1"}, {Name: "i2"}}
			p.Status.InitContainerStatuses = []v1.ContainerStatus{terminated("i1", "Completed", 0, 0), running("i2", false, 0)}
			return p
		}(), "Init:1/2", "0/1"},
		{"init container failed", func() *v1.Pod {
			p := mkPod(v1.PodPending, waiting("a", "PodInitializing"))
			p.Spec.InitContainers = []v1.Container{{Name: "i1"}}
			p.Status.InitContainerStatuses = []v1.ContainerStatus{terminated("i1", "", 1, 0)}
			return p
		}(), "Init:ExitCode:1", "0/1"},
		{"init container crashlooping", func() *v1.Pod {
			p := mkPod(v1.PodPending, waiting("a", "PodInitializing"))
			p.Spec.InitContainers = []v1.Container{{Name: "i1"}}
			p.Status.InitContainerStatuses = []v1.ContainerStatus{waiting("i1", "CrashLoopBackOff")}
			return p
		}(), "Init:CrashLoopBackOff", "0/1"},
		{"started sidecar counts as a ready container", func() *v1.Pod {
			p := mkPod(v1.PodRunning, running("a", true, 0))
			p.Spec.InitContainers = []v1.Container{{Name: "side", RestartPolicy: &always}}
			side := running("side", true, 0)
			side.Started = boolp(true)
			p.Status.InitContainerStatuses = []v1.ContainerStatus{side}
			p.Status.Conditions = []v1.PodCondition{{Type: v1.PodInitialized, Status: v1.ConditionTrue}}
			return p
		}(), "Running", "2/2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := summarizePod(tt.pod)
			if s.status != tt.status {
				t.Errorf("status = %q, want %q", s.status, tt.status)
			}
			if got := fmt.Sprintf("%d/%d", s.ready, s.total); got != tt.ready {
				t.Errorf("ready = %s, want %s", got, tt.ready)
			}
		})
	}
}

func TestRestartsSumAndLastRestart(t *testing.T) {
	a := running("a", true, 2)
	a.LastTerminationState.Terminated = &v1.ContainerStateTerminated{Reason: "Error", FinishedAt: *ago(5 * time.Minute)}
	b := running("b", true, 3)
	b.LastTerminationState.Terminated = &v1.ContainerStateTerminated{Reason: "OOMKilled", FinishedAt: *ago(90 * time.Second)}
	p := mkPod(v1.PodRunning, a, b)
	p.Status.StartTime = ago(time.Hour)

	s := summarizePod(p)
	if s.restarts != 5 {
		t.Errorf("restarts = %d, want 5", s.restarts)
	}
	var out bytes.Buffer
	if err := printPodTable(&out, []v1.Pod{*p}, false, now); err != nil {
		t.Fatal(err)
	}
	// The most recent restart is the one reported, like kubectl.
	if !strings.Contains(out.String(), "5 (90s ago)") {
		t.Errorf("table lacks \"5 (90s ago)\":\n%s", out.String())
	}
}

func TestHumanAge(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{5 * time.Second, "5s"},
		{119 * time.Second, "119s"},
		{3*time.Minute + 12*time.Second, "3m12s"},
		{45 * time.Minute, "45m"},
		{2 * time.Hour, "120m"},
		{5*time.Hour + 30*time.Minute, "5h30m"},
		{20 * time.Hour, "20h"},
		{4 * 24 * time.Hour, "4d"},
		{30 * 24 * time.Hour, "30d"},
	}
	for _, tt := range tests {
		if got := humanAge(now.Add(-tt.d), now); got != tt.want {
			t.Errorf("humanAge(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
	if got := humanAge(time.Time{}, now); got != "<unknown>" {
		t.Errorf("humanAge(zero) = %q, want <unknown>", got)
	}
}

func TestAgePrefersStartTime(t *testing.T) {
	p := mkPod(v1.PodRunning, running("a", true, 0))
	p.CreationTimestamp = *ago(4 * 24 * time.Hour)
	if got := humanAge(podAgeStart(p), now); got != "4d" {
		t.Errorf("age from creationTimestamp = %q, want 4d", got)
	}
	p.Status.StartTime = ago(5 * time.Second)
	if got := humanAge(podAgeStart(p), now); got != "5s" {
		t.Errorf("age from startTime = %q, want 5s", got)
	}
}

func samplePods() *v1.PodList {
	web := mkPod(v1.PodRunning, running("web", true, 0), running("log", true, 1))
	web.Name, web.Namespace = "web", "default"
	web.Spec.NodeName = "edge-1"
	web.Status.PodIP = "10.88.0.7"
	web.Status.StartTime = ago(3*time.Minute + 12*time.Second)
	web.Labels = map[string]string{"app": "web"}

	db := mkPod(v1.PodPending, waiting("db", "ErrImagePull"))
	db.Name, db.Namespace = "db", "factory"
	db.Status.StartTime = ago(2 * 24 * time.Hour)

	return &v1.PodList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodList"}, Items: []v1.Pod{*web, *db}}
}

func TestPrintTable(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := printPods(&out, &errOut, samplePods(), "", now); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"NAMESPACE   NAME   READY   STATUS         RESTARTS   AGE\n" +
		"default     web    2/2     Running        1          3m12s\n" +
		"factory     db     0/1     ErrImagePull   0          2d\n"
	if out.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", out.String(), want)
	}
	if errOut.Len() != 0 {
		t.Errorf("stderr = %q", errOut.String())
	}
}

func TestPrintWide(t *testing.T) {
	var out bytes.Buffer
	if err := printPods(&out, &out, samplePods(), "wide", now); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if f := strings.Fields(lines[0]); strings.Join(f[6:], " ") != "IP NODE CONTAINERS IMAGES" {
		t.Errorf("wide header = %q", lines[0])
	}
	if f := strings.Fields(lines[1]); strings.Join(f[6:], " ") != "10.88.0.7 edge-1 web,log img-web,img-log" {
		t.Errorf("wide row = %q", lines[1])
	}
	if f := strings.Fields(lines[2]); strings.Join(f[6:], " ") != "<none> <none> db img-db" {
		t.Errorf("wide row without ip/node = %q", lines[2])
	}
}

func TestPrintEmpty(t *testing.T) {
	var out, errOut bytes.Buffer
	empty := &v1.PodList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodList"}}
	if err := printPods(&out, &errOut, empty, "", now); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 0 || strings.TrimSpace(errOut.String()) != "No resources found." {
		t.Errorf("empty table: stdout %q stderr %q", out.String(), errOut.String())
	}
	out.Reset()
	if err := printPods(&out, &errOut, empty, "json", now); err != nil {
		t.Fatal(err)
	}
	var back v1.PodList
	if err := json.Unmarshal(out.Bytes(), &back); err != nil || back.Kind != "PodList" {
		t.Errorf("empty json list = %q (%v)", out.String(), err)
	}
}

func TestPrintJSONAndYAMLRoundTrip(t *testing.T) {
	in := samplePods()
	for _, format := range []string{"json", "yaml"} {
		var out bytes.Buffer
		if err := printPods(&out, &out, in, format, now); err != nil {
			t.Fatal(err)
		}
		var back v1.PodList
		var err error
		if format == "json" {
			if !strings.Contains(out.String(), "\n    \"") {
				t.Errorf("json is not indented:\n%s", out.String())
			}
			err = json.Unmarshal(out.Bytes(), &back)
		} else {
			err = yaml.UnmarshalStrict(out.Bytes(), &back)
		}
		if err != nil {
			t.Fatalf("%s output does not parse as a PodList: %v\n%s", format, err, out.String())
		}
		if back.Kind != "PodList" || back.APIVersion != "v1" || len(back.Items) != 2 {
			t.Fatalf("%s round trip: %+v", format, back.TypeMeta)
		}
		if back.Items[0].Status.PodIP != "10.88.0.7" || back.Items[1].Status.ContainerStatuses[0].State.Waiting.Reason != "ErrImagePull" ||
			!back.Items[0].Status.StartTime.Equal(in.Items[0].Status.StartTime) {
			t.Errorf("%s round trip lost fields: %+v", format, back.Items)
		}
	}
}

func TestDescribePod(t *testing.T) {
	p := &samplePods().Items[0]
	p.UID = "0b7c-uid"
	p.Status.HostIP = "192.168.1.20"
	p.Status.QOSClass = v1.PodQOSBurstable
	p.Annotations = map[string]string{"b": "2", "a": "1"}
	c := &p.Spec.Containers[0]
	c.Command = []string{"sh", "-c"}
	c.Args = []string{"httpd -f\necho done"}
	c.Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}
	c.Resources.Requests = v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m")}
	c.Env = []v1.EnvVar{
		{Name: "MODE", Value: "edge"},
		{Name: "TOKEN", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{
			LocalObjectReference: v1.LocalObjectReference{Name: "creds"}, Key: "token"}}},
	}
	cs := &p.Status.ContainerStatuses[1]
	cs.ContainerID = "containerd://abc"
	cs.LastTerminationState.Terminated = &v1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137,
		StartedAt: *ago(10 * time.Minute), FinishedAt: *ago(9 * time.Minute)}
	p.Status.Conditions = []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: *ago(time.Minute)}}

	var out bytes.Buffer
	if err := describePod(&out, p, now); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	// Compare with runs of spaces collapsed: alignment is tabwriter's job,
	// content and order are ours.
	norm := strings.Join(strings.Fields(got), " ")
	for _, want := range []string{
		"Name: web Namespace: default UID: 0b7c-uid Node: edge-1/192.168.1.20",
		"Start Time: " + ago(3*time.Minute+12*time.Second).Format(time.RFC1123Z),
		"Labels: app=web Annotations: a=1 b=2 Status: Running IP: 10.88.0.7 QoS Class: Burstable",
		"Containers: web: Container ID: <none> Image: img-web",
		"Command: sh -c Args: httpd -f echo done State: Running Started:",
		"Ready: True Restart Count: 0 Limits: memory: 64Mi Requests: cpu: 100m",
		"Environment: MODE: edge TOKEN: <set to the key 'token' in secret 'creds'> Optional: false",
		"log: Container ID: containerd://abc Image: img-log",
		"Last State: Terminated Reason: OOMKilled Exit Code: 137",
		"Ready: True Restart Count: 1 Environment: <none>",
		"Conditions: Type Status Reason Last Transition Ready True <none> 60s ago",
	} {
		if !strings.Contains(norm, want) {
			t.Errorf("describe output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "Reason:\t") || strings.Contains(norm, "Message:") {
		t.Errorf("describe printed empty pod Reason/Message:\n%s", got)
	}
}

func TestSplitPodRef(t *testing.T) {
	for _, tt := range []struct{ def, ref, ns, name string }{
		{"default", "web", "default", "web"},
		{"default", "factory/db", "factory", "db"},
	} {
		ns, name, err := splitPodRef(tt.def, tt.ref)
		if err != nil || ns != tt.ns || name != tt.name {
			t.Errorf("splitPodRef(%q, %q) = %q, %q, %v", tt.def, tt.ref, ns, name, err)
		}
	}
	for _, bad := range []string{"/web", "ns/", "a/b/c", ""} {
		if _, _, err := splitPodRef("default", bad); err == nil {
			t.Errorf("splitPodRef(%q) accepted", bad)
		}
	}
}

// listProvider serves fixed pods through the real API server, so the
// commands are tested over a real unix socket.
type listProvider struct{ pods []v1.Pod }

func (p listProvider) Pods() []v1.Pod { return p.pods }
func (p listProvider) Ready() error   { return nil }

func serveAPI(t *testing.T, pods []v1.Pod) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mq") // short: sun_path is 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "api.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.NewServer(listProvider{pods}, nil).Serve(ctx, sock) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		os.RemoveAll(dir)
	})
	c := api.NewClient(sock)
	for c.Ready(context.Background()) != nil {
		select {
		case err := <-done:
			t.Fatalf("Serve(%s) returned early: %v", sock, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	return sock
}

func TestCommandsOverSocket(t *testing.T) {
	sock := serveAPI(t, samplePods().Items)

	var out, errOut bytes.Buffer
	cmd := &PodsCmd{APISocket: sock, Namespace: "factory"}
	if err := cmd.run(context.Background(), &out, &errOut, now); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], "factory") {
		t.Errorf("pods -n factory:\n%s", out.String())
	}

	out.Reset()
	d := &DescribePodCmd{APISocket: sock, Namespace: "default", Name: "factory/db"}
	if err := d.run(context.Background(), &out, now); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "ErrImagePull") {
		t.Errorf("describe factory/db:\n%s", out.String())
	}

	d = &DescribePodCmd{APISocket: sock, Namespace: "default", Name: "x"}
	err := d.run(context.Background(), &out, now)
	if err == nil || err.Error() != "pod default/x not found" {
		t.Errorf("describe missing pod: err = %v, want \"pod default/x not found\"", err)
	}
}

func TestCommandWithoutAgent(t *testing.T) {
	cmd := &PodsCmd{APISocket: "/nonexistent/mqlet.sock"}
	err := cmd.run(context.Background(), &bytes.Buffer{}, &bytes.Buffer{}, now)
	if err == nil || !strings.Contains(err.Error(), `cannot reach the mqlet agent at /nonexistent/mqlet.sock (is "mqlet agent" running? use --api-socket)`) {
		t.Errorf("err = %v", err)
	}
}

// The lead embeds these structs in the CLI root; check that kong accepts
// their tags, including the empty enum value that selects the table.
func TestKongFlags(t *testing.T) {
	var cli struct {
		Pods     PodsCmd     `cmd:""`
		Describe DescribeCmd `cmd:""`
	}
	parser, err := kong.New(&cli, kong.Exit(func(int) { t.Fatal("kong tried to exit") }), kong.Vars(config.Vars()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parser.Parse([]string{"pods"}); err != nil {
		t.Fatal(err)
	}
	if cli.Pods.Output != "" || cli.Pods.APISocket != "/run/mqlet/mqlet.sock" || cli.Pods.Namespace != "" {
		t.Errorf("pods defaults = %+v", cli.Pods)
	}
	if _, err := parser.Parse([]string{"pods", "-o", "wide", "-n", "factory", "--api-socket", "/tmp/x.sock"}); err != nil {
		t.Fatal(err)
	}
	if cli.Pods.Output != "wide" || cli.Pods.Namespace != "factory" || cli.Pods.APISocket != "/tmp/x.sock" {
		t.Errorf("pods flags = %+v", cli.Pods)
	}
	if _, err := parser.Parse([]string{"pods", "-o", "xml"}); err == nil {
		t.Error("-o xml accepted")
	}
	if _, err := parser.Parse([]string{"describe", "pod", "web"}); err != nil {
		t.Fatal(err)
	}
	if cli.Describe.Pod.Name != "web" || cli.Describe.Pod.Namespace != "default" {
		t.Errorf("describe pod = %+v", cli.Describe.Pod)
	}
}
