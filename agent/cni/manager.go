package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/mqlet/mqlet/hw"
	"github.com/mqlet/mqlet/internal/atomicfile"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
)

// IfName is the pod's interface, as kubelet names it.
const IfName = "eth0"

// Options configures a Manager.
type Options struct {
	ConfDir string   // cniConfDir
	BinDirs []string // cniBinDirs, searched in order
	// StateDir holds one directory per attached pod: its record and libcni's cache of the result.
	StateDir string
	Log      *slog.Logger
}

// Manager attaches and detaches pods. It is safe for concurrent use by the pod workers; calls for
// one pod must not overlap (each pod has one worker, and the sweep only takes pods nobody runs).
type Manager struct {
	opts Options
	log  *slog.Logger

	mu      sync.Mutex
	checked map[string]bool // pod UIDs whose attachment this process made or CHECKed
}

// New returns a Manager; it touches nothing until used.
func New(o Options) *Manager {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Manager{opts: o, log: o.Log, checked: map[string]bool{}}
}

// Ready reports why pods cannot be attached now (nil: they can): no valid configuration, or a
// plugin binary the configuration names is missing. The node status shows it.
func (m *Manager) Ready() error {
	n, err := loadNetwork(m.opts.ConfDir)
	if err != nil {
		return err
	}
	return findPlugins(n, m.opts.BinDirs)
}

// record is what the node keeps of one pod's attachment, written before ADD runs (so a crash in
// the middle still leaves what DEL needs) and again with ADD's result.
type record struct {
	Network string          `json:"network"`
	File    string          `json:"file"`   // the configuration file it came from, for messages
	Conf    json.RawMessage `json:"conf"`   // the conflist ADD ran with; DEL runs the same
	NetNS   string          `json:"netns"`  // identity of the namespace attached (netnsID)
	IfName  string          `json:"ifName"` // interface in the pod
	Args    [][2]string     `json:"args"`   // CNI_ARGS
	Ports   []PortMapping   `json:"portMappings,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"` // ADD's result; absent while ADD has not succeeded
	IPs     []string        `json:"ips,omitempty"`    // the pod's addresses from Result, primary first
	// Releasing is set before a teardown's DEL: a record that has it describes an attachment that
	// may be released already (its addresses handed to other pods), however complete it looks.
	Releasing bool `json:"releasing,omitempty"`
}

const recordFile = "record.json"

// podDir is the pod's directory under the state dir; uid must be one path element (the runtime
// checked it, and the admission step made it path-safe).
func (m *Manager) podDir(uid string) (string, error) {
	if uid == "" || uid == "." || uid == ".." || strings.ContainsAny(uid, "/\x00") {
		return "", fmt.Errorf("pod UID %q cannot be used in a file path", uid)
	}
	return filepath.Join(m.opts.StateDir, uid), nil
}

func readRecord(dir string) (*record, error) {
	data, err := os.ReadFile(filepath.Join(dir, recordFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(dir, recordFile), err)
	}
	return &r, nil
}

// writeRecord replaces the record by rename, so a kill at any moment leaves the old or the new one.
// It is not fsynced: a power loss is a reboot, after which the attachment is made anew anyway, and
// a lost record then costs one failed ADD (cleaned up by DEL) rather than two fsyncs per pod start.
func writeRecord(dir string, r *record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, recordFile), data, 0o600)
}

