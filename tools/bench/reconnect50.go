package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
)

// The reconnect of protocol v2 (reconnect_bytes_50_mqtt_pods_1_changed): a node that subscribes
// to its index and fetches only the desired objects it lacks should move, on a reconnect, the index
// and what changed, not its whole desired set.
//
// The agent runs 50 pods from the control plane (ctlclient.Apply, busybox sleepers like every other
// pod of the harness, on the harness's containerd), on a broker of its own with persistence. Then
// the link is cut: the broker is stopped (SIGTERM: mosquitto saves its retained messages) and
// started again with only the harness listener open, so the agent cannot connect while the control
// plane changes one pod (a new command) through ctlclient on the same broker; that broker is
// stopped again, and started with both listeners. The figure is the agent's link bytes (both
// directions, whole IP packets, the harness's iptables counting on loopback) from just before that
// start until the link has been quiet for 2 s after the node took the change in: its acks list the
// pod applied at the new generation and digest, and its retained status shows the new container
// running.
//
// The floor (reconnect_floor_bytes_1_changed) is measured in the same run: a bare paho client (the
// node's client id, clean session, MQTT 3.1.1, keepalive 60 s) connects to a broker of its own
// that holds exactly the index and the changed object as the agent's broker held them, subscribes
// to the index (receives it), subscribes to the object's topic (receives it), publishes the changed
// pod's final status as the agent's broker holds it (QoS 1, retained, PUBACK) and nothing else;
// its link is counted the same way, from before the TCP connect until quiet.
const (
	r50Pods   = 50
	r50Ratio  = 1.5 // target: at most this many times the floor
	r50Prefix = "r50"
)

// r50Result is what the table shows besides the two figures.
type r50Result struct {
	conv, all, floor linkCount
	// Payload bytes of what the floor moves.
	indexBytes, objectBytes, statusBytes int
	acksBytes                            int // the node's retained acks at the end
	converge, online                     float64
	pubs                                 publishCounts
	desiredSent                          int // desired PUBLISHes the broker sent the agent
}

func (r results) reconnect50Ratio() float64 {
	if r.ReconnectFloorBytes1Changed == 0 {
		return 0
	}
	return r.ReconnectBytes50Pods1Changed / r.ReconnectFloorBytes1Changed
}

