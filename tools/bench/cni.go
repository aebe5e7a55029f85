package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/mqlet/mqlet/agent/cni"
	"github.com/mqlet/mqlet/internal/netclean"
	v1 "k8s.io/api/core/v1"
)

// The bench's pod network: mqlet's default chain on a bridge and subnet of its own, its host-local
// allocations under the bench's lib dir. The pods of every other figure are hostNetwork (the
// figures of earlier issues), so only pod_start_cni_* attaches pods to it.
const (
	benchNetwork = "mqlet-bench"
	benchBridge  = "mqbench0"
	benchSubnet  = "10.124.0.0/24"
)

func (b *bench) cniConfDir() string { return b.path("cni/net.d") }
func (b *bench) cniDataDir() string { return b.path("cni/ipam") }

// writeCNIConf writes the bench network into the agent's CNI configuration directory.
func (b *bench) writeCNIConf() error {
	data, err := cni.DefaultNetwork{Name: benchNetwork, Bridge: benchBridge, Subnet: benchSubnet, DataDir: b.cniDataDir()}.ConfList()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(b.cniConfDir(), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(b.cniConfDir(), "10-"+benchNetwork+".conflist"), data, 0o644)
}

// cleanupCNI removes the bench network from the host: after a normal run its pods were deleted
// (DEL) and only the bridge is left; after a killed run their rules too.
func cleanupCNI() error { return netclean.Network(benchBridge, benchNetwork) }

// cniPodManifest is podManifest without hostNetwork: the pod gets its address from the bench
// network.
func (b *bench) cniPodManifest(name string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: sleep
    image: %s
    imagePullPolicy: Never
    command: ["sleep", "3600"]
`, name, podNamespace, b.cfg.image)
}

// allocated counts the addresses host-local holds in the bench network.
func (b *bench) allocated() (int, error) {
	entries, err := os.ReadDir(filepath.Join(b.cniDataDir(), benchNetwork))
	if os.IsNotExist(err) {
		return 0, nil
	}
	n := 0
	for _, e := range entries {
		if net.ParseIP(e.Name()) != nil {
			n++
		}
	}
	return n, err
}

// measurePodStartCNI is pod_start with the pod attached to the bench network (bridge, host-local,
// portmap, loopback: four plugin runs), interleaved with ctr run samples the same way. Every pod
// must come up with an address from the network, and every address must be released after.
func (b *bench) measurePodStartCNI(ctx context.Context, r *results) error {
	if err := b.agentAlive(); err != nil {
		return err
	}
	withIP := func(p v1.Pod) string {
		_, subnet, _ := net.ParseCIDR(benchSubnet)
		if ip := net.ParseIP(p.Status.PodIP); ip == nil || !subnet.Contains(ip) {
			return fmt.Sprintf("podIP %q not in %s", p.Status.PodIP, benchSubnet)
		}
		return ""
	}
	cniSample := func(name string) (sample, error) {
		return b.agentSampleOf(ctx, name, b.cniPodManifest, withIP)
	}
	if _, err := cniSample("cni-warmup"); err != nil {
		return fmt.Errorf("warm-up pod: %w", err)
	}
	var agent, ctrWall []sample
	for i := 0; i < b.cfg.samples; i++ {
		for j := 0; j < 2; j++ {
			if (i+j)%2 == 0 {
				s, err := cniSample(fmt.Sprintf("cni-%02d", i))
				if err != nil {
					return fmt.Errorf("sample %d: %w", i, err)
				}
				agent = append(agent, s)
			} else {
				w, _, err := b.ctrSample(ctx, fmt.Sprintf("ctr-cni-%02d", i))
				if err != nil {
					return fmt.Errorf("ctr sample %d: %w", i, err)
				}
				ctrWall = append(ctrWall, w)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// Deletion runs DEL after the containers are gone: give it a bounded moment.
	deadline := time.Now().Add(b.cfg.step)
	for {
		n, err := b.allocated()
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d pod addresses still allocated in %s after the samples' pods were removed", n, b.cniDataDir())
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.PodStartCNIP50Ms, r.PodStartCNIP90Ms = ms(percentile(totals(agent), 50)), ms(percentile(totals(agent), 90))
	r.cniCtrRunP50Ms = ms(percentile(totals(ctrWall), 50))
	r.cniSamples = len(agent)
	return nil
}

// cniTarget is the target of pod_start_cni_p50_ms: 1.5 x ctr_run_p50_ms of the same run (the
// start step's, else this step's own interleaved ctr samples).
func (r results) cniTarget() float64 {
	if r.CtrRunP50Ms > 0 {
		return 1.5 * r.CtrRunP50Ms
	}
	return 1.5 * r.cniCtrRunP50Ms
}
