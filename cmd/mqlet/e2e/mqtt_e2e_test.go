package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/store"
	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The MQTT tests run the real agent on the test containerd against a real mosquitto. The control
// plane here is a small writer of the protocol (generations and index under the test's control,
// so stale and duplicate messages can be made on purpose); TestCtl* drive `mqlet ctl` itself.

var topics = protocol.MustTopics(protocol.DefaultPrefix)

const e2eNode = "e2e-node"

type controlPlane struct {
	t       *testing.T
	c       mqtt.Client
	rev     int64
	objects map[string]protocol.IndexEntry
}

func connectMQTT(t *testing.T, broker string) mqtt.Client {
	t.Helper()
	id := make([]byte, 4)
	rand.Read(id)
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(broker).SetClientID("e2e-" + hex.EncodeToString(id)).SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", broker, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}

func newControlPlane(t *testing.T, broker string) *controlPlane {
	return &controlPlane{t: t, c: connectMQTT(t, broker), objects: map[string]protocol.IndexEntry{}}
}

func (cp *controlPlane) raw(topic string, payload []byte, retained bool) {
	cp.t.Helper()
	if tok := cp.c.Publish(topic, 1, retained, payload); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		cp.t.Fatalf("publish %s: %v", topic, tok.Error())
	}
}

func (cp *controlPlane) encode(v any) []byte {
	b, err := protocol.Encode(v)
	if err != nil {
		cp.t.Fatal(err)
	}
	return b
}

// applyYAML publishes pods at the next revision, then the index.
func (cp *controlPlane) applyYAML(docs ...string) int64 {
	cp.t.Helper()
	cp.rev++
	for _, doc := range docs {
		var p v1.Pod
		if err := yaml.UnmarshalStrict([]byte(doc), &p); err != nil {
			cp.t.Fatal(err)
		}
		d, err := protocol.NewDesired(e2eNode, cp.rev, &p)
		if err != nil {
			cp.t.Fatal(err)
		}
		payload := cp.encode(d)
		cp.raw(topics.Desired(e2eNode, protocol.KindPod, d.Namespace, d.Name), payload, true)
		cp.objects[d.Key()] = protocol.IndexEntry{Generation: cp.rev, Digest: protocol.Digest(payload)}
	}
	cp.publishIndex()
	return cp.rev
}

func (cp *controlPlane) publishIndex() {
	cp.raw(topics.Index(e2eNode), cp.encode(&protocol.Index{Node: e2eNode, Revision: cp.rev, Objects: cp.objects}), true)
}

// deletePod publishes an index that leaves the pod out (v2 has no tombstones), then clears the
// pod's retained topic.
func (cp *controlPlane) deletePod(name string) {
	cp.t.Helper()
	cp.rev++
	delete(cp.objects, protocol.ObjectKey(protocol.KindPod, "default", name))
	cp.publishIndex()
	cp.raw(topics.Desired(e2eNode, protocol.KindPod, "default", name), nil, true)
}

// waitRetained waits until the retained message on topic satisfies ok (reading with a fresh
// subscription each time, as `mqlet ctl get` would).
func waitRetained(t *testing.T, broker, topic, what string, ok func([]byte) bool) {
	t.Helper()
	c := connectMQTT(t, broker)
	deadline := time.Now().Add(60 * time.Second)
	var last []byte
	for time.Now().Before(deadline) {
		got := make(chan []byte, 1)
		c.Subscribe(topic, 1, func(_ mqtt.Client, m mqtt.Message) {
			select {
			case got <- m.Payload():
			default:
			}
		}).WaitTimeout(5 * time.Second)
		select {
		case p := <-got:
			last = p
			if ok(p) {
				c.Unsubscribe(topic).WaitTimeout(5 * time.Second)
				return
			}
		case <-time.After(300 * time.Millisecond):
		}
		c.Unsubscribe(topic).WaitTimeout(5 * time.Second)
	}
	t.Fatalf("%s: retained %s never matched within 60s; last: %s", what, topic, last)
}

func podStatusIs(phase v1.PodPhase, gen int64) func([]byte) bool {
	return func(p []byte) bool {
		s, err := protocol.DecodePodStatus(p, 0)
		return err == nil && !s.Deleted && s.Object != nil && s.Object.Status.Phase == phase && (gen == 0 || s.Generation == gen)
	}
}

