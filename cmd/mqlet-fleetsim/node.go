package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"

	"github.com/mqlet/mqlet/agent/nodestatus"
	"github.com/mqlet/mqlet/agent/objects"
	"github.com/mqlet/mqlet/cmd/mqlet-fleetsim/simruntime"
	"github.com/mqlet/mqlet/hw"
	"github.com/mqlet/mqlet/node"
	"github.com/mqlet/mqlet/store"
)

// LabelSimulated marks every node of the fleet simulator, so nobody mistakes one for a device.
const LabelSimulated = "mqlet.io/simulated"

// simNode is one simulated node: the agent's parts as `mqlet agent` builds them (node.New), with
// an in-memory store, the in-memory runtime and made-up hardware.
type simNode struct {
	*node.Node
	name string
}

// simPodCIDR is where every simulated node's pod addresses come from (each node has the whole
// range, as each real node has its own pod network): RFC 2544's benchmarking range, which no real
// host uses, so an httpGet or tcpSocket probe of a simulated pod reaches no real pod of this machine.
var simPodCIDR = netip.MustParsePrefix("198.18.0.0/15")

// simStore is the in-memory state with session numbers that start at the fleet's start time: a
// restarted simulator's nodes must not reuse their previous run's sessions.
type simStore struct {
	*store.Memory
	base int64
}

func (s simStore) NextSession() (int64, error) {
	n, err := s.Memory.NextSession()
	return s.base + n, err
}

// simLogs answers `mqlet ctl logs` for a simulated node: its containers write nothing.
type simLogs struct{}

func (simLogs) LogPath(namespace, name, container string, _ bool) (string, error) {
	return "", fmt.Errorf("pod %s/%s container %q: simulated containers write no logs", namespace, name, container)
}

// newSimNode builds node i; nothing runs or connects before its Run.
func newSimNode(ctx context.Context, f *fleet, i int) (*simNode, error) {
	cfg := f.cfg
	cfg.NodeName = f.name(i)
	cfg.NodeLabels = map[string]string{LabelSimulated: "true"}
	maps.Copy(cfg.NodeLabels, f.cfg.NodeLabels)
	log := f.nodeLog.With("node", cfg.NodeName)
	n, err := node.New(ctx, cfg, node.Deps{Log: log, Version: version, Commit: commit, Simulated: &node.Simulated{
		Store: simStore{Memory: store.NewMemory(), base: f.sessionBase},
		Runtime: func(objs *objects.Store, imagesChanged func()) node.SimulatedRuntime {
			return simRuntime{simruntime.New(simruntime.Options{Objects: objs, PodCIDR: simPodCIDR, OnNewImage: imagesChanged})}
		},
		Host: nodestatus.Host{
			CPUs: f.cpus, Memory: f.memory, DiskCapacity: 32 << 30,
			Info: nodestatus.Info{OSImage: "mqlet fleet simulator", KernelVersion: "simulated", BootID: randomID(),
				MachineID: hashID(cfg.NodeName), OperatingSystem: "linux", Architecture: f.arch},
			Hardware: nodestatus.Hardware{CPUModel: "simulated", Board: hw.Board{Model: "mqlet simulated node"}, Machine: unameMachine(f.arch)},
		},
		HostIP: func() string { return nodeIP(i) },
		Logs:   simLogs{},
	}})
	if err != nil {
		return nil, err
	}
	return &simNode{Node: n, name: cfg.NodeName}, nil
}

// simRuntime is the in-memory runtime with its images as the node status lists them.
type simRuntime struct{ *simruntime.Runtime }

func (r simRuntime) Images(ctx context.Context) ([]nodestatus.Image, error) {
	list, err := r.ListImages(ctx)
	out := make([]nodestatus.Image, 0, len(list))
	for _, i := range list {
		out = append(out, nodestatus.Image{Name: i.Name, Digest: i.Digest, Size: i.Size})
	}
	return out, err
}

// unameMachine is what `uname -m` says on a machine of Go architecture arch.
func unameMachine(arch string) string {
	switch arch {
	case "arm64":
		return "aarch64"
	case "amd64":
		return "x86_64"
	case "arm":
		return "armv7l"
	}
	return arch
}

func hashID(name string) string {
	sum := sha256.Sum256([]byte("mqlet-fleet-sim/" + name))
	return hex.EncodeToString(sum[:16])
}

// randomID is a boot id: new at every start of the simulator, as a real node's is at every boot.
func randomID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
