package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/mqtttest"
	"github.com/mqlet/mqlet/sync/protocol"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	v1 "k8s.io/api/core/v1"
)

// fakeNode plays a node's side of the desired-state contract on a real broker: it is online, it
// follows its index and desired objects, and publishes acks with one outcome per index entry
// (refused when refuse says why, applied otherwise, missing while the payload with the listed
// digest has not arrived), a running status for every applied pod at its generation, and the
// status summary after them. It judges pods by its own rule, as a real node judges them by its
// own policy.
type fakeNode struct {
	t      *testing.T
	name   string
	cl     mqtt.Client
	refuse func(*v1.Pod) string // why the node refuses a pod; "" applies it

	msgs chan mqtt.Message
	done chan struct{}

	// Owned by the run goroutine.
	index    []byte
	desired  map[string][]byte // latest desired payload by object key
	statuses map[string]string // the spec of each pod whose status was published, as JSON
	acked    []byte            // the acks last published
}

func startFakeNode(t *testing.T, broker, name string, refuse func(*v1.Pod) string) *fakeNode {
	t.Helper()
	n := &fakeNode{t: t, name: name, cl: ctlRaw(t, broker), refuse: refuse, msgs: make(chan mqtt.Message, 1000),
		done: make(chan struct{}), desired: map[string][]byte{}, statuses: map[string]string{}}
	ctlPublish(t, n.cl, ctlTopics.Liveness(name), &protocol.Liveness{Node: name, Online: true, Session: 3, Time: now.Add(-time.Hour)})
	// paho must not be blocked in a handler (the publishes below wait for PUBACKs): hand over.
	handle := func(_ mqtt.Client, m mqtt.Message) { n.msgs <- m }
	tok := n.cl.SubscribeMultiple(map[string]byte{ctlTopics.Index(name): 1, ctlTopics.DesiredFilter(name): 1}, handle)
	if !tok.WaitTimeout(ctlTestTimeout) || tok.Error() != nil {
		t.Fatalf("fake node %s: subscribe: %v", name, tok.Error())
	}
	go n.run()
	t.Cleanup(func() { close(n.done) })
	return n
}

func (n *fakeNode) run() {
	for {
		select {
		case <-n.done:
			return
		case m := <-n.msgs:
			if m.Topic() == ctlTopics.Index(n.name) {
				n.index = m.Payload()
			} else if t, err := ctlTopics.Parse(m.Topic()); err == nil && t.Class == protocol.ClassDesired {
				n.desired[protocol.ObjectKey(t.Kind, t.Namespace, t.Name)] = m.Payload()
			}
			n.report()
		}
	}
}