// Setup attaches the pod's network namespace at netns (pinned by the runtime) and returns the pod's
// addresses, primary first. It is idempotent: a namespace already attached (the agent restarted)
// keeps its attachment and addresses, checked once per agent run with CHECK; a namespace that is new
// (fresh, or not the one recorded: the node rebooted) while a record of an older attachment
// exists, or a record whose ADD never finished (the agent died in the middle) or whose host ports
// differ from the pod's, has the old attachment released with DEL first, so host-local gives back
// its address, and is then attached with ADD.
func (m *Manager) Setup(ctx context.Context, pod *v1.Pod, netns string, fresh bool) ([]string, error) {
	uid := string(pod.UID)
	dir, err := m.podDir(uid)
	if err != nil {
		return nil, err
	}
	nsID, err := netnsID(netns)
	if err != nil {
		return nil, err
	}
	ports := PortMappings(pod)
	rec, err := readRecord(dir)
	if err != nil {
		return nil, err
	}
	if rec != nil {
		if rec.Result != nil && !rec.Releasing && !fresh && rec.NetNS == nsID && slices.Equal(rec.Ports, ports) {
			return m.adopt(ctx, pod, dir, rec, netns, nsID)
		}
		why := "its network namespace is new (reboot)"
		switch {
		case rec.Releasing:
			why = "its last teardown did not finish"
		case rec.Result == nil:
			why = "its last ADD did not finish"
		case !fresh && rec.NetNS == nsID:
			why = "its host ports changed"
		}
		m.log.Info("releasing the pod's earlier network attachment before attaching it again", "pod", podName(pod), "why", why)
		if err := m.del(ctx, dir, rec, netns); err != nil {
			return nil, fmt.Errorf("release the earlier attachment to CNI network %q: %w", rec.Network, err)
		}
		m.forget(uid)
	}
	return m.add(ctx, pod, dir, netns, nsID, ports)
}

// adopt keeps an attachment this process did not make (the agent restarted), with its addresses,
// once it has checked, once per agent run, that the pod's namespace still has the interface with
// every recorded address. Without them the pod has no network (its veth was deleted, or a teardown
// ran its DEL and was killed before it removed the record), and keeping the record would report it
// Running with an address host-local may hand to another pod: the attachment is released (DEL) and
// made again (ADD), and if that fails Setup fails, so the pod shows the reason and waits. CNI CHECK
// is run too but only reported: redoing a present attachment would change the addresses under a
// running pod, and the plugins' own CHECK is not always right (portmap 1.1.1 fails it on a node
// without IPv6 NAT chains); containerd's CRI does not CHECK at all.
func (m *Manager) adopt(ctx context.Context, pod *v1.Pod, dir string, rec *record, netns, nsID string) ([]string, error) {
	uid := string(pod.UID)
	m.mu.Lock()
	done := m.checked[uid]
	m.mu.Unlock()
	if done {
		return rec.IPs, nil
	}
	list, err := libcni.NetworkConfFromBytes(rec.Conf)
	if err != nil {
		return nil, fmt.Errorf("stored CNI configuration of network %q: %w", rec.Network, err)
	}
	missing, err := missingAddrs(netns, rec.IfName, rec.IPs)
	if err != nil {
		return nil, fmt.Errorf("look at the pod's interface %s in %s: %w", rec.IfName, netns, err)
	}
	if missing != "" {
		m.log.Warn("the pod's network attachment is gone from its namespace; attaching it again", "pod", podName(pod),
			"network", rec.Network, "ips", rec.IPs, "missing", missing)
		if nets, err := resultNets(rec.Result); err != nil {
			m.log.Warn("the recorded CNI result is unreadable; DEL may leave NAT rules behind", "pod", podName(pod), "err", err)
		} else if err := restoreForDel(netns, rec.IfName, nets); err != nil {
			m.log.Warn("could not put the pod's addresses back for DEL; it may leave NAT rules behind", "pod", podName(pod), "err", err)
		}
		if err := m.del(ctx, dir, rec, netns); err != nil {
			return nil, fmt.Errorf("release the broken attachment to CNI network %q (%s): %w", rec.Network, missing, err)
		}
		m.forget(uid)
		return m.add(ctx, pod, dir, netns, nsID, rec.Ports)
	}
	if err := m.config(dir).CheckNetworkList(ctx, list, rec.runtimeConf(uid, netns)); err != nil && !errors.Is(err, libcni.ErrorCheckNotSupp) {
		m.log.Warn("the pod's network attachment failed CNI CHECK; its interface and addresses are there, so it is kept",
			"pod", podName(pod), "network", rec.Network, "ips", rec.IPs, "err", err)
	}
	m.mu.Lock()
	m.checked[uid] = true
	m.mu.Unlock()
	m.log.Debug("kept the pod's network attachment", "pod", podName(pod), "network", rec.Network, "ips", rec.IPs)
	return rec.IPs, nil
}

