package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/internal/testpki"
	"github.com/mqlet/mqlet/sync/ctlclient"
	"github.com/mqlet/mqlet/sync/logserve"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/sealing"

	"github.com/alecthomas/kong"
	mqtt "github.com/eclipse/paho.mqtt.golang"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

const ctlTestTimeout = 10 * time.Second

var ctlTopics = protocol.MustTopics(protocol.DefaultPrefix)

// ctlRun runs `mqlet ctl args...` in-process, with stdin and the clock of the tests.
func ctlRun(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	var c cli
	p, err := parser(&c, kong.Exit(func(int) { t.Fatalf("kong tried to exit on ctl %v", args) }), kong.Writers(&out, &errOut))
	if err != nil {
		t.Fatal(err)
	}
	kctx, err := p.Parse(append([]string{"ctl"}, args...))
	if err != nil {
		return "", "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = kctx.Run(&ctlEnv{ctx: ctx, in: strings.NewReader(stdin), out: &out, errOut: &errOut, now: func() time.Time { return now }})
	return out.String(), errOut.String(), err
}

// ctlOK is ctlRun that must succeed.
func ctlOK(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := ctlRun(t, "", args...)
	if err != nil {
		t.Fatalf("ctl %s: %v\nstderr: %s", strings.Join(args, " "), err, errOut)
	}
	return out
}

// ctlRaw is a plain MQTT client playing a node.
func ctlRaw(t *testing.T, broker string) mqtt.Client {
	t.Helper()
	cl := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(broker).SetClientID(fmt.Sprintf("fake-%d", time.Now().UnixNano())).
		SetAutoReconnect(false).SetConnectTimeout(ctlTestTimeout))
	if tok := cl.Connect(); !tok.WaitTimeout(ctlTestTimeout) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", broker, tok.Error())
	}
	t.Cleanup(func() { cl.Disconnect(100) })
	return cl
}

func ctlPublish(t *testing.T, cl mqtt.Client, topic string, v any) {
	t.Helper()
	payload, err := protocol.Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	if tok := cl.Publish(topic, 1, true, payload); !tok.WaitTimeout(ctlTestTimeout) || tok.Error() != nil {
		t.Fatalf("publish %s: %v", topic, tok.Error())
	}
}

// ctlRetained reads every retained message under filter, ended by ctlclient's marker (not by a
// quiet period, which could end a read before a late message and make "nothing written" pass).
func ctlRetained(t *testing.T, broker, filter string) map[string][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ctlTestTimeout)
	defer cancel()
	c, err := ctlclient.Connect(ctx, ctlclient.Options{Broker: broker})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := c.Snapshot(ctx, filter)
	if err != nil {
		t.Fatalf("snapshot %s: %v", filter, err)
	}
	return got
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const ctlManifests = `# a web server with its configuration
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: nginx
    image: nginx:1.27
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: web-config
data:
  index.html: hello
---
apiVersion: v1
kind: Secret
metadata:
  name: web-token
  namespace: prod
stringData:
  token: s3cret
---
apiVersion: v1
kind: Pod
metadata:
  name: db
spec:
  containers:
  - name: db
    image: postgres:17
`