// report publishes what the node makes of its current index; errors are the test's (Errorf: this
// runs outside the test goroutine).
func (n *fakeNode) report() {
	if len(n.index) == 0 {
		return
	}
	idx, err := protocol.DecodeIndex(protocol.Topic{Class: protocol.ClassIndex, Node: n.name}, n.index, 0)
	if err != nil {
		n.t.Errorf("fake node %s: index: %v", n.name, err)
		return
	}
	// Compact acks, as a node sends while the broker holds its index: only the exceptions.
	acks := &protocol.Acks{Node: n.name, Session: 3, Compact: true, IndexRevision: idx.Revision, IndexDigest: protocol.Digest(n.index),
		Refused: map[string]protocol.Refusal{}, Missing: map[string]protocol.IndexEntry{}}
	runs := map[string]*v1.Pod{}
	for key, e := range idx.Objects {
		payload := n.desired[key]
		if payload == nil || protocol.Digest(payload) != e.Digest {
			acks.Missing[key] = e
			continue
		}
		kind, ns, name, _ := protocol.ParseObjectKey(key)
		d, err := protocol.DecodeDesired(protocol.Topic{Class: protocol.ClassDesired, Node: n.name, Kind: kind, Namespace: ns, Name: name}, payload, 0)
		if err != nil {
			acks.Refused[key] = protocol.Refusal{Generation: e.Generation, Digest: e.Digest, Reason: err.Error()}
			continue
		}
		if d.Pod != nil && n.refuse != nil {
			if why := n.refuse(d.Pod); why != "" {
				acks.Refused[key] = protocol.Refusal{Generation: e.Generation, Digest: e.Digest, Reason: why}
				continue
			}
		}
		if d.Pod != nil {
			runs[key] = d.Pod
		}
	}
	// Statuses first, then the summary that counts them, then the acks. Like the agent, the node
	// reports a pod again when something about it changed, not for a new generation of the same
	// pod: an object rewritten unchanged would show as not caught up.
	for key, p := range runs {
		gen := idx.Objects[key].Generation
		spec, _ := json.Marshal(p.Spec)
		if n.statuses[key] == string(spec) {
			continue
		}
		p = p.DeepCopy()
		p.Spec.NodeName = n.name
		p.Status = v1.PodStatus{Phase: v1.PodRunning, StartTime: ago(5 * time.Minute)}
		for _, c := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, running(c.Name, true, 0))
		}
		n.publish(ctlTopics.PodStatus(n.name, p.Namespace, p.Name), &protocol.PodStatus{Node: n.name, Namespace: p.Namespace,
			Name: p.Name, Source: "mqtt", Generation: gen, Object: p})
		n.statuses[key] = string(spec)
	}
	n.publish(ctlTopics.Summary(n.name), &protocol.StatusSummary{Node: n.name, Pods: len(n.statuses), Digest: ctlDigest})
	payload, err := protocol.Encode(acks)
	if err != nil {
		n.t.Errorf("fake node %s: %v", n.name, err)
		return
	}
	if string(payload) != string(n.acked) {
		n.publishRaw(ctlTopics.Acks(n.name), payload)
		n.acked = payload
	}
}

func (n *fakeNode) publish(topic string, v any) {
	payload, err := protocol.Encode(v)
	if err != nil {
		n.t.Errorf("fake node %s: %v", n.name, err)
		return
	}
	n.publishRaw(topic, payload)
}

func (n *fakeNode) publishRaw(topic string, payload []byte) {
	if tok := n.cl.Publish(topic, 1, true, payload); !tok.WaitTimeout(ctlTestTimeout) || tok.Error() != nil {
		n.t.Errorf("fake node %s: publish %s: %v", n.name, topic, tok.Error())
	}
}

const hostNetworkPod = `apiVersion: v1
kind: Pod
metadata:
  name: sniffer
spec:
  hostNetwork: true
  containers:
  - name: c
    image: busybox
    volumeMounts: [{name: logs, mountPath: /logs}]
  volumes:
  - {name: logs, hostPath: {path: /var/log/sniffer}}
`

// Whether a pod is admitted is the node's decision: a node whose policy allows host networking and
// the hostPath runs the pod ctl used to refuse for every node; a node that forbids them refuses it,
// and apply says why (from the node's acks) and fails; the refusal stays visible in get and
// describe without anyone having watched the node's events.
func TestCtlApplyLeavesAdmissionToTheNode(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	startFakeNode(t, b.Plain, "open", nil)
	strictReason := "policy: host network is not allowed; hostPath /var/log/sniffer is not allowed"
	startFakeNode(t, b.Plain, "strict", func(p *v1.Pod) string {
		if p.Spec.HostNetwork {
			return strictReason
		}
		return ""
	})
	file := writeFile(t, "sniffer.yaml", hostNetworkPod)

	out, errOut, err := ctlRun(t, "", "--broker", b.Plain, "apply", "-f", file, "--node", "open")
	if err != nil || out != "pod/default/sniffer created (generation 1)\nnode open applied 1 of 1 objects\n" {
		t.Fatalf("apply to a node that allows host networking = %q, %v\nstderr: %s", out, err, errOut)
	}
	if got := ctlOK(t, "--broker", b.Plain, "get", "pods", "--node", "open"); !strings.Contains(got, "sniffer   open   1/1     Running   0          1") {
		t.Errorf("get pods on the node that allows it:\n%s", got)
	}

	out, errOut, err = ctlRun(t, "", "--broker", b.Plain, "apply", "-f", file, "--node", "strict")
	if err == nil || !strings.Contains(err.Error(), "node strict refused 1 of 1 objects: pod/default/sniffer") {
		t.Errorf("apply to a node that refuses the pod = %v; want the refusal as the error", err)
	}
	if want := "\npod/default/sniffer refused by node strict (generation 1): " + strictReason + "\n"; !strings.HasSuffix(errOut, want) {
		t.Errorf("apply to the refusing node: stderr %q, want it to end in %q", errOut, want)
	}
	if out != "pod/default/sniffer created (generation 1)\n" {
		t.Errorf("apply to the refusing node printed %q", out)
	}

	got := ctlOK(t, "--broker", b.Plain, "get", "pods", "--node", "strict", "-o", "wide")
	for _, want := range []string{"sniffer   strict   -       Refused   -          <none> (refused 1)",
		"node strict refused generation 1: " + strictReason} {
		if !strings.Contains(got, want) {
			t.Errorf("get pods -o wide on the refusing node lacks %q:\n%s", want, got)
		}
	}
	got = ctlOK(t, "--broker", b.Plain, "describe", "pod", "sniffer", "--node", "strict")
	for _, want := range []string{"Refused:", "generation 1: " + strictReason, "refused this pod and runs no version of it"} {
		if !strings.Contains(got, want) {
			t.Errorf("describe pod lacks %q:\n%s", want, got)
		}
	}
	got = ctlOK(t, "--broker", b.Plain, "describe", "node", "strict")
	if !strings.Contains(got, "pods/default/sniffer  generation 1: "+strictReason) {
		t.Errorf("describe node lacks the refusal:\n%s", got)
	}
}