func (m *Manager) add(ctx context.Context, pod *v1.Pod, dir, netns, nsID string, ports []PortMapping) ([]string, error) {
	uid := string(pod.UID)
	n, err := loadNetwork(m.opts.ConfDir)
	if err != nil {
		return nil, err
	}
	if err := findPlugins(n, m.opts.BinDirs); err != nil {
		return nil, err
	}
	rec := &record{Network: n.list.Name, File: n.file, Conf: n.bytes, NetNS: nsID, IfName: IfName, Ports: ports,
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", pod.Namespace},
			{"K8S_POD_NAME", pod.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", uid},
			{"K8S_POD_UID", uid},
		}}
	if err := writeRecord(dir, rec); err != nil {
		return nil, fmt.Errorf("record the pod's network attachment: %w", err)
	}
	res, err := m.config(dir).AddNetworkList(ctx, n.list, rec.runtimeConf(uid, netns))
	if err != nil {
		err = fmt.Errorf("attach to CNI network %q (%s): %w", n.list.Name, n.file, err)
		// The CNI contract: a failed ADD is cleaned up with DEL, so nothing it half made (an
		// address, a veth) is left for the retry to trip over.
		if derr := m.del(ctx, dir, rec, netns); derr != nil {
			m.log.Warn("clean up after a failed CNI ADD; retried later", "pod", podName(pod), "err", derr)
		} else if rerr := os.RemoveAll(dir); rerr != nil {
			m.log.Warn("remove the pod's CNI record", "pod", podName(pod), "err", rerr)
		}
		return nil, err
	}
	if rec.Result, err = json.Marshal(res); err != nil {
		return nil, err
	}
	if rec.IPs, err = podIPs(res, netns); err != nil {
		return nil, fmt.Errorf("CNI network %q (%s): %w", n.list.Name, n.file, err)
	}
	if err := writeRecord(dir, rec); err != nil {
		return nil, fmt.Errorf("record the pod's network attachment: %w", err)
	}
	m.mu.Lock()
	m.checked[uid] = true
	m.mu.Unlock()
	m.log.Debug("pod attached to CNI network", "pod", podName(pod), "network", n.list.Name, "ips", rec.IPs)
	return rec.IPs, nil
}

// Teardown releases the pod's attachment (DEL with what ADD was given, and its result) and
// forgets it; a teardown interrupted after its DEL is finished by the next Setup or Teardown. netns is the pod's namespace if it still exists, else "": plugins then release
// what lives outside the pod (the address, NAT rules) and skip the rest. A pod never attached has
// nothing to release. When DEL fails the record stays, for the next teardown or sweep.
func (m *Manager) Teardown(ctx context.Context, uid, netns string) error {
	dir, err := m.podDir(uid)
	if err != nil {
		return err
	}
	rec, err := readRecord(dir)
	if err != nil {
		return err
	}
	if rec != nil {
		// Marked first: killed between the DEL and the removal below, the record must not be
		// taken for a live attachment by the next Setup.
		if !rec.Releasing {
			rec.Releasing = true
			if err := writeRecord(dir, rec); err != nil {
				return fmt.Errorf("mark the pod's network attachment as being released: %w", err)
			}
		}
		if err := m.del(ctx, dir, rec, netns); err != nil {
			return fmt.Errorf("detach from CNI network %q: %w", rec.Network, err)
		}
	}
	m.forget(uid)
	return os.RemoveAll(dir)
}

// Pods lists the UIDs of the pods the node keeps an attachment record of.
func (m *Manager) Pods() ([]string, error) {
	entries, err := os.ReadDir(m.opts.StateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func (m *Manager) forget(uid string) {
	m.mu.Lock()
	delete(m.checked, uid)
	m.mu.Unlock()
}

func (m *Manager) del(ctx context.Context, dir string, rec *record, netns string) error {
	list, err := libcni.NetworkConfFromBytes(rec.Conf)
	if err != nil {
		return fmt.Errorf("stored CNI configuration of network %q: %w", rec.Network, err)
	}
	uid := filepath.Base(dir)
	return m.config(dir).DelNetworkList(ctx, list, rec.runtimeConf(uid, netns))
}

// config runs plugins from the bin dirs with libcni's cache of results in the pod's own directory:
// that cache is what libcni hands DEL and CHECK as prevResult, and it goes with the pod.
func (m *Manager) config(dir string) *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir(m.opts.BinDirs, dir, nil)
}

func (r *record) runtimeConf(uid, netns string) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{ContainerID: uid, NetNS: netns, IfName: r.IfName, Args: r.Args}
	if len(r.Ports) > 0 {
		rt.CapabilityArgs = map[string]any{"portMappings": r.Ports}
	}
	return rt
}

