// Package cni attaches pods' network namespaces to the node's network through CNI plugins
// (libcni), the way containerd's CRI does for kubelet: one network configuration, the first valid
// one by file name in the configuration directory, run as a plugin chain with ADD when a pod's
// sandbox is set up and DEL when it goes. What ADD returned is kept on disk with the configuration
// it ran with, so DEL runs the same plugins with the same arguments even after the operator
// changed the configuration, the agent restarted or the node rebooted.
package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/mqlet/mqlet/internal/atomicfile"
)

// confExtensions are the file names containerd's CRI reads in the configuration directory.
var confExtensions = []string{".conf", ".conflist", ".json"}

// network is the configuration pods are attached with now.
type network struct {
	file string // where it was read
	list *libcni.NetworkConfigList
	// bytes is the list as one conflist document with every plugin in it (a .conf file, or plugins
	// kept in a side directory, are folded in), what a record keeps for DEL.
	bytes []byte
}

// loadNetwork reads the first valid configuration in dir, by file name, as containerd's CRI does.
// Invalid files are skipped, but when none is valid the error names each file and what is wrong
// with it, so the operator sees which file to fix.
func loadNetwork(dir string) (*network, error) {
	files, err := libcni.ConfFiles(dir, confExtensions)
	if err != nil {
		return nil, fmt.Errorf("read CNI configuration directory %s: %w", dir, err)
	}
	slices.Sort(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("no CNI network configuration in %s (.conflist, .conf or .json)", dir)
	}
	var bad []string
	for _, f := range files {
		n, err := loadFile(f)
		if err == nil {
			return n, nil
		}
		bad = append(bad, fmt.Sprintf("%s: %v", f, err))
	}
	return nil, fmt.Errorf("no valid CNI network configuration in %s: %s", dir, strings.Join(bad, "; "))
}

func loadFile(file string) (*network, error) {
	var list *libcni.NetworkConfigList
	if strings.HasSuffix(file, ".conflist") {
		l, err := libcni.NetworkConfFromFile(file)
		if err != nil {
			return nil, err
		}
		list = l
	} else {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		// A .conf file holds a single plugin, or (some tools write it so) a whole list.
		if l, err := libcni.NetworkConfFromBytes(data); err == nil && len(l.Plugins) > 0 {
			list = l
		} else {
			one, err := libcni.NetworkPluginConfFromBytes(data)
			if err != nil {
				return nil, err
			}
			if one.Network.Name == "" {
				return nil, errors.New("error parsing configuration: missing 'name'")
			}
			if list, err = libcni.ConfListFromConf(one); err != nil {
				return nil, err
			}
		}
	}
	if list.Name == "" {
		return nil, errors.New("error parsing configuration list: empty name")
	}
	if len(list.Plugins) == 0 {
		return nil, errors.New("error parsing configuration list: no plugins in list")
	}
	b, err := canonical(list)
	if err != nil {
		return nil, err
	}
	return &network{file: file, list: list, bytes: b}, nil
}

// canonical writes list as one conflist holding every plugin it runs.
func canonical(list *libcni.NetworkConfigList) ([]byte, error) {
	plugins := make([]json.RawMessage, 0, len(list.Plugins))
	for _, p := range list.Plugins {
		plugins = append(plugins, json.RawMessage(p.Bytes))
	}
	return json.Marshal(struct {
		CNIVersion   string            `json:"cniVersion"`
		Name         string            `json:"name"`
		DisableCheck bool              `json:"disableCheck,omitempty"`
		Plugins      []json.RawMessage `json:"plugins"`
	}{list.CNIVersion, list.Name, list.DisableCheck, plugins})
}

// pluginTypes lists the binaries a chain runs: each plugin and its IPAM plugin, in order.
func pluginTypes(list *libcni.NetworkConfigList) []string {
	var out []string
	for _, p := range list.Plugins {
		out = append(out, p.Network.Type)
		if p.Network.IPAM.Type != "" {
			out = append(out, p.Network.IPAM.Type)
		}
	}
	return out
}

// findPlugins checks that every binary the chain runs is in binDirs, before anything runs: a
// missing one is named with the network and file that want it.
func findPlugins(n *network, binDirs []string) error {
	for _, t := range pluginTypes(n.list) {
		if _, err := invoke.FindInPath(t, binDirs); err != nil {
			return fmt.Errorf("CNI plugin %q of network %q (%s) not found in %s", t, n.list.Name, n.file, strings.Join(binDirs, ", "))
		}
	}
	return nil
}

// DefaultNetwork is what mqlet writes when the configuration directory holds no configuration.
type DefaultNetwork struct {
	Name    string // network name, e.g. "mqlet"
	Bridge  string // the bridge device, e.g. "mqlet0"
	Subnet  string // podCIDR
	DataDir string // host-local's allocations
}

// ConfList is the default network as a conflist: a bridge that is the pods' gateway, masquerades
// their traffic leaving the subnet and lets a pod reach itself through its own host port
// (hairpin), host-local addresses from the subnet, portmap for hostPort (TCP and UDP, hostIP
// honoured) and loopback, which leaves the namespace's lo up whatever ran before.
func (d DefaultNetwork) ConfList() ([]byte, error) {
	type obj = map[string]any
	conf := obj{
		"cniVersion": "1.0.0",
		"name":       d.Name,
		"plugins": []obj{
			{
				"type": "bridge", "bridge": d.Bridge, "isGateway": true, "ipMasq": true, "hairpinMode": true,
				"ipam": obj{
					"type":    "host-local",
					"ranges":  [][]obj{{{"subnet": d.Subnet}}},
					"routes":  []obj{{"dst": defaultRoute(d.Subnet)}},
					"dataDir": d.DataDir,
				},
			},
			{"type": "portmap", "capabilities": obj{"portMappings": true}},
			{"type": "loopback"},
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}

func defaultRoute(subnet string) string {
	if strings.Contains(subnet, ":") {
		return "::/0"
	}
	return "0.0.0.0/0"
}

// DefaultConfFile is the name mqlet gives its default network in the configuration directory.
const DefaultConfFile = "10-mqlet.conflist"

// The names of the default network mqlet writes when the configuration directory holds none, and
// of its bridge (what `mqlet check` and `mqlet uninstall` look for).
const (
	DefaultNetworkName = "mqlet"
	DefaultBridge      = "mqlet0"
)

// WriteDefault writes d into dir as DefaultConfFile when dir holds no configuration file at all. A
// directory that holds only invalid files is left alone: the operator's file is to be fixed, not
// silently replaced. It reports whether it wrote.
func WriteDefault(dir string, d DefaultNetwork) (bool, error) {
	files, err := libcni.ConfFiles(dir, confExtensions)
	if err != nil {
		return false, fmt.Errorf("read CNI configuration directory %s: %w", dir, err)
	}
	if len(files) > 0 {
		return false, nil
	}
	data, err := d.ConfList()
	if err != nil {
		return false, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("CNI configuration directory: %w", err)
	}
	path := filepath.Join(dir, DefaultConfFile)
	// Written aside and renamed in: a reader never sees half of it. The temporary name ends in
	// ".tmp", which libcni's extension filter never loads.
	if err := atomicfile.Write(path, append(data, '\n'), 0o644); err != nil {
		return false, fmt.Errorf("write default CNI network: %w", err)
	}
	return true, nil
}
