package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

// The cost of probing (issue 11): 25 pods serving HTTP, each with an httpGet readiness probe every
// second, against the same 25 pods without probes.

const (
	probePods = 25
	// probeCPUTarget and probeAnonTarget are the targets: percent of one core, MiB.
	probeCPUTarget  = 1.0
	probeAnonTarget = 2.0
)

// probeRun is one side of the comparison.
type probeRun struct {
	cpuPct  float64
	cpuMs   float64
	wallS   float64
	anonMiB float64 // mean of the samples taken through the window
	anonEnd float64 // at the window's end
	samples int
}

// anonSample is how often the agent's anon memory is read in the window. One reading would catch
// the Go heap at a random point of its collection cycle (a few MiB apart from one point to
// another); the mean over the window does not depend on that. Reading /proc does not disturb the
// agent.
const anonSample = time.Second

// measureProbes runs the 25 pods twice, without and then with a readiness probe, each time under a
// freshly started agent that adopts them already running, so both figures come from an agent
// process of the same age that did the same work except probing. For each: wait until no status
// changes, read the agent's CPU time over idleCPUWindow (no container may start or exit in it) and
// its anon memory every anonSample through the window. probe_cpu_pct_25_pods is the probed
// agent's CPU; probe_anon_delta_mib the difference of the two runs' mean anon memory. It removes its pods and leaves the agent stopped.
func (b *bench) measureProbes(ctx context.Context, r *results) error {
	if b.agent == nil {
		if _, err := b.startAgent(false); err != nil {
			return err
		}
		if err := b.waitReady(ctx); err != nil {
			return err
		}
	}
	// Only this step's pods: earlier steps' are removed.
	left, err := filepath.Glob(filepath.Join(b.manifestDir(), "*.yaml"))
	if err != nil {
		return err
	}
	var old []string
	for _, f := range left {
		old = append(old, strings.TrimSuffix(filepath.Base(f), ".yaml"))
	}
	if err := b.removePods(ctx, old); err != nil {
		return err
	}

	names := podNames("probed", 0, probePods)
	base, err := b.probeRun(ctx, names, false)
	if err != nil {
		return fmt.Errorf("without probes: %w", err)
	}
	probed, err := b.probeRun(ctx, names, true)
	if err != nil {
		return fmt.Errorf("with probes: %w", err)
	}
	r.ProbeCPUPct25Pods = probed.cpuPct
	r.ProbeAnonDeltaMiB = round1(probed.anonMiB - base.anonMiB)
	r.probes.base, r.probes.probed = base, probed
	if err := b.removePods(ctx, names); err != nil {
		return err
	}
	return b.stopAgent()
}

// probeRun puts the pods (with or without probes), waits until they run (and are ready), restarts
// the agent over them, and measures.
func (b *bench) probeRun(ctx context.Context, names []string, probes bool) (probeRun, error) {
	for _, n := range names {
		tmp := filepath.Join(b.stagingDir(), n+".yaml")
		if err := os.WriteFile(tmp, b.webManifest(n, probes), 0o644); err != nil {
			return probeRun{}, err
		}
		if err := os.Rename(tmp, filepath.Join(b.manifestDir(), n+".yaml")); err != nil {
			return probeRun{}, err
		}
	}
	// With probes, the pods' containers are replaced (the spec changed) and must pass their probe.
	ready := func(p v1.Pod) string {
		if probes && !(b.probedSpec(p) && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready) {
			return "not ready with its probe yet"
		}
		return ""
	}
	if _, err := b.waitPods(ctx, names, ready); err != nil {
		return probeRun{}, err
	}
	if err := b.stopAgent(); err != nil {
		return probeRun{}, err
	}
	if _, err := b.startAgent(false); err != nil {
		return probeRun{}, err
	}
	if err := b.waitReady(ctx); err != nil {
		return probeRun{}, err
	}
	if _, err := b.waitPods(ctx, names, func(p v1.Pod) string {
		for _, cs := range p.Status.ContainerStatuses {
			if !cs.Ready {
				return "container " + cs.Name + " not ready"
			}
		}
		return ""
	}); err != nil {
		return probeRun{}, err
	}
	if err := b.waitPodsSettled(ctx, names); err != nil {
		return probeRun{}, err
	}

	pid := b.agent.pid()
	cpu0, err := cpuTime(pid, false)
	if err != nil {
		return probeRun{}, err
	}
	t0 := time.Now()
	var anonSum int64
	samples := 0
	tick := time.NewTicker(anonSample)
	defer tick.Stop()
	end := time.After(idleCPUWindow)
window:
	for {
		select {
		case <-tick.C:
			m, err := readMemory(pid)
			if err != nil {
				return probeRun{}, errors.Join(err, b.agentAlive())
			}
			anonSum += m.AnonKiB
			samples++
		case <-end:
			break window
		case <-ctx.Done():
			return probeRun{}, ctx.Err()
		}
	}
	cpu1, err := cpuTime(pid, false)
	t1 := time.Now()
	if err != nil {
		return probeRun{}, errors.Join(err, b.agentAlive())
	}
	key := podKeys(names)
	for _, n := range names {
		if evs := b.rec.between(t0, t1, n, key); len(evs) > 0 {
			return probeRun{}, fmt.Errorf("pod %s was not steady in the window: containerd saw %s for %s", n, evs[0].Topic, evs[0].ContainerID)
		}
	}
	// Still all ready: a probe that failed in the window would make the figure one of failures.
	if _, err := b.waitPods(ctx, names, func(p v1.Pod) string {
		if len(p.Status.ContainerStatuses) == 0 || !p.Status.ContainerStatuses[0].Ready {
			return "not ready after the window"
		}
		return ""
	}); err != nil {
		return probeRun{}, err
	}
	label := "probes-none"
	if probes {
		label = "probes-25"
	}
	m, err := b.memoryAfter(ctx, 0, label)
	if err != nil {
		return probeRun{}, err
	}
	used, wall := cpu1-cpu0, t1.Sub(t0)
	return probeRun{cpuPct: round2(100 * used.Seconds() / wall.Seconds()), cpuMs: ms(used), wallS: round1(wall.Seconds()),
		anonMiB: round1(float64(anonSum) / float64(samples) / 1024), anonEnd: m.anonMiB(), samples: samples}, nil
}

// probedSpec reports whether the pod listed is the version with the readiness probe.
func (b *bench) probedSpec(p v1.Pod) bool {
	return len(p.Spec.Containers) == 1 && p.Spec.Containers[0].ReadinessProbe != nil
}

// webManifest is a pod serving a page over HTTP with busybox httpd, with an httpGet readiness
// probe every second when probe is set.
func (b *bench) webManifest(name string, probe bool) []byte {
	m := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: web
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", "echo ok > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"]
`, name, podNamespace, b.cfg.image)
	if probe {
		m += `    readinessProbe:
      httpGet: {path: /, port: 8080}
      periodSeconds: 1
`
	}
	return []byte(m)
}