func (h *harness) startMQTTAgent(broker string, extra ...string) {
	h.t.Helper()
	h.startAgent(append([]string{"--mqtt-broker", broker, "--secret-key-file", filepath.Join(h.dir, "node.key")}, extra...)...)
}

func sleeper(name, arg string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `}
spec:
  containers:
  - {name: c, image: mqlet.test/busybox:1, command: ["sleep", "` + arg + `"]}
`
}

func TestMQTTApplyRunsAndDeleteWhileAgentStopped(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	cp := newControlPlane(t, b.Plain)
	h.startMQTTAgent(b.Plain)

	gen := cp.applyYAML(sleeper("web", "3600"))
	h.waitPod("web", "running from MQTT", allRunning)
	waitRetained(t, b.Plain, topics.PodStatus(e2eNode, "default", "web"), "status of web", podStatusIs(v1.PodRunning, gen))
	if len(h.tasks()) != 1 {
		t.Fatalf("tasks %v", h.tasks())
	}

	h.stopAgent()
	cp.deletePod("web")
	h.startMQTTAgent(b.Plain)
	waitFor(t, "web gone after the agent came back", func() bool {
		_, err := h.getPod("web")
		return err != nil && len(h.tasks()) == 0
	})
	waitRetained(t, b.Plain, topics.PodStatus(e2eNode, "default", "web"), "web reported gone", func(p []byte) bool {
		s, err := protocol.DecodePodStatus(p, 0)
		return err == nil && s.Deleted
	})
}

// The node's broker (a site broker bridged to the cloud one) is down while the control plane
// updates one of two pods on the cloud broker: when the site broker returns, the new spec runs
// and the other pod is not restarted. This is also the "agent behind a site broker" case.
func TestMQTTUpdateWhileBrokerDownBehindSiteBroker(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	cloud := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	site := mqtttest.Start(t, mqtttest.Options{Persistence: true, BridgeTo: cloud})
	cp := newControlPlane(t, cloud.Plain)
	h.startMQTTAgent(site.Plain, "--mqtt-reconnect-max", "2s")

	cp.applyYAML(sleeper("a", "3600"), sleeper("b", "3600"))
	h.waitPod("a", "a running", allRunning)
	h.waitPod("b", "b running", allRunning)
	before := h.tasks()

	site.Stop(t)
	gen := cp.applyYAML(sleeper("a", "3601"))
	site.Start(t)

	h.waitPod("a", "a running its new spec", func(p *v1.Pod) bool {
		return allRunning(p) && p.Spec.Containers[0].Command[1] == "3601"
	})
	waitRetained(t, cloud.Plain, topics.PodStatus(e2eNode, "default", "a"), "a's new status on the cloud", podStatusIs(v1.PodRunning, gen))
	after := h.tasks()
	bPod, err := h.getPod("b")
	if err != nil {
		t.Fatal(err)
	}
	cs := containerStatus(bPod, "c")
	id := strings.TrimPrefix(cs.ContainerID, "containerd://")
	if cs.RestartCount != 0 || before[id] == 0 || after[id] != before[id] {
		t.Fatalf("pod b was restarted: %+v (tasks before %v, after %v)", cs, before, after)
	}
}

