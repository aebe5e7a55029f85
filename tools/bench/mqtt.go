package main

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/mqlet/mqlet/internal/loopback"
	"github.com/mqlet/mqlet/sync/protocol"
	"github.com/mqlet/mqlet/sync/signing"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// mqttKeepalive is the agent's default keepalive; the agent is started without the flag.
	mqttKeepalive   = 60 * time.Second
	idleLinkWindow  = 5 * time.Minute
	idleLinkSettle  = 5 * time.Second
	counterPeriod   = 200 * time.Millisecond
	reconnectRounds = 10 // manifest updates per pod while the broker is down
	reconnectMax    = "1s"
	mqttApplyPods   = 20 // samples of the apply figure, after one unrecorded warm-up
	quietFor        = 2 * time.Second
)

var mqttTopics = protocol.MustTopics(protocol.DefaultPrefix)

// broker is one mosquitto the harness runs: the client listener, which only the client under
// measurement uses and the counters watch, and the harness's own listener (control plane,
// readers, readiness probes), which nothing counts.
type broker struct {
	name        string
	dir         string
	conf        string
	log         string // mosquitto's own log (log_type all): the PUBLISH packets it received and sent
	client      int    // port of the client listener
	harness     int    // port of the harness's listener
	persistence bool
	d           *daemon
}

func (br *broker) clientURL() string  { return fmt.Sprintf("tcp://127.0.0.1:%d", br.client) }
func (br *broker) harnessURL() string { return fmt.Sprintf("tcp://127.0.0.1:%d", br.harness) }

func (b *bench) newBroker(name string, persistence bool) (*broker, error) {
	dir := b.path(filepath.Join("mqtt", name))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ports, err := loopback.FreePorts(2)
	if err != nil {
		return nil, err
	}
	br := &broker{name: name, dir: dir, conf: filepath.Join(dir, "mosquitto.conf"), log: filepath.Join(dir, "mosquitto.log"),
		client: ports[0], harness: ports[1], persistence: persistence}
	var c strings.Builder
	fmt.Fprintf(&c, `# Written by tools/bench for the %s broker of one run.
per_listener_settings true
# Stay root, to write in the bench's root-owned directory.
user root
log_dest file %s
log_type all
connection_messages true
max_queued_messages 10000
`, name, br.log)
	if persistence {
		// As docs/protocol.md asks of a real broker: retained state survives a restart.
		fmt.Fprintf(&c, "persistence true\npersistence_location %s/\npersistence_file mosquitto.db\nautosave_interval 30\n", dir)
	} else {
		c.WriteString("persistence false\n")
	}
	fmt.Fprintf(&c, `
# The client under measurement; the counters watch this port.
listener %d 127.0.0.1
allow_anonymous true

# The harness: control plane, readers, readiness probes. Not counted.
listener %d 127.0.0.1
allow_anonymous true
`, br.client, br.harness)
	return br, os.WriteFile(br.conf, []byte(c.String()), 0o600)
}