func (b *bench) measureReconnect50(ctx context.Context, r *results) error {
	if b.cfg.mosquitto == "" || b.cfg.iptables == "" {
		return errors.New("-mosquitto and -iptables are required (scripts/bench.sh passes them)")
	}
	site, err := b.newBroker(r50Prefix, true)
	if err != nil {
		return err
	}
	floor, err := b.newBroker(r50Prefix+"-floor", false)
	if err != nil {
		return err
	}
	// The MQTT step's counters (if it ran) are done with; the chain now counts these two ports.
	ctrs, err := newCounters(b.cfg.iptables, []int{site.client, floor.client})
	if err != nil {
		return err
	}
	b.counters = ctrs
	for _, br := range []*broker{site, floor} {
		if _, err := b.startBroker(br); err != nil {
			return err
		}
		defer b.stopBroker(br)
	}
	saved := b.agentExtra
	defer func() { b.agentExtra = saved }()
	if err := b.stopAgent(); err != nil {
		return err
	}
	b.agentExtra = []string{"--mqtt-broker", site.clientURL(), "--secret-key-file", b.path("node.key"),
		"--mqtt-allow-host-namespaces", "--mqtt-reconnect-max", reconnectMax}
	if _, err := b.startAgent(false); err != nil {
		return err
	}
	defer b.stopAgent()
	if err := b.waitReady(ctx); err != nil {
		return err
	}

	pods := podNames(r50Prefix, 0, r50Pods)
	cl, err := b.ctlConnect(ctx, site, "r50-cp")
	if err != nil {
		return err
	}
	if _, err := b.waitNodeAcks(ctx, cl, nodeName); err != nil {
		cl.Close()
		return err
	}
	var objs []any
	for _, n := range pods {
		objs = append(objs, b.benchPod(n))
	}
	b.logf("applying %d pods with ctlclient", len(pods))
	if _, err := cl.Apply(ctx, nodeName, objs); err != nil {
		cl.Close()
		return err
	}
	idx, err := cl.Index(ctx, nodeName)
	cl.Close()
	if err != nil {
		return err
	}
	acks, err := followAcks(site, "r50-acks", nodeName)
	if err != nil {
		return err
	}
	if _, _, err := acks.wait(ctx, b, "all 50 pods applied", func(a *protocol.Acks) bool { return appliedAll(a, idx) }); err != nil {
		acks.close()
		return err
	}
	acks.close()
	before, err := b.waitRunning(ctx, pods)
	if err != nil {
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

	// The outage, and the change made during it.
	changed := pods[0]
	key := protocol.ObjectKey(protocol.KindPod, podNamespace, changed)
	oldID := before[changed].Status.ContainerStatuses[0].ContainerID
	b.logf("cutting the agent's link; changing %s meanwhile", changed)
	if err := b.stopBroker(site); err != nil {
		return err
	}
	if err := b.startBrokerHarnessOnly(site); err != nil {
		return err
	}
	cl, err = b.ctlConnect(ctx, site, "r50-cp2")
	if err != nil {
		return err
	}
	pod := b.benchPod(changed)
	pod.Spec.Containers[0].Command = []string{"sleep", "3601"}
	res, err := cl.Apply(ctx, nodeName, []any{pod})
	if err == nil && (len(res.Objects) != 1 || res.Objects[0].Unchanged) {
		err = fmt.Errorf("the apply of the changed pod wrote nothing: %+v", res)
	}
	if err == nil {
		idx, err = cl.Index(ctx, nodeName)
	}
	cl.Close()
	if err != nil {
		return fmt.Errorf("change %s while the agent is cut off: %w", changed, err)
	}
	want, ok := idx.Objects[key]
	if !ok || want.Generation != res.Objects[0].Generation {
		return fmt.Errorf("the broker's index after the change lists %s as %+v, want generation %d", key, want, res.Objects[0].Generation)
	}
	if err := b.stopBroker(site); err != nil {
		return err
	}
	if err := b.agentAlive(); err != nil {
		return err
	}

	// The reconnect.
	logOffset := fileSize(site.log)
	pre, err := b.counters.read()
	if err != nil {
		return err
	}
	up, err := b.startBroker(site)
	if err != nil {
		return err
	}
	reader, err := orderedClient(site.harnessURL(), "r50-reader") // the acks' order matters
	if err != nil {
		return err
	}
	defer reader.Disconnect(100)
	statusTopic := mqttTopics.PodStatus(nodeName, podNamespace, changed)
	ch, err := subscribe(reader, statusTopic, mqttTopics.Acks(nodeName), mqttTopics.Liveness(nodeName))
	if err != nil {
		return err
	}
	wctx, cancel := b.stepCtx(ctx)
	defer cancel()
	var (
		tookIn, published bool
		online, converged time.Time
	)
	for converged.IsZero() {
		select {
		case m := <-ch:
			switch m.topic {
			case mqttTopics.Liveness(nodeName):
				if l, err := protocol.DecodeLiveness(m.payload, 0); err == nil && l.Online && l.Session > session && online.IsZero() {
					online = m.at
				}
			case mqttTopics.Acks(nodeName):
				if a, err := protocol.DecodeAcks(m.payload, protocol.DefaultMaxPayload); err == nil {
					applied, known := a.AppliedIn(idx)
					tookIn = known && applied[key] == want
				}
			case statusTopic:
				if s, err := protocol.DecodePodStatus(m.payload, 0); err == nil && s.Object != nil {
					published = runsNew(s.Object, oldID)
				}
			}
			if tookIn && published {
				converged = m.at
			}
		case <-wctx.Done():
			return fmt.Errorf("the agent did not take the change in within %v (acks taken in: %t, new status published: %t)", b.cfg.step, tookIn, published)
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
	// The other 49 kept their containers; the changed one runs what its last status says.
	after, err := b.waitRunning(ctx, pods)
	if err != nil {
		return err
	}
	for _, n := range pods[1:] {
		if a, b := after[n].Status.ContainerStatuses[0].ContainerID, before[n].Status.ContainerStatuses[0].ContainerID; a != b {
			return fmt.Errorf("pod %s was restarted by the reconnect (%s, then %s)", n, b, a)
		}
	}
	final, err := retainedPayloads(ctx, b, site, statusTopic, mqttTopics.Index(nodeName), mqttTopics.Desired(nodeName, protocol.KindPod, podNamespace, changed), mqttTopics.Acks(nodeName))
	if err != nil {
		return err
	}
	if s, err := protocol.DecodePodStatus(final[statusTopic], 0); err != nil || s.Object == nil || viewOf(s.Object) != viewOf(ptr(after[changed])) {
		return fmt.Errorf("the retained status of %s does not match the agent's API after the reconnect (decode error %v)", changed, err)
	}
	pubs, err := countPublishes(site.log, logOffset)
	if err != nil {
		return err
	}
	x := &r.reconnect50
	x.conv, x.all = atConv[site.client].sub(pre[site.client]), atQuiet.sub(pre[site.client])
	x.converge = ms(converged.Sub(up))
	if !online.IsZero() {
		x.online = ms(online.Sub(up))
	}
	x.pubs, x.desiredSent = pubs, pubs.sent["desired"]
	x.indexBytes, x.objectBytes, x.statusBytes = len(final[mqttTopics.Index(nodeName)]), len(final[mqttTopics.Desired(nodeName, protocol.KindPod, podNamespace, changed)]), len(final[statusTopic])
	x.acksBytes = len(final[mqttTopics.Acks(nodeName)])
	r.ReconnectBytes50Pods1Changed = float64(x.all.total())

	b.logf("measuring the floor: a bare paho client moving the index, the changed object and one status")
	fl, err := b.measureReconnectFloor(ctx, floor, final[mqttTopics.Index(nodeName)],
		mqttTopics.Desired(nodeName, protocol.KindPod, podNamespace, changed), final[mqttTopics.Desired(nodeName, protocol.KindPod, podNamespace, changed)],
		statusTopic, final[statusTopic])
	if err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	x.floor = fl
	r.ReconnectFloorBytes1Changed = float64(fl.total())

	// Clean up: the 50 pods go (the later steps expect the node without them).
	cl, err = b.ctlConnect(ctx, site, "r50-cp3")
	if err != nil {
		return err
	}
	defer cl.Close()
	for _, n := range pods {
		if _, err := cl.Delete(ctx, nodeName, protocol.KindPod, podNamespace, n); err != nil {
			return fmt.Errorf("delete %s: %w", n, err)
		}
	}
	return b.waitGone(ctx, pods)
}

func ptr[T any](v T) *T { return &v }

// runsNew says whether p runs the changed pod's new spec in a new, running container.
func runsNew(p *v1.Pod, oldID string) bool {
	if p.Status.Phase != v1.PodRunning || len(p.Spec.Containers) == 0 || len(p.Spec.Containers[0].Command) < 2 ||
		p.Spec.Containers[0].Command[1] != "3601" || len(p.Status.ContainerStatuses) == 0 {
		return false
	}
	cs := p.Status.ContainerStatuses[0]
	return cs.State.Running != nil && cs.ContainerID != "" && cs.ContainerID != oldID
}

// appliedAll says whether the acks are for idx and list every entry of it applied.
func appliedAll(a *protocol.Acks, idx *protocol.Index) bool {
	applied, known := a.AppliedIn(idx)
	if !known || len(applied) != len(idx.Objects) {
		return false
	}
	for k, e := range idx.Objects {
		if applied[k] != e {
			return false
		}
	}
	return true
}

// startBrokerHarnessOnly starts br with its client listener closed: the client under measurement
// cannot connect, the harness can. Its retained state is br's (the same persistence file).
func (b *bench) startBrokerHarnessOnly(br *broker) error {
	data, err := os.ReadFile(br.conf)
	if err != nil {
		return err
	}
	client := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\n", br.client)
	if !strings.Contains(string(data), client) {
		return fmt.Errorf("%s: no client listener block %q", br.conf, client)
	}
	alt := filepath.Join(br.dir, "mosquitto-harness-only.conf")
	conf := strings.Replace(string(data), client, "# client listener closed: the client under measurement cannot connect\n", 1)
	if err := os.WriteFile(alt, []byte(conf), 0o600); err != nil {
		return err
	}
	full := br.conf
	br.conf = alt
	defer func() { br.conf = full }()
	_, err = b.startBroker(br)
	return err
}

// retainedPayloads reads the retained payloads of topics from br's harness listener.
func retainedPayloads(ctx context.Context, b *bench, br *broker, topics ...string) (map[string][]byte, error) {
	cl, err := b.ctlConnect(ctx, br, "r50-read")
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	got, err := cl.Snapshot(ctx, topics...)
	if err != nil {
		return nil, err
	}
	for _, t := range topics {
		if len(got[t]) == 0 {
			return nil, fmt.Errorf("the broker holds no retained message on %s", t)
		}
	}
	return got, nil
}

// measureReconnectFloor: see the comment at the top. The retained index and object are put on the
// floor's broker through its harness listener (not counted) first.
func (b *bench) measureReconnectFloor(ctx context.Context, br *broker, index []byte, objTopic string, obj []byte, statusTopic string, status []byte) (linkCount, error) {
	h, err := mqttClient(br.harnessURL(), "r50-floor-setup")
	if err != nil {
		return linkCount{}, err
	}
	for _, m := range []struct {
		topic   string
		payload []byte
	}{{mqttTopics.Index(nodeName), index}, {objTopic, obj}} {
		if err := waitTok(h.Publish(m.topic, 1, true, m.payload), "publish "+m.topic); err != nil {
			h.Disconnect(100)
			return linkCount{}, err
		}
	}
	h.Disconnect(100)
	if _, err := b.waitQuiet(ctx, br.client); err != nil {
		return linkCount{}, err
	}
	pre, err := b.counters.read()
	if err != nil {
		return linkCount{}, err
	}
	got := make(chan string, 4)
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(br.clientURL()).SetClientID(nodeName).
		SetProtocolVersion(4).SetCleanSession(true).SetAutoReconnect(false).SetKeepAlive(mqttKeepalive).
		SetConnectTimeout(5 * time.Second).SetDialer(&net.Dialer{KeepAlive: -1}).
		SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) {
			select {
			case got <- m.Topic():
			default:
			}
		}))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return linkCount{}, fmt.Errorf("connect the floor client to %s: %v", br.clientURL(), tok.Error())
	}
	defer c.Disconnect(100)
	var mu sync.Mutex
	var seen []string
	receive := func(topic string) error {
		if err := waitTok(c.Subscribe(topic, 1, nil), "subscribe "+topic); err != nil {
			return err
		}
		for {
			mu.Lock()
			ok := slices.Contains(seen, topic)
			mu.Unlock()
			if ok {
				return nil
			}
			select {
			case t := <-got:
				mu.Lock()
				seen = append(seen, t)
				mu.Unlock()
			case <-time.After(10 * time.Second):
				return fmt.Errorf("the retained message on %s did not arrive within 10s", topic)
			}
		}
	}
	if err := receive(mqttTopics.Index(nodeName)); err != nil {
		return linkCount{}, err
	}
	if err := receive(objTopic); err != nil {
		return linkCount{}, err
	}
	if err := waitTok(c.Publish(statusTopic, 1, true, status), "publish "+statusTopic); err != nil {
		return linkCount{}, err
	}
	end, err := b.waitQuiet(ctx, br.client)
	if err != nil {
		return linkCount{}, err
	}
	return end.sub(pre[br.client]), nil
}