// Statuses reported while the broker is down go to the bbolt outbox; the agent is killed with
// the outbox full; once broker and agent are back, every pod's final status is on the broker.
func TestMQTTKill9WithFullOutboxEveryFinalStatusArrives(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	h.startMQTTAgent(b.Plain, "--mqtt-reconnect-max", "2s")
	waitRetained(t, b.Plain, topics.Liveness(e2eNode), "online", func(p []byte) bool {
		l, err := protocol.DecodeLiveness(p, 0)
		return err == nil && l.Online
	})
	b.Stop(t)
	names := []string{"p1", "p2", "p3"}
	for _, n := range names {
		h.writeManifest(n+".yaml", sleeper(n, "3600"))
	}
	for _, n := range names {
		h.waitPod(n, n+" running", allRunning)
	}
	// One more pod comes and goes while the broker is down. After the restart the agent has no
	// record of it, so only the outbox can tell the broker that it went.
	h.writeManifest("gone.yaml", sleeper("gone", "3600"))
	h.waitPod("gone", "running", allRunning)
	if err := os.Remove(filepath.Join(h.manifests, "gone.yaml")); err != nil {
		t.Fatal(err)
	}
	goneTopic := topics.PodStatus(e2eNode, "default", "gone")
	waitFor(t, "gone removed", func() bool { _, err := h.getPod("gone"); return err != nil })
	// The uplink writes the outbox a moment after the pod is removed (its debug log "wrote to
	// the outbox" names the topics): kill only once the gone report was written there.
	waitFor(t, "gone's last report written to the outbox", func() bool {
		log := h.agentLog.String()
		i := strings.Index(log, `msg="pod removed" pod=default/gone`)
		return i >= 0 && strings.Contains(log[i:], goneTopic)
	})
	h.kill9Agent()

	db, err := store.Open(filepath.Join(h.state, store.FileName))
	if err != nil {
		t.Fatal(err)
	}
	st, err := db.OutboxStats()
	db.Close()
	if err != nil || st.Entries < len(names)+1 {
		t.Fatalf("outbox after kill -9: %+v, %v; want at least %d entries", st, err, len(names)+1)
	}

	b.Start(t)
	h.startMQTTAgent(b.Plain)
	for _, n := range names {
		waitRetained(t, b.Plain, topics.PodStatus(e2eNode, "default", n), n+"'s final status", podStatusIs(v1.PodRunning, 0))
	}
	waitRetained(t, b.Plain, topics.PodStatus(e2eNode, "default", "gone"), "gone reported gone from the outbox", func(p []byte) bool {
		s, err := protocol.DecodePodStatus(p, 0)
		return err == nil && s.Deleted
	})
}

// Garbled, oversized, misaddressed, stale and duplicate messages are refused with events naming
// the topic; the running pod is untouched and the agent keeps its connection.
func TestMQTTBadPayloadsAreRefusedAndPodsKeepRunning(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	cp := newControlPlane(t, b.Plain)
	h.startMQTTAgent(b.Plain, "--mqtt-max-payload", "65536")
	cp.applyYAML(sleeper("web", "3600"))
	h.waitPod("web", "running", allRunning)
	tasks := h.tasks()
	var session int64
	waitRetained(t, b.Plain, topics.Liveness(e2eNode), "online", func(p []byte) bool {
		l, err := protocol.DecodeLiveness(p, 0)
		if err == nil && l.Online {
			session = l.Session
		}
		return err == nil && l.Online
	})

	var mu sync.Mutex
	var events []protocol.Event
	ec := connectMQTT(t, b.Plain)
	ec.Subscribe(topics.Events(e2eNode), 1, func(_ mqtt.Client, m mqtt.Message) {
		if e, err := protocol.DecodeEvent(m.Payload(), 0); err == nil {
			mu.Lock()
			events = append(events, *e)
			mu.Unlock()
		}
	}).WaitTimeout(5 * time.Second)

	// v2: the node subscribes to its index and to the objects the index lists, so bad input reaches
	// it as an index, or as a listed object. Each is refused with a Warning naming the topic and the
	// reason; nothing stored or running changes.
	cp.applyYAML(sleeper("web", "3600")) // unchanged pod, a second revision: a stale one can be made
	rev := cp.rev
	index := topics.Index(e2eNode)
	idx := func(node string, r int64, objs map[string]protocol.IndexEntry) []byte {
		return cp.encode(&protocol.Index{Node: node, Revision: r, Objects: objs})
	}
	cases := []struct {
		payload []byte
		want    string
	}{
		{[]byte("{garbled"), "invalid JSON"},
		{[]byte(`{"apiVersion":"mqlet.io/v2","pad":"` + strings.Repeat("x", 70000) + `"}`), "payload too large"},
		{idx("other-node", rev+1, nil), `for node "other-node"`},
		{idx(e2eNode, rev-1, nil), "stale index revision"},
		{idx(e2eNode, rev, nil), "conflicting index"},
		{[]byte(`{"apiVersion":"mqlet.io/v2","node":"` + e2eNode + `","revision":` + fmt.Sprint(rev+1) + `,"objects":{"pods/default/web":{"generation":1,"digest":"nothex"}}}`), "digest"},
	}
	for _, c := range cases {
		cp.raw(index, c.payload, false)
	}
	// An object the index lists by digest that the node cannot decode: refused at its generation.
	broken := topics.Desired(e2eNode, protocol.KindPod, "default", "broken")
	garbled := []byte(`{"apiVersion":"mqlet.io/v2","kind":"Pod","node":"` + e2eNode + `","namespace":"default","name":"broken","generation":` + fmt.Sprint(rev+1) + `,"object":{"spec":{"bogus":true}}}`)
	cp.raw(broken, garbled, true)
	cp.rev++
	cp.objects["pods/default/broken"] = protocol.IndexEntry{Generation: cp.rev, Digest: protocol.Digest(garbled)}
	cp.publishIndex()
	// Matched by content: other events (about the running pod) may come in between.
	found := func(want, topic string) bool {
		for _, e := range events {
			if e.Type == "Warning" && strings.Contains(e.Message, want) && strings.Contains(e.Message, topic) {
				return true
			}
		}
		return false
	}
	waitFor(t, "a Warning event naming the topic and the reason for each case", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range cases {
			if !found(c.want, index) {
				return false
			}
		}
		return found("unknown field", broken)
	})
	waitAcksE2E(t, b.Plain, "broken refused at its generation", func(a *protocol.Acks, applied map[string]protocol.IndexEntry) bool {
		return a.IndexRevision == cp.rev && a.Refused["pods/default/broken"].Generation == cp.rev &&
			applied["pods/default/web"] == cp.objects["pods/default/web"]
	})

	p := h.waitPod("web", "still running", allRunning)
	if p.Spec.Containers[0].Command[1] != "3600" || !equalPids(h.tasks(), tasks) {
		t.Fatalf("bad input disturbed the pod: %v (tasks %v -> %v)", p.Spec.Containers[0].Command, tasks, h.tasks())
	}
	waitRetained(t, b.Plain, topics.Liveness(e2eNode), "same session", func(p []byte) bool {
		l, err := protocol.DecodeLiveness(p, 0)
		return err == nil && l.Online && l.Session == session
	})
}

