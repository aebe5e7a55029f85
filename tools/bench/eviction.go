package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/mqlet/mqlet/agent/admission"
	"github.com/mqlet/mqlet/hw"
	"github.com/mqlet/mqlet/sync/ctlclient"
	"github.com/mqlet/mqlet/sync/protocol"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The eviction figure (issue 10): how long a pod that drives the node into memory pressure lives
// on after the crossing.
//
// The agent runs with every eviction setting at its default (monitoring period 10 s: the kernel's
// memcg threshold or PSI trigger is what makes it prompt) but a hard memory.available threshold
// set evictionMargin under what the node has free when the sample starts. A pod from the control
// plane (manifest-dir pods are never evicted) waits for a flag file in its emptyDir, then two
// busybox dd processes each fill and hold a 1.5 GiB buffer (anonymous memory, charged to the pod's
// cgroup).
//
//   - t0, the crossing: the first instant the harness's own reading of memory.available, computed
//     as the agent computes it (hw.NodeMemory: capacity minus the root cgroup's working set) and
//     polled every evictionPoll, is below the threshold.
//   - t1: containerd's /tasks/exit event of the pod's container, as the harness received it.
//
// eviction_ms is the median of evictionSamples t1 - t0; the agent's own log line "evicting pod"
// splits it into detection and stop.
const (
	evictionSamples = 5
	evictionMargin  = 1 << 30 // bytes under memory.available at the start
	evictionHold    = "1536M" // per dd; two of them
	evictionPoll    = 2 * time.Millisecond
)

type evictionSample struct {
	total, decide time.Duration // crossing -> /tasks/exit; crossing -> the agent's "evicting pod" line
}

func (b *bench) measureEviction(ctx context.Context, r *results) error {
	if b.cfg.mosquitto == "" {
		return errors.New("-mosquitto is required (scripts/bench.sh passes it): the evicted pod comes over MQTT")
	}
	site, err := b.newBroker("eviction", false)
	if err != nil {
		return err
	}
	if _, err := b.startBroker(site); err != nil {
		return err
	}
	defer b.stopBroker(site)
	saved := b.agentExtra
	defer func() { b.agentExtra = saved }()

	// The control plane is ctlclient, the real writer: this broker is new, but the agent's state
	// holds the index (and revision) an earlier step's control plane reached, so each write must
	// build on where the node stands (ctl.go, waitNodeAcks).
	cp, err := b.ctlConnect(ctx, site, "eviction-cp")
	if err != nil {
		return err
	}
	defer cp.Close()
	var samples []evictionSample
	for i := 0; i < evictionSamples; i++ {
		s, err := b.evictionSample(ctx, site, cp, fmt.Sprintf("hog-%d", i))
		if err != nil {
			return fmt.Errorf("sample %d: %w", i, err)
		}
		b.logf("eviction sample %d: crossing -> agent decides %.1f ms -> /tasks/exit %.1f ms", i, ms(s.decide), ms(s.total))
		samples = append(samples, s)
	}
	var totals, decides []time.Duration
	for _, s := range samples {
		totals, decides = append(totals, s.total), append(decides, s.decide)
	}
	r.EvictionMs = ms(percentile(totals, 50))
	r.eviction.max = ms(percentile(totals, 100))
	r.eviction.decide = ms(percentile(decides, 50))
	r.eviction.samples = len(samples)
	return b.stopAgent()
}