// apply waits only for a node that is online, only as long as --wait, and never fails for a node
// that has not answered: the objects are queued for it.
func TestCtlApplyWaitIsBounded(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	file := writeFile(t, "sniffer.yaml", hostNetworkPod)
	raw := ctlRaw(t, b.Plain)

	// Offline: no wait at all.
	ctlPublish(t, raw, ctlTopics.Liveness("away"), &protocol.Liveness{Node: "away", Online: false, Session: 2})
	start := time.Now()
	out, errOut, err := ctlRun(t, "", "--broker", b.Plain, "apply", "-f", file, "--node", "away", "--wait", "20s")
	if err != nil || out != "pod/default/sniffer created (generation 1)\n" || !strings.HasSuffix(errOut, "\nnode away is offline: the objects are queued for it on the broker\n") {
		t.Errorf("apply to an offline node = %q, %q, %v", out, errOut, err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("apply to an offline node took %s", d)
	}

	// Online but silent: the wait ends, and that is no failure.
	ctlPublish(t, raw, ctlTopics.Liveness("mute"), &protocol.Liveness{Node: "mute", Online: true, Session: 2})
	out, errOut, err = ctlRun(t, "", "--broker", b.Plain, "apply", "-f", file, "--node", "mute", "--wait", "1s")
	if err != nil || out != "pod/default/sniffer created (generation 1)\n" ||
		!strings.Contains(errOut, "node mute has not reported on pod/default/sniffer within 1s: queued for it on the broker") {
		t.Errorf("apply to a silent node = %q, %q, %v", out, errOut, err)
	}
	// --wait=0: not even the node's liveness is read.
	out, errOut, err = ctlRun(t, "", "--broker", b.Plain, "apply", "-f", writeFile(t, "cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"),
		"--node", "mute", "--wait=0")
	if err != nil || out != "configmap/default/c created (generation 2)\n" || errOut != "" {
		t.Errorf("apply --wait=0 = %q, %q, %v", out, errOut, err)
	}
}

// An unchanged object is not written again, so its generation stays the one the node runs: a
// re-apply leaves no "(desired N)" in get pods.
func TestCtlUnchangedReapplyLeavesNothingPending(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	startFakeNode(t, b.Plain, "edge-1", nil)
	file := writeFile(t, "web.yaml", ctlManifests[:strings.Index(ctlManifests, "---")])
	if out := ctlOK(t, "--broker", b.Plain, "apply", "-f", file, "--node", "edge-1"); out != "pod/default/web created (generation 1)\nnode edge-1 applied 1 of 1 objects\n" {
		t.Fatalf("first apply printed %q", out)
	}
	if out := ctlOK(t, "--broker", b.Plain, "apply", "-f", file, "--node", "edge-1"); out != "pod/default/web unchanged (generation 1)\nnode edge-1 applied 1 of 1 objects\n" {
		t.Errorf("re-apply printed %q", out)
	}
	out := ctlOK(t, "--broker", b.Plain, "get", "pods", "--node", "edge-1")
	want := "NAMESPACE   NAME   NODE     READY   STATUS    RESTARTS   GENERATION   AGE\n" +
		"default     web    edge-1   1/1     Running   0          1            5m\n"
	if out != want {
		t.Errorf("get pods after an unchanged re-apply:\n%s\nwant:\n%s", out, want)
	}
}

// smallQueueBroker is a broker with the shipped configs' small per-client limits (20 in flight,
// 100 queued: 120 messages at most for one subscription's retained set), the size of queue a
// large fleet outgrows.
func smallQueueBroker(t *testing.T) *mqtttest.Broker {
	t.Helper()
	return queueBroker(t, 20, 100)
}

// queueBroker is a broker with max_inflight_messages inflight and max_queued_messages queued, and
// the extra config lines.
func queueBroker(t *testing.T, inflight, queued int, extra ...string) *mqtttest.Broker {
	t.Helper()
	b := mqtttest.Start(t, mqtttest.Options{})
	// mqtttest has no option for the queue limits: its config file is rewritten, and the broker
	// started again on it.
	b.Stop(t)
	conf := filepath.Join(b.Dir, "mosquitto.conf")
	data, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	const line = "max_queued_messages 10000\n"
	if !strings.Contains(string(data), line) {
		t.Fatalf("%s no longer holds %q; update the test", conf, line)
	}
	data = []byte(strings.Replace(string(data), line, fmt.Sprintf("max_queued_messages %d\nmax_inflight_messages %d\n", queued, inflight)+strings.Join(append(extra, ""), "\n"), 1))
	if err := os.WriteFile(conf, data, 0o600); err != nil {
		t.Fatal(err)
	}
	b.Start(t)
	return b
}

// publishFleet publishes, as nodes would, pods pod statuses per node (and one reported deleted),
// then each node's status summary.
func publishFleet(t *testing.T, broker string, pods map[string]int) {
	t.Helper()
	cl := ctlRaw(t, broker)
	var toks []mqtt.Token
	pub := func(topic string, v any) {
		payload, err := protocol.Encode(v)
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, cl.Publish(topic, 1, true, payload))
	}
	for node, n := range pods {
		for i := range n {
			p := mkPod(v1.PodRunning, running("c", true, 0))
			p.Name, p.Spec.NodeName, p.Status.StartTime = fmt.Sprintf("p%03d", i), node, ago(time.Hour)
			pub(ctlTopics.PodStatus(node, "default", p.Name), &protocol.PodStatus{Node: node, Namespace: "default", Name: p.Name,
				Source: "mqtt", Generation: 1, Object: p})
		}
		pub(ctlTopics.PodStatus(node, "default", "gone"), &protocol.PodStatus{Node: node, Namespace: "default", Name: "gone", Source: "mqtt", Generation: 1, Deleted: true})
		pub(ctlTopics.Summary(node), &protocol.StatusSummary{Node: node, Pods: n, Digest: ctlDigest})
	}
	for _, tok := range toks {
		if !tok.WaitTimeout(ctlTestTimeout) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
}

// countRows counts the table rows of node in get pods output.
func countRows(out, node string) int {
	n := 0
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[2] == node {
			n++
		}
	}
	return n
}