func mustPod(t *testing.T, doc string) *v1.Pod {
	t.Helper()
	var p v1.Pod
	if err := yaml.UnmarshalStrict([]byte(doc), &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

// Pods from MQTT obey the agent's policy; a name already taken by a manifest-dir pod is refused.
// Both refusals reach the control plane as events, and nothing runs for them.
func TestMQTTPolicyAndNameClashAreRefusedWithEvents(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	cp := newControlPlane(t, b.Plain)
	h.writeManifest("local.yaml", sleeper("local", "3600"))
	h.startMQTTAgent(b.Plain)
	h.waitPod("local", "file pod running", allRunning)

	var mu sync.Mutex
	reasons := map[string]string{}
	ec := connectMQTT(t, b.Plain)
	ec.Subscribe(topics.Events(e2eNode), 1, func(_ mqtt.Client, m mqtt.Message) {
		if e, err := protocol.DecodeEvent(m.Payload(), 0); err == nil {
			mu.Lock()
			reasons[e.Reason] = e.Message
			mu.Unlock()
		}
	}).WaitTimeout(5 * time.Second)

	cp.applyYAML(`apiVersion: v1
kind: Pod
metadata: {name: priv}
spec:
  containers:
  - {name: c, image: mqlet.test/busybox:1, command: ["sleep", "3600"], securityContext: {privileged: true}}
`, sleeper("local", "1"))
	waitFor(t, "PolicyDenied and NameClash events", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return reasons["PolicyDenied"] != "" && reasons["NameClash"] != ""
	})
	mu.Lock()
	if !strings.Contains(reasons["PolicyDenied"], "privileged") {
		t.Errorf("PolicyDenied message does not name the field: %q", reasons["PolicyDenied"])
	}
	mu.Unlock()
	if _, err := h.getPod("priv"); err == nil {
		t.Fatal("a privileged pod from MQTT was admitted")
	}
	if p := h.waitPod("local", "file pod untouched", allRunning); p.Spec.Containers[0].Command[1] != "3600" {
		t.Fatalf("the MQTT pod replaced the manifest-dir pod: %v", p.Spec.Containers[0].Command)
	}
}

// `mqlet ctl` end to end against a running agent: apply runs the pod, get reads what the node
// reported, and logs -f streams lines the container writes after the stream began.
func TestCtlApplyGetAndLogsFollow(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	h.startMQTTAgent(b.Plain)
	ctl := func(args ...string) string {
		t.Helper()
		return h.mqlet(append([]string{"ctl", "--broker", b.Plain}, args...)...)
	}
	file := writeFile(t, "ticker.yaml", `apiVersion: v1
kind: Pod
metadata: {name: ticker}
spec:
  containers:
  - {name: c, image: mqlet.test/busybox:1, command: ["sh", "-c", "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done"]}
`)
	// The node is online: apply waits for its acks, which say it applied the pod.
	out := ctl("apply", "-f", file, "--node", e2eNode)
	if !strings.Contains(out, "pod/default/ticker created") || !strings.Contains(out, "node "+e2eNode+" applied 1 of 1 objects") {
		t.Fatalf("ctl apply printed %q", out)
	}
	h.waitPod("ticker", "running from ctl apply", allRunning)

	// ctl sends what only the node judges; the node's policy refuses it, and apply says why
	// and fails; get pods shows the refusal from the node's acks.
	priv := writeFile(t, "priv.yaml", `apiVersion: v1
kind: Pod
metadata: {name: priv}
spec:
  containers:
  - {name: c, image: mqlet.test/busybox:1, command: ["sleep", "3600"], securityContext: {privileged: true}}
`)
	out, err := h.mqletErr("ctl", "--broker", b.Plain, "apply", "-f", priv, "--node", e2eNode)
	if err == nil || !strings.Contains(out, "pod/default/priv refused by node "+e2eNode+" (generation 2): ") || !strings.Contains(out, "privileged") {
		t.Fatalf("ctl apply of a pod the node's policy refuses = %v:\n%s", err, out)
	}
	if out, err := h.mqletErr("ctl", "--broker", b.Plain, "get", "pods", "--node", e2eNode, "-o", "wide"); err != nil ||
		!regexp.MustCompile(`priv\s+`+e2eNode+`\s+-\s+Refused\s.*privileged`).MatchString(out) {
		t.Fatalf("ctl get pods after the refusal = %v:\n%s", err, out)
	}
	waitFor(t, "ctl get pods shows it Running", func() bool {
		out, err := h.mqletErr("ctl", "--broker", b.Plain, "get", "pods", "--node", e2eNode)
		return err == nil && strings.Contains(out, "ticker") && strings.Contains(out, "Running")
	})
	if out := ctl("get", "nodes"); !strings.Contains(out, e2eNode) || !strings.Contains(out, "online") {
		t.Fatalf("ctl get nodes: %q", out)
	}

	// Follow: the stream must carry a line written after it started.
	cmd := exec.Command(h.bin, "ctl", "--broker", b.Plain, "logs", "ticker", "--node", e2eNode, "-f", "--tail", "1")
	buf := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = buf, buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var first int = -1
	waitFor(t, "the first streamed line", func() bool {
		first = lastTick(buf.String())
		return first >= 0
	})
	waitFor(t, "lines written after the stream began", func() bool { return lastTick(buf.String()) >= first+5 })
}

// lastTick is the highest "tick N" in s, -1 if none.
func lastTick(s string) int {
	best := -1
	for _, line := range strings.Split(s, "\n") {
		var n int
		if _, err := fmt.Sscanf(strings.TrimSpace(line), "tick %d", &n); err == nil && n > best {
			best = n
		}
	}
	return best
}

// A node that starts while its broker is unreachable runs what it stored and what its manifest
// dir holds at once; nothing waits for the link, nothing stored is dropped.
func TestMQTTBootWithBrokerUnreachable(t *testing.T) {
	mqtttest.Require(t)
	h := newHarness(t)
	b := mqtttest.Start(t, mqtttest.Options{Persistence: true})
	cp := newControlPlane(t, b.Plain)
	h.startMQTTAgent(b.Plain)
	cp.applyYAML(sleeper("remote", "3600"))
	h.waitPod("remote", "running", allRunning)
	before := h.tasks()
	h.stopAgent()
	b.Stop(t)

	h.writeManifest("local.yaml", sleeper("local", "3600"))
	h.startMQTTAgent(b.Plain)
	h.waitPod("local", "file pod started with the broker down", allRunning)
	h.waitPod("remote", "stored MQTT pod still running", allRunning)
	for id, pid := range before {
		if pid == 0 || h.tasks()[id] != pid {
			t.Fatalf("the stored pod was disturbed: tasks %v -> %v", before, h.tasks())
		}
	}
	waitFor(t, "a failed connect to the broker in the log", func() bool {
		return strings.Contains(h.agentLog.String(), strings.TrimPrefix(b.Plain, "tcp://"))
	})
}