// evictionSample restarts the agent with the threshold under what is free now, runs the hog, and
// times it from the crossing to its exit.
func (b *bench) evictionSample(ctx context.Context, site *broker, cp *ctlclient.Client, name string) (evictionSample, error) {
	if err := b.stopAgent(); err != nil {
		return evictionSample{}, err
	}
	mem, err := hw.NodeMemory("/")
	if err != nil {
		return evictionSample{}, err
	}
	if mem.Available < 2*evictionMargin+3<<30 {
		return evictionSample{}, fmt.Errorf("memory.available is %d MiB; the figure needs at least %d MiB", mem.Available>>20, (2*evictionMargin+3<<30)>>20)
	}
	threshold := (mem.Available - evictionMargin) >> 20 // MiB
	// Only this figure's flags: an earlier step's broker may be gone.
	b.agentExtra = []string{"--mqtt-broker", site.clientURL(),
		"--secret-key-file", b.path("node.key"), "--eviction-hard", fmt.Sprintf("memory.available<%dMi", threshold)}
	if _, err := b.startAgent(false); err != nil {
		return evictionSample{}, err
	}
	if err := b.waitReady(ctx); err != nil {
		return evictionSample{}, err
	}
	// The node's acks on this broker first: on the first sample the broker is new and holds no
	// index, and an apply that does not see the acks would start below the node's revision.
	if _, err := b.waitNodeAcks(ctx, cp, nodeName); err != nil {
		return evictionSample{}, err
	}
	if _, err := cp.Apply(ctx, nodeName, []any{b.hogPod(name)}); err != nil {
		return evictionSample{}, err
	}
	if _, err := b.waitRunning(ctx, []string{name}); err != nil {
		return evictionSample{}, err
	}

	// The sampler runs from before the flag to the exit.
	level := threshold << 20
	var crossing time.Time
	var once sync.Once
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(evictionPoll)
		defer t.Stop()
		for {
			if m, err := hw.NodeMemory("/"); err == nil && m.Available < level {
				now := time.Now()
				once.Do(func() { crossing = now })
				return
			}
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	uid := admission.StableUID(nodeName, podNamespace, name)
	flag := b.path(filepath.Join("agent-state", "pods", string(uid), "volumes", "ctl", "go"))
	released := time.Now()
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		stop()
		wg.Wait()
		return evictionSample{}, fmt.Errorf("release the hog: %w", err)
	}
	wctx, cancel := b.stepCtx(ctx)
	found, err := b.rec.waitFor(wctx, "/tasks/exit", released, []string{name}, podKeys([]string{name}))
	cancel()
	stop()
	wg.Wait()
	if err != nil {
		return evictionSample{}, errors.Join(err, b.agentAlive())
	}
	if crossing.IsZero() {
		return evictionSample{}, fmt.Errorf("the hog exited before the harness saw memory.available under %d MiB", threshold)
	}
	exit := found[name].Received
	// The pod must have been evicted, not have died by itself.
	if err := b.waitEvicted(ctx, name); err != nil {
		return evictionSample{}, err
	}
	decided, err := logTime(b.path("agent.log"), "eviction: evicting pod", "pod="+podNamespace+"/"+name)
	if err != nil {
		return evictionSample{}, err
	}
	if _, err := cp.Delete(ctx, nodeName, protocol.KindPod, podNamespace, name); err != nil {
		return evictionSample{}, err
	}
	if err := b.waitGone(ctx, []string{name}); err != nil {
		return evictionSample{}, err
	}
	return evictionSample{total: exit.Sub(crossing), decide: decided.Sub(crossing)}, nil
}

// waitEvicted polls the agent's API until the pod is Failed with reason Evicted.
func (b *bench) waitEvicted(ctx context.Context, name string) error {
	ctx, cancel := b.stepCtx(ctx)
	defer cancel()
	why := "not listed"
	for {
		if err := b.agentAlive(); err != nil {
			return err
		}
		if pods, err := b.api.ListPods(ctx, podNamespace); err == nil {
			for _, p := range pods.Items {
				if p.Name != name {
					continue
				}
				if p.Status.Phase == v1.PodFailed && p.Status.Reason == "Evicted" {
					return nil
				}
				why = fmt.Sprintf("phase %s, reason %q", p.Status.Phase, p.Status.Reason)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s exited but is not Failed/Evicted within %v: %s", name, b.cfg.step, why)
		case <-time.After(pollAPI):
		}
	}
}

// hogPod waits for the flag file, then holds 3 GiB until it is killed.
func (b *bench) hogPod(name string) *v1.Pod {
	grace := int64(30) // a hard eviction does not wait for it
	hold := "dd if=/dev/zero bs=" + evictionHold + " count=1 2>/dev/null | sleep 3600"
	return &v1.Pod{
		TypeMeta:   metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace},
		Spec: v1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Volumes:                       []v1.Volume{{Name: "ctl", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}},
			Containers: []v1.Container{{Name: "hog", Image: b.cfg.image, ImagePullPolicy: v1.PullNever,
				Command:      []string{"sh", "-c", "while [ ! -e /ctl/go ]; do sleep 0.05; done; " + hold + " & " + hold + " & wait"},
				Resources:    v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse("16Mi")}},
				VolumeMounts: []v1.VolumeMount{{Name: "ctl", MountPath: "/ctl"}}}},
		},
	}
}

// logTime finds the last line of the agent's text log holding every part and returns its time=.
func logTime(path string, parts ...string) (time.Time, error) {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}, err
	}
	defer f.Close()
	var last time.Time
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		line := s.Text()
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			last = t
		}
	}
	if last.IsZero() {
		return last, fmt.Errorf("%s: no line with %q", path, parts)
	}
	return last, nil
}