func TestCtlApplyAndDelete(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	// The node published its status (with its sealing key) once, and no acks.
	sealKey, err := sealing.Generate()
	if err != nil {
		t.Fatal(err)
	}
	ctlPublish(t, ctlRaw(t, b.Plain), ctlTopics.NodeStatus("edge-1"), &protocol.NodeStatus{Node: "edge-1",
		Object: &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1", Annotations: map[string]string{sealing.AnnotationKey: sealKey.Public()}}}})
	file := writeFile(t, "app.yaml", ctlManifests)
	out, errOut, err := ctlRun(t, "", "--broker", b.Plain, "apply", "-f", file, "--node", "edge-1")
	if err != nil {
		t.Fatalf("apply: %v\n%s", err, errOut)
	}
	// A node the broker never heard of: said so, and that the objects wait for it.
	for _, want := range []string{"Warning: node edge-1 has never reported to this broker", "node edge-1 is unknown: the objects are queued for it"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("apply to a new node: stderr lacks %q:\n%s", want, errOut)
		}
	}
	want := "pod/default/web created (generation 1)\nconfigmap/default/web-config created (generation 1)\n" +
		"secret/prod/web-token created (generation 1)\npod/default/db created (generation 1)\n"
	if out != want {
		t.Errorf("apply printed:\n%s\nwant:\n%s", out, want)
	}

	// What a node would get: the retained desired objects and the index.
	got := ctlRetained(t, b.Plain, ctlTopics.Node("edge-1")+"/#")
	objs := map[string]*protocol.DesiredObject{}
	for topic, payload := range got {
		tt, err := ctlTopics.Parse(topic)
		if err != nil {
			t.Fatal(err)
		}
		if tt.Class != protocol.ClassDesired {
			continue
		}
		d, err := protocol.DecodeDesired(tt, payload, 0)
		if err != nil {
			t.Fatalf("%s: %v", topic, err)
		}
		objs[d.Key()] = d
	}
	if len(objs) != 4 || objs["pods/default/web"].Pod.Spec.Containers[0].Image != "nginx:1.27" ||
		objs["configmaps/default/web-config"].ConfigMap.Data["index.html"] != "hello" {
		t.Fatalf("retained desired objects: %v", objs)
	}
	sec := objs["secrets/prod/web-token"]
	if len(sec.Secret.Data) != 0 || len(sec.Secret.StringData) != 0 || sec.Sealed == nil {
		t.Errorf("secret sent as %+v, want its data sealed", sec.Secret)
	} else if err := sealKey.Open("edge-1", sec.Secret, sec.Sealed); err != nil || string(sec.Secret.Data["token"]) != "s3cret" {
		t.Errorf("secret opened with the node's key: %q, %v; want stringData folded into data", sec.Secret.Data, err)
	}
	idx, err := protocol.DecodeIndex(protocol.Topic{Class: protocol.ClassIndex, Node: "edge-1"}, got[ctlTopics.Index("edge-1")], 0)
	if err != nil || idx.Revision != 1 || len(idx.Objects) != 4 {
		t.Fatalf("index = %+v, %v", idx, err)
	}

	// The same web from stdin: unchanged, nothing written; a changed web: configured, at the
	// next generation.
	web := ctlManifests[:strings.Index(ctlManifests, "---")]
	out, _, err = ctlRun(t, web, "--broker", b.Plain, "apply", "-f", "-", "--node", "edge-1")
	if err != nil || out != "pod/default/web unchanged (generation 1)\n" {
		t.Errorf("apply of the same web = %q, %v", out, err)
	}
	out, _, err = ctlRun(t, strings.Replace(web, "nginx:1.27", "nginx:1.28", 1), "--broker", b.Plain, "apply", "-f", "-", "--node", "edge-1")
	if err != nil || out != "pod/default/web configured (generation 2)\n" {
		t.Errorf("apply of a changed web = %q, %v", out, err)
	}

	out = ctlOK(t, "--broker", b.Plain, "delete", "pod", "db", "--node", "edge-1")
	if out != "pod/default/db deleted (generation 3)\n" {
		t.Errorf("delete printed %q", out)
	}
	// v2 has no tombstones: the index leaves db out, and its retained topic is cleared.
	got = ctlRetained(t, b.Plain, ctlTopics.Node("edge-1")+"/#")
	if p, ok := got[ctlTopics.Desired("edge-1", protocol.KindPod, "default", "db")]; ok {
		t.Errorf("db's desired topic still holds %s after the delete", p)
	}
	idx, err = protocol.DecodeIndex(protocol.Topic{Class: protocol.ClassIndex, Node: "edge-1"}, got[ctlTopics.Index("edge-1")], 0)
	if err != nil || idx.Revision != 3 || len(idx.Objects) != 3 {
		t.Fatalf("index after the delete = %+v, %v; want revision 3 without db", idx, err)
	}
	if _, listed := idx.Objects["pods/default/db"]; listed {
		t.Errorf("the index still lists db: %+v", idx)
	}
	ctlOK(t, "--broker", b.Plain, "delete", "secret", "prod/web-token", "--node", "edge-1")
	_, _, err = ctlRun(t, "", "--broker", b.Plain, "delete", "cm", "nope", "--node", "edge-1")
	if err == nil || err.Error() != "ctl delete: configmap/default/nope not found on node edge-1" {
		t.Errorf("delete of a missing configmap = %v", err)
	}
}

func TestCtlApplyRefusesBadDocuments(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	bad := `apiVersion: v1
kind: Pod
metadata:
  name: ok
spec:
  containers:
  - name: c
    image: busybox
---
apiVersion: v1
kind: Pod
metadata:
  name: typo
spec:
  containers:
  - name: c
    image: busybox
    imagePullPolcy: Always
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: d
---
apiVersion: v1
kind: Pod
metadata:
  name: noimage
spec:
  containers:
  - name: c
---
apiVersion: v1
kind: Pod
metadata:
  name: elsewhere
spec:
  nodeName: edge-2
  containers:
  - name: c
    image: busybox
`
	file := writeFile(t, "bad.yaml", bad)
	_, _, err := ctlRun(t, "", "--broker", b.Plain, "apply", "-f", file, "--node", "edge-1")
	if err == nil {
		t.Fatal("apply of bad documents succeeded")
	}
	for _, want := range []string{
		"ctl apply " + file + ": 3 documents refused, nothing applied:",
		`document 1 (line 10): unknown field "spec.containers[0].imagePullPolcy"`,
		"document 2 (line 20): kind Deployment is not supported",
		`document 4 (line 33): pod default/elsewhere: spec.nodeName is "edge-2", but it is being applied to node "edge-1"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	// A pod without an image is the node's to refuse (validation is admission's), not ctl's.
	if strings.Contains(err.Error(), "noimage") {
		t.Errorf("ctl judged a pod the node judges:\n%v", err)
	}
	if got := ctlRetained(t, b.Plain, ctlTopics.Node("edge-1")+"/#"); len(got) != 0 {
		t.Errorf("a refused apply wrote %d messages", len(got))
	}

	// One problem: the error reads "ctl apply FILE: document N (line L): ...".
	file = writeFile(t, "one.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: b\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n")
	_, _, err = ctlRun(t, "", "--broker", b.Plain, "apply", "-f", file, "--node", "edge-1")
	if err == nil || err.Error() != "ctl apply "+file+": document 1 (line 8): configmaps/default/c is already declared in document 0" {
		t.Errorf("duplicate = %v", err)
	}
	_, _, err = ctlRun(t, "", "--broker", "tcp://127.0.0.1:1", "apply", "-f", writeFile(t, "p.yaml", ctlManifests), "--node", "edge-1")
	if err == nil || !strings.HasPrefix(err.Error(), "ctl apply ") || !strings.Contains(err.Error(), "connect tcp://127.0.0.1:1") {
		t.Errorf("apply to no broker = %v", err)
	}
}

// fakeNodeStatus publishes what node edge-1 would report: liveness, node status, pod statuses.
func fakeNodeStatus(t *testing.T, b *mqtttest.Broker) {
	t.Helper()
	cl := ctlRaw(t, b.Plain)
	ctlPublish(t, cl, ctlTopics.Liveness("edge-1"), &protocol.Liveness{Node: "edge-1", Online: true, Session: 7, Time: now.Add(-time.Hour), Version: "v0.3.0"})
	sealKey, _ := sealing.FromNodeKey(make([]byte, 32))
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1", Annotations: map[string]string{sealing.AnnotationKey: sealKey.Public()}}, Status: v1.NodeStatus{
		Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady"}},
		Addresses:  []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.0.0.7"}},
		NodeInfo:   v1.NodeSystemInfo{Architecture: "arm64", KubeletVersion: "v0.3.0"},
	}}
	ctlPublish(t, cl, ctlTopics.NodeStatus("edge-1"), &protocol.NodeStatus{Node: "edge-1", Time: now.Add(-time.Minute), Object: node})
	ctlPublish(t, cl, ctlTopics.Liveness("edge-2"), &protocol.Liveness{Node: "edge-2", Online: false, Session: 2, Time: now.Add(-24 * time.Hour)})
	web := mkPod(v1.PodRunning, running("nginx", true, 1))
	web.Name, web.Spec.NodeName, web.Status.PodIP, web.Status.StartTime = "web", "edge-1", "10.88.0.4", ago(10*time.Minute)
	ctlPublish(t, cl, ctlTopics.PodStatus("edge-1", "default", "web"),
		&protocol.PodStatus{Node: "edge-1", Namespace: "default", Name: "web", Source: "mqtt", Generation: 1, Object: web})
	mon := mkPod(v1.PodPending, waiting("agent", "ImagePullBackOff"))
	mon.Name, mon.Namespace = "monitor", "kube-system"
	ctlPublish(t, cl, ctlTopics.PodStatus("edge-1", "kube-system", "monitor"),
		&protocol.PodStatus{Node: "edge-1", Namespace: "kube-system", Name: "monitor", Source: "file", Object: mon})
	ctlPublish(t, cl, ctlTopics.PodStatus("edge-1", "default", "gone"),
		&protocol.PodStatus{Node: "edge-1", Namespace: "default", Name: "gone", Source: "mqtt", Generation: 1, Deleted: true})
	ctlPublish(t, cl, ctlTopics.Summary("edge-1"), &protocol.StatusSummary{Node: "edge-1", Pods: 2, Digest: "x"})
	ctlPublish(t, cl, ctlTopics.Acks("edge-1"), &protocol.Acks{Node: "edge-1", Session: 7, IndexRevision: 1,
		Applied: map[string]protocol.IndexEntry{"pods/default/web": {Generation: 1, Digest: ctlDigest}},
		Refused: map[string]protocol.Refusal{"pods/default/db": {Generation: 1, Digest: ctlDigest, Reason: "hostPath /etc is not allowed"}},
		Missing: map[string]protocol.IndexEntry{"configmaps/default/web-config": {Generation: 1, Digest: ctlDigest}}})
}

// ctlDigest is a well-formed digest for hand-made acks.
var ctlDigest = protocol.Digest([]byte("hand-made"))

func TestCtlGetPods(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	fakeNodeStatus(t, b)
	// The node's acks are at generation 1, so the apply writes 2; the node reports web at 1, and
	// the column says so. It refused db at 1: a row of its own, though nothing runs.
	file := writeFile(t, "app.yaml", ctlManifests)
	ctlOK(t, "--broker", b.Plain, "apply", "-f", file, "--node", "edge-1", "--wait=0")

	out := ctlOK(t, "--broker", b.Plain, "get", "pods", "--node", "edge-1")
	want := "NAMESPACE   NAME   NODE     READY   STATUS    RESTARTS   GENERATION                      AGE\n" +
		"default     db     edge-1   -       Refused   -          <none> (refused 1, desired 2)   <unknown>\n" +
		"default     web    edge-1   1/1     Running   1          1 (desired 2)                   10m\n"
	if out != want {
		t.Errorf("get pods:\n%s\nwant:\n%s", out, want)
	}
	out = ctlOK(t, "--broker", b.Plain, "get", "pods", "-A", "-o", "wide")
	for _, want := range []string{"kube-system   monitor   edge-1   0/1     ImagePullBackOff", "10.88.0.4   mqtt", "<none>      file",
		"node edge-1 refused generation 1: hostPath /etc is not allowed"} {
		if !strings.Contains(out, want) {
			t.Errorf("get pods -A -o wide lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "gone") {
		t.Errorf("a pod reported deleted is listed:\n%s", out)
	}

	out = ctlOK(t, "--broker", b.Plain, "get", "pods", "-A", "-o", "json")
	var list v1.PodList
	if strict, err := sigsjson.UnmarshalStrict([]byte(out), &list); err != nil || len(strict) > 0 {
		t.Fatalf("-o json is not a strict v1.PodList: %v %v\n%s", err, strict, out)
	}
	if list.Kind != "PodList" || list.APIVersion != "v1" || len(list.Items) != 3 || list.Items[0].Name != "db" ||
		list.Items[1].Name != "web" || list.Items[2].Name != "monitor" || list.Items[1].Kind != "Pod" || list.Items[2].Spec.NodeName != "edge-1" {
		t.Errorf("-o json = %+v", list)
	}
	// The refused pod reads as kubelet shows a pod its admission rejected.
	if st := list.Items[0].Status; st.Phase != v1.PodFailed || st.Reason != "Refused" || !strings.Contains(st.Message, "hostPath /etc is not allowed") {
		t.Errorf("-o json: the refused pod's status = %+v", st)
	}
	out, errOut, err := ctlRun(t, "", "--broker", b.Plain, "get", "pods", "-n", "nothing-here")
	if err != nil || out != "" || errOut != "No resources found.\n" {
		t.Errorf("get pods in an empty namespace = %q, %q, %v", out, errOut, err)
	}
	if _, _, err := ctlRun(t, "", "--broker", b.Plain, "get", "pods", "-n", "x", "-A"); err == nil {
		t.Error("-n with -A accepted")
	}
}

func TestCtlGetNodesAndDescribe(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	fakeNodeStatus(t, b)
	ctlOK(t, "--broker", b.Plain, "apply", "-f", writeFile(t, "app.yaml", ctlManifests), "--node", "edge-1", "--wait=0")

	out := ctlOK(t, "--broker", b.Plain, "get", "nodes")
	want := "NAME     STATUS    SINCE   SESSION   READY    VERSION\n" +
		"edge-1   online    60m     7         True     v0.3.0\n" +
		"edge-2   offline   24h     2         <none>   <none>\n"
	if out != want {
		t.Errorf("get nodes:\n%s\nwant:\n%s", out, want)
	}

	out = ctlOK(t, "--broker", b.Plain, "describe", "node", "edge-1")
	for _, want := range []string{"Status:", "online (session 7)", "Ready  True", "InternalIP:", "10.0.0.7",
		"index revision 2: 2 pods, 1 configmaps, 1 secrets", "index revision 1 (behind: the index is at 2), 1 applied, 1 refused, 1 missing",
		"pods/default/db  generation 1: hostPath /etc is not allowed", "Missing:", "configmaps/default/web-config  generation 1",
		"2 pods (all received)", "1 (desired 2)", "monitor", "ImagePullBackOff"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe node lacks %q:\n%s", want, out)
		}
	}

	out = ctlOK(t, "--broker", b.Plain, "describe", "pod", "web", "--node", "edge-1")
	for _, want := range []string{"Generation:  observed 1, desired 2 (index revision 2)", "Source:", "mqtt", "Name:", "web", "nginx", "Restart Count:"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe pod lacks %q:\n%s", want, out)
		}
	}
	out = ctlOK(t, "--broker", b.Plain, "describe", "pod", "db", "--node", "edge-1")
	for _, want := range []string{"<not reported>, desired 2", "Refused:", "generation 1: hostPath /etc is not allowed", "refused this pod and runs no version of it"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe of an unreported pod lacks %q:\n%s", want, out)
		}
	}
	if _, _, err := ctlRun(t, "", "--broker", b.Plain, "describe", "pod", "nope", "--node", "edge-1"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("describe of a missing pod = %v", err)
	}
	if _, _, err := ctlRun(t, "", "--broker", b.Plain, "describe", "node", "nobody"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("describe of a missing node = %v", err)
	}
}

// ctlPub publishes for logserve with a paho client.
type ctlPub struct{ c mqtt.Client }

func (p ctlPub) Publish(ctx context.Context, topic string, payload []byte) error {
	tok := p.c.Publish(topic, 1, false, payload)
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		return ctx.Err()
	}
}

type ctlFinder string

func (f ctlFinder) LogPath(namespace, name, container string, previous bool) (string, error) {
	if namespace != "default" || name != "web" {
		return "", &os.PathError{Op: "find", Path: namespace + "/" + name, Err: os.ErrNotExist}
	}
	return string(f), nil
}

func TestCtlLogs(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	node := ctlRaw(t, b.Plain)
	srv := logserve.New(logserve.Options{Node: "edge-1", Topics: ctlTopics, Finder: ctlFinder(writeFile(t, "web.log", "one\ntwo\nthree\n")), Pub: ctlPub{node}})
	if tok := node.Subscribe(ctlTopics.LogsRequest("edge-1"), 1, func(_ mqtt.Client, m mqtt.Message) { srv.Handle(m.Payload()) }); !tok.WaitTimeout(ctlTestTimeout) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() { cancel(); <-done }()

	if out := ctlOK(t, "--broker", b.Plain, "logs", "web", "--node", "edge-1", "--tail", "2"); out != "two\nthree\n" {
		t.Errorf("logs --tail 2 = %q", out)
	}
	if out := ctlOK(t, "--broker", b.Plain, "logs", "default/web", "--node", "edge-1"); out != "one\ntwo\nthree\n" {
		t.Errorf("logs = %q", out)
	}
	_, _, err := ctlRun(t, "", "--broker", b.Plain, "logs", "db", "--node", "edge-1")
	if err == nil || !strings.HasPrefix(err.Error(), "ctl logs of pod default/db on node edge-1: the node says:") {
		t.Errorf("logs of a missing pod = %v", err)
	}
}

func TestCtlConfigFileAndTLS(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	fakeNodeStatus(t, b)
	cert, key := b.ClientCert(mqtttest.Admin)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "password"), []byte("hunter2\n"), 0o600)
	conf := filepath.Join(dir, "ctl.yaml")
	os.WriteFile(conf, []byte("broker: "+b.TLS+"\ncaFile: "+b.CAFile+"\ncertFile: "+cert+"\nkeyFile: "+key+
		"\nusername: admin\npasswordFile: password\n"), 0o600)

	// A relative passwordFile is read next to the config file; TLS with the admin certificate.
	out := ctlOK(t, "--config", conf, "get", "nodes")
	if !strings.Contains(out, "edge-1   online") {
		t.Errorf("get nodes over TLS from --config:\n%s", out)
	}
	// Flags win over the file: the plain listener, and the file's TLS settings do not apply...
	_, _, err := ctlRun(t, "", "--config", conf, "--broker", b.Plain, "get", "nodes")
	if err == nil || !strings.Contains(err.Error(), "not TLS") {
		t.Errorf("--broker tcp:// with a TLS config file = %v, want the not-TLS refusal", err)
	}
	// ... and a wrong broker is named, the password never shown.
	_, _, err = ctlRun(t, "", "--config", conf, "--broker", "ssl://127.0.0.1:1", "--timeout", "2s", "get", "nodes")
	if err == nil || !strings.Contains(err.Error(), "connect ssl://127.0.0.1:1") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("unreachable broker = %v", err)
	}

	os.WriteFile(conf, []byte("broker: "+b.Plain+"\nbrokerr: x\n"), 0o600)
	_, _, err = ctlRun(t, "", "--config", conf, "get", "nodes")
	if err == nil || !strings.Contains(err.Error(), "ctl config "+conf) || !strings.Contains(err.Error(), `unknown field "brokerr"`) {
		t.Errorf("config with an unknown key = %v", err)
	}
	_, _, err = ctlRun(t, "", "get", "nodes")
	if err == nil || !strings.Contains(err.Error(), "no broker") {
		t.Errorf("no broker = %v", err)
	}
	_, _, err = ctlRun(t, "", "--broker", b.Plain, "--username", "u", "--password-file", filepath.Join(dir, "missing"), "get", "nodes")
	if err == nil || !strings.Contains(err.Error(), "read password file") {
		t.Errorf("missing password file = %v", err)
	}
}

// A node whose liveness says offline keeps its last status on the broker, Ready True among it:
// ctl get nodes shows it as Unknown (was True), and -o json as the node lifecycle controller
// marks a node that stopped reporting.
func TestCtlGetNodesMarksOfflineNodes(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	fakeNodeStatus(t, b)
	cl := ctlRaw(t, b.Plain)
	went := now.Add(-2 * time.Hour)
	ctlPublish(t, cl, ctlTopics.Liveness("edge-3"), &protocol.Liveness{Node: "edge-3", Online: false, Session: 4, Time: went, Version: "v0.3.0"})
	ctlPublish(t, cl, ctlTopics.NodeStatus("edge-3"), &protocol.NodeStatus{Node: "edge-3", Time: now.Add(-3 * time.Hour), Object: &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "edge-3", Labels: map[string]string{"site": "a"}},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{
			{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status"},
			{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse, Reason: "KubeletHasSufficientMemory"}}}}})

	out := ctlOK(t, "--broker", b.Plain, "get", "nodes")
	want := "NAME     STATUS    SINCE   SESSION   READY                VERSION\n" +
		"edge-1   online    60m     7         True                 v0.3.0\n" +
		"edge-2   offline   24h     2         <none>               <none>\n" +
		"edge-3   offline   120m    4         Unknown (was True)   v0.3.0\n"
	if out != want {
		t.Errorf("get nodes:\n%s\nwant:\n%s", out, want)
	}

	for _, format := range []string{"json", "yaml"} {
		out := ctlOK(t, "--broker", b.Plain, "get", "nodes", "-o", format)
		var list v1.NodeList
		data := []byte(out)
		if format == "yaml" {
			var err error
			if data, err = yaml.YAMLToJSON(data); err != nil {
				t.Fatalf("-o yaml: %v\n%s", err, out)
			}
		}
		if strict, err := sigsjson.UnmarshalStrict(data, &list); err != nil || len(strict) > 0 {
			t.Fatalf("-o %s is not a strict v1.NodeList: %v %v\n%s", format, err, strict, out)
		}
		if list.Kind != "NodeList" || len(list.Items) != 3 {
			t.Fatalf("-o %s: %s %d items", format, list.Kind, len(list.Items))
		}
		on, off, bare := list.Items[0], list.Items[2], list.Items[1]
		if on.Name != "edge-1" || on.Kind != "Node" || on.Annotations["mqlet.io/liveness"] != "online" || on.Annotations["mqlet.io/session"] != "7" ||
			len(on.Status.Conditions) != 1 || on.Status.Conditions[0].Status != v1.ConditionTrue || on.Status.Addresses[0].Address != "10.0.0.7" {
			t.Errorf("-o %s: the online node = %+v", format, on)
		}
		if off.Name != "edge-3" || off.Labels["site"] != "a" || off.Annotations["mqlet.io/liveness"] != "offline" ||
			off.Annotations["mqlet.io/liveness-since"] != went.UTC().Format(time.RFC3339) || len(off.Status.Conditions) != 2 {
			t.Fatalf("-o %s: the offline node = %+v", format, off)
		}
		for _, c := range off.Status.Conditions {
			if c.Status != v1.ConditionUnknown || c.Reason != "NodeStatusUnknown" || !c.LastTransitionTime.Time.Equal(went) ||
				!strings.Contains(c.Message, "The node is offline") || !strings.Contains(c.Message, "last reported "+string(c.Type)) {
				t.Errorf("-o %s: the offline node's condition %+v, want Unknown since it went offline", format, c)
			}
		}
		if bare.Name != "edge-2" || len(bare.Status.Conditions) != 1 || bare.Status.Conditions[0].Status != v1.ConditionUnknown ||
			!strings.Contains(bare.Status.Conditions[0].Message, "has reported no status") {
			t.Errorf("-o %s: the node without status = %+v", format, bare)
		}
	}

	out = ctlOK(t, "--broker", b.Plain, "describe", "node", "edge-3")
	if !strings.Contains(out, "Ready           Unknown  NodeStatusUnknown  120m ago") ||
		!strings.Contains(out, "it last reported Ready True: kubelet is posting ready status") ||
		!strings.Contains(out, "it last reported MemoryPressure False\n") {
		t.Errorf("describe node of an offline node:\n%s", out)
	}
}

// Which CA vouches for the nodes' sealing keys: --node-ca (or nodeCA in the config, relative to
// it), else the CA in --ca-file that issued ctl's own client certificate (not another CA of that
// file), none when asked or without a client certificate; --node-crl revokes; a node CA file
// that holds no certificate is an error naming it.
func TestCtlNodeCA(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fleetCA, brokerCA, otherCA := testpki.NewCA(t), testpki.NewCA(t), testpki.NewCA(t)
	// ca.pem is ctl's --ca-file: the CA of the broker's certificate and the fleet's CA.
	ca := write("ca.pem", append(brokerCA.CertPEM(), fleetCA.CertPEM()...))
	other := write("other-ca.pem", otherCA.CertPEM())
	ctlCert := write("ctl.pem", testpki.PEM(fleetCA.Issue(t, testpki.Cert{CN: "admin"})))
	// vouches says whether o takes the attestation of a node whose certificate ca issued.
	vouches := func(o ctlclient.Options, ca *testpki.CA) bool {
		t.Helper()
		if o.NodeTrust == nil {
			return false
		}
		k, err := sealing.Generate()
		if err != nil {
			t.Fatal(err)
		}
		a, err := sealing.Attest(ca.Issue(t, testpki.Cert{CN: "edge-1"}), "edge-1", k)
		if err != nil {
			t.Fatal(err)
		}
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1", Annotations: map[string]string{sealing.AnnotationKey: k.Public(), sealing.AttestationKey: a}}}
		_, err = o.NodeTrust.Attested(n, time.Now())
		return err == nil
	}
	opts := func(c CtlCmd) ctlclient.Options {
		t.Helper()
		if c.Broker == "" && c.Config == "" {
			c.Broker = "ssl://127.0.0.1:1"
		}
		o, err := c.options()
		if err != nil {
			t.Fatalf("options %+v: %v", c, err)
		}
		return o
	}
	if o := opts(CtlCmd{CAFile: ca, CertFile: ctlCert, KeyFile: ctlCert}); !vouches(o, fleetCA) || vouches(o, brokerCA) {
		t.Error("with a client certificate, the node CA is not (only) the CA that issued it")
	}
	if o := opts(CtlCmd{CAFile: ca}); o.NodeTrust != nil {
		t.Error("without a client certificate, a node CA was taken")
	}
	if o := opts(CtlCmd{CAFile: ca, CertFile: ctlCert, KeyFile: ctlCert, NodeCA: other}); !vouches(o, otherCA) || vouches(o, fleetCA) {
		t.Error("--node-ca did not replace the default")
	}
	if o := opts(CtlCmd{CAFile: ca, CertFile: ctlCert, KeyFile: ctlCert, NodeCA: "none"}); o.NodeTrust != nil {
		t.Error("--node-ca none still verifies")
	}
	crl := write("fleet.crl", fleetCA.CRL(t, time.Now().Add(time.Hour)))
	if o := opts(CtlCmd{CAFile: ca, CertFile: ctlCert, KeyFile: ctlCert, NodeCRL: crl}); !vouches(o, fleetCA) {
		t.Error("a CRL revoking nothing refused a node")
	}
	conf := write("ctl.yaml", []byte("broker: ssl://127.0.0.1:1\nnodeCA: other-ca.pem\n"))
	if o := opts(CtlCmd{Config: conf}); !vouches(o, otherCA) {
		t.Error("nodeCA in the config file (relative to it) was not read")
	}
	for _, c := range []CtlCmd{
		{Broker: "ssl://127.0.0.1:1", NodeCA: conf},                     // no certificate in it
		{Broker: "ssl://127.0.0.1:1", CAFile: other, CertFile: ctlCert}, // ctl's issuer not in --ca-file
		{Broker: "ssl://127.0.0.1:1", NodeCA: other, NodeCRL: conf},     // no CRL in it
		{Broker: "ssl://127.0.0.1:1", NodeCA: "none", NodeCRL: crl},     // a CRL without a CA
	} {
		if _, err := c.options(); err == nil {
			t.Errorf("options %+v: no error", c)
		}
	}
}