// A broker drops what does not fit a client's queue without a word, and the marker still comes
// back: a fleet-wide read of 180 statuses through a 120-message queue is partial. ctl must either
// list every pod (reading short nodes again alone) or fail naming the node it could not read whole.
func TestCtlGetPodsNeverPassesOffAPartialRead(t *testing.T) {
	b := smallQueueBroker(t)
	fleet := map[string]int{}
	for i := range 6 {
		fleet[fmt.Sprintf("edge-%d", i)] = 30
	}
	publishFleet(t, b.Plain, fleet)
	// The premise: one read of every status (186 retained, the deleted ones included) does not
	// fit, and nothing says so.
	if got := ctlRetained(t, b.Plain, ctlTopics.AllNodes(protocol.ClassPodStatus)); len(got) >= 186 {
		t.Fatalf("the broker delivered all %d statuses in one read: its queue limits are not in force", len(got))
	}

	out, errOut, err := ctlRun(t, "", "--broker", b.Plain, "get", "pods", "-A")
	if err != nil {
		t.Fatalf("get pods of 6 nodes x 30 pods: %v\nstderr: %s", err, errOut)
	}
	for node, n := range fleet {
		if got := countRows(out, node); got != n {
			t.Errorf("get pods -A: %d rows of %s, want %d", got, node, n)
		}
	}
	if strings.Contains(out, "gone") {
		t.Errorf("a pod reported deleted is listed")
	}

	// One node alone holds more than the queue: even read alone it is short. The rows that did
	// arrive are printed, the node is named with what was expected and received, and ctl fails.
	publishFleet(t, b.Plain, map[string]int{"big": 150})
	for _, args := range [][]string{{"get", "pods", "-A"}, {"get", "pods", "--node", "big"}, {"get", "pods", "-A", "-o", "json"}} {
		out, errOut, err = ctlRun(t, "", append([]string{"--broker", b.Plain}, args...)...)
		if err == nil {
			t.Errorf("ctl %s: no error for a node read partially", strings.Join(args, " "))
			continue
		}
		if !strings.Contains(err.Error(), "incomplete read of pod statuses (node big: 150 pod statuses expected (its status summary), ") {
			t.Errorf("ctl %s: error %v does not name node big and its count", strings.Join(args, " "), err)
		}
		if !strings.Contains(errOut, "warning: incomplete: node big: 150 pod statuses expected (its status summary), ") {
			t.Errorf("ctl %s: stderr does not mark the output incomplete:\n%s", strings.Join(args, " "), errOut)
		}
		if strings.Contains(err.Error(), "edge-") {
			t.Errorf("ctl %s: nodes read whole are named short: %v", strings.Join(args, " "), err)
		}
	}
	if got := countRows(out, "big"); got != 0 {
		// -o json was the last: no table rows, but the list is there.
		t.Errorf("-o json printed %d table rows", got)
	}
	if !strings.Contains(out, `"kind": "PodList"`) {
		t.Errorf("-o json printed no list for a partial read:\n%.300s", out)
	}
	out, _, _ = ctlRun(t, "", "--broker", b.Plain, "get", "pods", "-A")
	if n := countRows(out, "big"); n == 0 || n >= 150 {
		t.Errorf("get pods -A printed %d of big's 150 rows; want the partial rows that arrived", n)
	}
	for node, n := range fleet {
		if got := countRows(out, node); got != n {
			t.Errorf("get pods -A next to a short node: %d rows of %s, want %d", got, node, n)
		}
	}
	// describe node reads the node's statuses too.
	ctlPublish(t, ctlRaw(t, b.Plain), ctlTopics.Liveness("big"), &protocol.Liveness{Node: "big", Online: true, Session: 1})
	_, errOut, err = ctlRun(t, "", "--broker", b.Plain, "describe", "node", "big")
	if err == nil || !strings.Contains(errOut, "warning: incomplete: node big") {
		t.Errorf("describe node big = %v, stderr %q; want it to fail, marked incomplete", err, errOut)
	}
}

