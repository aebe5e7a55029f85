package cni

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// The default network is written only into a directory without any configuration, loads as a
// chain of bridge (with host-local on the pod CIDR), portmap and loopback, and an operator's file,
// even a broken one, is never replaced.
func TestWriteDefault(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "net.d")
	d := DefaultNetwork{Name: "mqlet", Bridge: "mqlet0", Subnet: "10.89.0.0/24", DataDir: "/var/lib/mqlet/cni/networks"}
	wrote, err := WriteDefault(dir, d)
	if err != nil || !wrote {
		t.Fatalf("WriteDefault into a missing dir: %v %v", wrote, err)
	}
	n, err := loadNetwork(dir)
	if err != nil {
		t.Fatal(err)
	}
	if n.file != filepath.Join(dir, DefaultConfFile) || n.list.Name != "mqlet" {
		t.Errorf("loaded %s network %q", n.file, n.list.Name)
	}
	if got := pluginTypes(n.list); !slices.Equal(got, []string{"bridge", "host-local", "portmap", "loopback"}) {
		t.Errorf("default chain = %v", got)
	}
	var bridge struct {
		Bridge      string `json:"bridge"`
		IsGateway   bool   `json:"isGateway"`
		IPMasq      bool   `json:"ipMasq"`
		HairpinMode bool   `json:"hairpinMode"`
		IPAM        struct {
			Ranges  [][]struct{ Subnet string } `json:"ranges"`
			DataDir string                      `json:"dataDir"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal(n.list.Plugins[0].Bytes, &bridge); err != nil {
		t.Fatal(err)
	}
	if bridge.Bridge != "mqlet0" || !bridge.IsGateway || !bridge.IPMasq || !bridge.HairpinMode ||
		bridge.IPAM.Ranges[0][0].Subnet != "10.89.0.0/24" || bridge.IPAM.DataDir != d.DataDir {
		t.Errorf("bridge plugin = %+v", bridge)
	}
	if !n.list.Plugins[1].Network.Capabilities["portMappings"] {
		t.Error("portmap lacks the portMappings capability")
	}

	// A second call leaves the file as it is.
	os.WriteFile(filepath.Join(dir, DefaultConfFile), []byte("edited by the operator"), 0o644)
	if wrote, err := WriteDefault(dir, d); err != nil || wrote {
		t.Errorf("WriteDefault over an existing (broken) file: wrote=%v err=%v", wrote, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, DefaultConfFile)); string(b) != "edited by the operator" {
		t.Errorf("operator's file replaced: %q", b)
	}
}

// Host ports go to portmap as containerd's CRI passes them; ports without one do not.
func TestPortMappings(t *testing.T) {
	always := v1.ContainerRestartPolicyAlways
	pod := &v1.Pod{Spec: v1.PodSpec{
		InitContainers: []v1.Container{
			{Name: "init", Ports: []v1.ContainerPort{{ContainerPort: 1, HostPort: 1001}}},
			{Name: "sidecar", RestartPolicy: &always, Ports: []v1.ContainerPort{{ContainerPort: 2, HostPort: 1002, Protocol: v1.ProtocolUDP}}},
		},
		Containers: []v1.Container{{Name: "c", Ports: []v1.ContainerPort{
			{ContainerPort: 80},
			{ContainerPort: 80, HostPort: 8080, HostIP: "0.0.0.0"},
			{ContainerPort: 53, HostPort: 5353, Protocol: v1.ProtocolUDP, HostIP: "127.0.0.1"},
		}}},
	}}
	want := []PortMapping{
		{HostPort: 1002, ContainerPort: 2, Protocol: "udp"},
		{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"},
		{HostPort: 5353, ContainerPort: 53, Protocol: "udp", HostIP: "127.0.0.1"},
	}
	if got := PortMappings(pod); !slices.Equal(got, want) {
		t.Errorf("PortMappings = %+v\nwant %+v", got, want)
	}
}
