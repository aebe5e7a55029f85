package ctrd

import (
	"context"
	"testing"

	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/mqlet/mqlet/agent/devices"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Each allocated node goes into the spec at its path with the host node's type, numbers and mode,
// with an rwm allow rule for exactly those numbers after the default deny; a node already at that
// path (a privileged container's copy of the host's /dev) is replaced, not doubled.
func TestWithDeviceNodes(t *testing.T) {
	deny := specs.LinuxDeviceCgroup{Allow: false, Access: "rwm"}
	s := &oci.Spec{Linux: &specs.Linux{
		Devices:   []specs.LinuxDevice{{Path: "/dev/ttyUSB0", Type: "c", Major: 188, Minor: 0}, {Path: "/dev/other", Type: "c", Major: 1, Minor: 1}},
		Resources: &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{deny}},
	}}
	nodes := []devices.Node{
		{Path: "/dev/ttyUSB0", Type: "c", Major: 188, Minor: 1, Mode: 0o660, UID: 0, GID: 20},
		{Path: "/dev/video0", Type: "b", Major: 81, Minor: 0, Mode: 0o600},
	}
	if err := withDeviceNodes(nodes)(context.Background(), nil, nil, s); err != nil {
		t.Fatal(err)
	}
	if n := len(s.Linux.Devices); n != 3 {
		t.Fatalf("spec devices = %+v, want /dev/other and the two nodes", s.Linux.Devices)
	}
	byPath := map[string]specs.LinuxDevice{}
	for _, d := range s.Linux.Devices {
		byPath[d.Path] = d
	}
	tty := byPath["/dev/ttyUSB0"]
	if tty.Major != 188 || tty.Minor != 1 || tty.Type != "c" || tty.FileMode == nil || *tty.FileMode != 0o660 || tty.GID == nil || *tty.GID != 20 {
		t.Errorf("/dev/ttyUSB0 in the spec = %+v, want the allocated node c 188:1 0660 gid 20", tty)
	}
	if v := byPath["/dev/video0"]; v.Type != "b" || v.Major != 81 {
		t.Errorf("/dev/video0 in the spec = %+v, want b 81:0", v)
	}
	rules := s.Linux.Resources.Devices
	if len(rules) != 3 || rules[0] != deny {
		t.Fatalf("cgroup device rules = %+v, want the default deny then one allow per node", rules)
	}
	for i, n := range nodes {
		r := rules[i+1]
		if !r.Allow || r.Type != n.Type || r.Major == nil || *r.Major != n.Major || r.Minor == nil || *r.Minor != n.Minor || r.Access != "rwm" {
			t.Errorf("rule %d = %+v, want allow %s %d:%d rwm", i+1, r, n.Type, n.Major, n.Minor)
		}
	}
}