// The reproduction at its scale: 150 nodes x 10 pods read through the queue limits mqlet
// used to ship (20 in flight, 1,000 queued) came back as 1,020 of 1,500 rows with exit 0. Every
// node's statuses fit the queue alone, so ctl reads the short ones again and lists all 1,500.
func TestCtlGetPodsReadsAWholeFleetOf1500Statuses(t *testing.T) {
	b := queueBroker(t, 20, 1000)
	fleet := map[string]int{}
	for i := range 150 {
		fleet[fmt.Sprintf("edge-%03d", i)] = 10
	}
	publishFleet(t, b.Plain, fleet)
	// The premise: one read of every status (1,650 retained, the deleted ones included) does
	// not fit, and nothing says so.
	got := ctlRetained(t, b.Plain, ctlTopics.AllNodes(protocol.ClassPodStatus))
	if len(got) >= 1650 {
		t.Fatalf("the broker delivered all %d statuses in one read: its queue limits are not in force", len(got))
	}
	t.Logf("one fleet-wide read delivered %d of 1,650 retained statuses", len(got))
	out, errOut, err := ctlRun(t, "", "--broker", b.Plain, "get", "pods", "-A")
	if err != nil {
		t.Fatalf("get pods of 150 nodes x 10 pods: %v\nstderr: %s", err, errOut)
	}
	rows := 0
	for node, n := range fleet {
		got := countRows(out, node)
		rows += got
		if got != n {
			t.Errorf("get pods -A: %d rows of %s, want %d", got, node, n)
		}
	}
	if rows != 1500 {
		t.Errorf("get pods -A listed %d of 1,500 pods", rows)
	}
}