// startBroker starts br and returns the first instant its harness listener accepted (polled every
// 2 ms): the broker's return, for the reconnect figure.
func (b *bench) startBroker(br *broker) (time.Time, error) {
	d, err := startDaemon("mosquitto "+br.name, filepath.Join(br.dir, "mosquitto.out"), b.runPath("mosquitto-"+br.name+".pid"),
		os.Environ(), 0, b.cfg.mosquitto, "-c", br.conf)
	if err != nil {
		return time.Time{}, err
	}
	br.d = d
	if !slices.Contains(b.brokers, br) {
		b.brokers = append(b.brokers, br)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if !d.alive() {
			return time.Time{}, fmt.Errorf("%w\n%s (tail):\n%s", d.diedErr(), br.log, tail(br.log, 20))
		}
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", br.harness), 100*time.Millisecond)
		if err == nil {
			up := time.Now()
			c.Close()
			return up, nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("mosquitto %s did not accept on port %d within 10s; %s:\n%s", br.name, br.harness, br.log, tail(br.log, 20))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (b *bench) stopBroker(br *broker) error {
	if br.d == nil {
		return nil
	}
	err := br.d.stop(10 * time.Second)
	br.d = nil
	return err
}

// startFloor starts the bare paho client against br's client listener.
func (b *bench) startFloor(name string, br *broker, tcpKeepalive bool) (*daemon, error) {
	logPath := b.path(filepath.Join("mqtt", "floor-"+name+".log"))
	d, err := startDaemon("mqttfloor "+name, logPath, b.runPath("mqttfloor-"+name+".pid"), os.Environ(), 0,
		b.cfg.mqttFloor, "-broker", br.clientURL(), "-client-id", nodeName, "-keepalive", mqttKeepalive.String(),
		"-tcp-keepalive="+strconv.FormatBool(tcpKeepalive))
	if err != nil {
		return nil, err
	}
	b.floors = append(b.floors, d)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if data, _ := os.ReadFile(logPath); strings.Contains(string(data), "connected ") {
			return d, nil
		}
		if !d.alive() {
			return nil, d.diedErr()
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("mqttfloor %s did not connect to %s within 20s; log:\n%s", name, br.clientURL(), tail(logPath, 10))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mqttClient connects a harness client (control plane or reader) to url.
func mqttClient(url, role string) (mqtt.Client, error) {
	id := make([]byte, 4)
	rand.Read(id)
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(url).SetClientID("bench-" + role + "-" + hex.EncodeToString(id)).
		SetProtocolVersion(4).SetCleanSession(true).SetAutoReconnect(false).SetConnectTimeout(5 * time.Second).SetOrderMatters(false))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return nil, fmt.Errorf("connect the bench's %s client to %s: %v", role, url, tok.Error())
	}
	return c, nil
}

func waitTok(tok mqtt.Token, what string) error {
	if !tok.WaitTimeout(10 * time.Second) {
		return fmt.Errorf("%s: no acknowledgement within 10s", what)
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// controlPlane writes desired pods the way docs/protocol.md section 4.4 says: the object at the
// next revision first, then the index listing it with its generation and the digest of its payload.
// It is the bare writer the apply figure times (the node then fetches the object the index lists);
// every other control-plane write of the harness goes through ctlclient. It starts where the node
// stands (newControlPlane): a node refuses an index whose revision is below the one it holds.
type controlPlane struct {
	c       mqtt.Client
	rev     int64
	objects map[string]protocol.IndexEntry
	key     ed25519.PrivateKey // signs each index when set
}

func (cp *controlPlane) publishRaw(topic string, payload []byte) error {
	return waitTok(cp.c.Publish(topic, 1, true, payload), "publish "+topic)
}

func (cp *controlPlane) apply(p *v1.Pod) error {
	cp.rev++
	d, err := protocol.NewDesired(nodeName, cp.rev, p)
	if err != nil {
		return err
	}
	payload, err := protocol.Encode(d)
	if err != nil {
		return err
	}
	if err := cp.publishRaw(mqttTopics.Desired(nodeName, protocol.KindPod, d.Namespace, d.Name), payload); err != nil {
		return err
	}
	cp.objects[d.Key()] = protocol.IndexEntry{Generation: cp.rev, Digest: protocol.Digest(payload)}
	return cp.publishIndex()
}

// delete publishes the index without the pod, then clears its retained desired topic (v2 has no
// tombstones: the index that leaves an object out deletes it).
func (cp *controlPlane) delete(name string) error {
	cp.rev++
	delete(cp.objects, protocol.ObjectKey(protocol.KindPod, podNamespace, name))
	if err := cp.publishIndex(); err != nil {
		return err
	}
	return cp.clear(mqttTopics.Desired(nodeName, protocol.KindPod, podNamespace, name))
}

func (cp *controlPlane) publishIndex() error {
	x := &protocol.Index{Node: nodeName, Revision: cp.rev, Objects: cp.objects}
	if cp.key != nil {
		protocol.SignIndex(x, cp.key)
	}
	payload, err := protocol.Encode(x)
	if err != nil {
		return err
	}
	return cp.publishRaw(mqttTopics.Index(nodeName), payload)
}

// clear empties a retained topic.
func (cp *controlPlane) clear(topic string) error {
	return waitTok(cp.c.Publish(topic, 1, true, []byte{}), "clear "+topic)
}

// benchPod is podManifest as an object, for the control plane: hostNetwork too, which the agent's
// MQTT policy then has to allow (--mqtt-allow-host-namespaces).
func (b *bench) benchPod(name string) *v1.Pod {
	grace := int64(0)
	return &v1.Pod{
		TypeMeta:   metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace},
		Spec: v1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: &grace,
			Containers: []v1.Container{{Name: "sleep", Image: b.cfg.image, ImagePullPolicy: v1.PullNever,
				Command: []string{"sleep", "3600"}}},
		},
	}
}

// received is one message a reader got, with when.
type received struct {
	topic    string
	payload  []byte
	retained bool
	at       time.Time
}

// subscribe subscribes c to filters and delivers every message (retained replays included) on the
// returned channel, which holds plenty: the handler never blocks paho.
func subscribe(c mqtt.Client, filters ...string) (<-chan received, error) {
	ch := make(chan received, 4096)
	f := map[string]byte{}
	for _, x := range filters {
		f[x] = 1
	}
	tok := c.SubscribeMultiple(f, func(_ mqtt.Client, m mqtt.Message) {
		select {
		case ch <- received{m.Topic(), m.Payload(), m.Retained(), time.Now()}:
		default:
		}
	})
	return ch, waitTok(tok, fmt.Sprintf("subscribe %v", filters))
}

// podView is what the reconnect figure compares between the agent's API and a retained status.
type podView struct {
	phase      v1.PodPhase
	command    string
	containers string // name=containerID/restarts/running, sorted
}

func viewOf(p *v1.Pod) podView {
	v := podView{phase: p.Status.Phase}
	if len(p.Spec.Containers) > 0 {
		v.command = strings.Join(p.Spec.Containers[0].Command, " ")
	}
	var cs []string
	for _, c := range p.Status.ContainerStatuses {
		cs = append(cs, fmt.Sprintf("%s=%s/%d/%t", c.Name, c.ContainerID, c.RestartCount, c.State.Running != nil))
	}
	slices.Sort(cs)
	v.containers = strings.Join(cs, ",")
	return v
}

func (v podView) String() string {
	return fmt.Sprintf("%s %q [%s]", v.phase, v.command, v.containers)
}

// statusName returns the pod name of a status/pods/default/NAME topic.
func statusName(topic string) (string, bool) {
	prefix := mqttTopics.PodStatus(nodeName, podNamespace, "")
	if !strings.HasPrefix(topic, prefix) {
		return "", false
	}
	return strings.TrimPrefix(topic, prefix), true
}

// measureMQTT runs the MQTT figures: apply over MQTT to a running container, the idle link next
// to its floor, and the convergence after a broker outage.
func (b *bench) measureMQTT(ctx context.Context, r *results) error {
	if b.cfg.mosquitto == "" || b.cfg.mqttFloor == "" || b.cfg.iptables == "" {
		return errors.New("-mosquitto, -mqtt-floor and -iptables are required (scripts/bench.sh passes them)")
	}
	// The agent's broker (persistence on, as docs/protocol.md asks of a real one) and one broker
	// per floor client: the floors use the agent's client id, which one broker would not let two
	// clients hold at once.
	site, err := b.newBroker("agent", true)
	if err != nil {
		return err
	}
	floor, err := b.newBroker("floor", false)
	if err != nil {
		return err
	}
	defaults, err := b.newBroker("paho-defaults", false)
	if err != nil {
		return err
	}
	ctrs, err := newCounters(b.cfg.iptables, []int{site.client, floor.client, defaults.client})
	if err != nil {
		return err
	}
	b.counters = ctrs
	for _, br := range []*broker{site, floor, defaults} {
		if _, err := b.startBroker(br); err != nil {
			return err
		}
	}
	// The floors connect now, so they are long idle when the window opens.
	if _, err := b.startFloor("floor", floor, false); err != nil {
		return err
	}
	if _, err := b.startFloor("paho-defaults", defaults, true); err != nil {
		return err
	}

	// The agent, with every MQTT setting at its default but the broker. The ten manifest-dir pods
	// of the earlier figures (started here when those were skipped) are the idle node's pods.
	if err := b.stopAgent(); err != nil {
		return err
	}
	b.agentExtra = []string{"--mqtt-broker", site.clientURL(), "--secret-key-file", b.path("node.key"), "--mqtt-allow-host-namespaces"}
	if _, err := b.startAgent(false); err != nil {
		return err
	}
	if err := b.waitReady(ctx); err != nil {
		return err
	}
	pods := podNames("pods", 0, 10)
	var missing []string
	for _, n := range pods {
		if _, err := os.Stat(filepath.Join(b.manifestDir(), n+".yaml")); err != nil {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		if _, err := b.putManifests(missing); err != nil {
			return err
		}
	}
	if _, err := b.waitRunning(ctx, pods); err != nil {
		return err
	}

	cp, err := b.newControlPlane(ctx, site, "cp")
	if err != nil {
		return err
	}
	defer cp.c.Disconnect(100)

	b.logf("measuring MQTT apply -> running (%d pods, one at a time)", mqttApplyPods)
	p50, p90, n, err := b.measureMQTTApply(ctx, cp)
	if err != nil {
		return fmt.Errorf("apply over MQTT: %w", err)
	}
	r.MQTTApplyP50Ms, r.MQTTApplyP90Ms, r.mqttApplySamples = ms(p50), ms(p90), n
	if m, err := readMemory(b.agent.pid()); err == nil {
		r.MQTTApplyAnonMiB = m.anonMiB()
	}
	b.logf("measuring the idle link (at least %v at keepalive %v; the floors run at the same time)", idleLinkWindow, mqttKeepalive)
	if err := b.measureIdleLink(ctx, r, site, floor, defaults, pods); err != nil {
		return fmt.Errorf("idle link: %w", err)
	}
	b.logf("measuring the reconnect after %d status changes while the broker is down", reconnectRounds*len(pods))
	if err := b.measureReconnect(ctx, r, site, pods); err != nil {
		return fmt.Errorf("reconnect: %w", err)
	}
	b.logf("measuring MQTT apply -> running with signed desired state (the agent trusts one key)")
	if err := b.measureSignedApply(ctx, r, site, pods); err != nil {
		return fmt.Errorf("signed apply over MQTT: %w", err)
	}
	return nil
}

// measureSignedApply is the apply figure again with the agent started with a trust anchor and every
// index signed by the control plane: what verifying the signature (and the digests it covers)
// costs a node, in time to running and in anon memory, beside the unsigned figures of this run.
func (b *bench) measureSignedApply(ctx context.Context, r *results, site *broker, pods []string) error {
	if _, err := signing.GenerateKeyPair(b.path("bench-signing")); err != nil {
		return err
	}
	priv, err := signing.LoadPrivateKey(b.path("bench-signing") + ".key")
	if err != nil {
		return err
	}
	saved := b.agentExtra
	defer func() { b.agentExtra = saved }()
	if err := b.stopAgent(); err != nil {
		return err
	}
	b.agentExtra = append(slices.Clone(saved), "--mqtt-trusted-key", b.path("bench-signing")+".pub")
	if _, err := b.startAgent(false); err != nil {
		return err
	}
	if err := b.waitReady(ctx); err != nil {
		return err
	}
	if _, err := b.waitRunning(ctx, pods); err != nil {
		return err
	}
	cp, err := b.newControlPlane(ctx, site, "cp-signed")
	if err != nil {
		return err
	}
	defer cp.c.Disconnect(100)
	cp.key = priv
	p50, p90, n, err := b.measureMQTTApply(ctx, cp)
	if err != nil {
		return err
	}
	r.MQTTApplySignedP50Ms, r.MQTTApplySignedP90Ms, r.mqttSignedSamples = ms(p50), ms(p90), n
	m, err := readMemory(b.agent.pid())
	if err != nil {
		return err
	}
	r.MQTTApplySignedAnonMiB = m.anonMiB()
	return nil
}

// measureMQTTApply publishes one pod at a time and times from just before the publish of its
// desired message (then the index) to containerd's /tasks/start event for its container.
func (b *bench) measureMQTTApply(ctx context.Context, cp *controlPlane) (p50, p90 time.Duration, samplesN int, err error) {
	names := append([]string{"mqtt-warmup"}, podNames("mqtt", 0, mqttApplyPods)...)
	var samples []time.Duration
	for i, n := range names {
		key := podKeys([]string{n})
		t0 := time.Now()
		if err := cp.apply(b.benchPod(n)); err != nil {
			return 0, 0, 0, err
		}
		wctx, cancel := b.stepCtx(ctx)
		found, err := b.rec.waitFor(wctx, "/tasks/start", t0, []string{n}, key)
		cancel()
		if err != nil {
			return 0, 0, 0, errors.Join(err, b.agentAlive())
		}
		if i > 0 {
			samples = append(samples, found[n].Received.Sub(t0))
		}
		if _, err := b.waitRunning(ctx, []string{n}); err != nil {
			return 0, 0, 0, err
		}
		if err := cp.delete(n); err != nil {
			return 0, 0, 0, err
		}
		if err := b.waitGone(ctx, []string{n}); err != nil {
			return 0, 0, 0, err
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The pods are gone (their desired topics were cleared with each deletion), so the control
	// plane clears their final statuses too: a reader would otherwise keep listing them.
	for _, n := range names {
		if err := cp.clear(mqttTopics.PodStatus(nodeName, podNamespace, n)); err != nil {
			return 0, 0, 0, err
		}
	}
	return percentile(samples, 50), percentile(samples, 90), len(samples), nil
}

// waitRetainedRunning reads the retained statuses of names from br until each says Running with
// the container the agent's API reports.
func (b *bench) waitRetainedRunning(ctx context.Context, br *broker, names []string) error {
	ctx, cancel := b.stepCtx(ctx)
	defer cancel()
	want, err := b.waitRunning(ctx, names)
	if err != nil {
		return err
	}
	c, err := mqttClient(br.harnessURL(), "reader")
	if err != nil {
		return err
	}
	defer c.Disconnect(100)
	ch, err := subscribe(c, mqttTopics.PodStatusFilter(nodeName))
	if err != nil {
		return err
	}
	got := map[string]podView{}
	for {
		ok := true
		for _, n := range names {
			p := want[n]
			if got[n] != viewOf(&p) {
				ok = false
			}
		}
		if ok {
			return nil
		}
		select {
		case m := <-ch:
			if n, ok := statusName(m.topic); ok && len(m.payload) > 0 {
				if s, err := protocol.DecodePodStatus(m.payload, 0); err == nil && !s.Deleted && s.Object != nil {
					got[n] = viewOf(s.Object)
				}
			}
		case <-ctx.Done():
			return fmt.Errorf("the broker's retained statuses did not all match the agent's within %v: got %v", b.cfg.step, got)
		}
	}
}

// measureIdleLink counts the idle agent's link and the two floors' links at the same time.
func (b *bench) measureIdleLink(ctx context.Context, r *results, site, floor, defaults *broker, pods []string) error {
	p := b.counters.poll(counterPeriod)
	defer p.close()
	if err := b.waitRetainedRunning(ctx, site, pods); err != nil {
		return err
	}
	settle := time.Now().Add(idleLinkSettle)
	windows := []*idleWindow{
		{port: site.client, start: -1, end: -1},
		{port: floor.client, start: -1, end: -1},
		{port: defaults.client, start: -1, end: -1},
	}
	bound := time.Now().Add(idleLinkSettle + 2*(mqttKeepalive+15*time.Second) + idleLinkWindow + 30*time.Second)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
		if err := b.agentAlive(); err != nil {
			return err
		}
		for _, f := range b.floors {
			if !f.alive() {
				return f.diedErr()
			}
		}
		s, err := p.snapshot()
		if err != nil {
			return err
		}
		done := true
		for _, w := range windows {
			if !w.advance(s, settle, idleLinkWindow, mqttKeepalive) {
				done = false
			}
		}
		if done {
			res := []idleResult{windows[0].result(s), windows[1].result(s), windows[2].result(s)}
			r.IdleLinkKBPerHour, r.IdleLinkFloorKBPerHour, r.IdleLinkPahoDefaultsKBPerH = res[0].KBPerH, res[1].KBPerH, res[2].KBPerH
			r.idleLink = res
			return nil
		}
		if time.Now().After(bound) {
			return fmt.Errorf("idle windows not complete by %v (bounded wait)", bound.Format(time.TimeOnly))
		}
	}
}

// measureReconnect: the agent (reconnect back-off capped at 1 s) loses its broker; while the
// broker is down each of the ten manifest-dir pods is updated reconnectRounds times (a new
// command: the agent replaces the container, so every update is a status change); then the broker
// returns and the figure runs until every pod's retained status matches what the agent's API says.
func (b *bench) measureReconnect(ctx context.Context, r *results, site *broker, pods []string) error {
	key := podKeys(pods)
	if err := b.stopAgent(); err != nil {
		return err
	}
	b.agentExtra = append(b.agentExtra, "--mqtt-reconnect-max", reconnectMax)
	if _, err := b.startAgent(false); err != nil {
		return err
	}
	if err := b.waitReady(ctx); err != nil {
		return err
	}
	if err := b.waitRetainedRunning(ctx, site, pods); err != nil {
		return err
	}
	if _, err := b.waitQuiet(ctx, site.client); err != nil {
		return err
	}
	session, err := b.onlineSession(site)
	if err != nil {
		return err
	}
	if err := b.stopBroker(site); err != nil {
		return err
	}
	outage := time.Now()
	for round := 1; round <= reconnectRounds; round++ {
		arg := strconv.Itoa(3600 + round)
		cur, err := b.waitRunning(ctx, pods)
		if err != nil {
			return err
		}
		for _, n := range pods {
			if err := os.WriteFile(filepath.Join(b.stagingDir(), n+".yaml"), b.podManifestCmd(n, arg), 0o644); err != nil {
				return err
			}
			if err := os.Rename(filepath.Join(b.stagingDir(), n+".yaml"), filepath.Join(b.manifestDir(), n+".yaml")); err != nil {
				return err
			}
		}
		// The API shows the new spec as soon as the manifest is read: the container must be new too.
		if _, err := b.waitPods(ctx, pods, func(p v1.Pod) string {
			if len(p.Spec.Containers) == 0 || len(p.Spec.Containers[0].Command) < 2 || p.Spec.Containers[0].Command[1] != arg {
				return "spec not yet sleep " + arg
			}
			old := cur[p.Name]
			if len(p.Status.ContainerStatuses) == 0 || len(old.Status.ContainerStatuses) == 0 ||
				p.Status.ContainerStatuses[0].ContainerID == old.Status.ContainerStatuses[0].ContainerID {
				return "container not yet replaced"
			}
			return ""
		}); err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
	}
	r.ReconnectStatusChanges = b.rec.count("/tasks/start", outage, time.Now(), pods, key)
	if r.ReconnectStatusChanges < reconnectRounds*len(pods) {
		return fmt.Errorf("containerd saw %d container starts for the %d updates made while the broker was down", r.ReconnectStatusChanges, reconnectRounds*len(pods))
	}
	// Let the agent settle (its outbox writer folds reports into one transaction); the figure's
	// clock has not started.
	time.Sleep(time.Second)
	list, err := b.api.ListPods(ctx, podNamespace)
	if err != nil {
		return err
	}
	want := map[string]podView{}
	for _, p := range list.Items {
		if slices.Contains(pods, p.Name) {
			want[p.Name] = viewOf(&p)
		}
	}
	logOffset := fileSize(site.log)
	before, err := b.counters.read()
	if err != nil {
		return err
	}

	up, err := b.startBroker(site)
	if err != nil {
		return err
	}
	reader, err := mqttClient(site.harnessURL(), "reader")
	if err != nil {
		return err
	}
	defer reader.Disconnect(100)
	ch, err := subscribe(reader, mqttTopics.PodStatusFilter(nodeName), mqttTopics.Liveness(nodeName))
	if err != nil {
		return err
	}
	wctx, cancel := b.stepCtx(ctx)
	defer cancel()
	got := map[string]podView{}
	var online, converged time.Time
	for converged.IsZero() {
		select {
		case m := <-ch:
			if m.topic == mqttTopics.Liveness(nodeName) {
				if l, err := protocol.DecodeLiveness(m.payload, 0); err == nil && l.Online && l.Session > session && online.IsZero() {
					online = m.at
				}
				continue
			}
			n, ok := statusName(m.topic)
			if !ok || len(m.payload) == 0 {
				continue
			}
			if s, err := protocol.DecodePodStatus(m.payload, 0); err == nil && !s.Deleted && s.Object != nil {
				got[n] = viewOf(s.Object)
			}
			all := true
			for _, n := range pods {
				if got[n] != want[n] {
					all = false
				}
			}
			if all {
				converged = m.at
			}
		case <-wctx.Done():
			var diff []string
			for _, n := range pods {
				if got[n] != want[n] {
					diff = append(diff, fmt.Sprintf("%s: retained %v, agent %v", n, got[n], want[n]))
				}
			}
			return fmt.Errorf("retained statuses did not converge within %v:\n  %s", b.cfg.step, strings.Join(diff, "\n  "))
		}
	}
	atConv, err := b.counters.read()
	if err != nil {
		return err
	}
	atQuiet, err := b.waitQuiet(ctx, site.client)
	if err != nil {
		return err
	}
	// The agent's view must not have moved while the figure ran.
	list, err = b.api.ListPods(ctx, podNamespace)
	if err != nil {
		return err
	}
	for _, p := range list.Items {
		if w, ok := want[p.Name]; ok && viewOf(&p) != w {
			return fmt.Errorf("pod %s changed during the reconnect: %v, then %v", p.Name, w, viewOf(&p))
		}
	}
	pubs, err := countPublishes(site.log, logOffset)
	if err != nil {
		return err
	}
	conv := atConv[site.client].sub(before[site.client])
	all := atQuiet.sub(before[site.client])
	r.ReconnectConvergeMs = ms(converged.Sub(up))
	r.ReconnectBytes = float64(conv.total())
	r.ReconnectStatusMessages = pubs.received["status/pods"]
	if online.IsZero() {
		return errors.New("the agent's online message of its new session was not seen after the broker returned")
	}
	r.reconnect.online = ms(online.Sub(up))
	r.ReconnectAfterOnlineMs = ms(converged.Sub(online))
	r.reconnect.conv, r.reconnect.all, r.reconnect.pubs = conv, all, pubs
	return nil
}

// onlineSession reads the agent's retained online message: the session of its connection.
func (b *bench) onlineSession(br *broker) (int64, error) {
	c, err := mqttClient(br.harnessURL(), "reader")
	if err != nil {
		return 0, err
	}
	defer c.Disconnect(100)
	ch, err := subscribe(c, mqttTopics.Liveness(nodeName))
	if err != nil {
		return 0, err
	}
	select {
	case m := <-ch:
		l, err := protocol.DecodeLiveness(m.payload, 0)
		if err != nil {
			return 0, fmt.Errorf("the agent's online message: %w", err)
		}
		if !l.Online {
			return 0, fmt.Errorf("the agent's online message says offline (session %d)", l.Session)
		}
		return l.Session, nil
	case <-time.After(5 * time.Second):
		return 0, errors.New("no retained online message from the agent within 5s")
	}
}

// waitQuiet waits until the counters of port have not moved for quietFor and returns them.
func (b *bench) waitQuiet(ctx context.Context, port int) (linkCount, error) {
	ctx, cancel := b.stepCtx(ctx)
	defer cancel()
	var last linkCount
	since := time.Now()
	for {
		m, err := b.counters.read()
		if err != nil {
			return linkCount{}, err
		}
		if c := m[port]; c != last {
			last, since = c, time.Now()
		} else if time.Since(since) >= quietFor {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return linkCount{}, fmt.Errorf("the link on port %d did not go quiet for %v within %v", port, quietFor, b.cfg.step)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// publishCounts is what mosquitto logged about the agent's PUBLISH packets, by topic class (the
// part of the topic after <prefix>/nodes/<node>/, with status/pods/<ns>/<name> as "status/pods").
type publishCounts struct {
	received      map[string]int // from the agent
	sent          map[string]int // to the agent (retained replays on its subscriptions)
	receivedBytes int            // payload bytes, as mosquitto reports them
	sentBytes     int
}

// countPublishes reads mosquitto's log (log_type all) from offset: "Received PUBLISH from CLIENT
// (d0, q1, r1, m2, 'TOPIC', ... (N bytes))" and "Sending PUBLISH to CLIENT (...)".
func countPublishes(logPath string, offset int64) (publishCounts, error) {
	pc := publishCounts{received: map[string]int{}, sent: map[string]int{}}
	f, err := os.Open(logPath)
	if err != nil {
		return pc, err
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return pc, err
	}
	node := mqttTopics.Node(nodeName) + "/"
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		var into map[string]int
		var bytes *int
		switch {
		case strings.Contains(line, "Received PUBLISH from "+nodeName+" ("):
			into, bytes = pc.received, &pc.receivedBytes
		case strings.Contains(line, "Sending PUBLISH to "+nodeName+" ("):
			into, bytes = pc.sent, &pc.sentBytes
		default:
			continue
		}
		topic := between(line, "'", "'")
		class := strings.TrimPrefix(topic, node)
		if strings.HasPrefix(class, "status/pods/") {
			class = "status/pods"
		} else if strings.HasPrefix(class, "desired/") {
			class = "desired"
		}
		into[class]++
		if i := strings.LastIndex(line, "("); i >= 0 {
			if n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSuffix(line[i+1:], "))"), " bytes")); err == nil {
				*bytes += n
			}
		}
	}
	return pc, sc.Err()
}

func between(s, open, close string) string {
	i := strings.Index(s, open)
	if i < 0 {
		return ""
	}
	s = s[i+len(open):]
	j := strings.Index(s, close)
	if j < 0 {
		return ""
	}
	return s[:j]
}

// stopMQTT stops the floors and brokers (by pid) and removes the counting rules.
func (b *bench) stopMQTT() error {
	var errs []error
	for _, f := range b.floors {
		errs = append(errs, f.stop(10*time.Second))
	}
	b.floors = nil
	for _, br := range b.brokers {
		errs = append(errs, b.stopBroker(br))
	}
	b.brokers = nil
	if b.counters != nil {
		errs = append(errs, b.counters.remove())
		b.counters = nil
	} else {
		errs = append(errs, removeCounters(b.cfg.iptables))
	}
	// Leftovers of a killed run, by their pid files and executables only.
	for _, pat := range []struct{ glob, exe string }{
		{b.runPath("mosquitto-*.pid"), filepath.Base(b.cfg.mosquitto)},
		{b.runPath("mqttfloor-*.pid"), filepath.Base(b.cfg.mqttFloor)},
	} {
		files, _ := filepath.Glob(pat.glob)
		for _, pf := range files {
			if pid, ok := leftoverPid(pf, pat.exe); ok {
				b.logf("stopping %s left by an earlier run (pid %d)", pat.exe, pid)
				syscall.Kill(pid, syscall.SIGKILL)
				waitGone(pid, 10*time.Second)
			}
			os.Remove(pf)
		}
	}
	return errors.Join(errs...)
}