// podIPs picks the pod's addresses from an ADD result: those on the pod's interface, in the
// result's order (the first is the primary), or, when the plugins did not say which interface an
// address is on, every address that is not loopback.
// resultNets reads the addresses, with their prefixes, of the pod's interface from a stored ADD
// result.
func resultNets(raw json.RawMessage) ([]*net.IPNet, error) {
	r, err := create.CreateFromBytes(raw)
	if err != nil {
		return nil, err
	}
	res, err := types100.NewResultFromResult(r)
	if err != nil {
		return nil, err
	}
	var out []*net.IPNet
	for _, ip := range res.IPs {
		if ip.Address.IP == nil || ip.Address.IP.IsLoopback() {
			continue
		}
		if ip.Interface != nil && *ip.Interface >= 0 && *ip.Interface < len(res.Interfaces) && res.Interfaces[*ip.Interface].Name != IfName {
			continue
		}
		a := ip.Address
		out = append(out, &a)
	}
	return out, nil
}

func podIPs(res types.Result, netns string) ([]string, error) {
	r, err := types100.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("read ADD result: %w", err)
	}
	var onIf, all []string
	for _, ip := range r.IPs {
		if ip.Address.IP == nil || ip.Address.IP.IsLoopback() {
			continue
		}
		all = append(all, ip.Address.IP.String())
		if ip.Interface != nil && *ip.Interface >= 0 && *ip.Interface < len(r.Interfaces) {
			if ifc := r.Interfaces[*ip.Interface]; ifc.Name == IfName && (ifc.Sandbox == "" || ifc.Sandbox == netns) {
				onIf = append(onIf, ip.Address.IP.String())
			}
		}
	}
	if len(onIf) > 0 {
		return onIf, nil
	}
	return all, nil
}

// netnsID identifies the namespace pinned at path across agent restarts, and tells a namespace
// made after a reboot from the one before: namespace inode numbers repeat across boots, so the
// boot id is part of it.
func netnsID(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("pod network namespace %s: %w", path, err)
	}
	boot := hw.BootID("/")
	if boot == "" {
		boot = "-"
	}
	return fmt.Sprintf("%s/%d:%d", boot, st.Dev, st.Ino), nil
}

func podName(pod *v1.Pod) string { return pod.Namespace + "/" + pod.Name }

// PortMapping is one hostPort as portmap's portMappings capability takes it.
type PortMapping struct {
	HostPort      int32  `json:"hostPort"`
	ContainerPort int32  `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

// PortMappings lists the host ports of the pod's containers (and of its sidecars, which run
// beside them), as containerd's CRI hands them to portmap: protocol in lower case, TCP when unset,
// and the "every address" host IP (unset or 0.0.0.0) left out.
func PortMappings(pod *v1.Pod) []PortMapping {
	var out []PortMapping
	add := func(c *v1.Container) {
		for _, p := range c.Ports {
			if p.HostPort <= 0 {
				continue
			}
			proto := strings.ToLower(string(p.Protocol))
			if proto == "" {
				proto = "tcp"
			}
			ip := p.HostIP
			if ip == "0.0.0.0" {
				ip = ""
			} else if parsed := net.ParseIP(ip); parsed != nil {
				ip = parsed.String()
			}
			out = append(out, PortMapping{HostPort: p.HostPort, ContainerPort: p.ContainerPort, Protocol: proto, HostIP: ip})
		}
	}
	for i := range pod.Spec.InitContainers {
		if c := &pod.Spec.InitContainers[i]; c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			add(c)
		}
	}
	for i := range pod.Spec.Containers {
		add(&pod.Spec.Containers[i])
	}
	return out
}