// The refused pods in get pods -A come from every node's acks, a fleet-wide read of its own: a
// node whose acks did not fit the broker's queue for the reader (here its byte limit: the acks are
// large, the summaries small) is read again alone, so its refusals are not left out.
func TestCtlGetPodsReadsShortAcksAgainAlone(t *testing.T) {
	b := queueBroker(t, 20, 10000, "max_queued_bytes 60000")
	cl := ctlRaw(t, b.Plain)
	reason := "policy: " + strings.Repeat("hostPath volumes outside allowedHostPaths are not allowed; ", 40)
	const nodes = 60
	for i := range nodes {
		node := fmt.Sprintf("edge-%02d", i)
		ctlPublish(t, cl, ctlTopics.Acks(node), &protocol.Acks{Node: node, Session: 1, IndexRevision: 1,
			Refused: map[string]protocol.Refusal{"pods/default/bad": {Generation: 1, Digest: ctlDigest, Reason: reason}}})
		ctlPublish(t, cl, ctlTopics.Summary(node), &protocol.StatusSummary{Node: node, Digest: ctlDigest})
	}
	// The premise: one read of every node's acks is partial, and nothing says so.
	got := ctlRetained(t, b.Plain, ctlTopics.AllNodes(protocol.ClassAcks))
	if len(got) >= nodes {
		t.Fatalf("the broker delivered all %d acks in one read: its queue limits are not in force", len(got))
	}
	t.Logf("one fleet-wide read delivered %d of %d acks", len(got), nodes)
	out, errOut, err := ctlRun(t, "", "--broker", b.Plain, "get", "pods", "-A")
	if err != nil {
		t.Fatalf("get pods -A: %v\nstderr: %s", err, errOut)
	}
	for i := range nodes {
		node := fmt.Sprintf("edge-%02d", i)
		if n := countRows(out, node); n != 1 {
			t.Errorf("get pods -A: %d rows of %s, want its refused pod", n, node)
		}
	}
}

// The same for the indexes behind "(desired N)": a node whose index did not arrive in the fleet-wide
// read is read again alone, so its pending generation is not left out as if it had caught up.
func TestCtlGetPodsReadsShortIndexesAgainAlone(t *testing.T) {
	b := queueBroker(t, 20, 10000, "max_queued_bytes 60000")
	cl := ctlRaw(t, b.Plain)
	const nodes = 60
	for i := range nodes {
		node := fmt.Sprintf("edge-%02d", i)
		objects := map[string]protocol.IndexEntry{"pods/default/bad": {Generation: 2, Digest: ctlDigest}}
		for j := range 40 { // other objects, so the indexes overflow the reader's queue
			objects[fmt.Sprintf("configmaps/default/filler-%02d", j)] = protocol.IndexEntry{Generation: 1, Digest: ctlDigest}
		}
		ctlPublish(t, cl, ctlTopics.Index(node), &protocol.Index{APIVersion: protocol.APIVersion, Node: node, Revision: 2, Objects: objects})
		ctlPublish(t, cl, ctlTopics.Acks(node), &protocol.Acks{Node: node, Session: 1, IndexRevision: 1,
			Refused: map[string]protocol.Refusal{"pods/default/bad": {Generation: 1, Digest: ctlDigest, Reason: "policy: no"}}})
		ctlPublish(t, cl, ctlTopics.Summary(node), &protocol.StatusSummary{Node: node, Digest: ctlDigest})
	}
	// The premise: one read of every node's index is partial, and nothing says so.
	got := ctlRetained(t, b.Plain, ctlTopics.AllNodes(protocol.ClassIndex))
	if len(got) >= nodes {
		t.Fatalf("the broker delivered all %d indexes in one read: its queue limits are not in force", len(got))
	}
	t.Logf("one fleet-wide read delivered %d of %d indexes", len(got), nodes)
	out, errOut, err := ctlRun(t, "", "--broker", b.Plain, "get", "pods", "-A")
	if err != nil {
		t.Fatalf("get pods -A: %v\nstderr: %s", err, errOut)
	}
	for i := range nodes {
		if node := fmt.Sprintf("edge-%02d", i); countRows(out, node) != 1 {
			t.Errorf("get pods -A: %d rows of %s, want its refused pod", countRows(out, node), node)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "edge-") && !strings.Contains(line, "desired 2") {
			t.Errorf("get pods -A row without the pending generation: %q", line)
		}
	}
}

// A node without a summary (an agent from before summaries) is listed, and -o wide says it was not
// checked.
func TestCtlGetPodsNodeWithoutSummary(t *testing.T) {
	b := mqtttest.Start(t, mqtttest.Options{})
	raw := ctlRaw(t, b.Plain)
	p := mkPod(v1.PodRunning, running("c", true, 0))
	p.Name = "old"
	ctlPublish(t, raw, ctlTopics.Liveness("legacy"), &protocol.Liveness{Node: "legacy", Online: true, Session: 1})
	ctlPublish(t, raw, ctlTopics.PodStatus("legacy", "default", "old"), &protocol.PodStatus{Node: "legacy", Namespace: "default", Name: "old", Source: "mqtt", Generation: 1, Object: p})
	out, errOut, err := ctlRun(t, "", "--broker", b.Plain, "get", "pods", "-o", "wide")
	if err != nil || countRows(out, "legacy") != 1 {
		t.Fatalf("get pods of a node without a summary = %v\n%s", err, out)
	}
	if !strings.Contains(errOut, "note: node legacy publishes no status summary") {
		t.Errorf("-o wide does not say the node was not checked: %q", errOut)
	}
	out = ctlOK(t, "--broker", b.Plain, "describe", "node", "legacy")
	if !strings.Contains(out, "<none>: the node publishes none") {
		t.Errorf("describe node of a node without a summary:\n%s", out)
	}
}

// ctl apply --wait read back index R (its own); meanwhile another writer published R+1,
// which still lists the object at the same generation and digest, and the node took it and
// applied everything: its compact acks name R+1 with no exceptions. The object is applied, but
// outcomes says another writer changed or deleted it.
func TestCtlWaitCompactAcksOfANewerIndexAreNotADeletion(t *testing.T) {
	e := protocol.IndexEntry{Generation: 5, Digest: protocol.Digest([]byte("web"))}
	mine := &protocol.Index{APIVersion: protocol.APIVersion, Node: "edge-1", Revision: 5,
		Objects: map[string]protocol.IndexEntry{"pods/default/web": e}}
	mp, _ := protocol.Encode(mine)
	mine, err := protocol.DecodeIndex(protocol.Topic{Class: protocol.ClassIndex, Node: "edge-1"}, mp, 0)
	if err != nil {
		t.Fatal(err)
	}
	other := &protocol.Index{APIVersion: protocol.APIVersion, Node: "edge-1", Revision: 6,
		Objects: map[string]protocol.IndexEntry{"pods/default/web": e,
			"pods/default/db": {Generation: 6, Digest: protocol.Digest([]byte("db"))}}}
	op, _ := protocol.Encode(other)
	acks := &protocol.Acks{Node: "edge-1", Compact: true, IndexRevision: 6, IndexDigest: protocol.Digest(op)} // compact, nothing refused or missing
	got := outcomes(acks, map[string]protocol.IndexEntry{"pods/default/web": e}, mine)
	if s := got["pods/default/web"].state; s == outcomeSuperseded {
		t.Fatalf("web is applied (compact acks of revision 6, which lists it unchanged), but the outcome is 'changed or deleted by another writer'")
	}
}
